// The crate's rotary-embedding kernel, as rotary.cpp sees it (no CUDA types here). Defined in
// csrc/cuda/rotary_own.cpp in CUDA builds, in csrc/no_cuda.cpp otherwise.
#pragma once
#include <ATen/ATen.h>

#include <array>
#include <string>
#include <utility>

#include "linear_own.h"

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

// The projection of q | k | v and their rotation: the linear layer's operands `ops` (x [B, T, C],
// the weight [(heads + 2 kv_heads) · D, C], an optional bias, their shadows) and `in`'s tables,
// host offset and layout (its q, k and device offset undefined).
// cos_gemm and sin_gemm: the tables permuted for the GEMM's epilogue (rotary.cpp's
// permuted_table), or undefined.
struct Projection {
  tcg::linear::Operands ops;
  int64_t heads, kv_heads, head_dim;
  at::Tensor cos_gemm, sin_gemm;
};

// Why the crate's path cannot take the projection (the linear layer's conditions, then the
// kernel's), or "".
std::string project_unsupported(const Projection& p, const Inputs& in);

// q, k and v as views of qkv = x · weightᵀ (+ bias) [B, T, heads + 2 kv_heads, D], q and k
// rotated in place (or in the GEMM's epilogue, where rotary_gemm.h's kernel takes the operands
// and the permuted tables are given), through one autograd node whose backward packs the three
// gradients with the rotation transposed in one launch and runs the linear layer's backward on it
// (`fp32_wgrad` as linear_own.h's). Call only where project_unsupported() is "".
std::array<at::Tensor, 3> fused_project_qkv(const Projection& p, bool fp32_wgrad, const Inputs& in);

}  // namespace tcg::rotary
