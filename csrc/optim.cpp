// Fused optimizer kernels and gradient helpers (ATen has CPU and CUDA kernels for all of them).
#include "optim_own.h"
#include "shim.h"

#include <mutex>
#include <optional>
#include <unordered_set>

using tcg::guard;
using tcg::misuse;
using tcg::tensor_list;
using tcg::tensor_ref;

namespace {
std::mutex kept_mu;
std::unordered_set<const c10::TensorImpl*>& kept() {
  static auto* set = new std::unordered_set<const c10::TensorImpl*>();  // never destroyed
  return *set;
}
}  // namespace

void tcg::keep_grad(const at::Tensor& param, bool on) noexcept {
  try {
    std::lock_guard<std::mutex> lock(kept_mu);
    if (on) {
      kept().insert(param.unsafeGetTensorImpl());
    } else {
      kept().erase(param.unsafeGetTensorImpl());
    }
  } catch (...) {
  }
}

bool tcg::grad_kept(const at::Tensor& param) noexcept {
  try {
    std::lock_guard<std::mutex> lock(kept_mu);
    return kept().count(param.unsafeGetTensorImpl()) != 0;
  } catch (...) {
    return false;
  }
}

namespace {
std::optional<at::Tensor> optional_tensor(tcg_tensor t) {
  if (t == nullptr) return std::nullopt;
  return tensor_ref(t);
}

// Whether the own kernels ran (`tried` returned true); if they could not where only they were
// asked for, TCG_UNSUPPORTED with the reason.
bool own_ran(int kernels, bool ran, const std::string& why) {
  if (!ran && kernels == TCG_KERNELS_OWN) {
    throw tcg::exception(TCG_UNSUPPORTED, "the crate's own optimizer kernels cannot run this step: " + why);
  }
  return ran;
}
}  // namespace

