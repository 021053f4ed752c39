// The launch parameters of the crate's bias + GELU kernels: the one layout that the kernels
// (csrc/cuda/gelu_kernels.cu, compiled by nvcc into a fat binary) and their launcher
// (csrc/cuda/gelu_own.cpp, host compiler) share. Plain data, each kernel's only argument.
//
// What they compute, x [rows, F] the output of a linear layer run without its bias, b [F] that
// bias in float32 (fp32 math, read and written in x's dtype):
//   forward:  z = x + b,  y = z · Φ(z)                (exact: Φ through the normal distribution's
//                                                      tail, gelu_kernels.cu's tail_of)
//                         y = z/2 · (1 + tanh(√(2/π) · (z + 0.044715 z³)))   (tanh: ATen's
//                                                      formula, ActivationGeluKernel.cu)
//   backward: dx = dy · gelu'(z)  (dx is also the gradient of the bias's input: dz)
//             db = sum over rows of dx, before dx's rounding (per block of rows, then summed by
//             col_sum.cuh's finishing kernel: a fixed order)
// Both passes: one thread per 4 columns, kThreads threads a block across the columns (the grid's
// x), blocks of the grid's y dimension striding over the rows, a few rows' loads in flight
// together (kFwdRows, kBwdRows); the forward about kBlocksPerSm blocks an SM in all, the
// backward as many as the SMs hold at once (its partials, a row a block in y, as few as can be);
// at least kMinRows rows a block. The kernels are bound by their math (a reciprocal, an
// exponential and a polynomial a value) as much as by memory: few registers, many threads
// (H200, measured against the variants of 2 to 8 rows and 8 columns a thread, 128 and 256
// threads).
#pragma once
#include <stdint.h>

namespace tcg::gelu {

constexpr int kThreads = 128;
constexpr int kFwdRows = 4;
constexpr int kBwdRows = 2;
constexpr int kBlocksPerSm = 32;
// The fewest rows a block is given (each block's bias-gradient partial is a row to write and sum).
constexpr int kMinRows = 4;

struct Forward {
  const void* x;       // [rows, F]
  const float* bias;   // [F] or null
  void* y;             // [rows, F]
  int64_t rows;
  int64_t f;           // F, a multiple of 4
};

struct Backward {
  const void* x;       // [rows, F]: the forward's input
  const float* bias;   // [F] or null
  const void* dy;      // [rows, F]
  void* dx;            // [rows, F]
  float* part;         // [gridDim.y, F] per-block sums of dx, or null (no bias gradient)
  int64_t rows;
  int64_t f;
};

// The bias gradient: sum[c] = sum over b < blocks of part[b * F + c].
struct Finish {
  const float* part[1];
  float* sum[1];
  int32_t blocks;
  int32_t cols;
};

}  // namespace tcg::gelu
