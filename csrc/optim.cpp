// Fused optimizer kernels and gradient helpers (ATen has CPU and CUDA kernels for all of them).
#include "kernels.h"
#include "optim_own.h"
#include "shadow.h"
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

// An in-place update counts as ATen's in-place ops count: one new version of each tensor it
// wrote (what weight shadows and autograd's saved-tensor checks go by). The own kernels need it,
// and so do ATen's fused optimizers: `_fused_adam(w)_` and `_fused_sgd_` leave the versions as
// they were (seen on PyTorch 2.11).
void bump_versions(std::initializer_list<const std::vector<at::Tensor>*> lists) {
  for (const auto* list : lists) {
    for (const auto& t : *list) {
      if (t.defined() && !t.is_inference()) t.unsafeGetTensorImpl()->bump_version();
    }
  }
}

// What an attempt of the own kernels tells tcg::kernels::own: "" when they ran, else why not.
std::string why_not(bool ran, const std::string& why) {
  if (ran) return std::string();
  return why.empty() ? std::string("they did not run") : why;
}

// Global-norm clipping's total norm and factor, min(1, max_norm / (total + 1e-6)), both on the
// device (no host sync), as PyTorch's clip_grad_norm_ computes them: the norm of the stacked
// per-tensor norms of `_foreach_norm`. Unless ATen's kernels are asked for, the own kernels
// compute the per-tensor norms (float32 L2: the same values bit for bit, already one tensor) and
// the factor (one kernel for ATen's four, the same value) where they apply.
std::pair<at::Tensor, at::Tensor> clip_factor(const std::vector<at::Tensor>& g, double max_norm, double norm_type,
                                              tcg_kernels kernels) {
  const bool own = kernels != TCG_KERNELS_PYTORCH;
  at::Tensor norms = own ? tcg::optim::grad_norms(g, norm_type) : at::Tensor();
  if (!norms.defined()) norms = at::stack(at::_foreach_norm(g, norm_type));
  at::Tensor total = at::linalg_vector_norm(norms, norm_type);
  at::Tensor coef = own ? tcg::optim::clip_coef(total, max_norm) : at::Tensor();
  if (!coef.defined()) coef = at::clamp_max(at::reciprocal(total + 1e-6) * max_norm, 1.0);
  return {std::move(total), std::move(coef)};
}

}  // namespace

