// The linear layer's own kernel (see linear_params.h): the sum of a float32 weight gradient's
// slices. Four values a thread, every slice's load issued before the first add; the adds in
// slice order, unfused (no contraction to change a result).
//
// Compiled by nvcc into a fat binary that build.rs embeds in the shim; the launcher
// (lt_matmul.cpp) launches the extern "C" kernel by name.
#include "dependent_launch.cuh"
#include "linear_params.h"

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
