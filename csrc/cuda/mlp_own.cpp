// The crate's MLP with GELU in the GEMMs' epilogues: an autograd function whose forward runs fc's
// GEMM with the bias added and GELU applied to the float32 accumulators (keeping GELU's input, or
// its derivative) and proj's GEMM, and whose backward runs proj's input-gradient GEMM with GELU's
// derivative applied, and the weight-gradient GEMMs of linear_own.cpp. No GELU kernel
// runs either way. The tanh form: cuBLASLt's GELU_AUX_BIAS and DGELU epilogues, fc's bias gradient
// in its weight-gradient GEMM's BGRADB epilogue (where cuBLASLt offers no algorithm for an
// epilogue, ATen's GEMM and GELU, or GELU backward and sum, run instead, on the same saved
// tensors). The exact form: CUTLASS's GEMMs (gelu_gemm.h): the forward keeps GELU's derivative
// (float16) instead of its input, the backward multiplies by it and sums fc's bias gradient.
// And the SwiGLU MLP, w2(silu(gate) · up) with [gate | up] = w13(x): the forward runs w13's GEMM
// in two halves, SwiGLU's forward in the up half's epilogue (CUTLASS's, swiglu_gemm.h; or w13's
// GEMM and swiglu_kernels.cu's forward), then w2's GEMM; the backward w2's input-gradient GEMM
// with SwiGLU's backward in its epilogue (the same file's), writing [dgate | dup] with no dh
// between.
#include "../mlp_own.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/csrc/autograd/custom_function.h>

#include "../kernels.h"
#include "../linear_own.h"
#include "../swiglu_own.h"
#include "cuda_shim.h"
#include "col_sum.h"
#include "gelu_gemm.h"
#include "gelu_params.h"
#include "lt_matmul.h"
#include "own_kernels.h"
#include "swiglu_gemm.h"

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

namespace tcg::mlp {
namespace {

using tcg::lt::compute_dtype;
using tcg::lt::in_dtype;

// h [N, H] = gelu_tanh(x2 [N, C] · fcᵀ + bias) with `pre` [N, H] = its input, in fc's forward
// GEMM (the GELU_AUX_BIAS epilogue).
bool forward_gemm(const at::Tensor& x2, const at::Tensor& fc, const at::Tensor& bias, at::Tensor& pre, at::Tensor& h) {
  tcg::lt::Epilogue e;
  e.kind = bias.defined() ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
  if (bias.defined()) {
    e.bias = bias.data_ptr();
    e.bias_type = bias.scalar_type();
  }
  e.aux = pre.data_ptr();
  e.aux_ld = fc.size(0);
  return tcg::lt::forward(x2, fc, h, e);
}

// dpre [N, H] = (dy2 [N, C'] · proj [C', H]) ⊙ gelu_tanh'(pre) in proj's input-gradient GEMM.
// (DGELU, not DGELU_BGRAD: cuBLASLt 13 on sm_90 sums DGELU_BGRAD's bias gradient in a separate
// pass that takes 3.5 times the GEMM; fc's weight-gradient GEMM sums it instead, in its BGRADB
// epilogue.)
bool backward_gemm(const at::Tensor& dy2, const at::Tensor& proj, const at::Tensor& pre, at::Tensor& dpre) {
  tcg::lt::Epilogue e;
  e.kind = CUBLASLT_EPILOGUE_DGELU;
  e.aux = pre.data_ptr();
  e.aux_ld = proj.size(1);
  return tcg::lt::input_gradient(dy2, proj, dpre, e);
}

// h [N, H] = gelu(z), z = x2 [N, C] · fcᵀ + bias, with `grad` [N, H] (float16) = gelu'(z), in
// CUTLASS's GEMM (gelu_gemm.h: the float32 bias, GELU's exact form). False where that GEMM does
// not take these operands (a view not 16-byte aligned): nothing ran.
bool exact_forward_gemm(const at::Tensor& x2, const at::Tensor& fc, const at::Tensor& bias, at::Tensor& grad,
                        at::Tensor& h) {
#ifdef TCG_CUTLASS_GEMMS
  const at::Tensor b = bias.defined() ? bias.to(at::kFloat).contiguous() : at::Tensor();
  const tcg::gelu_gemm::Forward a{x2.data_ptr(), fc.data_ptr(), b.defined() ? b.data_ptr<float>() : nullptr,
                                  grad.data_ptr(), h.data_ptr(), static_cast<int32_t>(x2.size(0)),
                                  static_cast<int32_t>(fc.size(0)), static_cast<int32_t>(fc.size(1))};
  if (*tcg::gelu_gemm::unsupported(a) != '\0') return false;
  const int device = x2.get_device();
  check_cuda(tcg::gelu_gemm::forward(a, static_cast<int>(own::sm_count(device)),
                                     at::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device)).stream()),
             "mlp: the GEMM with GELU in its epilogue");
  return true;
#else
  (void)x2, (void)fc, (void)bias, (void)grad, (void)h;
  return false;
#endif
}

