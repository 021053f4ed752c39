// The MLPs with their activation in their GEMMs' epilogues (CPU and CUDA builds): the C API over
// the crate's path (cuda/mlp_own.cpp) and ATen's composition, linear, gelu (or silu and mul),
// linear, for every input that path does not take. Both read weight shadows where a step made
// them.
#include "kernels.h"
#include "mlp_own.h"
#include "shadow.h"
#include "shim.h"

#include <memory>

using tcg::guard;
using tcg::misuse;
using tcg::tensor_ref;

namespace {

void check_layer(const char* name, const at::Tensor& w, const at::Tensor& b, int64_t in) {
  const std::string layer = std::string("mlp: ") + name;
  if (w.dim() != 2) misuse(layer + "'s weight must be a matrix [out, in]");
  if (w.size(1) != in) {
    misuse(layer + "'s weight takes " + std::to_string(w.size(1)) + " features, its input has " + std::to_string(in));
  }
  if (b.defined() && (b.dim() != 1 || b.size(0) != w.size(0))) {
    misuse(layer + "'s bias must be a vector of its weight's out (" + std::to_string(w.size(0)) + ")");
  }
}

std::optional<at::Tensor> read_bias(const at::Tensor& b) {
  return b.defined() ? std::optional<at::Tensor>(tcg::shadow::read(b)) : std::nullopt;
}

// The operands of either MLP, checked: x's last dimension feeds fc, fc's output (or its half, for
// SwiGLU's [gate | up]) feeds proj.
tcg::mlp::Operands read_operands(const tcg_mlp_inputs* in, bool gated) {
  if (in == nullptr) misuse("mlp: null inputs");
  const at::Tensor& x = tensor_ref(in->x);
  const at::Tensor& fc_w = tensor_ref(in->fc_weight);
  const at::Tensor& proj_w = tensor_ref(in->proj_weight);
  const at::Tensor fc_b = tcg::tensor_or_undefined(in->fc_bias), proj_b = tcg::tensor_or_undefined(in->proj_bias);
  if (x.dim() < 1) misuse("mlp: the input needs at least one dimension");
  check_layer("fc", fc_w, fc_b, x.size(-1));
  if (gated && fc_w.size(0) % 2 != 0) misuse("mlp: fc's out must be even ([gate | up])");
  check_layer("proj", proj_w, proj_b, gated ? fc_w.size(0) / 2 : fc_w.size(0));
  using tcg::shadow::lookup;
  return {x, fc_w, fc_b, proj_w, proj_b, lookup(fc_w), lookup(fc_b), lookup(proj_w), lookup(proj_b)};
}

void check_wgrad(tcg_weight_grad wgrad) {
  if (wgrad != TCG_WEIGHT_GRAD_ROUNDED && wgrad != TCG_WEIGHT_GRAD_FP32) misuse("mlp: unknown weight-gradient mode");
}

}  // namespace

extern "C" {

tcg_status tcg_mlp_gelu(const tcg_mlp_inputs* in, tcg_gelu_form form, tcg_weight_grad wgrad, tcg_kernels kernels,
                        tcg_tensor* out, bool* ran_own) {
  return guard([&] {
    *out = nullptr;
    *ran_own = false;
    check_wgrad(wgrad);
    if (form != TCG_GELU_ERF && form != TCG_GELU_TANH) misuse("mlp: unknown GELU form");
    const bool tanh = form == TCG_GELU_TANH;
    const tcg::mlp::Operands ops = read_operands(in, false);
    const bool own = tcg::kernels::own(kernels, "mlp", [&] { return tcg::mlp::unsupported(ops, tanh); });
    at::Tensor y;
    if (own) {
      y = tcg::mlp::gelu(ops, tanh, wgrad == TCG_WEIGHT_GRAD_FP32);
    } else {
      const at::Tensor h =
          at::gelu(at::linear(ops.x, tcg::shadow::read(ops.fc_w), read_bias(ops.fc_b)), tanh ? "tanh" : "none");
      y = at::linear(h, tcg::shadow::read(ops.proj_w), read_bias(ops.proj_b));
    }
    *out = std::make_unique<at::Tensor>(std::move(y)).release();
    *ran_own = own;
  });
}

tcg_status tcg_mlp_swiglu(const tcg_mlp_inputs* in, tcg_weight_grad wgrad, tcg_kernels kernels, tcg_tensor* out,
                          bool* ran_own) {
  return guard([&] {
    *out = nullptr;
    *ran_own = false;
    check_wgrad(wgrad);
    const tcg::mlp::Operands ops = read_operands(in, true);
    const bool own = tcg::kernels::own(kernels, "mlp", [&] { return tcg::mlp::unsupported_swiglu(ops); });
    at::Tensor y;
    if (own) {
      y = tcg::mlp::swiglu(ops, wgrad == TCG_WEIGHT_GRAD_FP32);
    } else {
      const auto parts = at::linear(ops.x, tcg::shadow::read(ops.fc_w), read_bias(ops.fc_b)).chunk(2, -1);
      y = at::linear(at::silu(parts[0]) * parts[1], tcg::shadow::read(ops.proj_w), read_bias(ops.proj_b));
    }
    *out = std::make_unique<at::Tensor>(std::move(y)).release();
    *ran_own = own;
  });
}

}  // extern "C"
