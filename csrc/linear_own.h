// The crate's linear layer path, as linear.cpp sees it (no CUDA types here). Defined in
// csrc/cuda/linear_own.cpp in CUDA builds, in csrc/no_cuda.cpp otherwise.
#pragma once
#include <ATen/ATen.h>

#include <string>

namespace tcg::linear {

// The operands, already read: `weight` and `bias` are the parameters (autograd inputs); `shadow_w`
// and `shadow_b` their shadows in the compute dtype, or undefined where there is none (the path
// then casts, as autocast would). `grad_to`: where the weight's gradient goes instead (a tied
// embedding's alias of the weight, embedding_own.h), or undefined.
struct Operands {
  at::Tensor x, weight, bias, shadow_w, shadow_b, grad_to;
};

// Why the crate's path cannot take these operands, or "" when it can.
std::string unsupported(const Operands& in);

// y = x · weightᵀ + bias through one autograd node whose backward computes the bias gradient in
// the weight-gradient GEMM; `fp32_wgrad`: that GEMM writes float32 (else the compute dtype, cast).
// Call only where unsupported() is "".
at::Tensor fused(const Operands& in, bool fp32_wgrad);

// Why the crate's split (fused_split) cannot take y = x · weightᵀ split into `parts` pieces, or
// "" when it can (asked after unsupported()).
std::string split_unsupported(const Operands& in, int64_t parts);

// The `parts` pieces of y = x · weightᵀ + bias along its last dimension, as views of y (as
// at::split). y is fused()'s, its bias added in the GEMM's epilogue but not differentiated
// there; a second autograd node's backward packs the pieces' gradients into y's in one kernel
// that also sums the bias gradient (no cat, no separate pass for the bias). Call only where
// unsupported() and split_unsupported() are "".
std::vector<at::Tensor> fused_split(const Operands& in, bool fp32_wgrad, int64_t parts);

}  // namespace tcg::linear
