// The GEMM with SwiGLU's backward in its epilogue, built on CUTLASS (swiglu_gemm.cu, compiled by
// nvcc where build.rs finds CUTLASS's headers: TCG_CUTLASS_GEMMS is then defined, as for
// gelu_gemm.h): the plain-data interface that mlp_own.cpp (host compiler) calls. bf16 operands,
// float32 accumulation and epilogue math, sm_90 (H100, H200) only.
//
// What it computes (row-major tensors): the gradient of y = silu(gate) · up · w2ᵀ through w2 and
// SwiGLU at once,
//   dh [M, F] = dy [M, C] · w [C, F]                      (float32, not written)
//   dab [M, 2F] = [dh ⊙ u ⊙ σ(g) ⊙ (1 + g (1 - σ(g))) | dh ⊙ silu(g)]   (bf16)
// with g and u the halves of ab [M, 2F] = [gate | up] (bf16), swiglu_math.cuh's arithmetic
// applied to the float32 product: the separate SwiGLU backward's arithmetic on dh before its
// rounding to bf16.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace tcg::swiglu_gemm {

struct Backward {
  const void* dy;  // [m, c] bf16
  const void* w;   // [c, f] bf16
  const void* ab;  // [m, 2f] bf16: [gate | up]
  void* dab;       // [m, 2f] bf16: [dgate | dup]
  int32_t m, f, c;
};

// Loads the kernel on the current device and sets its shared memory (as gelu_gemm.h's). "" or
// why it cannot run.
const char* prepare();
// "" where the GEMM can run these sizes (f and c multiples of 8, 16-byte aligned pointers), else
// why not.
const char* unsupported(const Backward& a);
// Launches on `stream`; cudaSuccess or the launch's error.
cudaError_t backward(const Backward& a, int sm_count, cudaStream_t stream);

}  // namespace tcg::swiglu_gemm
