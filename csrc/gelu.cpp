// Bias + GELU (CPU and CUDA builds): the C API over the crate's kernels (cuda/gelu_own.cpp) and
// ATen's composition, gelu(x + bias) cast to x's dtype, for every input they do not take.
#include "gelu_own.h"
#include "kernels.h"
#include "shim.h"

#include <memory>

using tcg::guard;
using tcg::misuse;
using tcg::tensor_ref;

extern "C" {

tcg_status tcg_gelu(tcg_tensor x_handle, tcg_tensor bias_handle, tcg_gelu_form form, tcg_kernels kernels,
                    tcg_tensor* out, bool* ran_own) {
  return guard([&] {
    *out = nullptr;
    *ran_own = false;
    const at::Tensor& x = tensor_ref(x_handle);
    const at::Tensor bias = tcg::tensor_or_undefined(bias_handle);
    if (form != TCG_GELU_ERF && form != TCG_GELU_TANH) misuse("gelu: unknown form");
    if (x.dim() < 1) misuse("gelu: the input needs at least one dimension");
    if (!at::isFloatingType(x.scalar_type())) misuse("gelu: the input must be floating point");
    if (bias.defined()) {
      if (bias.dim() != 1 || bias.size(0) != x.size(-1)) {
        misuse("gelu: the input's last dimension (dimension " + std::to_string(x.dim() - 1) + ", size " +
               std::to_string(x.size(-1)) + ") differs from the bias's size (" + std::to_string(bias.numel()) + ")");
      }
      if (!at::isFloatingType(bias.scalar_type())) misuse("gelu: the bias must be floating point");
      if (bias.device() != x.device()) misuse("gelu: the bias is on another device than the input");
    }
    const bool tanh = form == TCG_GELU_TANH;
    const bool own = tcg::kernels::own(kernels, "gelu", [&] { return tcg::gelu::unsupported(x, bias); });
    at::Tensor y;
    if (own) {
      y = tcg::gelu::fused(x, bias, tanh);
    } else {
      y = at::gelu(bias.defined() ? x + bias : x, tanh ? "tanh" : "none");
      if (y.scalar_type() != x.scalar_type()) y = y.to(x.scalar_type());
    }
    *out = std::make_unique<at::Tensor>(std::move(y)).release();
    *ran_own = own;
  });
}

}  // extern "C"
