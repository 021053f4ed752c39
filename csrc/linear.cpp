// The linear layer (CPU and CUDA builds): the C API over the crate's path (cuda/linear_own.cpp:
// bias gradients in the weight-gradient GEMM, float32 weight gradients) and ATen's at::linear for
// every input that path does not take. Both read weight shadows where a step made them.
#include "kernels.h"
#include "linear_own.h"
#include "shadow.h"
#include "shim.h"

#include <memory>

using tcg::guard;
using tcg::misuse;
using tcg::tensor_ref;

extern "C" {

tcg_status tcg_linear_forward(const tcg_linear_inputs* in, tcg_weight_grad wgrad, tcg_kernels kernels,
                              tcg_tensor* out, bool* ran_own) {
  return guard([&] {
    *out = nullptr;
    *ran_own = false;
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
    tcg::linear::Operands ops{x, weight, bias, tcg::shadow::lookup(weight), tcg::shadow::lookup(bias)};
    const bool own = tcg::kernels::own(kernels, "linear", [&] { return tcg::linear::unsupported(ops); });
    at::Tensor y;
    if (own) {
      y = tcg::linear::fused(ops, wgrad == TCG_WEIGHT_GRAD_FP32);
    } else {
      const at::Tensor b = bias.defined() ? tcg::shadow::read(bias) : at::Tensor();
      y = at::linear(x, tcg::shadow::read(weight), b.defined() ? std::optional<at::Tensor>(b) : std::nullopt);
    }
    *out = std::make_unique<at::Tensor>(std::move(y)).release();
    *ran_own = own;
  });
}

}  // extern "C"
