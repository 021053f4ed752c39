// The exponentials the crate's memory-bound kernels use: the hardware's base-2 exponential
// (ex2.approx.ftz, one MUFU instruction). `__expf` is the same ex2.approx without .ftz unless the
// whole file is built with -ftz: three more instructions a value to rescale results below 2^-126,
// which made the cross-entropy, SwiGLU and GELU kernels bound by their instructions. Results
// below 2^-126 are flushed to 0 (a probability, a sigmoid or a normal density that small is 0 in
// every dtype the kernels write but fp32, and its sums are unchanged). rcp_approx is the
// hardware's reciprocal.
#pragma once

namespace tcg::cuda {

// 2^x, within 2 ulp of the exact value; 0 below 2^-126.
__device__ __forceinline__ float exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// e^x, within 2 ulp + |x| · 2^-24 relative of the exact value; 0 below 2^-126.
__device__ __forceinline__ float exp_ftz(float x) { return exp2_ftz(x * 1.4426950408889634f); }

// 1 / x for a normal x, within 1 ulp (rcp.approx.ftz.f32: one MUFU instruction).
__device__ __forceinline__ float rcp_approx(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

}  // namespace tcg::cuda
