// The fused q | k | v projection with rotary embeddings in its GEMM's epilogue, built on CUTLASS
// (rotary_gemm.cu, compiled by nvcc where build.rs finds CUTLASS's headers: TCG_CUTLASS_GEMMS is
// then defined, as for swiglu_gemm.h): the plain-data interface that rotary_own.cpp (host
// compiler) calls. bf16 operands, float32 accumulation, sm_90 (H100, H200).
//
// What it computes (row-major tensors): y [m, n] = x [m, c] · wᵀ (w [n, c]), each value rounded
// to bf16 as a bf16 GEMM writes it, then in the first `rot_cols` columns (q's and k's heads of 64
// values) every interleaved pair (2i, 2i+1) of a head rotated as the rotary kernel
// (rotary_params.h) rotates it: at position p = row mod seq + offset,
//   y0' = y0·cos − y1·sin,  y1' = y0·sin + y1·cos   (the tables' row p, angle i)
// each product and sum rounded once in float32, then rounded to bf16; NaN past the tables' rows.
// The columns from `rot_cols` on (v's heads) are the GEMM's values. So y is the projection's GEMM
// followed by the rotary kernel's forward, with no pass of its own over the projection.
//
// The tables come permuted (tcg_rotary_permuted_table, rotary.cpp): each row's angles in the
// order the GEMM's threads hold the pairs, angle i at (i mod 4) · kHeadDim/8 + i / 4, so that a
// thread loads its row's angles in two 16-byte loads.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace tcg::rotary_gemm {

// The head dimension the kernel takes.
constexpr int kHeadDim = 64;

struct Forward {
  const void* x;     // [m, c] bf16
  const void* w;     // [n, c] bf16
  void* y;           // [m, n] bf16, written
  const float* cos;  // [positions, kHeadDim / 2] float32, permuted
  const float* sin;
  int64_t offset;
  int64_t positions;
  int32_t m, n, c;
  int32_t seq;       // rows per sequence: row r is at position r mod seq + offset
  int32_t rot_cols;  // the columns rotated (a multiple of kHeadDim)
};

// Loads the kernel on the current device and sets its shared memory (as swiglu_gemm.h's). "" or
// why it cannot run.
const char* prepare();
// "" where the GEMM can run these sizes (n and c multiples of 8, whole heads rotated, 16-byte
// aligned pointers), else why not.
const char* unsupported(const Forward& a);
// Launches on `stream`; cudaSuccess or the launch's error.
cudaError_t forward(const Forward& a, int sm_count, cudaStream_t stream);

}  // namespace tcg::rotary_gemm
