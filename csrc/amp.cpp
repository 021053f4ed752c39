// Mixed precision (CPU and CUDA builds): an autocast guard over at::autocast, and the on-device
// GradScaler ops.
#include "shim.h"

#include <ATen/autocast_mode.h>

#include <memory>

struct tcg_autocast_guard {
  bool prev_enabled;
  at::ScalarType prev_dtype;
  bool prev_cache;
  bool entered;  // an autocast region was entered (nesting incremented), not a suspension
};

extern "C" {

tcg_status tcg_autocast_guard_new(tcg_dtype dtype, bool cache, tcg_autocast_guard** out) {
  return tcg::guard([&] {
    if (dtype != TCG_DTYPE_HALF && dtype != TCG_DTYPE_BFLOAT16) tcg::misuse("autocast dtype must be Half or BFloat16");
    auto st = static_cast<at::ScalarType>(dtype);
    auto g = std::make_unique<tcg_autocast_guard>();
    g->prev_enabled = at::autocast::is_autocast_enabled(at::kCUDA);
    g->prev_dtype = at::autocast::get_autocast_dtype(at::kCUDA);
    g->prev_cache = at::autocast::is_autocast_cache_enabled();
    // torch.autocast.__enter__, for CUDA
    at::autocast::set_autocast_enabled(at::kCUDA, true);
    at::autocast::set_autocast_dtype(at::kCUDA, st);
    at::autocast::set_autocast_cache_enabled(cache);
    at::autocast::increment_nesting();
    g->entered = true;
    *out = g.release();
  });
}

tcg_status tcg_autocast_suspend_new(tcg_autocast_guard** out) {
  return tcg::guard([&] {
    auto g = std::make_unique<tcg_autocast_guard>();
    g->prev_enabled = at::autocast::is_autocast_enabled(at::kCUDA);
    g->prev_dtype = at::autocast::get_autocast_dtype(at::kCUDA);
    g->prev_cache = at::autocast::is_autocast_cache_enabled();
    g->entered = false;
    at::autocast::set_autocast_enabled(at::kCUDA, false);
    *out = g.release();
  });
}

void tcg_autocast_guard_free(tcg_autocast_guard* g) {
  if (g == nullptr) return;
  try {
    // torch.autocast.__exit__: the outermost exit clears the cast cache
    if (g->entered && at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    at::autocast::set_autocast_enabled(at::kCUDA, g->prev_enabled);
    at::autocast::set_autocast_dtype(at::kCUDA, g->prev_dtype);
    at::autocast::set_autocast_cache_enabled(g->prev_cache);
  } catch (...) {
  }
  delete g;
}

tcg_status tcg_autocast_state(bool* enabled, tcg_dtype* dtype, bool* cache) {
  return tcg::guard([&] {
    *enabled = at::autocast::is_autocast_enabled(at::kCUDA);
    *dtype = static_cast<tcg_dtype>(at::autocast::get_autocast_dtype(at::kCUDA));
    *cache = at::autocast::is_autocast_cache_enabled();
  });
}

tcg_status tcg_scaler_check_unscale(tcg_tensors grads, tcg_tensor found_inf, tcg_tensor inv_scale) {
  return tcg::guard([&] {
    auto g = tcg::tensor_list(grads);
    if (g.empty()) return;
    at::_amp_foreach_non_finite_check_and_unscale_(g, tcg::tensor_ref(found_inf), tcg::tensor_ref(inv_scale));
  });
}

tcg_status tcg_scaler_update(tcg_tensor scale, tcg_tensor growth_tracker, tcg_tensor found_inf,
                             double growth, double backoff, int64_t interval) {
  return tcg::guard([&] {
    at::_amp_update_scale_(tcg::tensor_ref(scale), tcg::tensor_ref(growth_tracker),
                           tcg::tensor_ref(found_inf), growth, backoff, interval);
  });
}

}  // extern "C"
