// The crate's embedding backward, as embedding.cpp sees it (no CUDA types here). Defined in
// csrc/cuda/embedding_own.cpp in CUDA builds, in csrc/no_cuda.cpp otherwise.
#pragma once
#include <ATen/ATen.h>

#include <string>

namespace tcg::embedding {

// Why the kernel cannot take this weight [vocab, dim] and these indices, or "".
std::string unsupported(const at::Tensor& weight, const at::Tensor& indices);

// weight[indices] (ATen's gather) through one autograd node whose backward is the crate's
// deterministic kernel; row `padding_idx` (negative: none) gets no gradient. With `tie` (in grad
// mode, for a weight that requires grad) the node's second output, an alias of the weight, comes
// back too, else an undefined tensor: the gradient a tied head sends it (linear_own.h's grad_to)
// is the weight's, to which the backward adds the embedding's rows in place. Call only where
// unsupported() is "".
std::pair<at::Tensor, at::Tensor> fused(const at::Tensor& weight, const at::Tensor& indices, int64_t padding_idx,
                                        bool tie);

}  // namespace tcg::embedding
