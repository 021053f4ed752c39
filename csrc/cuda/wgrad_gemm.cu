// The weight-gradient GEMM of a large float32 gradient (wgrad_gemm.h), a CUTLASS 3 kernel for
// sm_90 (cutlass_gemm.cuh's) with a plain epilogue: dw [out, in] = dyᵀ · x, A = dyᵀ (out × rows,
// column-major: dy as it lies), B = x (rows × in, row-major), D row-major in float32.
// Cooperative on 128 × 256 tiles. On an H200 at a Llama head's [32000, 768] over 12,288 rows:
// 775 µs, where cuBLASLt's heuristic's kernel took 898 µs, ping-pong on 128 × 128 tiles 884, and
// cooperative kernels on 128 × 128 and 256 × 128 tiles 907 and 852; at [4096, 768] cuBLASLt's
// 99 µs against 119, at [768, 768] and [1280, 768] 33 and 38 against 117 (few tiles, no split of
// k): lt_matmul.cpp calls it for gradients of at least 2^23 values only.
#include "wgrad_gemm.h"

#include "cutlass_gemm.cuh"

namespace tcg::wgrad_gemm {
namespace {

using namespace tcg::cutlass_gemm;

using Plain = cutlass::epilogue::fusion::LinearCombination<float, float, void, float>;
using Gemm = Kernel<Shape<_128, _256, _64>, ColumnMajor, RowMajor, RowMajor, Plain, Cooperative, float>::Gemm;

}  // namespace

const char* prepare() { return prepare_all<Gemm>(); }

const char* unsupported(const WeightGrad& a) {
  if (a.rows <= 0 || a.in <= 0 || a.out <= 0 || a.in % 8 != 0 || a.out % 8 != 0) {
    return "sizes that are not multiples of 8";
  }
  if (!aligned(a.x) || !aligned(a.dy) || !aligned(a.dw)) return "operands not 16-byte aligned";
  return "";
}

cudaError_t weight_grad(const WeightGrad& a, int sm_count, cudaStream_t stream) {
  return run<Gemm>(gemm_args<Gemm>(a.out, a.in, a.rows, a.dy, a.x, a.dw, sm_count), stream);
}

}  // namespace tcg::wgrad_gemm