// dpre [N, H] = (dy2 [N, C'] · proj [C', H]) ⊙ grad (exact_forward_gemm's) and, where `dbias` is
// defined (float32 [H]), fc's bias gradient, in CUTLASS's GEMM. False as exact_forward_gemm's.
bool exact_backward_gemm(const at::Tensor& dy2, const at::Tensor& proj, const at::Tensor& grad, at::Tensor& dpre,
                         at::Tensor& dbias) {
#ifdef TCG_CUTLASS_GEMMS
  const int32_t h = static_cast<int32_t>(proj.size(1));
  tcg::gelu_gemm::Backward a{dy2.data_ptr(), proj.data_ptr(), grad.data_ptr(), dpre.data_ptr(), nullptr,
                             static_cast<int32_t>(dy2.size(0)), h, static_cast<int32_t>(proj.size(0))};
  at::Tensor part;
  if (dbias.defined()) {
    part = at::empty({tcg::gelu_gemm::backward_partial_rows(a), h}, dy2.options().dtype(at::kFloat));
    a.partials = part.data_ptr<float>();
  }
  if (*tcg::gelu_gemm::unsupported(a) != '\0') return false;
  const int device = dy2.get_device();
  check_cuda(tcg::gelu_gemm::backward(a, static_cast<int>(own::sm_count(device)),
                                      at::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device)).stream()),
             "mlp: the GEMM with GELU's derivative in its epilogue");
  if (part.defined()) {  // the partials' column sums, in a fixed order (gelu_kernels.cu's finish)
    tcg::gelu::Finish fin{{part.data_ptr<float>()}, {dbias.data_ptr<float>()}, static_cast<int32_t>(part.size(0)), h};
    own::launch("tcg_gelu_finish", device, static_cast<unsigned>((h + cuda::kColSumCols - 1) / cuda::kColSumCols),
                cuda::kColSumThreads, &fin);
  }
  return true;
#else
  (void)dy2, (void)proj, (void)grad, (void)dpre, (void)dbias;
  return false;
#endif
}

// [gate | up] [N, 2F] = x2 [N, C] · w13ᵀ and h [N, F] = silu(gate) · up, with SwiGLU's forward in
// the up half's GEMM (CUTLASS's, swiglu_gemm.h) after the gate half's (cuBLASLt's, into [gate |
// up]'s first half): no pass of its own reads [gate | up] back, and h is the SwiGLU forward
// kernel's on the same bf16 values. False where either GEMM does not take these operands (as
// swiglu_backward_gemm's, or cuBLASLt offering no algorithm for the gate half): nothing ran.
bool swiglu_forward_gemm(const at::Tensor& x2, const at::Tensor& w13, at::Tensor& ab, at::Tensor& h) {
#ifdef TCG_CUTLASS_GEMMS
  const int device = x2.get_device();
  if (x2.scalar_type() != at::kBFloat16 || !own::cutlass_gemms_unavailable(device).empty()) return false;
  const int64_t n = x2.size(0), c = x2.size(1), f = w13.size(0) / 2;
  // checked before the outputs are made (new tensors, aligned: null passes the check)
  tcg::swiglu_gemm::Forward a{x2.data_ptr(),           w13.narrow(0, f, f).data_ptr(), nullptr,
                              nullptr,                 static_cast<int32_t>(n),        static_cast<int32_t>(f),
                              static_cast<int32_t>(c)};
  if (*tcg::swiglu_gemm::unsupported(a) != '\0') return false;
  at::Tensor ab_out = at::empty({n, 2 * f}, x2.options()), h_out = at::empty({n, f}, x2.options());
  a.ab = ab_out.data_ptr();
  a.h = h_out.data_ptr();
  // gate [N, F] = x2 · w13[:F]ᵀ: in cuBLASLt's terms gateᵀ [F, N] with a leading dimension of 2F
  using tcg::lt::Matrix;
  const at::ScalarType dt = x2.scalar_type();
  if (!tcg::lt::matmul(Matrix{w13.data_ptr(), dt, c, f, c, true}, Matrix{x2.data_ptr(), dt, c, n, c, false},
                       Matrix{ab_out.data_ptr(), dt, f, n, 2 * f, false}, tcg::lt::Epilogue{})) {
    return false;
  }
  check_cuda(tcg::swiglu_gemm::forward(a, static_cast<int>(own::sm_count(device)),
                                       at::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device)).stream()),
             "mlp: the GEMM with SwiGLU's forward in its epilogue");
  ab = ab_out;
  h = h_out;
  return true;
