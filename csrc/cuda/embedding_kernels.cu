// The crate's embedding backward (see embedding_params.h): one warp per row of the weight's
// gradient, or a block's warps sharing one where rows have many positions; a row's positions found
// by binary search in the sorted ids and summed in a fixed order; every row written (zero where
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

using tcg::cuda::load4;
using tcg::cuda::store4;

// The first index in sorted[0, n) whose id is >= v (> v with `after`).
__device__ __forceinline__ int64_t search(const int32_t* sorted, int64_t n, int64_t v, bool after) {
  int64_t lo = 0, hi = n;
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    const int64_t id = sorted[mid];
    if (id < v || (after && id == v)) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo;
}

template <typename T>
__device__ void backward(const Backward& a) {
  __shared__ float4 part[kWarps][32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int per_row = a.warps_per_row, rows_per_block = kWarps / per_row;
  const int member = warp % per_row, first = warp - member;
  const T* dy = static_cast<const T*>(a.dy);
  T* dw = static_cast<T*>(a.dw);
  // the loops' bounds are the block's (every warp reaches each barrier)
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * rows_per_block; base < a.vocab;
       base += static_cast<int64_t>(gridDim.x) * rows_per_block) {
    const int64_t v = base + warp / per_row;
    const bool active = v < a.vocab;
    // the row's run of positions (none for padding_idx)
    int64_t lo = 0, hi = 0;
    if (active && v != a.padding_idx) {
      lo = search(a.sorted, a.n, v, false);
      hi = search(a.sorted, a.n, v, true);
    }
    for (int32_t c0 = 0; c0 < a.dim; c0 += 32 * 4) {
      const int32_t c = c0 + lane * 4;
      const bool live = active && c < a.dim;
      float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (live) {
#pragma unroll 4
        for (int64_t j = lo + member; j < hi; j += per_row) {
          const float4 g = load4<T>(dy + a.order[j] * a.dim + c);
          acc.x += g.x;
          acc.y += g.y;
          acc.z += g.z;
          acc.w += g.w;
        }
      }
      if (per_row > 1) {
        part[warp][lane] = acc;
        __syncthreads();
        if (member == 0) {
          for (int m = 1; m < per_row; ++m) {
            const float4 p = part[first + m][lane];
            acc.x += p.x;
            acc.y += p.y;
            acc.z += p.z;
            acc.w += p.w;
          }
        }
        __syncthreads();
      }
      if (live && member == 0) store4<T>(dw + v * a.dim + c, acc);
    }
  }
}

__device__ __forceinline__ void add4(float4& acc, float4 g) {
  acc.x += g.x;
  acc.y += g.y;
  acc.z += g.z;
  acc.w += g.w;
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
            if (q < k) add4(acc, g[q]);
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
    for (int w = 1; w < kScanWarps; ++w) add4(sum, part[w][lane]);
    store4<T>(static_cast<T*>(a.dw) + v * a.dim + c, sum);
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
