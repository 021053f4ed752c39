// The crate's fused normalization kernels, as norm.cpp sees them (no CUDA types here). Defined
// in csrc/cuda/norm_own.cpp in CUDA builds, in csrc/no_cuda.cpp otherwise.
#pragma once
#include <ATen/ATen.h>

#include <string>
#include <utility>

namespace tcg::norm {

struct Options {
  bool rms;          // RMSNorm (no mean, no bias) instead of LayerNorm
  double eps;
  double dropout;    // the branch's dropout probability, applied when train
  bool train;
  at::ScalarType out;  // the dtype of y
};

// Why the fused kernels cannot take these inputs (undefined: none), or "" when they can.
std::string unsupported(const at::Tensor& res, const at::Tensor& branch, const at::Tensor& weight,
                        const at::Tensor& bias, const Options& o);

// The fused forward, differentiable through one autograd node: {x, y}, x undefined without a
// branch. Call only where unsupported() is "".
std::pair<at::Tensor, at::Tensor> fused(const at::Tensor& res, const at::Tensor& branch,
                                        const at::Tensor& weight, const at::Tensor& bias,
                                        const Options& o);

}  // namespace tcg::norm
