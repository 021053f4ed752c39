// The launch parameters of the crate's fused normalization kernels: the one layout that the
// kernels (csrc/cuda/norm_kernels.cu, compiled by nvcc into a fat binary) and their launcher
// (csrc/cuda/norm_own.cpp, compiled by the host compiler) share. Plain data, each kernel's only
// argument, passed by value.
//
// What they compute, per row of `cols` values (fp32 math):
//   forward:  x = res + dropout(branch + bb)      (res_out; skipped without a branch; bb: the
//                                                  branch's bias, 0 without one, a row of its
//                                                  own per position where it has one per
//                                                  position; without res,
//                                                  x = dropout(branch + bb): the stream's start)
//             y = (x - mean) * rstd * gamma + beta (LayerNorm; RMSNorm: mean 0, no beta)
//   backward: dx = dres + rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * gamma
//             dbranch = dropout mask * scale * dx;  dgamma = sum over rows of dy * xhat,
//             dbeta = sum of dy, dbb = sum of dbranch before its rounding (per block, then
//             summed by the finishing kernel; a bias of several rows: the launcher's sum over
//             the batch of dbranch, float32 there)
// Forward: one warp per row (kWarps rows a block); backward: one block of 32 * VEC threads.
// The dropout mask of element e is Philox4x32-10 of counter (offset / 4, e / 4) and key seed,
// lane e % 4, below `keep`: the backward draws it again rather than storing it.
#pragma once
#include <stdint.h>

#include <ATen/cuda/PhiloxCudaState.h>

namespace tcg::norm {

// Rows per block (one warp per row) and the widest row: every lane holds up to kMaxVec groups of
// 4 values (kernels for 3, 4, 6 and 8 groups: own_kernel_list.h), so cols must be a multiple of 4 and at most 32 * 4 * kMaxVec.
constexpr int kWarps = 4;
constexpr int kMaxVec = 8;
constexpr int kMaxCols = 32 * 4 * kMaxVec;

// The backward's blocks (32 * vec threads, one row at a time) resident per SM that its grid
// asks for: about 32 warps an SM, enough rows in flight for DRAM, and no more blocks (each
// writes a row of weight and bias gradient partials).
constexpr int bwd_blocks_per_sm(int vec) { return 32 / vec; }
// The fewest rows a backward block is given (its partials cost a row of writes each, and a row of
// the finishing kernel's reads).
constexpr int kBwdMinRows = 4;

// The per-block gradient sums of the backward: weight, bias, branch bias.
constexpr int kFinishSums = 3;

struct Forward {
  const float* res;     // [rows, cols] fp32, or null where a branch starts the stream
  const void* branch;   // [rows, cols] of the kernel's branch type, or null
  const float* branch_bias;  // [bias_rows, cols] or null (zeros)
  const float* gamma;   // [cols] or null (ones)
  const float* beta;    // [cols] or null (zeros; RMSNorm has none)
  float* res_out;       // [rows, cols] fp32, written when there is a branch
  void* y;              // [rows, cols] of the kernel's output type
  float* mean;          // [rows] (LayerNorm; RMSNorm writes 0)
  float* rstd;          // [rows]
  int64_t rows;
  int64_t bias_rows;    // the branch bias's rows: row r adds row r % bias_rows (1: one for all;
                        // a position table's T where the rows are [batch, T])
  int32_t cols;
  int32_t rms;          // 1: RMSNorm
  float eps;
  float keep;           // 1 - dropout probability
  float scale;          // 1 / keep
  int32_t dropout;      // 1: draw the mask (training, p > 0, a branch)
  at::PhiloxCudaState philox;
};

struct Backward {
  const void* dy;       // [rows, cols] of the output type, or null (zero)
  const float* dres;    // [rows, cols] fp32 gradient of res_out (or of nothing: null)
  const float* x;       // [rows, cols] fp32: what was normalized (res_out, or res)
  const float* mean;
  const float* rstd;
  const float* gamma;   // or null
  float* dx;            // [rows, cols] fp32: the gradient of res, or null (no res)
  void* dbranch;        // [rows, cols] of the branch type, or null
  float* part[kFinishSums];  // [gridDim.x, cols] per-block sums of the weight, bias and branch-bias
                            // gradients (Finish's order), each null where there is none
  int64_t rows;
  int32_t cols;
  int32_t rms;
  float keep;
  float scale;
  int32_t dropout;
  at::PhiloxCudaState philox;
};

// Sums the per-block partials: sum[k][c] = sum over b < blocks of part[k][b * cols + c], for the
// weight (k = 0), bias (1) and branch bias (2) gradients; a null part[k] is skipped.
struct Finish {
  const float* part[kFinishSums];
  float* sum[kFinishSums];
  int32_t blocks;
  int32_t cols;
};
// The finishing kernel is col_sum.cuh's sum_columns: ceil(cols / kColSumCols) blocks of kColSumThreads.

}  // namespace tcg::norm
