// SwiGLU's arithmetic, shared by the separate kernels (swiglu_kernels.cu) and the GEMM that
// applies its backward in its epilogue (swiglu_gemm.cu): float32, the hardware's exponential
// (fast_math.cuh's exp_ftz) and approximate division, so both compute the same from the same
// inputs.
#pragma once
#include "fast_math.cuh"

namespace tcg::swiglu {

__device__ __forceinline__ float silu(float g) { return __fdividef(g, 1.0f + tcg::cuda::exp_ftz(-g)); }

// Both gradients of one element of silu(g) · u, given the output's gradient d; exp(-g) computed
// once for the sigmoid and the SiLU.
__device__ __forceinline__ void grads(float g, float u, float d, float* dg, float* du) {
  const float sig = __fdividef(1.0f, 1.0f + tcg::cuda::exp_ftz(-g));
  *du = d * (g * sig);
  *dg = ((d * u) * sig) * (1.0f + g * (1.0f - sig));
}

}  // namespace tcg::swiglu
