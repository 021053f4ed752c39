// The launch parameters of the crate's rotary-embedding kernel: the one layout that the kernel
// (csrc/cuda/rotary_kernels.cu, compiled by nvcc into a fat binary) and its launcher
// (csrc/cuda/rotary_own.cpp, host compiler) share. Plain data, the kernel's only argument.
//
// What it computes, for q [B, T, H, D] and k [B, T, KV, D] of one dtype in one launch (fp32 math,
// read and written in their dtype), position p = offset (+ *offset_dev) + t, angle
// a_i = p · inv_freq_i (cos and sin from the tables [positions, D/2]), for each pair (x0, x1):
//   out0 = x0·cos − x1·sin,  out1 = x0·sin + x1·cos    (sin negated in the backward: the
//                                                        transposed rotation)
// each product and sum rounded once, as ATen's element-wise composition rounds them. The pairs
// are (2i, 2i+1) when interleaved (Meta's Llama) and (i, i + D/2) when half-split (GPT-NeoX,
// Hugging Face's Llama). A position outside the table gives NaN.
#pragma once
#include <stdint.h>

namespace tcg::rotary {

constexpr int kThreads = 256;

// One of the tensors: the input and the output, each with its last dimension contiguous and the
// others strided (the output: contiguous [B, T, heads, D], or a slice of the packed [B, T,
// H + 2KV, D] gradient of a fused q | k | v projection).
struct Part {
  const void* x;
  void* out;
  int64_t stride_b, stride_t, stride_h;  // x's, elements
  int64_t out_b, out_t, out_h;           // out's, elements
  int32_t heads;                         // 0: no such part
};

// q and k are rotated; v (heads 0 where there is none) is copied as it is, in the same launch:
// the values of a fused q | k | v projection, in and out of the packed layout.
struct Params {
  Part q, k, v;
  const float* cos;  // [positions, D/2]
  const float* sin;
  const int64_t* offset_dev;  // null, or a device value added to offset
  int64_t offset;
  int64_t positions;  // rows of the tables
  int32_t batch, seq, dim;
  int32_t half_split;  // 1: pairs (i, i + D/2); 0: (2i, 2i+1)
  int32_t negate_sin;  // 1: the backward
};

}  // namespace tcg::rotary
