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

}  // namespace tcg::loss
