// The column sums that finish a reduction over rows, shared by the kernels that sum a gradient
// per block first (norm_kernels.cu: weight, bias and branch-bias gradients; gelu_kernels.cu: the
// bias gradient): out[k][c] = sum over b < blocks of part[k][b * cols + c], in a fixed order
// (deterministic). One block of kColSumThreads threads per kColSumCols columns: its threads sum
// strided rows of partials, then the first row of threads adds the others' sums in order.
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
  if (row == 0 && c < cols) {
#pragma unroll
    for (int k = 0; k < K; ++k) {
      for (int p = 1; p < parts; ++p) acc[k] += s[k][p][lane];
      if (sum[k] != nullptr) sum[k][c] = acc[k];
    }
  }
}

}  // namespace tcg::cuda
