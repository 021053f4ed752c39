// The launch parameters of the linear layer's own kernels: the one layout that the kernels
// (csrc/cuda/linear_kernels.cu, compiled by nvcc into a fat binary) and their launchers
// (csrc/cuda/lt_matmul.cpp, linear_own.cpp; host compiler) share. Plain data, each kernel's only
// argument.
//
// tcg_wgrad_slices_sum: the sum of a float32 weight gradient computed in slices of the rows
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

// tcg_split_bwd_<T>: the backward of a linear layer's output y [rows, parts · w] split into
// `parts` pieces of width w (the views of Linear::f_forward_split): the pieces' gradients
// [rows, w] each are packed into y's gradient, and the bias gradient (the column sums of y's
// gradient) is summed on the way:
//   packed[r, p · w + c] = grad[p][r, c]           (a null grad[p]: zeros)
//   part[b, j] = sum over the rows block b visits of packed[r, j]   (float32)
// then tcg_split_finish sums part over b in a fixed order (col_sum.cuh). Each thread moves 8
// values (16 bytes) of a row at a time; a block is `lanes` threads across the packed row's
// columns (the grid's x tiles it) by blockDim.x / lanes rows, the grid's y striding over the
// rows, one wave of blocks; the block's rows of sums are added in shared memory, in order,
// before its partial is written. w is a multiple of 8, so a thread's 8 values lie in one piece.
constexpr int kSplitMaxParts = 4;
constexpr int kSplitValues = 8;         // values a thread moves at a time
constexpr int kSplitMaxThreads = 512;   // a block's threads at most
constexpr int kSplitMaxLanes = 256;     // threads across the columns at most
constexpr int kSplitRows = 2;           // rows a thread has in flight
constexpr int kSplitMinRows = 8;        // the fewest rows a block row of threads is given

struct SplitBackward {
  const void* grad[kSplitMaxParts];  // [rows, w] each, contiguous; null: a zero gradient
  void* packed;                      // [rows, parts · w]
  float* part;                       // [gridDim.y, parts · w] or null (no bias gradient)
  int64_t rows;
  int32_t w;                         // a multiple of kSplitValues
  int32_t parts;                     // 1 to kSplitMaxParts
  int32_t lanes;                     // threads across the columns (divides blockDim.x)
};

// The bias gradient: sum[c] = sum over b < blocks of part[b * cols + c].
struct SplitFinish {
  const float* part[1];
  float* sum[1];
  int32_t blocks;
  int32_t cols;
};

}  // namespace tcg::linear
