// The launch parameters of the crate's fused cross-entropy kernels: the one layout that the
// kernels (csrc/cuda/loss_kernels.cu, compiled by nvcc into a fat binary) and their launcher
// (csrc/cuda/loss_own.cpp, compiled by the host compiler) share. Plain data, each kernel's only
// argument, passed by value.
//
// What they compute, one block per row of `cols` logits (fp32 math, the logits read in their own
// dtype):
//   count:    inv_count = 1 / count (count: rows not ignored), one block
//   forward:  with lse = log Σ exp(x), row_loss = lse - x[target] (0 where target == ignore_index;
//             NaN where the target is out of range); with `dlogits` (the forward that also writes
//             the gradient, after count) also dx = (exp(x - lse) - [i == target]) * inv_count
//             (0 on ignored rows), the gradient for a loss gradient of 1, in the logits' dtype
//   finish:   loss = Σ row_loss / count (count: rows not ignored), the sum in a fixed order
//             (deterministic)
//   scale:    dx *= grad where the loss's gradient is not 1 (after the forward that wrote dx;
//             where it is 1, as when backward starts from the loss, nothing is written)
#pragma once
#include <stdint.h>

namespace tcg::loss {

// The widest block (threads per row): kRowThreads, or kMaxThreads where the rows in flight would
// not fit in the L2 cache (loss_own.cpp's grid_for); narrower rows get fewer (a multiple of 32).
// Rows of at most kWarpRowItems loads go a warp each, kWarpRowsPerBlock warps to a block.
constexpr int kRowThreads = 512;
constexpr int kMaxThreads = 1024;
constexpr int kWarpRowItems = 512;
constexpr int kWarpRowsPerBlock = 8;
constexpr int kFinishThreads = 1024;
// The scale: at most kScaleBlocks blocks of kScaleThreads over a grid-stride loop (so that where
// it writes nothing it costs one wave).
constexpr int kScaleThreads = 256;
constexpr int kScaleBlocks = 1024;

struct Forward {
  const void* logits;      // [rows, cols] of the kernel's type
  const int64_t* targets;  // [rows]
  float* row_loss;         // [rows]
  int64_t rows;
  int64_t cols;
  int64_t ignore_index;
  int32_t vec;             // 1: every row starts 16-byte aligned and cols % 4 == 0 (4-value loads)
  int32_t warp_rows;       // 1: a warp per row (else a block per row)
  const float* inv_count;  // 0-d, from count: only with dlogits
  void* dlogits;           // [rows, cols] of the kernel's type, or null (no gradient written)
};

struct Count {
  const int64_t* targets;  // [rows]
  float* inv_count;        // 0-d
  int64_t rows;
  int64_t ignore_index;
};

struct Scale {
  void* dlogits;           // [n] of the kernel's type
  const float* grad;       // 0-d: the gradient of the mean loss
  int64_t n;
};

struct Finish {
  const float* row_loss;   // [rows]
  const int64_t* targets;  // [rows]
  float* loss;             // 0-d: the mean
  int64_t rows;
  int64_t ignore_index;
};


}  // namespace tcg::loss
