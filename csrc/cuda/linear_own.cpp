// The crate's linear layer path: an autograd function whose forward is ATen's at::linear on the
// 16-bit operands (weight shadows where a step made them, casts otherwise) and whose backward
// computes the weight gradient and the bias gradient in one cuBLASLt GEMM (the BGRADB epilogue:
// the bias gradient is the reduction of the output gradient over the GEMM's k dimension, made
// while the GEMM reads it), optionally writing the weight gradient in float32 directly.
#include "../linear_own.h"

#include <ATen/autocast_mode.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <cublasLt.h>
#include <torch/csrc/autograd/custom_function.h>

#include "cuda_shim.h"

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

namespace tcg::linear {
namespace {

bool is_16bit(at::ScalarType t) { return t == at::kBFloat16 || t == at::kHalf; }

cudaDataType_t cuda_type(at::ScalarType t) {
  switch (t) {
    case at::kBFloat16: return CUDA_R_16BF;
    case at::kHalf: return CUDA_R_16F;
    default: return CUDA_R_32F;
  }
}

void check_lt(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) {
    throw tcg::exception(TCG_ERROR, std::string("linear: cuBLASLt ") + what + " failed with status " + std::to_string(static_cast<int>(s)));
  }
}

// The cuBLASLt descriptors of one call, destroyed with it.
struct MatmulDesc {
  cublasLtMatmulDesc_t d = nullptr;
  MatmulDesc() { check_lt(cublasLtMatmulDescCreate(&d, CUBLAS_COMPUTE_32F, CUDA_R_32F), "matmul descriptor"); }
  ~MatmulDesc() { (void)cublasLtMatmulDescDestroy(d); }
  template <class T>
  void set(cublasLtMatmulDescAttributes_t a, const T& v) {
    check_lt(cublasLtMatmulDescSetAttribute(d, a, &v, sizeof(v)), "matmul attribute");
  }
};

struct Layout {
  cublasLtMatrixLayout_t l = nullptr;
  Layout(at::ScalarType t, int64_t rows, int64_t cols, int64_t ld) {
    check_lt(cublasLtMatrixLayoutCreate(&l, cuda_type(t), static_cast<uint64_t>(rows), static_cast<uint64_t>(cols), ld),
             "matrix layout");
  }
  ~Layout() { (void)cublasLtMatrixLayoutDestroy(l); }
};

struct Preference {
  cublasLtMatmulPreference_t p = nullptr;
  Preference() { check_lt(cublasLtMatmulPreferenceCreate(&p), "preference"); }
  ~Preference() { (void)cublasLtMatmulPreferenceDestroy(p); }
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

// dw [out, in] (row-major) = dy2ᵀ · x2 and, with db, db [out] = the column sums of dy2, in one
// cuBLASLt GEMM: in cuBLASLt's column-major terms dwᵀ [in, out] = x2ᵀ [in, N] · (dy2ᵀ [out, N])ᵀ,
// so A = x2 (no transpose), B = dy2 (transposed), k = N, and BGRADB reduces op(B) over k: one
// value per column of D, per output feature. Returns false, having launched nothing, where
// cuBLASLt offers no algorithm.
bool wgrad_gemm(const at::Tensor& x2, const at::Tensor& dy2, at::Tensor& dw, at::Tensor* db) {
  const int64_t rows = x2.size(0), in = x2.size(1), out = dy2.size(1);
  const at::ScalarType dt = x2.scalar_type();
  MatmulDesc desc;
  desc.set(CUBLASLT_MATMUL_DESC_TRANSA, static_cast<int32_t>(CUBLAS_OP_N));
  desc.set(CUBLASLT_MATMUL_DESC_TRANSB, static_cast<int32_t>(CUBLAS_OP_T));
  if (db != nullptr) {
    desc.set(CUBLASLT_MATMUL_DESC_EPILOGUE, static_cast<uint32_t>(CUBLASLT_EPILOGUE_BGRADB));
    desc.set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, db->data_ptr());
    desc.set(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, static_cast<int32_t>(cuda_type(db->scalar_type())));
  }
  Layout a(dt, in, rows, in), b(dt, out, rows, out), d(dw.scalar_type(), in, out, in);
  const size_t ws_size = at::cuda::getCUDABlasLtWorkspaceSize();
  Preference pref;
  pref.set(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, static_cast<uint64_t>(ws_size));
  pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, alignment(x2.data_ptr()));
  pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, alignment(dy2.data_ptr()));
  pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, alignment(dw.data_ptr()));
  pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, alignment(dw.data_ptr()));
  cublasLtHandle_t handle = at::cuda::getCurrentCUDABlasLtHandle();
  cublasLtMatmulHeuristicResult_t found{};
  int n = 0;
  if (cublasLtMatmulAlgoGetHeuristic(handle, desc.d, a.l, b.l, d.l, d.l, pref.p, 1, &found, &n) != CUBLAS_STATUS_SUCCESS ||
      n == 0) {
    return false;
  }
  const float alpha = 1.0f, beta = 0.0f;
  check_lt(cublasLtMatmul(handle, desc.d, &alpha, x2.data_ptr(), a.l, dy2.data_ptr(), b.l, &beta, dw.data_ptr(), d.l,
                          dw.data_ptr(), d.l, &found.algo, at::cuda::getCUDABlasLtWorkspace(), ws_size,
                          at::cuda::getCurrentCUDAStream()),
           "matmul");
  return true;
}