#else
  (void)x2, (void)w13, (void)ab, (void)h;
  return false;
#endif
}

// [dgate | dup] [N, 2F] from dy2 [N, C'] through w2 [C', F] and SwiGLU at `ab` [N, 2F] = [gate |
// up], in CUTLASS's GEMM (swiglu_gemm.h). False where that GEMM does not take these operands
// (not bf16, not sm_90, built without CUTLASS, a view not 16-byte aligned): nothing ran.
bool swiglu_backward_gemm(const at::Tensor& dy2, const at::Tensor& w2, const at::Tensor& ab, at::Tensor& dab) {
#ifdef TCG_CUTLASS_GEMMS
  const int device = dy2.get_device();
  if (ab.scalar_type() != at::kBFloat16 || !own::cutlass_gemms_unavailable(device).empty()) return false;
  const tcg::swiglu_gemm::Backward a{dy2.data_ptr(), w2.data_ptr(), ab.data_ptr(), dab.data_ptr(),
                                     static_cast<int32_t>(dy2.size(0)), static_cast<int32_t>(w2.size(1)),
                                     static_cast<int32_t>(w2.size(0))};
  if (*tcg::swiglu_gemm::unsupported(a) != '\0') return false;
  check_cuda(tcg::swiglu_gemm::backward(a, static_cast<int>(own::sm_count(device)),
                                        at::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device)).stream()),
             "mlp: the GEMM with SwiGLU's backward in its epilogue");
  return true;
#else
  (void)dy2, (void)w2, (void)ab, (void)dab;
  return false;
#endif
}

// The non-tensor arguments: autograd's Function does not track them.
struct Args {
  at::Tensor shadow_fc_w, shadow_fc_b, shadow_proj_w, shadow_proj_b;
  at::ScalarType dt;
  bool fp32_wgrad;
  bool tanh;  // GELU's tanh form (cuBLASLt), else the exact one (CUTLASS)
};

std::optional<at::Tensor> opt(const at::Tensor& t) { return t.defined() ? std::optional<at::Tensor>(t) : std::nullopt; }

// What both MLPs' autograd nodes keep: x2, fc's weight, what the activation's backward reads
// (`act`), h and proj's weight, and beside them which biases there are, the weight-gradient
// mode, the arguments' dtypes and x's sizes.
void save_layers(AutogradContext* ctx, const Operands& p, bool fp32_wgrad, std::initializer_list<at::Tensor> kept) {
  ctx->save_for_backward(kept);
  ctx->saved_data["fc_bias"] = p.fc_b.defined();
  ctx->saved_data["proj_bias"] = p.proj_b.defined();
  ctx->saved_data["fp32_wgrad"] = fp32_wgrad;
  ctx->saved_data["x_dtype"] = static_cast<int64_t>(p.x.scalar_type());
  ctx->saved_data["fc_w_dtype"] = static_cast<int64_t>(p.fc_w.scalar_type());
  ctx->saved_data["fc_b_dtype"] = static_cast<int64_t>(p.fc_b.defined() ? p.fc_b.scalar_type() : at::kFloat);
  ctx->saved_data["proj_w_dtype"] = static_cast<int64_t>(p.proj_w.scalar_type());
  ctx->saved_data["proj_b_dtype"] = static_cast<int64_t>(p.proj_b.defined() ? p.proj_b.scalar_type() : at::kFloat);
  ctx->saved_data["x_sizes"] = p.x.sizes().vec();
}

