// The crate's rotary-embedding kernel, as rotary.cpp sees it (no CUDA types here). Defined in
// csrc/cuda/rotary_own.cpp in CUDA builds, in csrc/no_cuda.cpp otherwise.
#pragma once
#include <ATen/ATen.h>

#include <array>
#include <string>
#include <utility>

namespace tcg::rotary {

// What rotary.cpp has checked: q [B, T, H, D], k [B, T, KV, D] of one dtype (last dimension
// contiguous), cos and sin [positions, D/2] float32, offset_dev undefined or a 0-d int64 on q's
// device.
struct Inputs {
  at::Tensor q, k, cos, sin, offset_dev;
  int64_t offset;
  bool half_split;
};

// Why the kernel cannot take these inputs, or "".
std::string unsupported(const Inputs& in);

// q and k rotated (contiguous), differentiable through one autograd node. Call only where
// unsupported() is "".
std::pair<at::Tensor, at::Tensor> fused(const Inputs& in);

// q and k of the packed qkv [B, T, heads + 2 kv_heads, D] rotated and its v copied (contiguous,
// new), differentiable in qkv through one autograd node whose backward writes qkv's gradient
// directly. `in` holds q and k as views of qkv, as unsupported() checked them.
std::array<at::Tensor, 3> fused_qkv(const at::Tensor& qkv, int64_t heads, int64_t kv_heads, const Inputs& in);

}  // namespace tcg::rotary
