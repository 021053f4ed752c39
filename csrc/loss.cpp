// The cross-entropy loss (CPU and CUDA builds): the C API over the crate's fused kernels
// (cuda/loss_own.cpp) and ATen's cross_entropy_loss for every input they do not take.
#include "kernels.h"
#include "loss_own.h"
#include "shim.h"

#include <memory>

using tcg::guard;
using tcg::misuse;
using tcg::tensor_ref;

extern "C" {

tcg_status tcg_loss_cross_entropy(tcg_tensor logits_h, tcg_tensor targets_h, int64_t ignore_index, tcg_kernels kernels,
                             tcg_tensor* out, bool* ran_own) {
  return guard([&] {
    *out = nullptr;
    *ran_own = false;
    const at::Tensor& logits = tensor_ref(logits_h);
    const at::Tensor& targets = tensor_ref(targets_h);
    if (logits.dim() != 2 || targets.dim() != 1 || targets.size(0) != logits.size(0)) {
      misuse("cross_entropy: logits must be [rows, classes] and targets [rows]");
    }
    if (targets.scalar_type() != at::kLong) misuse("cross_entropy: targets must be int64 class indices");
    const bool own = tcg::kernels::own(kernels, "cross_entropy", [&] { return tcg::loss::unsupported(logits, targets); });
    at::Tensor loss = own ? tcg::loss::cross_entropy(logits, targets, ignore_index)
                          : at::cross_entropy_loss(logits, targets, std::nullopt, at::Reduction::Mean, ignore_index, 0.0);
    *out = std::make_unique<at::Tensor>(std::move(loss)).release();
    *ran_own = own;
  });
}

}  // extern "C"