extern "C" {

int tcg_own_kernels_built(void) { return tcg::optim::built() ? 1 : 0; }

tcg_status tcg_own_kernels_check(int device) {
  return guard([&] {
    auto why = tcg::optim::unavailable(device);
    if (!why.empty()) throw tcg::exception(TCG_UNSUPPORTED, why);
  });
}

tcg_status tcg_fused_sgd(tcg_tensor* params, tcg_tensor* grads, tcg_tensor* bufs, size_t n,
                         size_t n_bufs, double weight_decay, double momentum, tcg_tensor lr,
                         double dampening, int nesterov, int maximize, int is_first_step,
                         tcg_tensor grad_scale, tcg_tensor found_inf, int kernels, int* ran_own) {
  return guard([&] {
    *ran_own = 0;
    if (n_bufs != 0 && n_bufs != n) misuse("momentum buffers must be empty or one per parameter");
    auto p = tensor_list(params, n);
    auto g = tensor_list(grads, n);
    auto b = tensor_list(bufs, n_bufs);
    if (kernels != TCG_KERNELS_PYTORCH) {
      std::string why;
      bool ran = tcg::optim::sgd(p, g, b, weight_decay, momentum, tensor_ref(lr), dampening,
                                 nesterov != 0, maximize != 0, is_first_step != 0,
                                 optional_tensor(grad_scale), optional_tensor(found_inf), &why);
      if (own_ran(kernels, ran, why)) {
        *ran_own = 1;
        return;
      }
    }
    at::_fused_sgd_(p, g, b, weight_decay, momentum, tensor_ref(lr), dampening, nesterov != 0,
                    maximize != 0, is_first_step != 0, optional_tensor(grad_scale),
                    optional_tensor(found_inf));
  });
}

tcg_status tcg_fused_adam(int adamw, tcg_tensor* params, tcg_tensor* grads, tcg_tensor* exp_avgs,
                          tcg_tensor* exp_avg_sqs, tcg_tensor* max_exp_avg_sqs, size_t n_max,
                          tcg_tensor* steps, size_t n, tcg_tensor lr, double beta1, double beta2,
                          double weight_decay, double eps, int amsgrad, int maximize,
                          tcg_tensor grad_scale, tcg_tensor found_inf, int kernels,
                          tcg_tensor arrivals, const size_t* slots, int* ran_own) {
  return guard([&] {
    *ran_own = 0;
    if (amsgrad != 0 && n_max != n) misuse("amsgrad needs one max_exp_avg_sq per parameter");
    auto p = tensor_list(params, n);
    auto g = tensor_list(grads, n);
    auto m = tensor_list(exp_avgs, n);
    auto v = tensor_list(exp_avg_sqs, n);
    auto vmax = tensor_list(max_exp_avg_sqs, n_max);
    auto s = tensor_list(steps, n);
    auto scale = optional_tensor(grad_scale);
    auto found = optional_tensor(found_inf);
    if (kernels != TCG_KERNELS_PYTORCH) {
      std::string why = "no arrival counters given";
      bool ran = arrivals != nullptr && slots != nullptr &&
                 tcg::optim::adam(adamw != 0, p, g, m, v, vmax, s, tensor_ref(lr), beta1, beta2,
                                  weight_decay, eps, amsgrad != 0, maximize != 0, scale, found,
                                  tensor_ref(arrivals), slots, &why);
      if (own_ran(kernels, ran, why)) {
        *ran_own = 1;
        return;
      }
    }
    // PyTorch's _fused_adam: the per-parameter step counts go up first, in one kernel.
    at::_foreach_add_(s, 1);
    if (adamw != 0) {
      at::_fused_adamw_(p, g, m, v, vmax, s, tensor_ref(lr), beta1, beta2, weight_decay, eps,
                        amsgrad != 0, maximize != 0, scale, found);
    } else {
      at::_fused_adam_(p, g, m, v, vmax, s, tensor_ref(lr), beta1, beta2, weight_decay, eps,
                       amsgrad != 0, maximize != 0, scale, found);
    }
    // a skipped step (inf/NaN grads) does not count (PyTorch's _fused_adam does the same)
    if (found.has_value()) at::_foreach_sub_(s, std::vector<at::Tensor>(s.size(), *found));
  });
}

tcg_status tcg_grads_set_to_none(tcg_tensor* params, size_t n) {
  return guard([&] {
    std::vector<at::Tensor> views;  // bucket views (tcg::keep_grad): zeroed, never dropped
    for (size_t i = 0; i < n; ++i) {
      auto& p = tensor_ref(params[i]);
      if (p.grad().defined() && tcg::grad_kept(p)) {
        views.push_back(p.grad());
      } else {
        p.mutable_grad().reset();
      }
    }
    if (!views.empty()) at::_foreach_zero_(views);
  });
}

tcg_status tcg_grads_zero(tcg_tensor* params, size_t n) {
  return guard([&] {
    std::vector<at::Tensor> grads;
    for (size_t i = 0; i < n; ++i) {
      const auto& g = tensor_ref(params[i]).grad();
      if (g.defined()) grads.push_back(g);
    }
    if (!grads.empty()) at::_foreach_zero_(grads);
  });
}

tcg_status tcg_clip_grad_norm(tcg_tensor* grads, size_t n, double max_norm, double norm_type,
                              tcg_tensor* total_out) {
  return guard([&] {
    auto g = tensor_list(grads, n);
    if (g.empty()) misuse("clip_grad_norm: no gradients (call backward first)");
    auto norms = at::_foreach_norm(g, norm_type);
    at::Tensor total = at::linalg_vector_norm(at::stack(norms), norm_type);
    // clamp(max_norm / (total + 1e-6), max=1): stays on the device, no host sync.
    at::Tensor coef = at::clamp_max(at::reciprocal(total + 1e-6) * max_norm, 1.0);
    at::_foreach_mul_(g, coef);
    *total_out = new at::Tensor(std::move(total));
  });
}

}  // extern "C"
