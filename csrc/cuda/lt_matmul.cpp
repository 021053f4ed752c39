// One cuBLASLt GEMM with an epilogue (lt_matmul.h): the descriptors of a call, created and
// destroyed with it, and the weight-gradient GEMM the linear layers share.
#include "lt_matmul.h"

#include <ATen/cuda/CUDAContext.h>

#include "cuda_shim.h"

namespace tcg::lt {
namespace {

cudaDataType_t cuda_type(at::ScalarType t) {
  switch (t) {
    case at::kBFloat16: return CUDA_R_16BF;
    case at::kHalf: return CUDA_R_16F;
    default: return CUDA_R_32F;
  }
}

void check_lt(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) {
    throw tcg::exception(TCG_ERROR, std::string("cuBLASLt ") + what + " failed with status " + std::to_string(static_cast<int>(s)));
  }
}

struct MatmulDesc {
  cublasLtMatmulDesc_t d = nullptr;
  MatmulDesc() { check_lt(cublasLtMatmulDescCreate(&d, CUBLAS_COMPUTE_32F, CUDA_R_32F), "matmul descriptor"); }
  ~MatmulDesc() { (void)cublasLtMatmulDescDestroy(d); }
  MatmulDesc(const MatmulDesc&) = delete;
  MatmulDesc& operator=(const MatmulDesc&) = delete;
  template <class T>
  void set(cublasLtMatmulDescAttributes_t a, const T& v) {
    check_lt(cublasLtMatmulDescSetAttribute(d, a, &v, sizeof(v)), "matmul attribute");
  }
};

struct Layout {
  cublasLtMatrixLayout_t l = nullptr;
  explicit Layout(const Matrix& m) {
    check_lt(cublasLtMatrixLayoutCreate(&l, cuda_type(m.type), static_cast<uint64_t>(m.rows),
                                        static_cast<uint64_t>(m.cols), m.ld),
             "matrix layout");
  }
  ~Layout() { (void)cublasLtMatrixLayoutDestroy(l); }
  Layout(const Layout&) = delete;
  Layout& operator=(const Layout&) = delete;
};

struct Preference {
  cublasLtMatmulPreference_t p = nullptr;
  Preference() { check_lt(cublasLtMatmulPreferenceCreate(&p), "preference"); }
  ~Preference() { (void)cublasLtMatmulPreferenceDestroy(p); }
  Preference(const Preference&) = delete;
  Preference& operator=(const Preference&) = delete;
  template <class T>
  void set(cublasLtMatmulPreferenceAttributes_t a, const T& v) {
    check_lt(cublasLtMatmulPreferenceSetAttribute(p, a, &v, sizeof(v)), "preference attribute");
  }
};

// The largest power of two up to 256 that divides the address (what cuBLASLt may assume).
uint32_t alignment(const void* p) {
  uint32_t a = 256;
  while (a > 1 && reinterpret_cast<uintptr_t>(p) % a != 0) a /= 2;
  return a;
}

}  // namespace

