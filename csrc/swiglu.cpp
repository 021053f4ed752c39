// SwiGLU (CPU and CUDA builds): the C API over the crate's kernels (cuda/swiglu_own.cpp) and
// ATen's composition, silu(gate) · up, for every input they do not take.
#include "kernels.h"
#include "shim.h"
#include "swiglu_own.h"

#include <memory>

using tcg::guard;
using tcg::misuse;
using tcg::tensor_ref;

extern "C" {

tcg_status tcg_swiglu(tcg_tensor h_handle, tcg_kernels kernels, tcg_tensor* out, bool* ran_own) {
  return guard([&] {
    *out = nullptr;
    *ran_own = false;
    const at::Tensor& h = tensor_ref(h_handle);
    if (h.dim() < 1 || h.size(-1) % 2 != 0) misuse("swiglu: the last dimension must be even ([gate | up])");
    if (!at::isFloatingType(h.scalar_type())) misuse("swiglu: the input must be floating point");
    const bool own = tcg::kernels::own(kernels, "swiglu", [&] { return tcg::swiglu::unsupported(h); });
    at::Tensor y;
    if (own) {
      y = tcg::swiglu::fused(h);
    } else {
      const auto parts = h.chunk(2, -1);
      y = at::silu(parts[0]) * parts[1];
    }
    *out = std::make_unique<at::Tensor>(std::move(y)).release();
    *ran_own = own;
  });
}

}  // extern "C"
