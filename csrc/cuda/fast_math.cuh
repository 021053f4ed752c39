// The exponential the crate's memory-bound kernels use: the hardware's base-2 exponential
// (ex2.approx.ftz, one MUFU instruction) of x · log2 e. `__expf` is the same ex2.approx without
// .ftz unless the whole file is built with -ftz: three more instructions a value to rescale
// results below 2^-126, which made the cross-entropy and SwiGLU kernels bound by their
// instructions. Results below 2^-126 are flushed to 0 (a probability or a sigmoid that small
// is 0 in every dtype the kernels write but fp32, and its sums are unchanged).
#pragma once

namespace tcg::cuda {

// e^x, within 2 ulp + |x| · 2^-24 relative of the exact value; 0 below 2^-126.
__device__ __forceinline__ float exp_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x * 1.4426950408889634f));
  return y;
}

}  // namespace tcg::cuda
