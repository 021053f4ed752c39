// The crate's fused cross-entropy, as loss.cpp sees it (no CUDA types here). Defined in
// csrc/cuda/loss_own.cpp in CUDA builds, in csrc/no_cuda.cpp otherwise.
#pragma once
#include <ATen/ATen.h>

#include <string>

namespace tcg::loss {

// Why the fused kernels cannot take these logits [rows, classes] and targets [rows], or "".
std::string unsupported(const at::Tensor& logits, const at::Tensor& targets);

// The mean cross-entropy (float32, 0-d) through one autograd node. Call only where
// unsupported() is "".
at::Tensor cross_entropy(const at::Tensor& logits, const at::Tensor& targets, int64_t ignore_index);

// The linear layer + cross-entropy's operands: the hidden states h [.., C], the weight [V, C] (an
// autograd input) and its shadow in the compute dtype (or undefined), int64 targets (one per row
// of h).
struct LinearOperands {
  at::Tensor h, weight, shadow_w, targets;
};

// Why the chunked path cannot take these operands, or "".
std::string linear_unsupported(const LinearOperands& in);

// Why the exponentials-in-the-head path cannot take these operands (beyond linear_unsupported), or "".
std::string exp_in_head_unsupported(const LinearOperands& in);

// The mean cross-entropy of h · weightᵀ against the targets (float32, 0-d) through one autograd
// node, `chunk_rows` rows of logits at a time (0: as many as 256 MiB of logits hold): each chunk's
// GEMM, the fused kernel writing the chunk's gradient over its logits, and in grad mode its share
// of h's and the weight's gradients (`fp32_wgrad`: the weight's in float32), so the logits are
// never all in memory. `exp_in_head`: where exp_in_head_unsupported() is "", the head's GEMM takes
// the exponentials in its epilogue and the backward GEMMs form the gradient as they read them
// (cuda/ce_head_gemm.h), all [rows, classes] of them held through the call, in place of the
// chunks. Call only where linear_unsupported() is "".
at::Tensor linear_cross_entropy(const LinearOperands& in, int64_t ignore_index, int64_t chunk_rows, bool fp32_wgrad,
                                bool exp_in_head);

}  // namespace tcg::loss
