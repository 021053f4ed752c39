// The cross-entropy loss (CPU and CUDA builds): the C API over the crate's fused kernels
// (cuda/loss_own.cpp) and ATen's cross_entropy_loss for every input they do not take.
#include "kernels.h"
#include "loss_own.h"
#include "shadow.h"
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

tcg_status tcg_loss_linear_cross_entropy(tcg_tensor h_h, tcg_tensor weight_h, tcg_tensor targets_h,
                                         const tcg_linear_ce_options* options, tcg_kernels kernels, tcg_tensor* out,
                                         bool* ran_own) {
  return guard([&] {
    *out = nullptr;
    *ran_own = false;
    if (options == nullptr) misuse("linear_cross_entropy: null options");
    if (options->wgrad != TCG_WEIGHT_GRAD_ROUNDED && options->wgrad != TCG_WEIGHT_GRAD_FP32) {
      misuse("linear_cross_entropy: unknown weight-gradient mode");
    }
    if (options->chunk_rows < 0) misuse("linear_cross_entropy: chunk_rows must be at least 0 (0: chosen by the path)");
    if (options->method != TCG_LINEAR_CE_CHUNKED && options->method != TCG_LINEAR_CE_EXP_IN_HEAD) {
      misuse("linear_cross_entropy: unknown method");
    }
    const at::Tensor& h = tensor_ref(h_h);
    const at::Tensor& weight = tensor_ref(weight_h);
    const at::Tensor& targets = tensor_ref(targets_h);
    if (weight.dim() != 2) misuse("linear_cross_entropy: the weight must be a matrix [classes, in]");
    if (h.dim() < 1 || h.size(-1) != weight.size(1)) {
      misuse("linear_cross_entropy: the hidden states' last dimension (" + std::to_string(h.dim() < 1 ? 0 : h.size(-1)) +
             ") differs from the weight's in (" + std::to_string(weight.size(1)) + ")");
    }
    if (targets.scalar_type() != at::kLong) misuse("linear_cross_entropy: targets must be int64 class indices");
    if (h.size(-1) == 0 || targets.numel() != h.numel() / h.size(-1)) {
      misuse("linear_cross_entropy: " + std::to_string(targets.numel()) + " targets for " +
             std::to_string(h.size(-1) == 0 ? 0 : h.numel() / h.size(-1)) + " rows of hidden states");
    }
    const tcg::loss::LinearOperands ops{h, weight, tcg::shadow::lookup(weight), targets};
    const bool exp_in_head = options->method == TCG_LINEAR_CE_EXP_IN_HEAD;
    // with TCG_KERNELS_OWN the method asked for, or TCG_UNSUPPORTED; else the chunks where it does
    // not apply
    const bool own = tcg::kernels::own(kernels, "linear_cross_entropy", [&] {
      std::string why = tcg::loss::linear_unsupported(ops);
      if (why.empty() && exp_in_head && kernels == TCG_KERNELS_OWN) why = tcg::loss::exp_in_head_unsupported(ops);
      return why;
    });
    at::Tensor loss;
    if (own) {
      loss = tcg::loss::linear_cross_entropy(ops, options->ignore_index, options->chunk_rows,
                                             options->wgrad == TCG_WEIGHT_GRAD_FP32,
                                             exp_in_head);
    } else {
      const at::Tensor logits = at::linear(h, tcg::shadow::read(weight));
      loss = at::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}), targets.reshape({-1}), std::nullopt,
                                    at::Reduction::Mean, options->ignore_index, 0.0);
    }
    *out = std::make_unique<at::Tensor>(std::move(loss)).release();
    *ran_own = own;
  });
}

}  // extern "C"
