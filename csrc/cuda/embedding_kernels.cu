// The crate's embedding backward (see embedding_params.h): one warp per row of the weight's
// gradient, or a block's warps sharing one where rows have many positions; a row's positions found
// by binary search in the sorted ids and summed in a fixed order; every row written (zero where
// no position names it), so no zero-fill pass.
//
// Compiled by nvcc into a fat binary that build.rs embeds in the shim; the launcher
// (embedding_own.cpp) launches the extern "C" kernels by name.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

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

}  // namespace
}  // namespace tcg::embedding

// The kernels of own_kernel_list.h's TCG_EMBEDDING_TYPES.
#define TCG_EMBEDDING_KERNEL(T)                                                                   \
  extern "C" __global__ void __launch_bounds__(tcg::embedding::kThreads)                           \
      tcg_embedding_bwd_##T(const tcg::embedding::Backward a) {                                    \
    tcg::embedding::backward<TCG_CUDA_TYPE(T)>(a);                                                 \
  }
TCG_EMBEDDING_TYPES(TCG_EMBEDDING_KERNEL)
