// The launch parameters of the linear layer's own kernel: the one layout that the kernel
// (csrc/cuda/linear_kernels.cu, compiled by nvcc into a fat binary) and its launcher
// (csrc/cuda/lt_matmul.cpp, host compiler) share. Plain data, the kernel's only argument.
//
// What it computes: the sum of a float32 weight gradient computed in slices of the rows
// (lt_matmul.cpp's sliced_wgrad: one batched GEMM into partials [slices, n]),
//   out[i] = ((part[0][i] + part[1][i]) + part[2][i]) + ...   (slice order: deterministic)
// or, accumulating, out[i] + that sum. One thread per 4 values, a grid-stride loop.
#pragma once
#include <stdint.h>

namespace tcg::linear {

constexpr int kSlicesSumThreads = 256;
// The most slices one launch sums.
constexpr int kMaxSlices = 8;

struct SlicesSum {
  const float* part;  // [slices, n]
  float* out;         // [n]
  int64_t n;          // a multiple of 4
  int32_t slices;      // 1 to kMaxSlices
  int32_t accumulate;  // 1: out += the sum; 0: out = the sum
};

}  // namespace tcg::linear