// An operand in the compute dtype: the shadow when there is one, else a cast (as autocast's).
at::Tensor in_dtype(const at::Tensor& t, const at::Tensor& shadow, at::ScalarType dt) {
  if (!t.defined()) return t;
  if (shadow.defined()) return shadow;
  return t.scalar_type() == dt ? t : t.to(dt);
}

// The non-tensor arguments: autograd's Function does not track them.
struct Args {
  at::Tensor shadow_w, shadow_b;
  at::ScalarType dt;
  bool fp32_wgrad;
};

struct FusedLinear : torch::autograd::Function<FusedLinear> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                               const std::optional<at::Tensor>& bias_arg, Args args) {
    const at::Tensor bias = bias_arg.value_or(at::Tensor());
    c10::cuda::CUDAGuard guard(x.device());
    const at::Tensor xc = in_dtype(x, at::Tensor(), args.dt).contiguous();
    const at::Tensor wc = in_dtype(weight, args.shadow_w, args.dt);
    const at::Tensor bc = in_dtype(bias, args.shadow_b, args.dt);
    at::Tensor y = at::linear(xc, wc, bc.defined() ? std::optional<at::Tensor>(bc) : std::nullopt);
    ctx->save_for_backward({xc, wc});
    ctx->saved_data["has_bias"] = bias.defined();
    ctx->saved_data["fp32_wgrad"] = args.fp32_wgrad;
    ctx->saved_data["x_dtype"] = static_cast<int64_t>(x.scalar_type());
    ctx->saved_data["w_dtype"] = static_cast<int64_t>(weight.scalar_type());
    ctx->saved_data["b_dtype"] = static_cast<int64_t>(bias.defined() ? bias.scalar_type() : at::kFloat);
    return {y};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    if (at::GradMode::is_enabled()) misuse("linear: double backward (create_graph) is not supported");
    auto saved = ctx->get_saved_variables();
    const at::Tensor &xc = saved[0], &wc = saved[1];
    const bool has_bias = ctx->saved_data.at("has_bias").toBool();
    const auto dtype_of = [&](const char* key) { return static_cast<at::ScalarType>(ctx->saved_data.at(key).toInt()); };
    const at::ScalarType dt = xc.scalar_type();
    at::Tensor dy = grads.at(0);
    if (!dy.defined()) return {at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
    c10::cuda::CUDAGuard guard(xc.device());
    const int64_t in = wc.size(1), out = wc.size(0);
    const at::Tensor dy2 = dy.to(dt).contiguous().view({-1, out});
    const at::Tensor x2 = xc.view({-1, in});
    at::Tensor dx, dw, db;
    if (ctx->needs_input_grad(0)) dx = at::mm(dy2, wc).view(xc.sizes()).to(dtype_of("x_dtype"));
    const bool want_w = ctx->needs_input_grad(1), want_b = has_bias && ctx->needs_input_grad(2);
    // float32 weight gradients only for float32 parameters (a 16-bit parameter takes its own dtype)
    const at::ScalarType wt = ctx->saved_data.at("fp32_wgrad").toBool() && dtype_of("w_dtype") == at::kFloat ? at::kFloat : dt;
    if (want_w) {
      dw = at::empty({out, in}, xc.options().dtype(wt));
      bool made_db = false;
      if (want_b) {
        db = at::empty({out}, xc.options().dtype(wt));
        made_db = wgrad_gemm(x2, dy2, dw, &db);
      }
      if (!made_db && !wgrad_gemm(x2, dy2, dw, nullptr)) {
        dw = wt == dt ? at::mm(dy2.t(), x2) : at::mm(dy2.t(), x2, wt);  // cuBLASLt offered no algorithm
      }
      if (!made_db) db = at::Tensor();
      dw = dw.to(dtype_of("w_dtype"));
    }
    if (want_b && !db.defined()) db = dy2.sum(0, false, wt);
    if (db.defined()) db = db.to(dtype_of("b_dtype"));
    return {dx, dw, db, at::Tensor()};
  }
};

