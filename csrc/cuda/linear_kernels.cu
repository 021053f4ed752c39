// The linear layer's own kernels (see linear_params.h): the sum of a float32 weight gradient's
// slices (four values a thread, every slice's load issued before the first add; the adds in
// slice order, unfused: no contraction to change a result), and the backward of a split output
// (its pieces' gradients packed, the bias gradient summed on the way).
//
// Compiled by nvcc into a fat binary that build.rs embeds in the shim; the launchers
// (lt_matmul.cpp, linear_own.cpp) launch the extern "C" kernels by name.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "col_sum.cuh"
#include "dependent_launch.cuh"
#include "linear_params.h"
#include "own_kernel_list.h"

namespace {

using tcg::linear::kMaxSlices;

__device__ __forceinline__ float4 add4(float4 a, float4 b) {
  return make_float4(__fadd_rn(a.x, b.x), __fadd_rn(a.y, b.y), __fadd_rn(a.z, b.z), __fadd_rn(a.w, b.w));
}

}  // namespace

extern "C" __global__ void __launch_bounds__(tcg::linear::kSlicesSumThreads)
    tcg_wgrad_slices_sum(const tcg::linear::SlicesSum a) { tcg::cuda::wait_prior();
  const float4* part = reinterpret_cast<const float4*>(a.part);
  float4* out = reinterpret_cast<float4*>(a.out);
  const int64_t n4 = a.n / 4, step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n4; i += step) {
    float4 v[kMaxSlices];
#pragma unroll
    for (int k = 0; k < kMaxSlices; ++k) {
      if (k < a.slices) v[k] = __ldg(part + k * n4 + i);
    }
    float4 s = v[0];
#pragma unroll
    for (int k = 1; k < kMaxSlices; ++k) {
      if (k < a.slices) s = add4(s, v[k]);
    }
    out[i] = a.accumulate ? add4(out[i], s) : s;
  }
}

namespace tcg::linear {
namespace {

// Two 16-bit values as floats.
__device__ __forceinline__ float2 to_float2(__nv_bfloat162 v) { return __bfloat1622float2(v); }
__device__ __forceinline__ float2 to_float2(__half2 v) { return __half22float2(v); }

// Eight 16-bit values of T (16 bytes) added into float accumulators.
template <typename T>
__device__ __forceinline__ void add8(float (&acc)[kSplitValues], uint4 v) {
  using Pair = std::conditional_t<std::is_same_v<T, __half>, __half2, __nv_bfloat162>;
  const Pair* h = reinterpret_cast<const Pair*>(&v);
#pragma unroll
  for (int i = 0; i < kSplitValues / 2; ++i) {
    const float2 f = to_float2(h[i]);
    acc[2 * i] += f.x;
    acc[2 * i + 1] += f.y;
  }
}

template <typename T>
__device__ void split_backward(const SplitBackward& a) {
  const int lane = static_cast<int>(threadIdx.x) % a.lanes, block_row = static_cast<int>(threadIdx.x) / a.lanes;
  const int rows_per_block = static_cast<int>(blockDim.x) / a.lanes;
  const int64_t cols = static_cast<int64_t>(a.w) * a.parts;
  const int64_t c = (static_cast<int64_t>(blockIdx.x) * a.lanes + lane) * kSplitValues;
  const bool active = c < cols;
  float acc[kSplitValues] = {};
  if (active) {
    const int piece = static_cast<int>(c / a.w);
    const T* g = nullptr;
#pragma unroll
    for (int k = 0; k < kSplitMaxParts; ++k) {
      if (k == piece) g = static_cast<const T*>(a.grad[k]);
    }
    const int64_t gc = c - static_cast<int64_t>(piece) * a.w;
    T* out = static_cast<T*>(a.packed);
    const int64_t stride = static_cast<int64_t>(gridDim.y) * rows_per_block;
    const uint4 zero = make_uint4(0, 0, 0, 0);
    for (int64_t first = static_cast<int64_t>(blockIdx.y) * rows_per_block + block_row; first < a.rows;
         first += kSplitRows * stride) {
      uint4 v[kSplitRows];
#pragma unroll
      for (int k = 0; k < kSplitRows; ++k) {
        const int64_t row = first + k * stride;
        v[k] = row < a.rows && g != nullptr ? __ldg(reinterpret_cast<const uint4*>(g + row * a.w + gc)) : zero;
      }
#pragma unroll
      for (int k = 0; k < kSplitRows; ++k) {
        const int64_t row = first + k * stride;
        if (row < a.rows) {
          *reinterpret_cast<uint4*>(out + row * cols + c) = v[k];
          add8<T>(acc, v[k]);
        }
      }
    }
  }
  if (a.part == nullptr) return;  // the same for the whole block
  // the block's rows of sums, added in row order by its first row of threads
  __shared__ float s[kSplitMaxThreads * kSplitValues];
#pragma unroll
  for (int j = 0; j < kSplitValues; ++j) s[threadIdx.x * kSplitValues + j] = acc[j];
  __syncthreads();
  if (block_row != 0 || !active) return;
  for (int r = 1; r < rows_per_block; ++r) {
#pragma unroll
    for (int j = 0; j < kSplitValues; ++j) acc[j] += s[(r * a.lanes + lane) * kSplitValues + j];
  }
  float4* part = reinterpret_cast<float4*>(a.part + static_cast<int64_t>(blockIdx.y) * cols + c);
  part[0] = make_float4(acc[0], acc[1], acc[2], acc[3]);
  part[1] = make_float4(acc[4], acc[5], acc[6], acc[7]);
}

}  // namespace
}  // namespace tcg::linear

// The split's backward per own_kernel_list.h's TCG_SPLIT_TYPES, and its finish.
#define TCG_SPLIT_KERNEL(N)                                                                         \
  extern "C" __global__ void __launch_bounds__(tcg::linear::kSplitMaxThreads)                       \
      tcg_split_bwd_##N(const tcg::linear::SplitBackward a) {                                       \
    tcg::cuda::wait_prior();                                                                        \
    tcg::linear::split_backward<TCG_CUDA_TYPE(N)>(a);                                               \
  }
TCG_SPLIT_TYPES(TCG_SPLIT_KERNEL)

extern "C" __global__ void __launch_bounds__(tcg::cuda::kColSumThreads)
    tcg_split_finish(const tcg::linear::SplitFinish a) {
  tcg::cuda::wait_prior();
  tcg::cuda::sum_columns<1>(a.part, a.sum, a.blocks, a.cols);
}
