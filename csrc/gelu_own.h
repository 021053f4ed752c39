// The crate's bias + GELU kernels, as gelu.cpp sees them (no CUDA types here). Defined in
// csrc/cuda/gelu_own.cpp in CUDA builds, in csrc/no_cuda.cpp otherwise.
#pragma once
#include <ATen/ATen.h>

#include <string>

namespace tcg::gelu {

// Why the kernels cannot take x [.., F] and bias [F] (undefined: none), or "".
std::string unsupported(const at::Tensor& x, const at::Tensor& bias);

// gelu(x + bias) in x's dtype (tanh: the approximation), differentiable in x and bias through
// one autograd node. Call only where unsupported() is "".
at::Tensor fused(const at::Tensor& x, const at::Tensor& bias, bool tanh);

}  // namespace tcg::gelu
