// The crate's embedding backward (see embedding_params.h): one warp per row of the weight's
// gradient, or a block's warps sharing one where rows have many positions; a row's positions found
// by the warp's search in the sorted ids and summed in a fixed order; every row written (zero where
// no position names it), so no zero-fill pass. At a small vocabulary, no sort: a block per row
// scans the ids (`scan`).
//
// Compiled by nvcc into a fat binary that build.rs embeds in the shim; the launcher
// (embedding_own.cpp) launches the extern "C" kernels by name.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "dependent_launch.cuh"
#include "embedding_params.h"
#include "own_kernel_list.h"
#include "vec_io.cuh"

namespace tcg::embedding {
namespace {

using tcg::cuda::add4;
using tcg::cuda::load4;
using tcg::cuda::store4;

// The first index in sorted[0, n) whose id is >= v, found by the warp's 32 lanes together: each
// round probes 32 evenly spaced ids of the range left (a 32-ary search: 3 rounds of dependent
// loads at 12,288 ids, where a binary search takes 14). Call with the whole warp.
__device__ __forceinline__ int64_t warp_lower_bound(const int32_t* sorted, int64_t n, int64_t v, int lane) {
  int64_t lo = 0, hi = n;
  while (lo < hi) {
    const int64_t step = (hi - lo + 31) / 32;
    const int64_t p = lo + lane * step;
    // true for a prefix of the lanes: the ids ascend
    const int below = __popc(__ballot_sync(0xffffffffu, p < hi && sorted[p] < v));
    if (below == 0) return lo;
    const int64_t last = lo + (below - 1) * step;
    hi = min(hi, last + step);
    lo = last + 1;
  }
  return lo;
}

// The end of v's run of ids from `lo` (its first): 32 ids a round. Call with the whole warp.
__device__ __forceinline__ int64_t warp_run_end(const int32_t* sorted, int64_t n, int64_t v, int64_t lo, int lane) {
  for (int64_t base = lo;; base += 32) {
    const int64_t p = base + lane;
    const unsigned in = __ballot_sync(0xffffffffu, p < n && sorted[p] == v);
    if (in != 0xffffffffu) return base + __popc(in);
  }
}

// x rounded to T (to nearest even, as store4 rounds), as a float.
template <typename T>
__device__ __forceinline__ float rounded(float x);
template <>
__device__ __forceinline__ float rounded<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ float rounded<__nv_bfloat16>(float x) {
  return __bfloat162float(__float2bfloat16_rn(x));
}
template <>
__device__ __forceinline__ float rounded<__half>(float x) {
  return __half2float(__float2half_rn(x));
}

// A row sum rounded to T, as a float4 (what a store and a load of T would give).
template <typename T>
__device__ __forceinline__ float4 rounded4(float4 v) {
  return make_float4(rounded<T>(v.x), rounded<T>(v.y), rounded<T>(v.z), rounded<T>(v.w));
}

// What the gradient `old` (a tied head's) becomes with a row sum added: the sum rounded to T
// first, as autograd's add of two gradients of T would take it.
template <typename T>
__device__ __forceinline__ float4 plus_rounded(float4 old, float4 sum) {
  return add4(old, rounded4<T>(sum));
}

// Row sum `acc` into dw at p: stored, or (accumulate) added to what p holds.
template <typename T>
__device__ __forceinline__ void put4(T* p, float4 acc, bool accumulate) {
  store4<T>(p, accumulate ? plus_rounded<T>(load4<T>(p), acc) : acc);
}

// The lane's column of group k of a pass from c0: groups lane-interleaved, so each coalesces.
__device__ __forceinline__ int32_t pass_col(int32_t c0, int k, int lane) { return c0 + (k * 32 + lane) * 4; }

// The lane's kChunks groups of 4 columns of a row's pass from column c0 (zeros past dim), all
// loads issued together.
template <typename T>
__device__ __forceinline__ void load_pass(float4 (&out)[kChunks], const T* row, int32_t c0, int32_t dim, int lane) {
#pragma unroll
  for (int k = 0; k < kChunks; ++k) {
    const int32_t c = pass_col(c0, k, lane);
    out[k] = c < dim ? load4<T>(row + c) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
}

// The pass's groups stored into a row (none past dim).
template <typename T>
__device__ __forceinline__ void store_pass(T* row, const float4 (&in)[kChunks], int32_t c0, int32_t dim, int lane) {
#pragma unroll
  for (int k = 0; k < kChunks; ++k) {
    const int32_t c = pass_col(c0, k, lane);
    if (c < dim) store4<T>(row + c, in[k]);
  }
}

template <typename T>
__device__ void backward(const Backward& a) {
  __shared__ float4 part[kWarps][32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int per_row = a.warps_per_row, rows_per_block = kWarps / per_row;
  const int member = warp % per_row, first = warp - member;
  const T* dy = static_cast<const T*>(a.dy);
  T* dw = static_cast<T*>(a.dw);
  const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  // the loops' bounds are the block's (every warp reaches each barrier)
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * rows_per_block; base < a.vocab;
       base += static_cast<int64_t>(gridDim.x) * rows_per_block) {
    const int64_t v = base + warp / per_row;
    const bool active = v < a.vocab;
    // the row's run of positions (none for padding_idx)
    int64_t lo = 0, hi = 0;
    if (active && v != a.padding_idx) {  // the same for the warp's lanes
      lo = warp_lower_bound(a.sorted, a.n, v, lane);
      hi = warp_run_end(a.sorted, a.n, v, lo, lane);
    }
    // kChunks groups of 4 columns a lane, all of a position's loads issued together
    for (int32_t c0 = 0; c0 < a.dim; c0 += kPassCols) {
      float4 acc[kChunks];
#pragma unroll
      for (int k = 0; k < kChunks; ++k) acc[k] = zero;
      for (int64_t j = lo + member; j < hi; j += per_row) {
        float4 g[kChunks];
        load_pass<T>(g, dy + a.order[j] * a.dim, c0, a.dim, lane);
#pragma unroll
        for (int k = 0; k < kChunks; ++k) acc[k] = add4(acc[k], g[k]);
      }
      if (per_row > 1) {
#pragma unroll
        for (int k = 0; k < kChunks; ++k) {
          part[warp][lane] = acc[k];
          __syncthreads();
          if (member == 0) {
            for (int m = 1; m < per_row; ++m) acc[k] = add4(acc[k], part[first + m][lane]);
          }
          __syncthreads();
        }
      }
      // accumulating, a row without positions keeps the head's gradient
      if (active && member == 0 && (!a.accumulate || hi > lo)) {
        T* out = dw + v * a.dim;
        if (a.accumulate) {
          float4 old[kChunks];
          load_pass<T>(old, out, c0, a.dim, lane);
#pragma unroll
          for (int k = 0; k < kChunks; ++k) acc[k] = plus_rounded<T>(old[k], acc[k]);
        }
        store_pass<T>(out, acc, c0, a.dim, lane);
      }
    }
  }
}

// ids[p] for the lane's kScanIds positions from `base` (-1 past `hi`).
__device__ __forceinline__ void load_ids(int64_t (&id)[kScanIds], const int64_t* ids, int64_t base, int64_t hi,
                                         int lane) {
#pragma unroll
  for (int u = 0; u < kScanIds; ++u) {
    const int64_t p = base + u * 32 + lane;
    id[u] = p < hi ? __ldg(ids + p) : -1;
  }
}

template <typename T>
__device__ void scan(const Scan& a) {
  __shared__ float4 part[kScanWarps][32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t v = blockIdx.x;
  const int32_t c = static_cast<int32_t>(blockIdx.y) * kScanCols + lane * 4;
  const bool live = c < a.dim;
  const int64_t chunk = (a.n + kScanWarps - 1) / kScanWarps;
  const int64_t lo = min(a.n, warp * chunk), hi = min(a.n, lo + chunk);
  const T* dy = static_cast<const T*>(a.dy) + c;
  float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  if (v != a.padding_idx) {
    int64_t next[kScanIds];
    load_ids(next, a.ids, lo, hi, lane);
    for (int64_t base = lo; base < hi; base += 32 * kScanIds) {
      int64_t id[kScanIds];
#pragma unroll
      for (int u = 0; u < kScanIds; ++u) id[u] = next[u];
      load_ids(next, a.ids, base + 32 * kScanIds, hi, lane);
#pragma unroll
      for (int u = 0; u < kScanIds; ++u) {
        unsigned m = __ballot_sync(0xffffffffu, id[u] == v);
        // the matches in position order, up to four rows' loads in flight at a time
        while (m != 0) {
          int64_t p[4];
          int k = 0;
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            p[q] = base + u * 32 + (__ffs(m) - 1);
            if (m != 0) {
              m &= m - 1;
              k = q + 1;
            }
          }
          float4 g[4];
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            g[q] = live && q < k ? load4<T>(dy + p[q] * a.dim) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
          }
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            if (q < k) acc = add4(acc, g[q]);
          }
        }
      }
    }
  }
  // the warps' sums, in warp order
  part[warp][lane] = acc;
  __syncthreads();
  if (warp == 0 && live) {
    float4 sum = part[0][lane];
    for (int w = 1; w < kScanWarps; ++w) sum = add4(sum, part[w][lane]);
    put4<T>(static_cast<T*>(a.dw) + v * a.dim + c, sum, a.accumulate);
  }
}

}  // namespace
}  // namespace tcg::embedding

// The kernels of own_kernel_list.h's TCG_EMBEDDING_TYPES.
#define TCG_EMBEDDING_KERNEL(T)                                                                   \
  extern "C" __global__ void __launch_bounds__(tcg::embedding::kThreads)                           \
      tcg_embedding_bwd_##T(const tcg::embedding::Backward a) { tcg::cuda::wait_prior();                                    \
    tcg::embedding::backward<TCG_CUDA_TYPE(T)>(a);                                                 \
  }                                                                                                \
  extern "C" __global__ void __launch_bounds__(tcg::embedding::kScanThreads)                       \
      tcg_embedding_scan_##T(const tcg::embedding::Scan a) { tcg::cuda::wait_prior();                                       \
    tcg::embedding::scan<TCG_CUDA_TYPE(T)>(a);                                                     \
  }
TCG_EMBEDDING_TYPES(TCG_EMBEDDING_KERNEL)
