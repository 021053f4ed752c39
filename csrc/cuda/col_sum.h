// The launch shape of col_sum.cuh's column sums, for the launchers (host compiler) and the
// kernels alike: ceil(cols / kColSumCols) blocks of kColSumThreads threads.
#pragma once

namespace tcg::cuda {

constexpr int kColSumCols = 8;
constexpr int kColSumThreads = 1024;

}  // namespace tcg::cuda
