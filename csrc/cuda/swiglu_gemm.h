// The GEMMs with SwiGLU in their epilogues, built on CUTLASS (swiglu_gemm.cu, compiled by
// nvcc where build.rs finds CUTLASS's headers: TCG_CUTLASS_GEMMS is then defined, as for
// gelu_gemm.h): the plain-data interface that mlp_own.cpp (host compiler) calls. bf16 operands,
// float32 accumulation and epilogue math, sm_90 (H100, H200) only.
//
// What the backward computes (row-major tensors): the gradient of y = silu(gate) · up · w2ᵀ
// through w2 and SwiGLU at once,
//   dh [M, F] = dy [M, C] · w [C, F]                      (float32, not written)
//   dab [M, 2F] = [dh ⊙ u ⊙ σ(g) ⊙ (1 + g (1 - σ(g))) | dh ⊙ silu(g)]   (bf16)
// with g and u the halves of ab [M, 2F] = [gate | up] (bf16), swiglu_math.cuh's arithmetic
// applied to the float32 product: the separate SwiGLU backward's arithmetic on dh before its
// rounding to bf16.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace tcg::swiglu_gemm {

// And the forward's second half: the up half of w13's GEMM with SwiGLU's forward in its epilogue,
//   up [M, F] = x [M, C] · w_upᵀ (w_up = w13 [2F, C]'s second half), written into ab's second
//   half (bf16, rounded as cuBLASLt rounds it), and h [M, F] = silu(gate) · up (bf16) from gate
//   (ab's first half, written before by the gate half's GEMM) and up rounded:
// the separate SwiGLU forward kernel's arithmetic on the same bf16 values, with no pass of its own
// reading [gate | up] back.
struct Forward {
  const void* x;     // [m, c] bf16
  const void* w_up;  // [f, c] bf16: w13's second half
  void* ab;          // [m, 2f] bf16: [gate | up], gate written, up written here
  void* h;           // [m, f] bf16
  int32_t m, f, c;
};

struct Backward {
  const void* dy;  // [m, c] bf16
  const void* w;   // [c, f] bf16
  const void* ab;  // [m, 2f] bf16: [gate | up]
  void* dab;       // [m, 2f] bf16: [dgate | dup]
  int32_t m, f, c;
};

// Loads the kernels on the current device and sets their shared memory (as gelu_gemm.h's). "" or
// why it cannot run.
const char* prepare();
// "" where the GEMM can run these sizes (f and c multiples of 8, 16-byte aligned pointers), else
// why not.
const char* unsupported(const Backward& a);
// Launches on `stream`; cudaSuccess or the launch's error.
cudaError_t backward(const Backward& a, int sm_count, cudaStream_t stream);

// The same for the forward's up half (`ab`'s gate half written before, on the same stream).
const char* unsupported(const Forward& a);
cudaError_t forward(const Forward& a, int sm_count, cudaStream_t stream);

}  // namespace tcg::swiglu_gemm
