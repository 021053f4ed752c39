// The launch parameters of the crate's embedding backward: the one layout that the kernel
// (csrc/cuda/embedding_kernels.cu, compiled by nvcc into a fat binary) and its launcher
// (csrc/cuda/embedding_own.cpp, host compiler) share. Plain data, the kernel's only argument.
//
// What it computes: dw [vocab, dim], each row v the sum over the positions p with ids[p] == v of
// dy[p] (float32 accumulation, in a fixed order: deterministic without atomics),
// zero for a row no position names and for padding_idx. The positions come sorted by id (a
// stable sort: `sorted` the ids, `order` their positions), so a row's positions are one run of
// `sorted`, found by the warp's 32-ary search. `warps_per_row` warps (1 or kWarps) share a row:
// each sums every warps_per_row-th of its positions, and the row's first warp adds their sums in
// order (through shared memory); kChunks groups of four columns per lane at a time, each
// position's loads issued together. With `accumulate`, dw already holds a tied head's weight
// gradient: each row's sum, rounded to the dtype, is added to it (as autograd's add of the two
// gradients would, the head's first), and rows no position names are left as they are.
#pragma once
#include <stdint.h>

namespace tcg::embedding {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
// Columns a lane holds at a time: kChunks groups of 4, 1024 columns a warp per pass.
constexpr int kChunks = 8;
constexpr int kPassCols = 32 * 4 * kChunks;

struct Backward {
  const int32_t* sorted;  // [n] ids, ascending
  const int64_t* order;   // [n] their positions (ascending within an id)
  const void* dy;         // [n, dim], the weight's dtype
  void* dw;               // [vocab, dim]
  int64_t n, vocab;
  int64_t padding_idx;  // a row left zero; negative: none
  int32_t dim;          // a multiple of 4
  int32_t warps_per_row;  // 1 or kWarps
  bool accumulate;        // add into dw (a tied head's gradient) instead of writing it
};

// The backward at a small vocabulary, without the sort (tcg_embedding_scan_<T>): a block per
// row of dw and 128 of its columns (the grid's x and y), its kScanWarps warps each scanning a
// contiguous kScanWarps-th of the ids in order for the row's id (kScanIds ids a lane at a time,
// the next ones loaded while the matches of these are summed, up to four matching rows of dy in
// flight, added in position order), then the warps' sums added in warp order: a fixed order,
// deterministic. Every block reads all n ids (from L2), so it is chosen where
// vocab · n · ceil(dim / 128) is at most kScanMaxWork.
constexpr int kScanWarps = 16;
constexpr int kScanThreads = kScanWarps * 32;
constexpr int kScanIds = 4;
constexpr int kScanCols = 128;
constexpr int64_t kScanMaxWork = int64_t{1} << 24;

struct Scan {
  const int64_t* ids;  // [n]: the indices as the forward read them
  const void* dy;      // [n, dim], the weight's dtype
  void* dw;            // [vocab, dim]
  int64_t n, vocab;
  int64_t padding_idx;  // a row left zero; negative: none
  int32_t dim;          // a multiple of 4
  bool accumulate;      // add into dw (a tied head's gradient; every row, zero sums too)
};

}  // namespace tcg::embedding
