// Copies for feeding batches into static inputs (CPU and CUDA).
#include "shim.h"

#include <c10/core/GradMode.h>

extern "C" {

tcg_status tcg_feed_copy(tcg_tensor dst, tcg_tensor src, bool non_blocking) {
  return tcg::guard([&] {
    c10::AutoGradMode no_grad(false);
    tcg::tensor_ref(dst).copy_(tcg::tensor_ref(src), non_blocking);
  });
}

tcg_status tcg_feed_is_pinned(tcg_tensor t, bool* out) {
  return tcg::guard([&] {
    const at::Tensor& x = tcg::tensor_ref(t);
    *out = x.is_cpu() && x.is_pinned();  // is_pinned(device) is deprecated: no device
  });
}

tcg_status tcg_feed_pin(tcg_tensor t, tcg_tensor* out) {
  return tcg::guard([&] { *out = new at::Tensor(tcg::tensor_ref(t).pin_memory()); });
}

}  // extern "C"
