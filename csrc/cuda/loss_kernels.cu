// The crate's fused cross-entropy kernels: log-softmax, the negative log-likelihood and the mean
// in one pass over the logits, reading and writing the logits in their own dtype (bf16, fp16 or
// fp32) with fp32 math. Where the loss will be differentiated, the forward also writes the
// gradient (for a loss gradient of 1) from the row it has just read, which the L2 cache still
// holds: one read of the logits from memory in all, and the backward only scales the gradient,
// where the loss's gradient is not 1. The kernel is bound by its instructions as much as by
// memory, so the exponentials are the hardware's (fast_math.cuh's exp2_ftz: ex2.approx.ftz, of
// one fused multiply-add a value, x·log2 e plus a bias per row; a few ulp, far below a bf16
// rounding of the gradient, and the sums they feed are of terms at most 1), and the target's 1
// is subtracted once per row, not compared for at every value (with `__expf`'s subnormal
// handling and that compare: 463 M instructions at [12288, 32000] bf16 and 598 µs on an H200;
// then 320 M and 467 µs; with the fused multiply-adds 269 M and 447 µs). ATen's path under
// autocast casts the logits to fp32, runs log_softmax and nll_loss, and in the backward writes
// the fp32 gradient, its log_softmax gradient and the cast back: five passes over the largest
// tensor of a language model. One block per row (see loss_params.h for what each computes); the
// row's max and sum of exponentials are kept online per thread and combined across the block
// (a warp per row for narrow rows, a character vocabulary's).
//
// Compiled by nvcc into a fat binary that build.rs embeds in the shim; the launcher
// (loss_own.cpp) launches the extern "C" kernels by name.
#include <math_constants.h>

#include "dependent_launch.cuh"
#include "loss_params.h"
#include "own_kernel_list.h"
#include "fast_math.cuh"
#include "vec_io.cuh"

