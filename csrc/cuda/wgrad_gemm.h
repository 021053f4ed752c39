// The weight-gradient GEMM of a large float32 gradient, built on CUTLASS (wgrad_gemm.cu, compiled
// by nvcc where build.rs finds CUTLASS's headers: TCG_CUTLASS_GEMMS is then defined, as for
// gelu_gemm.h): the plain-data interface that lt_matmul.cpp (host compiler) calls. bf16
// operands, float32 accumulation and output, sm_90 (H100, H200) only.
//
// What it computes (row-major tensors): dw [out, in] = dyᵀ · x, with dy [rows, out] and
// x [rows, in] (bf16), written in float32 (no accumulation into what dw holds).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace tcg::wgrad_gemm {

struct WeightGrad {
  const void* x;   // [rows, in] bf16
  const void* dy;  // [rows, out] bf16
  float* dw;       // [out, in] float32
  int32_t rows, in, out;
};

// Loads the kernel on the current device and sets its shared memory (as gelu_gemm.h's). "" or
// why it cannot run.
const char* prepare();
// "" where the GEMM can run these sizes (in and out multiples of 8, 16-byte aligned pointers),
// else why not.
const char* unsupported(const WeightGrad& a);
// Launches on `stream`; cudaSuccess or the launch's error.
cudaError_t weight_grad(const WeightGrad& a, int sm_count, cudaStream_t stream);

}  // namespace tcg::wgrad_gemm