// What both forwards' GEMMs read: x2 [N, C] and the two weights, in the compute dtype (the
// weights' shadows where a step made them), contiguous.
struct LayersInput {
  at::Tensor x2, wfc, wproj;
  LayersInput(const at::Tensor& x, const at::Tensor& fc_w, const at::Tensor& proj_w, const Args& args)
      : x2(in_dtype(x, at::Tensor(), args.dt).contiguous().view({-1, fc_w.size(1)})),
        wfc(in_dtype(fc_w, args.shadow_fc_w, args.dt).contiguous()),
        wproj(in_dtype(proj_w, args.shadow_proj_w, args.dt).contiguous()) {}
};

// y [.., C'] from y2 [N, C'], shaped as x.
at::Tensor shaped_as_x(const at::Tensor& y2, const at::Tensor& x) {
  std::vector<int64_t> sizes = x.sizes().vec();
  sizes.back() = y2.size(1);
  return y2.view(sizes);
}

// The backward both MLPs share around their activation's: at construction the checks, the device
// and proj's weight and bias gradients from h and dy; then, given dpre (the gradient of fc's output), fc's and x's in
// finish(). One result per forward argument (x, fc's weight and bias, proj's weight and bias);
// needs_input_grad counts the tensors given (an absent bias has no index).
struct LayersBackward {
  AutogradContext* ctx;
  c10::cuda::OptionalCUDAGuard guard;
  at::Tensor x2, wfc, act, h, wproj, dy2;
  variable_list out = variable_list(6);
  bool want_fc_bias = false;

  LayersBackward(AutogradContext* c, const at::Tensor& dy) : ctx(c) {
    if (at::GradMode::is_enabled()) misuse("mlp: double backward (create_graph) is not supported");
    if (!dy.defined()) return;
    guard.set_device(dy.device());
    auto saved = ctx->get_saved_variables();
    x2 = saved[0], wfc = saved[1], act = saved[2], h = saved[3], wproj = saved[4];
    dy2 = dy.to(x2.scalar_type()).contiguous().view({-1, wproj.size(0)});
    const bool fc_bias = flag("fc_bias"), proj_bias = flag("proj_bias");
    const size_t proj_w_at = fc_bias ? 3 : 2;
    want_fc_bias = fc_bias && ctx->needs_input_grad(2);
    const bool want_pb = proj_bias && ctx->needs_input_grad(proj_w_at + 1);
    auto proj = tcg::lt::weight_grads(h, dy2, ctx->needs_input_grad(proj_w_at), want_pb, grad_type("proj_w_dtype"));
    if (proj.dw.defined()) out[3] = proj.dw.to(dtype_of("proj_w_dtype"));
    if (proj.db.defined()) out[4] = proj.db.to(dtype_of("proj_b_dtype"));
  }

  bool flag(const char* key) const { return ctx->saved_data.at(key).toBool(); }
  at::ScalarType dtype_of(const char* key) const { return static_cast<at::ScalarType>(ctx->saved_data.at(key).toInt()); }
  at::ScalarType grad_type(const char* param) const {
    return tcg::lt::weight_grad_type(flag("fp32_wgrad"), dtype_of(param), x2.scalar_type());
  }
  // Whether `out` is complete already: no gradient came, or nothing before the activation wants
  // one.
  bool done() const {
    return !dy2.defined() || !(ctx->needs_input_grad(0) || ctx->needs_input_grad(1) || want_fc_bias);
  }

  // fc's weight gradient (and its bias gradient in the same GEMM where `bias_in_gemm`; else
  // `dbias`, summed by the caller, where defined) and x's gradient from dpre.
  variable_list finish(const at::Tensor& dpre, bool bias_in_gemm, const at::Tensor& dbias) {
    auto fc = tcg::lt::linear_grads(x2, wfc, dpre, ctx->needs_input_grad(0), ctx->needs_input_grad(1), bias_in_gemm,
                                    grad_type("fc_w_dtype"));
    if (fc.dw.defined()) out[1] = fc.dw.to(dtype_of("fc_w_dtype"));
    if (fc.db.defined()) out[2] = fc.db.to(dtype_of("fc_b_dtype"));
    if (dbias.defined()) out[2] = dbias.to(dtype_of("fc_b_dtype"));
    if (fc.dx2.defined()) out[0] = fc.dx2.view(ctx->saved_data.at("x_sizes").toIntVector()).to(dtype_of("x_dtype"));
    return out;
  }
};

