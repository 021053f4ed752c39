// The GEMMs with GELU's exact (erf) form in their epilogues, built on CUTLASS (gelu_gemm.cu,
// compiled by nvcc where build.rs finds CUTLASS's headers: TCG_CUTLASS_GEMMS is then defined): the
// plain-data interface that mlp_own.cpp (host compiler) calls. bf16 operands, float32
// accumulation and epilogue math, sm_90 (H100, H200) only.
//
// What they compute (row-major tensors; the GELU is gelu_kernels.cu's x · Φ(x) through the normal
// distribution's tail, applied to the float32 accumulators, not to a bf16 rounding of them):
//   forward:  z [M, N] = x [M, K] · wᵀ (w [N, K]) + bias [N] (float32),  h [M, N] = gelu(z) (bf16)
//             and grad [M, N] = gelu'(z) (float16, rounded once), what the backward reads: z
//             itself is not written
//   backward: dpre [M, H] = (dy [M, C] · w [C, H]) ⊙ grad [M, H],  and, with partials,
//             partials [backward_partial_rows(), H] = the sums over each tile's rows of dpre
//             (float32, before dpre's rounding, in a fixed order), which col_sum.cuh's finishing
//             kernel sums into fc's bias gradient (deterministic)
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace tcg::gelu_gemm {

struct Forward {
  const void* x;      // [m, k] bf16
  const void* w;      // [n, k] bf16
  const float* bias;  // [n] or null
  void* grad;         // [m, n] float16: GELU's derivative at x · wᵀ + bias
  void* h;            // [m, n] bf16
  int32_t m, n, k;
};

struct Backward {
  const void* dy;     // [m, c] bf16
  const void* w;      // [c, h] bf16
  const void* grad;   // [m, h] float16: the forward's `grad`
  void* dpre;         // [m, h] bf16
  float* partials;    // [backward_partial_rows(), h] float32, or null (no bias gradient)
  int32_t m, h, c;
};

// Loads the kernels on the current device and sets their shared memory (a module's load may be
// refused inside a capture: own_kernels.cpp calls this with the own kernels' check, outside one).
// "" or why they cannot run.
const char* prepare();
// "" where the GEMM can run these sizes (the contiguous dimensions multiples of 8, 16-byte
// aligned pointers), else why not.
const char* unsupported(const Forward& a);
const char* unsupported(const Backward& a);
// The rows of the backward's partial bias-gradient sums (one per tile of rows).
int32_t backward_partial_rows(const Backward& a);
// Launches on `stream`; cudaSuccess or the launch's error.
cudaError_t forward(const Forward& a, int sm_count, cudaStream_t stream);
cudaError_t backward(const Backward& a, int sm_count, cudaStream_t stream);

}  // namespace tcg::gelu_gemm
