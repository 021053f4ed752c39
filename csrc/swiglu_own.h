// The crate's SwiGLU kernels, as swiglu.cpp sees them (no CUDA types here). Defined in
// csrc/cuda/swiglu_own.cpp in CUDA builds, in csrc/no_cuda.cpp otherwise.
#pragma once
#include <ATen/ATen.h>

#include <string>

namespace tcg::swiglu {

// Why the kernels cannot take h [.., 2F], or "".
std::string unsupported(const at::Tensor& h);

// silu(h[.., :F]) · h[.., F:], differentiable through one autograd node. Call only where
// unsupported() is "".
at::Tensor fused(const at::Tensor& h);

// The kernels alone, outside autograd (CUDA builds only: cuda/mlp_own.cpp's SwiGLU MLP): the
// forward of h [.., 2F], and the backward given the output's gradient d [.., F] (contiguous, h's
// dtype), [dgate | dup]. Call only where unsupported(h) is "".
at::Tensor forward_kernel(const at::Tensor& h);
at::Tensor backward_kernel(const at::Tensor& h, const at::Tensor& d);

}  // namespace tcg::swiglu
