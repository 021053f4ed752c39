// The launch tables of the crate's own optimizer kernels and of global-norm clipping's norms: the
// one layout that the kernels (csrc/cuda/optim_kernels.cu, compiled by nvcc into a fat binary)
// and their launcher (csrc/cuda/optim_own.cpp, compiled by the host compiler) share. Plain data,
// passed to the kernel by value as its only argument (CUDA 12.1+ allows kernel arguments up to
// 32 KiB).
//
// The work: every tensor of the table is cut into chunks of `chunk` elements (the last one
// shorter), one thread block per chunk, so a launch has as many blocks as chunks whatever the
// tensor count and sizes. Block b works on tensor i where chunk_end[i - 1] <= b < chunk_end[i].
#pragma once
#include <stdint.h>

namespace tcg::optim {

// Tensors per launch; longer lists take several launches. Adam's table is then about 9 KiB.
constexpr int kMaxTensors = 128;
// Threads per block; each handles 4 elements per iteration (one 16-byte load for float32).
constexpr int kBlockThreads = 256;
constexpr int kIlp = 4;

// Tensor lists by position: Adam uses all five, SGD the first three (no momentum: two).
enum : int { kParam = 0, kGrad = 1, kExpAvg = 2, kExpAvgSq = 3, kMaxExpAvgSq = 4 };
constexpr int kMomentumBuffer = 2;

template <int depth>
struct Table {
  void* ptr[depth][kMaxTensors];
  int64_t numel[kMaxTensors];
  // Cumulative chunk counts: tensor i owns blocks [chunk_end[i - 1], chunk_end[i]).
  int32_t chunk_end[kMaxTensors];
  int32_t n_tensors;
  // Elements per chunk, a multiple of kBlockThreads * kIlp.
  int64_t chunk;
  // Adam: each tensor's step count (0-d float32), and a self-resetting arrival counter per
  // tensor (zero between launches): the last block of a tensor to finish writes its step.
  float* step[kMaxTensors];
  unsigned int* arrivals[kMaxTensors];
  // Device scalars: the learning rate (float32, always set), and for mixed precision the grad
  // scale and the found-inf flag (float32, or null).
  const float* lr;
  const float* grad_scale;
  const float* found_inf;
  // Adam, float32 parameters: the clipping factor the gradients are multiplied by as they are
  // read (null: none; the gradients are not written), and each tensor's 16-bit shadow
  // (shadow.cpp; null: none) that the updated parameter is also stored to, rounded as a cast.
  const float* clip_coef;
  void* shadow[kMaxTensors];
  int32_t shadow_is_half;  // the shadows' dtype: float16 (1) or bfloat16 (0)
  // Hyper-parameters, as PyTorch passes them (double; the kernels convert as PyTorch does).
  double beta1, beta2, weight_decay, eps;  // Adam
  double momentum, dampening;              // SGD
  int32_t maximize, nesterov, is_first_step;
};

// Global-norm clipping's per-tensor L2 norms of float32 tensors, computed as ATen's `_foreach_norm`
// computes them (its CUDA fast path: every tensor cut into chunks of kNormChunk elements, one
// block of kNormThreads threads each, kIlp elements per thread and step) so that each norm equals
// it bit for bit, in one launch over every chunk (tcg_grad_norm_chunks: each chunk's sum of
// squares) and one over the tensors (tcg_grad_norm_finish: each tensor's chunks summed as
// `lpnorm_cleanup` sums them, then the square root).
constexpr int64_t kNormChunk = 65536;
constexpr int kNormThreads = 512;

struct NormTable {
  const float* ptr[kMaxTensors];
  int64_t numel[kMaxTensors];
  // Cumulative chunk counts, as in Table (an empty tensor owns no chunk).
  int32_t chunk_end[kMaxTensors];
  int32_t n_tensors;
  float* partial;  // one sum per chunk, by block of the chunks' launch
  float* norms;    // one norm per tensor of this table
};

}  // namespace tcg::optim