namespace tcg::loss {
namespace {

using tcg::cuda::exp2_ftz;
using tcg::cuda::exp_ftz;
using tcg::cuda::load1;
using tcg::cuda::load4;
using tcg::cuda::load4_last;
using tcg::cuda::store1;
using tcg::cuda::store4;
using tcg::cuda::store4_streaming;

constexpr float kLog2e = 1.4426950408889634f;

// Running (max, Σ exp(x - max)) of one thread, and -max · log2 e (0 while the max is -inf), the
// bias of add4's exponentials.
struct MaxSum {
  float m = -CUDART_INF_F;
  float s = 0.0f;
  float neg_ml = 0.0f;
  // A new max mx > m: the sum rescaled.
  __device__ __forceinline__ void raise(float mx) {
    s *= exp_ftz(m - mx);
    m = mx;
    neg_ml = -mx * kLog2e;
  }
  __device__ __forceinline__ void add(float x) {
    if (x > m) {
      raise(x);
      s += 1.0f;
    } else if (m != -CUDART_INF_F) {  // (x and m both -inf: nothing to add)
      s += exp_ftz(x - m);
    }
  }
  __device__ __forceinline__ void merge(float m2, float s2) {
    const float mm = fmaxf(m, m2);
    if (mm == -CUDART_INF_F) return;  // both empty (or all -inf)
    s = s * exp_ftz(m - mm) + s2 * exp_ftz(m2 - mm);
    m = mm;
    neg_ml = -mm * kLog2e;
  }
};

// The warp's (max, sum) combined, in every lane.
__device__ __forceinline__ MaxSum warp_max_sum(MaxSum v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v.merge(__shfl_xor_sync(0xffffffffu, v.m, o), __shfl_xor_sync(0xffffffffu, v.s, o));
  return v;
}

// The block's (max, sum) combined, in every thread. blockDim.x: a multiple of 32 up to 1024.
__device__ MaxSum block_max_sum(MaxSum v) {
  __shared__ float ms[32], ss[32];
  v = warp_max_sum(v);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  if (lane == 0) {
    ms[warp] = v.m;
    ss[warp] = v.s;
  }
  __syncthreads();
  MaxSum r;
  if (lane < warps) {
    r.m = ms[lane];
    r.s = ss[lane];
  }
  return warp_max_sum(r);
}

// Which row this thread works on, its index among the row's threads and their count: a block per
// row, or a warp per row (narrow rows: `warp_rows`).
struct RowThread {
  int64_t row;
  int tid;
  int n;
  __device__ RowThread(int32_t warp_rows) {
    if (warp_rows) {
      row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
      tid = threadIdx.x % 32;
      n = 32;
    } else {
      row = blockIdx.x;
      tid = threadIdx.x;
      n = blockDim.x;
    }
  }
};

// Folds four more values into a running (max, sum): one rescale for the four, then each value's
// e^(x - max) as 2^(x · log2 e - max · log2 e), one fused multiply-add and the hardware's
// exponential (the max's product rounded once per row: its exponentials all off by the same
// factor, within 7e-7 of 1 for a max below 64 (every sum and the loss within that), no branch for
// a max still -inf: then every x is -inf too, and 2^-inf is 0).
__device__ __forceinline__ void add4(MaxSum& v, float4 q) {
  const float mx = fmaxf(fmaxf(q.x, q.y), fmaxf(q.z, q.w));
  if (mx > v.m) v.raise(mx);
  v.s += (exp2_ftz(fmaf(q.x, kLog2e, v.neg_ml)) + exp2_ftz(fmaf(q.y, kLog2e, v.neg_ml))) +
         (exp2_ftz(fmaf(q.z, kLog2e, v.neg_ml)) + exp2_ftz(fmaf(q.w, kLog2e, v.neg_ml)));
}

// One row's gradient, dx = (exp(x - lse) - [i == t]) * scale, this thread's share of it: the
// row read for the last time (the forward has just read it, the L2 cache holds it) and the
// gradient streamed out past the cache. The target's value is written again afterwards, with its
// 1 subtracted, by the thread that wrote it (program order: its last write wins), from the
// logit every thread read before the row's reduction: no compare per value.
// Indices within a row are 32-bit (the launcher refuses rows of more than 2^30 classes): a
// 64-bit index's arithmetic and compares cost twice the instructions of a kernel bound by them.
template <typename T>
__device__ __forceinline__ void grad_row(const T* x, T* dx, int32_t cols, int64_t target, float x_target, float lse,
                                         float scale, bool vec, const RowThread& rt) {
  if (vec) {
    // e^(x - lse) · scale = 2^(x · log2 e + (log2 scale - lse · log2 e)): one fused multiply-add
    // and the exponential a value (a scale of 0, an ignored row: 2^-inf, 0)
    const float bias = log2f(scale) - lse * kLog2e;
    const int32_t step = 4 * rt.n;
    const T* xp = x + 4 * rt.tid;
    T* dp = dx + 4 * rt.tid;
    for (int32_t i = 4 * rt.tid; i < cols; i += step, xp += step, dp += step) {
      const float4 q = load4_last<T>(xp);
      store4_streaming<T>(dp, make_float4(exp2_ftz(fmaf(q.x, kLog2e, bias)), exp2_ftz(fmaf(q.y, kLog2e, bias)),
                                          exp2_ftz(fmaf(q.z, kLog2e, bias)), exp2_ftz(fmaf(q.w, kLog2e, bias))));
    }
  } else {
    for (int32_t i = rt.tid; i < cols; i += rt.n) store1(dx + i, exp_ftz(load1(x + i) - lse) * scale);
  }
  if (target < 0 || target >= cols) return;  // no class: nothing to subtract
  const int32_t t = static_cast<int32_t>(target);
  const int owner = vec ? (t / 4) % rt.n : t % rt.n;
  if (rt.tid == owner) store1(dx + t, (exp_ftz(x_target - lse) - 1.0f) * scale);
}

__device__ __forceinline__ bool ignored(int64_t t, int64_t ignore_index, int64_t cols) {
  return t == ignore_index || t < 0 || t >= cols;
}

template <typename T>
__device__ void forward(const Forward& a) {
  const RowThread rt(a.warp_rows);
  // a block per row returns as a whole (no barrier skipped); a warp per row uses no barrier
  if (rt.row >= a.rows) return;
  const int64_t row = rt.row;
  const T* x = static_cast<const T*>(a.logits) + row * a.cols;
  const int32_t cols = static_cast<int32_t>(a.cols);
  // the target's logit, read before the reduction's barrier (or the warp's shuffles): after it
  // the gradient may overwrite the row in place (dlogits == logits, as the chunked linear +
  // cross-entropy runs it), each thread rewriting only what it has just read itself
  const int64_t target = a.targets[row];
  // (every thread reads it: the one that writes the target's gradient needs it too)
  float x_target = 0.0f;
  if (!ignored(target, a.ignore_index, a.cols)) x_target = load1(x + target);
  MaxSum v, w;  // two running sums: independent chains
  if (a.vec) {
    const int32_t step = 4 * rt.n;
    int32_t i = 4 * rt.tid;
    const T* xp = x + i;
    for (; i + step < cols; i += 2 * step, xp += 2 * step) {
      const float4 q0 = load4<T>(xp), q1 = load4<T>(xp + step);
      add4(v, q0);
      add4(w, q1);
    }
    if (i < cols) add4(v, load4<T>(xp));
  } else {
    for (int32_t i = rt.tid; i < cols; i += rt.n) v.add(load1(x + i));
  }
  v.merge(w.m, w.s);
  const MaxSum r = a.warp_rows ? warp_max_sum(v) : block_max_sum(v);
  const float lse = r.m + logf(r.s);
  if (a.dlogits != nullptr) {
    const float scale = ignored(target, a.ignore_index, a.cols) ? 0.0f : *a.inv_count;
    if (a.warp_rows) __syncwarp();  // every lane's read of the target's logit before any write
    grad_row(x, static_cast<T*>(a.dlogits) + row * a.cols, cols, ignored(target, a.ignore_index, a.cols) ? -1 : target,
             x_target, lse, scale, a.vec, rt);
  }
  if (rt.tid == 0) {
    if (target == a.ignore_index) {
      a.row_loss[row] = 0.0f;
    } else if (target < 0 || target >= a.cols) {
      a.row_loss[row] = CUDART_NAN_F;
    } else {
      a.row_loss[row] = lse - x_target;
    }
  }
}

// dx *= grad, four values at a time over a grid-stride loop (the last few one each), unless the
// loss's gradient is 1: then every block returns at once.
template <typename T>
__device__ void scale(const Scale& a) {
  const float g = *a.grad;
  if (g == 1.0f) return;
  T* dx = static_cast<T*>(a.dlogits);
  const int64_t stride = 4 * static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = 4 * (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x); i < a.n; i += stride) {
    if (i + 3 < a.n) {
      const float4 q = load4<T>(dx + i);
      store4<T>(dx + i, make_float4(q.x * g, q.y * g, q.z * g, q.w * g));
    } else {
      for (int64_t j = i; j < a.n; ++j) store1(dx + j, load1(dx + j) * g);
    }
  }
}

}  // namespace
}  // namespace tcg::loss