struct GeluMlp : torch::autograd::Function<GeluMlp> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& fc_w,
                               const std::optional<at::Tensor>& fc_b_arg, const at::Tensor& proj_w,
                               const std::optional<at::Tensor>& proj_b_arg, Args args) {
    const at::Tensor fc_b = fc_b_arg.value_or(at::Tensor()), proj_b = proj_b_arg.value_or(at::Tensor());
    c10::cuda::CUDAGuard guard(x.device());
    const at::ScalarType dt = args.dt;
    const auto [x2, wfc, wproj] = LayersInput(x, fc_w, proj_w, args);
    at::Tensor h = at::empty({x2.size(0), fc_w.size(0)}, x2.options());
    // what the backward reads: GELU's input, or (the exact form in CUTLASS's GEMM, `kept_grad`)
    // GELU's derivative
    at::Tensor pre;
    bool kept_grad = false;
    if (args.tanh) {
      // the bias in the compute dtype, as at::linear's under autocast (cuBLASLt 13 takes no
      // float32 bias beside a 16-bit output)
      const at::Tensor bfc = in_dtype(fc_b, args.shadow_fc_b, dt);
      pre = at::empty_like(h);
      if (!forward_gemm(x2, wfc, bfc, pre, h)) {
        pre = at::linear(x2, wfc, opt(bfc));
        h = at::gelu(pre, "tanh");
      }
    } else {
      pre = at::empty_like(h, h.options().dtype(at::kHalf));
      kept_grad = exact_forward_gemm(x2, wfc, fc_b, pre, h);  // the float32 bias itself
      if (!kept_grad) {
        pre = at::linear(x2, wfc, opt(fc_b.defined() ? fc_b.to(dt) : fc_b));
        h = at::gelu(pre);
      }
    }
    const at::Tensor y2 = tcg::lt::linear(h, wproj, in_dtype(proj_b, args.shadow_proj_b, dt));
    save_layers(ctx, {x, fc_w, fc_b, proj_w, proj_b}, args.fp32_wgrad, {x2, wfc, pre, h, wproj});
    ctx->saved_data["tanh"] = args.tanh;
    ctx->saved_data["kept_grad"] = kept_grad;
    return {shaped_as_x(y2, x)};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    LayersBackward b(ctx, grads.at(0));
    if (b.done()) return b.out;
    // through GELU: dpre in proj's input-gradient GEMM
    const at::Tensor &pre = b.act, &dy2 = b.dy2, &wproj = b.wproj;
    const at::ScalarType dt = b.x2.scalar_type();
    at::Tensor dpre = at::empty(pre.sizes(), b.x2.options());
    const bool tanh = b.flag("tanh");
    at::Tensor dbias;  // fc's, from the exact form's GEMM
    if (tanh) {
      if (!backward_gemm(dy2, wproj, pre, dpre)) dpre = at::gelu_backward(at::mm(dy2, wproj), pre, "tanh");
    } else {
      if (b.want_fc_bias) dbias = at::empty({pre.size(1)}, pre.options().dtype(at::kFloat));
      const bool kept_grad = b.flag("kept_grad");
      if (!kept_grad || !exact_backward_gemm(dy2, wproj, pre, dpre, dbias)) {
        const at::Tensor dh = at::mm(dy2, wproj).to(at::kFloat);
        const at::Tensor d = kept_grad ? dh * pre.to(at::kFloat) : at::gelu_backward(dh, pre.to(at::kFloat));
        dpre = d.to(dt);
        if (b.want_fc_bias) dbias = d.sum(0);
      }
    }
    // fc: the tanh form's bias gradient in its weight-gradient GEMM, the exact form's in dbias
    return b.finish(dpre, b.want_fc_bias && tanh, dbias);
  }
};

