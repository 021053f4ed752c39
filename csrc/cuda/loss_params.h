// The launch parameters of the crate's fused cross-entropy kernels: the one layout that the
// kernels (csrc/cuda/loss_kernels.cu, compiled by nvcc into a fat binary) and their launcher
// (csrc/cuda/loss_own.cpp, compiled by the host compiler) share. Plain data, each kernel's only
// argument, passed by value.
//
// What they compute, one block per row of `cols` logits (fp32 math, the logits read in their own
// dtype):
//   forward:  lse = log Σ exp(x), row_loss = lse - x[target] (0 where target == ignore_index;
//             NaN where the target is out of range)
//   finish:   loss = Σ row_loss / count, inv_count = 1 / count (count: rows not ignored), the
//             sum in a fixed order (deterministic)
//   backward: dx = (exp(x - lse) - [i == target]) * grad * inv_count (0 on ignored rows), stored
//             in the logits' dtype
#pragma once
#include <stdint.h>

namespace tcg::loss {

// The widest block (threads per row); narrower rows get fewer (a multiple of 32). Rows of at most
// kWarpRowItems loads go a warp each, kWarpRowsPerBlock warps to a block.
constexpr int kMaxThreads = 512;
constexpr int kWarpRowItems = 512;
constexpr int kWarpRowsPerBlock = 8;
constexpr int kFinishThreads = 1024;

struct Forward {
  const void* logits;      // [rows, cols] of the kernel's type
  const int64_t* targets;  // [rows]
  float* lse;              // [rows]
  float* row_loss;         // [rows]
  int64_t rows;
  int64_t cols;
  int64_t ignore_index;
  int32_t vec;             // 1: every row starts 16-byte aligned and cols % 4 == 0 (4-value loads)
  int32_t warp_rows;       // 1: a warp per row (else a block per row)
};

struct Finish {
  const float* row_loss;   // [rows]
  const int64_t* targets;  // [rows]
  float* loss;             // 0-d: the mean
  float* inv_count;        // 0-d: 1 / the rows counted
  int64_t rows;
  int64_t ignore_index;
};

struct Backward {
  const void* logits;      // [rows, cols]
  const int64_t* targets;
  const float* lse;
  const float* grad;       // 0-d: the gradient of the mean loss
  const float* inv_count;  // 0-d
  void* dlogits;           // [rows, cols] of the kernel's type
  int64_t rows;
  int64_t cols;
  int64_t ignore_index;
  int32_t vec;
  int32_t warp_rows;
};

}  // namespace tcg::loss
