// The crate's linear layer path, as linear.cpp sees it (no CUDA types here). Defined in
// csrc/cuda/linear_own.cpp in CUDA builds, in csrc/no_cuda.cpp otherwise.
#pragma once
#include <ATen/ATen.h>

#include <string>

namespace tcg::linear {

// The operands, already read: `weight` and `bias` are the parameters (autograd inputs); `shadow_w`
// and `shadow_b` their shadows in the compute dtype, or undefined where there is none (the path
// then casts, as autocast would).
struct Operands {
  at::Tensor x, weight, bias, shadow_w, shadow_b;
};

// Why the crate's path cannot take these operands, or "" when it can.
std::string unsupported(const Operands& in);

// y = x · weightᵀ + bias through one autograd node whose backward computes the bias gradient in
// the weight-gradient GEMM; `fp32_wgrad`: that GEMM writes float32 (else the compute dtype, cast).
// Call only where unsupported() is "".
at::Tensor fused(const Operands& in, bool fp32_wgrad);

}  // namespace tcg::linear