extern "C" {

tcg_status tcg_optim_sgd(const tcg_sgd_tensors* t, tcg_tensor lr, const tcg_sgd_hyper* h,
                         bool is_first_step, tcg_amp_scaling amp, tcg_kernels kernels, bool* ran_own) {
  return guard([&] {
    *ran_own = false;
    size_t n = t->params.len;
    if (t->grads.len != n) misuse("sgd: one gradient per parameter");
    if (t->momentum_buffers.len != 0 && t->momentum_buffers.len != n) {
      misuse("sgd: momentum buffers must be empty or one per parameter");
    }
    auto p = tensor_list(t->params);
    auto g = tensor_list(t->grads);
    auto b = tensor_list(t->momentum_buffers);
    auto scale = optional_tensor(amp.grad_scale);
    auto found = optional_tensor(amp.found_inf);
    if (amp.clip_coef != nullptr) misuse("sgd: a clipping factor is not taken (clip the gradients first)");
    // the attempt runs the own kernels where they apply, else says why not
    if (tcg::kernels::own(kernels, "sgd", [&] {
          std::string why;
          const bool ran = tcg::optim::sgd(p, g, b, h->weight_decay, h->momentum, tensor_ref(lr), h->dampening,
                                           h->nesterov, h->maximize, is_first_step, scale, found, &why);
          return why_not(ran, why);
        })) {
      bump_versions({&p, &b});
      *ran_own = true;
      return;
    }
    at::_fused_sgd_(p, g, b, h->weight_decay, h->momentum, tensor_ref(lr), h->dampening, h->nesterov,
                    h->maximize, is_first_step, scale, found);
    bump_versions({&p, &b});
  });
}

tcg_status tcg_optim_adam(const tcg_adam_tensors* t, tcg_tensor lr, const tcg_adam_hyper* h,
                          tcg_amp_scaling amp, tcg_kernels kernels, tcg_tensor arrivals,
                          const size_t* slots, bool* ran_own) {
  return guard([&] {
    *ran_own = false;
    size_t n = t->params.len;
    for (const tcg_tensors* l : {&t->grads, &t->exp_avgs, &t->exp_avg_sqs, &t->steps}) {
      if (l->len != n) misuse("adam: one gradient, exp_avg, exp_avg_sq and step per parameter");
    }
    if (t->max_exp_avg_sqs.len != (h->amsgrad ? n : 0)) {
      misuse("adam: one max_exp_avg_sq per parameter with amsgrad, none without");
    }
    auto p = tensor_list(t->params);
    auto g = tensor_list(t->grads);
    auto m = tensor_list(t->exp_avgs);
    auto v = tensor_list(t->exp_avg_sqs);
    auto vmax = tensor_list(t->max_exp_avg_sqs);
    auto s = tensor_list(t->steps);
    auto scale = optional_tensor(amp.grad_scale);
    auto found = optional_tensor(amp.found_inf);
    auto clip = optional_tensor(amp.clip_coef);
    if (clip && scale) misuse("adam: a clipping factor and a grad scale together (unscale, then clip)");
    // The own kernel also writes the shadows of the set read on this thread, if it has any.
    tcg::optim::AdamExtras extras{clip, tcg::shadow::of(p)};
    if (tcg::kernels::own(kernels, "adam", [&] {
          if (arrivals == nullptr || slots == nullptr) return std::string("no arrival counters given");
          std::string why;
          const bool ran = tcg::optim::adam(h->adamw, p, g, m, v, vmax, s, tensor_ref(lr), h->beta1, h->beta2,
                                            h->weight_decay, h->eps, h->amsgrad, h->maximize, scale, found,
                                            tensor_ref(arrivals), slots, extras, &why);
          return why_not(ran, why);
        })) {
      bump_versions({&p, &m, &v, &vmax});
      if (!extras.shadows.empty()) tcg::shadow::written(p);
      *ran_own = true;
      return;
    }
    // ATen's kernels take no clipping factor: they read clipped copies (the gradients stay).
    if (clip) g = at::_foreach_mul(g, *clip);
    // PyTorch's _fused_adam: the per-parameter step counts go up first, in one kernel.
    at::_foreach_add_(s, 1);
    if (h->adamw) {
      at::_fused_adamw_(p, g, m, v, vmax, s, tensor_ref(lr), h->beta1, h->beta2, h->weight_decay,
                        h->eps, h->amsgrad, h->maximize, scale, found);
    } else {
      at::_fused_adam_(p, g, m, v, vmax, s, tensor_ref(lr), h->beta1, h->beta2, h->weight_decay,
                       h->eps, h->amsgrad, h->maximize, scale, found);
    }
    // a skipped step (inf/NaN grads) does not count (PyTorch's _fused_adam does the same)
    if (found.has_value()) at::_foreach_sub_(s, std::vector<at::Tensor>(s.size(), *found));
    bump_versions({&p, &m, &v, &vmax});
  });
}

tcg_status tcg_grads_set_to_none(tcg_tensors params) {
  return guard([&] {
    std::vector<at::Tensor> views;  // bucket views (tcg::keep_grad): zeroed, never dropped
    for (size_t i = 0; i < params.len; ++i) {
      auto& p = tensor_ref(params.data[i]);
      if (p.grad().defined() && tcg::grad_kept(p)) {
        views.push_back(p.grad());
      } else {
        p.mutable_grad().reset();
      }
    }
    if (!views.empty()) at::_foreach_zero_(views);
  });
}

tcg_status tcg_grads_zero(tcg_tensors params) {
  return guard([&] {
    std::vector<at::Tensor> grads;
    for (size_t i = 0; i < params.len; ++i) {
      const auto& g = tensor_ref(params.data[i]).grad();
      if (g.defined()) grads.push_back(g);
    }
    if (!grads.empty()) at::_foreach_zero_(grads);
  });
}

tcg_status tcg_grads_clip_norm(tcg_tensors grads, double max_norm, double norm_type, tcg_kernels kernels,
                               tcg_tensor* total_out) {
  return guard([&] {
    auto g = tensor_list(grads);
    if (g.empty()) misuse("clip_grad_norm: no gradients (call backward first)");
    auto [total, coef] = clip_factor(g, max_norm, norm_type, kernels);
    at::_foreach_mul_(g, coef);
    *total_out = new at::Tensor(std::move(total));
  });
}

tcg_status tcg_grads_clip_coef(tcg_tensors grads, double max_norm, double norm_type, tcg_kernels kernels,
                               tcg_tensor* total_out, tcg_tensor* coef_out) {
  return guard([&] {
    *total_out = nullptr;
    *coef_out = nullptr;
    auto g = tensor_list(grads);
    if (g.empty()) misuse("clip_grad_norm: no gradients (call backward first)");
    auto [total, coef] = clip_factor(g, max_norm, norm_type, kernels);
    *total_out = new at::Tensor(std::move(total));
    *coef_out = new at::Tensor(std::move(coef));
  });
}

tcg_status tcg_lr_schedule_step(tcg_tensor step, const tcg_schedule* schedule, tcg_tensors lrs, const double* bases,
                                bool* ran_own) {
  return guard([&] {
    *ran_own = false;
    if (schedule == nullptr || (lrs.len > 0 && bases == nullptr)) misuse("lr schedule: null schedule or bases");
    if (schedule->kind != TCG_SCHEDULE_WARMUP_COSINE && schedule->kind != TCG_SCHEDULE_LINEAR_WARMUP &&
        schedule->kind != TCG_SCHEDULE_STEP_DECAY) {
      misuse("lr schedule: unknown kind");
    }
    *ran_own = tcg::optim::lr_schedule(tensor_ref(step), *schedule, tensor_list(lrs), bases);
  });
}

tcg_status tcg_grads_clip_value(tcg_tensors grads, double clip) {
  return guard([&] {
    auto g = tensor_list(grads);
    if (g.empty()) misuse("clip_grad_value: no gradients (call backward first)");
    at::_foreach_clamp_min_(g, -clip);
    at::_foreach_clamp_max_(g, clip);
  });
}

}  // extern "C"