// w2(swiglu(w13(x))), fc = w13 [2F, C] and proj = w2 [C', F]. Saves x, w13, [gate | up], SwiGLU's
// output and w2: what the three layers apart would save.
struct SwiGluMlp : torch::autograd::Function<SwiGluMlp> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& fc_w,
                               const std::optional<at::Tensor>& fc_b_arg, const at::Tensor& proj_w,
                               const std::optional<at::Tensor>& proj_b_arg, Args args) {
    const at::Tensor fc_b = fc_b_arg.value_or(at::Tensor()), proj_b = proj_b_arg.value_or(at::Tensor());
    c10::cuda::CUDAGuard guard(x.device());
    const at::ScalarType dt = args.dt;
    const auto [x2, w13, w2] = LayersInput(x, fc_w, proj_w, args);
    const at::Tensor fc_bias = in_dtype(fc_b, args.shadow_fc_b, dt);
    at::Tensor ab, h;  // [gate | up] and SwiGLU's output: in two GEMMs, or a GEMM and the kernel
    if (fc_bias.defined() || !swiglu_forward_gemm(x2, w13, ab, h)) {
      ab = tcg::lt::linear(x2, w13, fc_bias);
      h = tcg::swiglu::forward_kernel(ab);
    }
    const at::Tensor y2 = tcg::lt::linear(h, w2, in_dtype(proj_b, args.shadow_proj_b, dt));
    save_layers(ctx, {x, fc_w, fc_b, proj_w, proj_b}, args.fp32_wgrad, {x2, w13, ab, h, w2});
    return {shaped_as_x(y2, x)};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    LayersBackward b(ctx, grads.at(0));
    if (b.done()) return b.out;
    // through w2 and SwiGLU: [dgate | dup] in w2's input-gradient GEMM, or that GEMM's dh and
    // SwiGLU's backward kernel
    at::Tensor dab = at::empty_like(b.act);
    if (!swiglu_backward_gemm(b.dy2, b.wproj, b.act, dab)) {
      dab = tcg::swiglu::backward_kernel(b.act, tcg::lt::input_grad(b.dy2, b.wproj));
    }
    return b.finish(dab, b.want_fc_bias, at::Tensor());
  }
};

// Why either MLP's path cannot take its two layers (the linear layer's conditions), or "".
std::string layers_unsupported(const Operands& in) {
  for (const tcg::linear::Operands& layer :
       {tcg::linear::Operands{in.x, in.fc_w, in.fc_b, {}, {}}, tcg::linear::Operands{in.x, in.proj_w, in.proj_b, {}, {}}}) {
    std::string why = tcg::linear::unsupported(layer);
    if (!why.empty()) return why;
  }
  return "";
}

}  // namespace

std::string unsupported(const Operands& in, bool tanh) {
  if (std::string why = layers_unsupported(in); !why.empty()) return why;
  if (in.fc_w.size(0) % 8 != 0) {
    return "a hidden width of " + std::to_string(in.fc_w.size(0)) + " (the GELU epilogues need a multiple of 8)";
  }
  if (tanh) return "";
  const std::string why = own::cutlass_gemms_unavailable(in.x.get_device());
  if (!why.empty()) return "GELU's exact form in the GEMMs' epilogues: " + why;
  if (compute_dtype(in.x, in.fc_w) != at::kBFloat16) return "GELU's exact form in the GEMMs' epilogues: bf16 only";
  if (in.fc_w.size(1) % 8 != 0 || in.proj_w.size(0) % 8 != 0) {
    return "GELU's exact form in the GEMMs' epilogues: widths that are multiples of 8";
  }
  return "";
}

std::string unsupported_swiglu(const Operands& in) {
  if (std::string why = layers_unsupported(in); !why.empty()) return why;
  if (in.proj_w.size(1) % 4 != 0) {
    return "a hidden width of " + std::to_string(in.proj_w.size(1)) + " (SwiGLU's kernels need a multiple of 4)";
  }
  if (!own::swiglu_builds(compute_dtype(in.x, in.fc_w))) return "SwiGLU's kernels are not built for this dtype";
  return kernels::unavailable(in.x.get_device());
}

at::Tensor gelu(const Operands& in, bool tanh, bool fp32_wgrad) {
  const at::ScalarType dt = compute_dtype(in.x, in.fc_w);
  Args args{in.shadow_fc_w, in.shadow_fc_b, in.shadow_proj_w, in.shadow_proj_b, dt, fp32_wgrad, tanh};
  return GeluMlp::apply(in.x, in.fc_w, opt(in.fc_b), in.proj_w, opt(in.proj_b), args)[0];
}

at::Tensor swiglu(const Operands& in, bool fp32_wgrad) {
  const at::ScalarType dt = compute_dtype(in.x, in.fc_w);
  Args args{in.shadow_fc_w, in.shadow_fc_b, in.shadow_proj_w, in.shadow_proj_b, dt, fp32_wgrad, false};
  return SwiGluMlp::apply(in.x, in.fc_w, opt(in.fc_b), in.proj_w, opt(in.proj_b), args)[0];
}

}  // namespace tcg::mlp