// The 16-bit dtype the GEMMs run in for these operands (CUDA autocast's, or x's and weight's when
// both are bfloat16 or float16), or Undefined when there is none.
at::ScalarType compute_dtype(const at::Tensor& x, const at::Tensor& weight) {
  if (x.is_cuda() && at::autocast::is_autocast_enabled(at::kCUDA)) {
    const at::ScalarType t = at::autocast::get_autocast_dtype(at::kCUDA);
    return is_16bit(t) ? t : at::ScalarType::Undefined;
  }
  if (is_16bit(x.scalar_type()) && x.scalar_type() == weight.scalar_type()) return x.scalar_type();
  return at::ScalarType::Undefined;
}

}  // namespace

std::string unsupported(const Operands& in) {
  if (!in.x.is_cuda() || !in.weight.is_cuda()) return "the input or the weight is not on a CUDA device";
  if (in.weight.device() != in.x.device() || (in.bias.defined() && in.bias.device() != in.x.device())) {
    return "the input, weight and bias are on different devices";
  }
  const at::ScalarType dt = compute_dtype(in.x, in.weight);
  if (dt == at::ScalarType::Undefined) {
    return "no 16-bit compute dtype (CUDA autocast is off and the input and weight are not both bfloat16 or float16)";
  }
  for (const at::Tensor* t : {&in.x, &in.weight, &in.bias}) {
    if (t->defined() && t->scalar_type() != at::kFloat && t->scalar_type() != dt) {
      return std::string("an operand of dtype ") + c10::toString(t->scalar_type()) + " (float32 or " + c10::toString(dt) +
             " only)";
    }
  }
  if (in.x.numel() == 0 || in.weight.numel() == 0) return "an empty input or weight";
  if (!tcg::cublaslt_loaded()) return "libcublasLt is not loaded in this process";
  return "";
}

at::Tensor fused(const Operands& in, bool fp32_wgrad) {
  const at::ScalarType dt = compute_dtype(in.x, in.weight);
  auto opt = [](const at::Tensor& t) { return t.defined() ? std::optional<at::Tensor>(t) : std::nullopt; };
  return FusedLinear::apply(in.x, in.weight, opt(in.bias), Args{in.shadow_w, in.shadow_b, dt, fp32_wgrad})[0];
}

}  // namespace tcg::linear
