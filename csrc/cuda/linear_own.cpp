// The crate's linear layer path: an autograd function whose forward is one cuBLASLt GEMM on the
// 16-bit operands (weight shadows where a step made them, casts otherwise; the bias in its
// epilogue) and whose backward runs the input-gradient GEMM and computes the weight gradient and
// the bias gradient in one cuBLASLt GEMM (the BGRADB epilogue:
// the bias gradient is the reduction of the output gradient over the GEMM's k dimension, made
// while the GEMM reads it), optionally writing the weight gradient in float32 directly.
#include "../linear_own.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/csrc/autograd/custom_function.h>

#include "cuda_shim.h"
#include "lt_matmul.h"

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

namespace tcg::linear {
namespace {

using tcg::lt::compute_dtype;
using tcg::lt::in_dtype;

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
    std::vector<int64_t> sizes = xc.sizes().vec();
    sizes.back() = wc.size(0);
    const at::Tensor y = tcg::lt::linear(xc.view({-1, xc.size(-1)}), wc.contiguous(), bc).view(sizes);
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
    at::Tensor dx;
    if (ctx->needs_input_grad(0)) dx = tcg::lt::input_grad(dy2, wc.contiguous()).view(xc.sizes()).to(dtype_of("x_dtype"));
    const bool want_w = ctx->needs_input_grad(1), want_b = has_bias && ctx->needs_input_grad(2);
    const at::ScalarType wt = tcg::lt::weight_grad_type(ctx->saved_data.at("fp32_wgrad").toBool(), dtype_of("w_dtype"), dt);
    auto [dw, db] = tcg::lt::weight_grads(x2, dy2, want_w, want_b, wt);
    if (dw.defined()) dw = dw.to(dtype_of("w_dtype"));
    if (db.defined()) db = db.to(dtype_of("b_dtype"));
    return {dx, dw, db, at::Tensor()};
  }
};

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
