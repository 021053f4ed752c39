// The linear layer (CPU and CUDA builds): the C API over the crate's path (cuda/linear_own.cpp:
// bias gradients in the weight-gradient GEMM, float32 weight gradients) and ATen's at::linear for
// every input that path does not take. Both read weight shadows where a step made them.
#include "kernels.h"
#include "linear_own.h"
#include "shadow.h"
#include "shim.h"

#include <algorithm>
#include <memory>
#include <vector>

using tcg::guard;
using tcg::misuse;
using tcg::tensor_ref;

namespace {

// The operands of a call, checked (misuse otherwise), with their shadows.
tcg::linear::Operands operands(const tcg_linear_inputs* in, tcg_weight_grad wgrad) {
  if (in == nullptr) misuse("linear: null inputs");
  if (wgrad != TCG_WEIGHT_GRAD_ROUNDED && wgrad != TCG_WEIGHT_GRAD_FP32) misuse("linear: unknown weight-gradient mode");
  const at::Tensor& x = tensor_ref(in->x);
  const at::Tensor& weight = tensor_ref(in->weight);
  const at::Tensor bias = tcg::tensor_or_undefined(in->bias);
  if (weight.dim() != 2) misuse("linear: the weight must be a matrix [out, in]");
  if (x.dim() < 1 || x.size(-1) != weight.size(1)) {
    misuse("linear: the input's last dimension (" + std::to_string(x.dim() < 1 ? 0 : x.size(-1)) +
           ") differs from the weight's in (" + std::to_string(weight.size(1)) + ")");
  }
  if (bias.defined() && (bias.dim() != 1 || bias.size(0) != weight.size(0))) {
    misuse("linear: the bias must be a vector of the weight's out (" + std::to_string(weight.size(0)) + ")");
  }
  const at::Tensor grad_to = tcg::tensor_or_undefined(in->weight_grad_to);
  if (grad_to.defined() && (grad_to.sizes() != weight.sizes() || grad_to.scalar_type() != weight.scalar_type() ||
                            grad_to.device() != weight.device())) {
    misuse("linear: weight_grad_to must be the weight's tie (its shape, dtype and device)");
  }
  return {x, weight, bias, tcg::shadow::lookup(weight), tcg::shadow::lookup(bias), grad_to};
}

// ATen's linear on the operands, reading the shadows.
at::Tensor aten_linear(const tcg::linear::Operands& ops) {
  const at::Tensor b = ops.bias.defined() ? tcg::shadow::read(ops.bias) : at::Tensor();
  return at::linear(ops.x, tcg::shadow::read(ops.weight), b.defined() ? std::optional<at::Tensor>(b) : std::nullopt);
}

}  // namespace

extern "C" {

tcg_status tcg_linear_forward(const tcg_linear_inputs* in, tcg_weight_grad wgrad, tcg_kernels kernels,
                              tcg_tensor* out, bool* ran_own) {
  return guard([&] {
    *out = nullptr;
    *ran_own = false;
    const tcg::linear::Operands ops = operands(in, wgrad);
    const bool own = tcg::kernels::own(kernels, "linear", [&] { return tcg::linear::unsupported(ops); });
    at::Tensor y = own ? tcg::linear::fused(ops, wgrad == TCG_WEIGHT_GRAD_FP32) : aten_linear(ops);
    *out = std::make_unique<at::Tensor>(std::move(y)).release();
    *ran_own = own;
  });
}

tcg_status tcg_linear_split(const tcg_linear_inputs* in, int64_t parts, tcg_weight_grad wgrad, tcg_kernels kernels,
                            tcg_tensor* outs, bool* ran_own) {
  return guard([&] {
    if (outs == nullptr) misuse("linear split: null outputs");
    if (parts < 1 || parts > TCG_LINEAR_MAX_PARTS) {
      misuse("linear split: " + std::to_string(parts) + " pieces (1 to " + std::to_string(TCG_LINEAR_MAX_PARTS) + ")");
    }
    std::fill(outs, outs + parts, nullptr);
    *ran_own = false;
    const tcg::linear::Operands ops = operands(in, wgrad);
    if (ops.grad_to.defined()) misuse("linear split: a weight_grad_to is not taken here");
    if (ops.weight.size(0) % parts != 0) {
      misuse("linear split: the output's width (" + std::to_string(ops.weight.size(0)) + ") is not a multiple of " +
             std::to_string(parts) + " pieces");
    }
    const bool own = tcg::kernels::own(kernels, "linear", [&] {
      std::string why = tcg::linear::unsupported(ops);
      return why.empty() ? tcg::linear::split_unsupported(ops, parts) : why;
    });
    std::vector<at::Tensor> pieces;
    if (own) {
      pieces = tcg::linear::fused_split(ops, wgrad == TCG_WEIGHT_GRAD_FP32, parts);
    } else {
      pieces = aten_linear(ops).split(ops.weight.size(0) / parts, -1);
    }
    std::vector<std::unique_ptr<at::Tensor>> made;
    for (auto& p : pieces) made.push_back(std::make_unique<at::Tensor>(std::move(p)));
    for (int64_t i = 0; i < parts; ++i) outs[i] = made[static_cast<size_t>(i)].release();
    *ran_own = own;
  });
}

}  // extern "C"
