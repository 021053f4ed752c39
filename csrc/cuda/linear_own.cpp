// The crate's linear layer path: an autograd function whose forward is one cuBLASLt GEMM on the
// 16-bit operands (weight shadows where a step made them, casts otherwise; the bias in its
// epilogue) and whose backward runs the input-gradient GEMM and computes the weight gradient and
// the bias gradient in one cuBLASLt GEMM (the BGRADB epilogue:
// the bias gradient is the reduction of the output gradient over the GEMM's k dimension, made
// while the GEMM reads it), optionally writing the weight gradient in float32 directly; and the
// split of its output into views whose gradients one kernel packs back, summing the bias
// gradient on the way (linear_kernels.cu).
#include "../linear_own.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>

#include "../kernels.h"
#include "col_sum.h"
#include "cuda_shim.h"
#include "linear_params.h"
#include "lt_matmul.h"
#include "own_kernels.h"

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
  // grad_to: where the weight's gradient goes instead of `weight` (a tied embedding's alias).
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                               const std::optional<at::Tensor>& bias_arg, const std::optional<at::Tensor>& grad_to,
                               Args args) {
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
    ctx->saved_data["grad_to"] = grad_to.has_value() && grad_to->defined();
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
    if (!dy.defined()) return {at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
    c10::cuda::CUDAGuard guard(xc.device());
    const int64_t in = wc.size(1), out = wc.size(0);
    const at::Tensor dy2 = dy.to(dt).contiguous().view({-1, out});
    const at::Tensor x2 = xc.view({-1, in});
    // needs_input_grad counts the tensors given (an absent bias is not one)
    const bool tied = ctx->saved_data.at("grad_to").toBool();
    const bool want_w = ctx->needs_input_grad(tied ? (has_bias ? 3 : 2) : 1);
    const bool want_b = has_bias && ctx->needs_input_grad(2);
    const at::ScalarType wt = tcg::lt::weight_grad_type(ctx->saved_data.at("fp32_wgrad").toBool(), dtype_of("w_dtype"), dt);
    auto [dx, dw, db] = tcg::lt::linear_grads(x2, wc.contiguous(), dy2, ctx->needs_input_grad(0), want_w, want_b, wt);
    if (dx.defined()) dx = dx.view(xc.sizes()).to(dtype_of("x_dtype"));
    if (dw.defined()) dw = dw.to(dtype_of("w_dtype"));
    if (db.defined()) db = db.to(dtype_of("b_dtype"));
    if (tied) return {dx, at::Tensor(), db, dw, at::Tensor()};
    return {dx, dw, db, at::Tensor(), at::Tensor()};
  }
};

// The split's launch shape for a packed row of `cols` values (linear_params.h): tiles of `lanes`
// threads across the columns, rows_per_block rows of them a block.
struct SplitShape {
  int64_t tiles, lanes, rows_per_block;
};

SplitShape split_shape(int64_t cols) {
  const int64_t groups = cols / kSplitValues;
  const int64_t tiles = (groups + kSplitMaxLanes - 1) / kSplitMaxLanes;
  const int64_t lanes = 32 * (((groups + tiles - 1) / tiles + 31) / 32);
  return {tiles, lanes, std::max<int64_t>(1, kSplitMaxThreads / lanes)};
}