// The kernels of own_kernel_list.h's TCG_LOSS_TYPES, and the finish.
#define TCG_LOSS_KERNELS(N)                                                                         \
  extern "C" __global__ void __launch_bounds__(tcg::loss::kMaxThreads) tcg_ce_fwd_##N(const tcg::loss::Forward a) { tcg::cuda::wait_prior(); \
    tcg::loss::forward<TCG_CUDA_TYPE(N)>(a);                                                        \
  }                                                                                                 \
  extern "C" __global__ void __launch_bounds__(tcg::loss::kScaleThreads) tcg_ce_scale_##N(const tcg::loss::Scale a) { tcg::cuda::wait_prior(); \
    tcg::loss::scale<TCG_CUDA_TYPE(N)>(a);                                                          \
  }
TCG_LOSS_TYPES(TCG_LOSS_KERNELS)

namespace tcg::loss {
namespace {

// How many loads a thread of the one-block kernels has in flight: one at a time, a thread's 16
// loads of 16,384 rows took 9 µs, each waiting on memory.
constexpr int kFinishLoads = 8;

// This thread's values of v (rows threadIdx.x, + blockDim.x, ...), kFinishLoads read at a time
// and summed in the rows' order: rows r are read as load(r).
template <class Load>
__device__ __forceinline__ float strided_sum(int64_t rows, Load load) {
  float s = 0.0f;
  for (int64_t first = threadIdx.x; first < rows; first += kFinishLoads * static_cast<int64_t>(blockDim.x)) {
    float v[kFinishLoads];
#pragma unroll
    for (int k = 0; k < kFinishLoads; ++k) {
      const int64_t r = first + k * static_cast<int64_t>(blockDim.x);
      v[k] = r < rows ? load(r) : 0.0f;
    }
#pragma unroll
    for (int k = 0; k < kFinishLoads; ++k) s += v[k];
  }
  return s;
}

// This thread's share of the rows not ignored (strided over the block).
__device__ float rows_counted(const int64_t* targets, int64_t rows, int64_t ignore_index) {
  return strided_sum(rows, [&](int64_t r) { return targets[r] == ignore_index ? 0.0f : 1.0f; });
}

// The block's sum of v, in a fixed order (a tree over the threads: deterministic), in every thread.
__device__ float block_sum_fixed(float v) {
  __shared__ float s[kFinishThreads];
  s[threadIdx.x] = v;
  __syncthreads();
  for (int half = blockDim.x / 2; half > 0; half >>= 1) {
    if (threadIdx.x < half) s[threadIdx.x] += s[threadIdx.x + half];
    __syncthreads();
  }
  const float r = s[0];
  __syncthreads();  // s is free for the next sum
  return r;
}

}  // namespace
}  // namespace tcg::loss

// One block: the reciprocal of the count of rows not ignored.
extern "C" __global__ void __launch_bounds__(tcg::loss::kFinishThreads) tcg_ce_count(const tcg::loss::Count a) { tcg::cuda::wait_prior();
  const float count = tcg::loss::block_sum_fixed(tcg::loss::rows_counted(a.targets, a.rows, a.ignore_index));
  if (threadIdx.x == 0) *a.inv_count = 1.0f / count;
}

// One block: the rows' losses summed in a fixed order (per thread strided, then a tree) over the
// count of rows not ignored: the mean.
extern "C" __global__ void __launch_bounds__(tcg::loss::kFinishThreads) tcg_ce_finish(const tcg::loss::Finish a) { tcg::cuda::wait_prior();
  const float s = tcg::loss::strided_sum(a.rows, [&](int64_t r) { return a.row_loss[r]; });
  const float sum = tcg::loss::block_sum_fixed(s);
  const float count = tcg::loss::block_sum_fixed(tcg::loss::rows_counted(a.targets, a.rows, a.ignore_index));
  if (threadIdx.x == 0) *a.loss = sum / count;  // no row counted: 0 / 0, NaN (as ATen's mean)
}
