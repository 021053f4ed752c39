// One cuBLASLt GEMM with an epilogue, shared by the layers that use cuBLASLt (linear_own.cpp:
// every GEMM of the linear layer, bias gradients in the weight-gradient GEMM; mlp_own.cpp: GELU
// in the GEMMs' epilogues; loss_own.cpp: the chunked head). Each GEMM shape's algorithm is
// chosen once, as gemm.h's choice says.
// cuBLASLt is column-major: a row-major tensor [r, c] is, to it, a c × r matrix with leading
// dimension c. CUDA builds only.
#pragma once
#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <cublasLt.h>

#include <cstdint>

namespace tcg::lt {

// A matrix as cuBLASLt reads it: column-major `rows` × `cols` with leading dimension `ld`, and
// whether the GEMM takes its transpose; `batch` of them, `batch_stride` elements apart (a strided
// batched GEMM: every operand of one call has the same batch).
struct Matrix {
  void* data;
  at::ScalarType type;
  int64_t rows, cols, ld;
  bool transpose;
  int32_t batch = 1;
  int64_t batch_stride = 0;
};

// What runs after the product. `bias`: the bias (read; CUBLASLT_EPILOGUE_*BIAS) or the bias
// gradient (written; *BGRAD*), of `bias_type`. `aux`: GELU's input, written by GELU_AUX(_BIAS)
// and read by DGELU(_BGRAD), with leading dimension `aux_ld` (in D's dtype).
struct Epilogue {
  cublasLtEpilogue_t kind = CUBLASLT_EPILOGUE_DEFAULT;
  void* bias = nullptr;
  at::ScalarType bias_type = at::kFloat;
  void* aux = nullptr;
  int64_t aux_ld = 0;
};

// d = op(a) · op(b) (`accumulate`: d += op(a) · op(b)), then the epilogue, in float32
// accumulation on the current stream with ATen's cuBLASLt handle and workspace. Returns false,
// having launched nothing, where cuBLASLt offers no algorithm for it; throws TCG_ERROR where a
// call fails.
bool matmul(const Matrix& a, const Matrix& b, const Matrix& d, const Epilogue& epilogue, bool accumulate = false);

// The forward GEMM y2 [N, out] = x2 [N, in] · wᵀ and the input-gradient GEMM dx2 [N, in] =
// dy2 [N, out] · w [out, in], each then `e`, into the given output (all contiguous, of the
// compute dtype): false, having launched nothing, where cuBLASLt offers no algorithm. The
// operands' layouts for cuBLASLt are written here once, for the linear layer and the MLP's
// epilogue GEMMs alike.
bool forward(const at::Tensor& x2, const at::Tensor& w, at::Tensor& y2, const Epilogue& e);
bool input_gradient(const at::Tensor& dy2, const at::Tensor& w, at::Tensor& dx2, const Epilogue& e);

// y2 [N, out] = x2 [N, in] · wᵀ (+ bias [out], the BIAS epilogue): the forward GEMM, x2 and w
// contiguous and of the compute dtype, the bias of it too; ATen's addmm or mm where cuBLASLt
// offers no algorithm. `_into`: into y2, contiguous [N, out] of that dtype.
at::Tensor linear(const at::Tensor& x2, const at::Tensor& w, const at::Tensor& bias);
void linear_into(const at::Tensor& x2, const at::Tensor& w, const at::Tensor& bias, at::Tensor& y2);

// dx2 [N, in] = dy2 [N, out] · w [out, in]: the input-gradient GEMM (both contiguous, of the
// compute dtype); ATen's mm where cuBLASLt offers no algorithm. `_into`: into dx2, contiguous.
at::Tensor input_grad(const at::Tensor& dy2, const at::Tensor& w);
void input_grad_into(const at::Tensor& dy2, const at::Tensor& w, at::Tensor& dx2);

// The weight and bias gradients of y = x · wᵀ + b from x2 [N, in] and dy2 [N, out] (both of the
// compute dtype, contiguous): dw [out, in] = dy2ᵀ · x2 when `want_w`, db [out] = dy2's column sums
// when `want_b`, both in `type`. One GEMM with the BGRADB epilogue where cuBLASLt offers one,
// ATen's mm and sum otherwise. Either result is undefined when not wanted.
struct WeightGrads {
  at::Tensor dw, db;
};
WeightGrads weight_grads(const at::Tensor& x2, const at::Tensor& dy2, bool want_w, bool want_b, at::ScalarType type);

// The gradients of y = x · wᵀ + b from x2 [N, in], w [out, in] and dy2 [N, out] (contiguous, of
// the compute dtype): the weight's and the bias's (weight_grads, in `type`), then dx2 [N, in]
// = dy2 · w where `want_x` (input_grad). Each result undefined where not wanted. The linear
// layer's, the rotary projection's and the MLPs' first layer's backward.
struct LinearGrads {
  at::Tensor dx2, dw, db;
};
LinearGrads linear_grads(const at::Tensor& x2, const at::Tensor& w, const at::Tensor& dy2, bool want_x, bool want_w,
                         bool want_b, at::ScalarType type);

// dw [out, in] (+)= dy2ᵀ · x2 (dw's dtype: the compute dtype or float32; `accumulate`: added to
// what dw holds), one GEMM; ATen's mm (and add_) where cuBLASLt offers no algorithm.
void weight_grad_into(const at::Tensor& x2, const at::Tensor& dy2, at::Tensor& dw, bool accumulate);

// The 16-bit dtype the GEMMs run in for these operands (CUDA autocast's, or x's and weight's when
// both are bfloat16 or float16), or Undefined when there is none.
inline at::ScalarType compute_dtype(const at::Tensor& x, const at::Tensor& weight) {
  const auto is_16bit = [](at::ScalarType t) { return t == at::kBFloat16 || t == at::kHalf; };
  if (x.is_cuda() && at::autocast::is_autocast_enabled(at::kCUDA)) {
    const at::ScalarType t = at::autocast::get_autocast_dtype(at::kCUDA);
    return is_16bit(t) ? t : at::ScalarType::Undefined;
  }
  if (is_16bit(x.scalar_type()) && x.scalar_type() == weight.scalar_type()) return x.scalar_type();
  return at::ScalarType::Undefined;
}

// The dtype a weight-gradient GEMM writes for a parameter of dtype `param`: float32 where
// `fp32_wgrad` asks for it and the parameter is float32, else the compute dtype `dt` (a 16-bit
// parameter takes its own dtype).
inline at::ScalarType weight_grad_type(bool fp32_wgrad, at::ScalarType param, at::ScalarType dt) {
  return fp32_wgrad && param == at::kFloat ? at::kFloat : dt;
}

// An operand in the compute dtype: its shadow when there is one, else a cast (as autocast's);
// undefined stays undefined.
inline at::Tensor in_dtype(const at::Tensor& t, const at::Tensor& shadow, at::ScalarType dt) {
  if (!t.defined()) return t;
  if (shadow.defined()) return shadow;
  return t.scalar_type() == dt ? t : t.to(dt);
}

}  // namespace tcg::lt