// The pieces of a linear layer's output as views; backward, their gradients packed into the
// output's and the bias gradient summed, in one pass and a small finishing kernel.
struct PackedSplit : torch::autograd::Function<PackedSplit> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& y, const std::optional<at::Tensor>& bias_arg,
                               int64_t parts, bool fp32_wgrad) {
    const at::Tensor bias = bias_arg.value_or(at::Tensor());
    ctx->saved_data["sizes"] = y.sizes().vec();
    ctx->saved_data["dtype"] = static_cast<int64_t>(y.scalar_type());
    ctx->saved_data["device"] = static_cast<int64_t>(y.get_device());
    ctx->saved_data["b_dtype"] = static_cast<int64_t>(bias.defined() ? bias.scalar_type() : at::kFloat);
    ctx->saved_data["parts"] = parts;
    ctx->saved_data["fp32_wgrad"] = fp32_wgrad;
    return y.split(y.size(-1) / parts, -1);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    if (at::GradMode::is_enabled()) misuse("linear split: double backward (create_graph) is not supported");
    const std::vector<int64_t> sizes = ctx->saved_data.at("sizes").toIntVector();
    const auto dtype_of = [&](const char* key) { return static_cast<at::ScalarType>(ctx->saved_data.at(key).toInt()); };
    const at::ScalarType dt = dtype_of("dtype");
    const int device = static_cast<int>(ctx->saved_data.at("device").toInt());
    const int64_t parts = ctx->saved_data.at("parts").toInt();
    const bool want_b = ctx->needs_input_grad(1);
    const auto none = variable_list{at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
    if (std::none_of(grads.begin(), grads.end(), [](const at::Tensor& g) { return g.defined(); })) return none;
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
    const auto options = at::TensorOptions().dtype(dt).device(at::kCUDA, static_cast<c10::DeviceIndex>(device));
    const int64_t cols = sizes.back(), w = cols / parts, rows = cols == 0 ? 0 : c10::multiply_integers(sizes) / cols;
    at::Tensor packed = at::empty(sizes, options);
    at::Tensor db = want_b ? at::empty({cols}, options.dtype(at::kFloat)) : at::Tensor();
    SplitBackward p{};
    std::vector<at::Tensor> held(static_cast<size_t>(parts));
    for (int64_t i = 0; i < parts; ++i) {
      const at::Tensor& g = grads.at(static_cast<size_t>(i));
      if (!g.defined()) continue;
      held[i] = g.to(dt).contiguous();
      if (!own::aligned16(held[i])) held[i] = held[i].clone();
      p.grad[i] = held[i].data_ptr();
    }
    if (rows == 0) {
      if (want_b) db.zero_();
    } else {
      const SplitShape shape = split_shape(cols);
      const unsigned threads = static_cast<unsigned>(shape.lanes * shape.rows_per_block);
      const std::string name = own::split_kernel(dt);
      const int64_t per_block = shape.rows_per_block * kSplitMinRows;
      const int64_t most = std::clamp<int64_t>((rows + per_block - 1) / per_block, 1, 65535);
      const int64_t wave = own::sm_count(device) * own::resident_blocks(name, device, threads);
      const int64_t splits = std::clamp<int64_t>((wave + shape.tiles - 1) / shape.tiles, 1, most);
      at::Tensor part = want_b ? at::empty({splits, cols}, options.dtype(at::kFloat)) : at::Tensor();
      p.packed = packed.data_ptr();
      p.part = want_b ? part.data_ptr<float>() : nullptr;
      p.rows = rows;
      p.w = static_cast<int32_t>(w);
      p.parts = static_cast<int32_t>(parts);
      p.lanes = static_cast<int32_t>(shape.lanes);
      own::launch(name, device, dim3(static_cast<unsigned>(shape.tiles), static_cast<unsigned>(splits)), threads, &p);
      if (want_b) {
        SplitFinish fin{{part.data_ptr<float>()}, {db.data_ptr<float>()}, static_cast<int32_t>(splits),
                        static_cast<int32_t>(cols)};
        own::launch("tcg_split_finish", device,
                    static_cast<unsigned>((cols + cuda::kColSumCols - 1) / cuda::kColSumCols), cuda::kColSumThreads,
                    &fin);
      }
    }
    // the bias gradient as the GEMM's epilogue would give it: rounded to the compute dtype
    // first unless the layer writes float32 gradients
    if (want_b && !ctx->saved_data.at("fp32_wgrad").toBool()) db = db.to(dt);
    if (want_b) db = db.to(dtype_of("b_dtype"));
    return {packed, db, at::Tensor(), at::Tensor()};
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
  return FusedLinear::apply(in.x, in.weight, opt(in.bias), opt(in.grad_to),
                            Args{in.shadow_w, in.shadow_b, dt, fp32_wgrad})[0];
}

std::string split_unsupported(const Operands& in, int64_t parts) {
  const at::ScalarType dt = compute_dtype(in.x, in.weight);
  if (!own::split_builds(dt)) return std::string("the split's kernel is not built for ") + c10::toString(dt);
  if (parts > kSplitMaxParts) return "more than " + std::to_string(kSplitMaxParts) + " pieces";
  if ((in.weight.size(0) / parts) % kSplitValues != 0) {
    return "the pieces' width (" + std::to_string(in.weight.size(0) / parts) + ") is not a multiple of " +
           std::to_string(kSplitValues);
  }
  return kernels::unavailable(in.x.get_device());
}

std::vector<at::Tensor> fused_split(const Operands& in, bool fp32_wgrad, int64_t parts) {
  // the GEMM adds the bias but leaves its gradient to the split's backward
  Operands gemm = in;
  if (in.bias.defined()) gemm.bias = in.bias.detach();
  const at::Tensor y = fused(gemm, fp32_wgrad);
  const auto bias = in.bias.defined() ? std::optional<at::Tensor>(in.bias) : std::nullopt;
  return PackedSplit::apply(y, bias, parts, fp32_wgrad);
}

}  // namespace tcg::linear
