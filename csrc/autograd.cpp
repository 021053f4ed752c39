// Autograd helpers (CPU and CUDA): torch::autograd::grad with explicit grad_outputs and
// allow_unused, which tch's C API does not offer. See tcg.h for the contract.
#include "shim.h"

#include <torch/csrc/autograd/autograd.h>

#include <memory>

using namespace tcg;

extern "C" {

tcg_status tcg_autograd_grad(tcg_tensor* outputs, size_t n_out, tcg_tensor* inputs, size_t n_in,
                             tcg_tensor* grad_outputs, bool retain_graph, bool create_graph,
                             bool allow_unused, tcg_tensor* out) {
  return guard([&] {
    for (size_t i = 0; i < n_in; ++i) out[i] = nullptr;
    auto outs = tensor_list(outputs, n_out);
    auto ins = tensor_list(inputs, n_in);
    std::vector<at::Tensor> gouts;
    if (grad_outputs != nullptr) gouts = tensor_list(grad_outputs, n_out);
    auto grads = torch::autograd::grad(outs, ins, gouts, retain_graph, create_graph,
                                       allow_unused);
    if (grads.size() != n_in) misuse("autograd::grad returned a gradient count unlike the inputs'");
    // Hand out only once every handle exists: none is leaked if an allocation throws.
    std::vector<std::unique_ptr<at::Tensor>> made(n_in);
    for (size_t i = 0; i < n_in; ++i) {
      if (grads[i].defined()) made[i] = std::make_unique<at::Tensor>(std::move(grads[i]));
    }
    for (size_t i = 0; i < n_in; ++i) out[i] = made[i].release();
  });
}

}  // extern "C"