bool matmul(const Matrix& a, const Matrix& b, const Matrix& d, const Epilogue& e, bool accumulate) {
  MatmulDesc desc;
  desc.set(CUBLASLT_MATMUL_DESC_TRANSA, static_cast<int32_t>(a.transpose ? CUBLAS_OP_T : CUBLAS_OP_N));
  desc.set(CUBLASLT_MATMUL_DESC_TRANSB, static_cast<int32_t>(b.transpose ? CUBLAS_OP_T : CUBLAS_OP_N));
  if (e.kind != CUBLASLT_EPILOGUE_DEFAULT) {
    desc.set(CUBLASLT_MATMUL_DESC_EPILOGUE, static_cast<uint32_t>(e.kind));
    if (e.bias != nullptr) {
      desc.set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, e.bias);
      desc.set(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, static_cast<int32_t>(cuda_type(e.bias_type)));
    }
    if (e.aux != nullptr) {
      desc.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, e.aux);
      desc.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, e.aux_ld);
    }
  }
  const Layout la(a), lb(b), ld(d);
  const size_t ws_size = at::cuda::getCUDABlasLtWorkspaceSize();
  Preference pref;
  pref.set(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, static_cast<uint64_t>(ws_size));
  pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, alignment(a.data));
  pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, alignment(b.data));
  pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, alignment(d.data));
  pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, alignment(d.data));
  cublasLtHandle_t handle = at::cuda::getCurrentCUDABlasLtHandle();
  cublasLtMatmulHeuristicResult_t found{};
  int n = 0;
  if (cublasLtMatmulAlgoGetHeuristic(handle, desc.d, la.l, lb.l, ld.l, ld.l, pref.p, 1, &found, &n) != CUBLAS_STATUS_SUCCESS ||
      n == 0) {
    return false;
  }
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  check_lt(cublasLtMatmul(handle, desc.d, &alpha, a.data, la.l, b.data, lb.l, &beta, d.data, ld.l, d.data, ld.l,
                          &found.algo, at::cuda::getCUDABlasLtWorkspace(), ws_size, at::cuda::getCurrentCUDAStream()),
           "matmul");
  return true;
}

// dw [out, in] (row-major) = dy2ᵀ · x2: in cuBLASLt's terms dwᵀ [in, out] = x2ᵀ [in, N] · (dy2ᵀ
// [out, N])ᵀ, so A = x2 (no transpose), B = dy2 (transposed), k = N, and BGRADB reduces op(B)
// over k: one value per column of D, per output feature.
namespace {
struct WgradOperands {
  Matrix a, b, d;
};
WgradOperands wgrad_operands(const at::Tensor& x2, const at::Tensor& dy2, const at::Tensor& dw) {
  const int64_t rows = x2.size(0), in = x2.size(1), out = dy2.size(1);
  const at::ScalarType dt = x2.scalar_type();
  return {Matrix{x2.data_ptr(), dt, in, rows, in, false}, Matrix{dy2.data_ptr(), dt, out, rows, out, true},
          Matrix{dw.data_ptr(), dw.scalar_type(), in, out, in, false}};
}
at::Tensor aten_wgrad(const at::Tensor& x2, const at::Tensor& dy2, at::ScalarType type) {
  return type == x2.scalar_type() ? at::mm(dy2.t(), x2) : at::mm(dy2.t(), x2, type);
}
}  // namespace

WeightGrads weight_grads(const at::Tensor& x2, const at::Tensor& dy2, bool want_w, bool want_b, at::ScalarType type) {
  WeightGrads g;
  if (!want_w) {
    if (want_b) g.db = dy2.sum(0, false, type);
    return g;
  }
  g.dw = at::empty({dy2.size(1), x2.size(1)}, x2.options().dtype(type));
  const WgradOperands m = wgrad_operands(x2, dy2, g.dw);
  if (want_b) {
    g.db = at::empty({dy2.size(1)}, x2.options().dtype(type));
    Epilogue e;
    e.kind = CUBLASLT_EPILOGUE_BGRADB;
    e.bias = g.db.data_ptr();
    e.bias_type = type;
    if (matmul(m.a, m.b, m.d, e)) return g;
    g.db = dy2.sum(0, false, type);
  }
  if (!matmul(m.a, m.b, m.d, Epilogue{})) g.dw = aten_wgrad(x2, dy2, type);  // cuBLASLt offered no algorithm
  return g;
}

void weight_grad_into(const at::Tensor& x2, const at::Tensor& dy2, at::Tensor& dw, bool accumulate) {
  const WgradOperands m = wgrad_operands(x2, dy2, dw);
  if (matmul(m.a, m.b, m.d, Epilogue{}, accumulate)) return;
  const at::Tensor part = aten_wgrad(x2, dy2, dw.scalar_type());
  if (accumulate) {
    dw.add_(part);
  } else {
    dw.copy_(part);
  }
}

}  // namespace tcg::lt
