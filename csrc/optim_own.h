// The crate's own fused optimizer kernels, as optim.cpp sees them (no CUDA types here).
// Defined in csrc/cuda/optim_own.cpp in CUDA builds, in csrc/no_cuda.cpp otherwise.
#pragma once
#include <ATen/ATen.h>

#include "tcg.h"

#include <optional>
#include <string>
#include <vector>

namespace tcg::optim {

// What an Adam update may do besides PyTorch's: multiply each gradient by a clipping factor as it
// reads it (0-d float32 on the device; the gradients are not written), and store each updated
// float32 parameter to its 16-bit shadow too (one per parameter, undefined where none).
struct AdamExtras {
  std::optional<at::Tensor> clip_coef;
  std::vector<at::Tensor> shadows;
};

// The own kernels' Adam / AdamW over these lists, on the current stream: returns false, having
// done nothing, with the reason in *why, where they do not apply (CPU tensors, a dtype other
// than float32/64/16/bfloat16, non-contiguous tensors, grads unlike their params, ...).
// `steps`: one 0-d float32 per parameter, incremented (unless found_inf) by the kernel itself.
// `arrivals`: an int32 tensor of zeros on the device; `slots[k]` its element for tensor k.
bool adam(bool adamw, const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads,
          const std::vector<at::Tensor>& exp_avgs, const std::vector<at::Tensor>& exp_avg_sqs,
          const std::vector<at::Tensor>& max_exp_avg_sqs, const std::vector<at::Tensor>& steps,
          const at::Tensor& lr, double beta1, double beta2, double weight_decay, double eps,
          bool amsgrad, bool maximize, const std::optional<at::Tensor>& grad_scale,
          const std::optional<at::Tensor>& found_inf, const at::Tensor& arrivals,
          const size_t* slots, const AdamExtras& extras, std::string* why);

// The own kernels' SGD (momentum buffers empty: no momentum), as above.
bool sgd(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads,
         const std::vector<at::Tensor>& bufs, double weight_decay, double momentum,
         const at::Tensor& lr, double dampening, bool nesterov, bool maximize, bool is_first_step,
         const std::optional<at::Tensor>& grad_scale, const std::optional<at::Tensor>& found_inf,
         std::string* why);

// Clipping's factor from the total norm (0-d float32 on a CUDA device), a new 0-d float32, by the
// own kernel, rounded as ATen's clamp_max(reciprocal(total + 1e-6) * max_norm, 1) rounds it;
// undefined, nothing done, where the own kernels do not run there.
at::Tensor clip_coef(const at::Tensor& total, double max_norm);

// Global-norm clipping's per-tensor `norm_type`-norms of `grads` by the own kernels, as one
// float32 tensor [grads.size()]: each equal bit for bit to what ATen's `_foreach_norm(grads, 2)`
// gives for it, in two launches whatever the list (ATen's takes one per 320 chunks, then one
// more). They apply to L2 norms (norm_type 2) of float32 contiguous tensors on one CUDA device;
// elsewhere the result is undefined, nothing done.
at::Tensor grad_norms(const std::vector<at::Tensor>& grads, double norm_type);

// A schedule's step by the own kernel (tcg.h's tcg_lr_schedule_step): false, nothing done, where
// it does not apply.
bool lr_schedule(const at::Tensor& step, const tcg_schedule& schedule, const std::vector<at::Tensor>& lrs,
                 const double* bases);

}  // namespace tcg::optim
