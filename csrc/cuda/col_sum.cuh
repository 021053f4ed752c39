// The column sums that finish a reduction over rows, shared by the kernels that sum a gradient
// per block first (norm_kernels.cu: weight, bias and branch-bias gradients; gelu_kernels.cu: the
// bias gradient): out[k][c] = sum over b < blocks of part[k][b * cols + c], in a fixed order
// (deterministic). One block of kColSumThreads threads per kColSumCols columns: its threads sum
// strided rows of partials, then a tree over the rows of threads adds their sums. The partials
// are L2-resident (just written): narrow blocks (8 columns, one 32-byte sector a row) make many
// blocks, each thread few loads, so the sum is not held to L2's latency.
#pragma once
#include <stdint.h>

#include "col_sum.h"

namespace tcg::cuda {

// K sums at once (a null part[k] or sum[k] is skipped); launch ceil(cols / kColSumCols) blocks
// of kColSumThreads threads.
template <int K>
__device__ __forceinline__ void sum_columns(const float* const (&part)[K], float* const (&sum)[K], int32_t blocks,
                                            int32_t cols) {
  constexpr int parts = kColSumThreads / kColSumCols;
  __shared__ float s[K][parts][kColSumCols + 1];
  const int lane = threadIdx.x % kColSumCols, row = threadIdx.x / kColSumCols;
  const int c = blockIdx.x * kColSumCols + lane;
  float acc[K] = {};
  if (c < cols) {
    for (int b = row; b < blocks; b += parts) {
      const int64_t at = static_cast<int64_t>(b) * cols + c;
#pragma unroll
      for (int k = 0; k < K; ++k) {
        if (part[k] != nullptr) acc[k] += part[k][at];
      }
    }
  }
#pragma unroll
  for (int k = 0; k < K; ++k) s[k][row][lane] = acc[k];
  __syncthreads();
  // a tree over the rows of threads, in a fixed order
  for (int stride = parts / 2; stride > 0; stride /= 2) {
    if (row < stride) {
#pragma unroll
      for (int k = 0; k < K; ++k) s[k][row][lane] += s[k][row + stride][lane];
    }
    __syncthreads();
  }
  if (row == 0 && c < cols) {
#pragma unroll
    for (int k = 0; k < K; ++k) {
      if (sum[k] != nullptr) sum[k][c] = s[k][0][lane];
    }
  }
}

}  // namespace tcg::cuda
