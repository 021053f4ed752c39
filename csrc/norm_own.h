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

// The tensors of one call (undefined: none): x = res + dropout(branch + branch_bias), y = norm(x)
// with weight and bias; without res (a branch is then given), x = dropout(branch + branch_bias).
struct Inputs {
  at::Tensor res, branch, branch_bias, weight, bias;
};

// Why the fused kernels cannot take these inputs, or "" when they can.
std::string unsupported(const Inputs& in, const Options& o);

// The fused forward, differentiable through one autograd node: {x, y}, x undefined without a
// branch (x is then res). Call only where unsupported() is "".
std::pair<at::Tensor, at::Tensor> fused(const Inputs& in, const Options& o);

}  // namespace tcg::norm
