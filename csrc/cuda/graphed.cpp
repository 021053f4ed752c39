// Graphed callables (CUDA builds): the autograd function of PyTorch's make_graphed_callables,
// in C++ (no Python). A tcg_graphed holds the static tensors of one callable whose forward and
// backward were captured as two graphs (by the Rust side, which owns the graphs). Applying it
// runs a custom autograd Function: forward copies the user args into the static inputs, replays
// the forward graph and returns the static outputs detached; backward copies the incoming
// gradients into the static grad outputs, replays the backward graph and returns the static
// grad inputs detached. See tcg.h for the C contract.
//
// Lifetimes: the autograd nodes that apply makes hold the state (a capsule in their context),
// so a backward may run after the owner let go of the handle. The graphs belong to the owner,
// who frees the handle (marking the state dead, under its lock) before it frees the graphs; a
// backward that comes later fails with TCG_MISUSE instead of touching freed graphs.
//
// Gradient buffers: backward returns the static grad inputs without copying them, as PyTorch
// does, so AccumulateGrad steals the buffer of a leaf whose .grad was none (zero_grad with
// set_to_none): that .grad is then the static buffer itself, and the next backward replay would
// overwrite it before accumulating into it (PyTorch's pytorch/pytorch#181723). Here, before a
// backward replay, every leaf input whose .grad shares storage with a static grad buffer of
// this callable gets a private copy of its .grad first. Accumulation over several backwards
// (no zero_grad between them, or zero_grad in place) is therefore exact, and the usual
// set_to_none loop pays no copy.
#include "cuda_shim.h"

#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/variable.h>

#include <memory>
#include <mutex>

using namespace tcg;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

namespace {

struct GraphedState : torch::CustomClassHolder {
  std::mutex mu;
  bool alive = true;
  tcg_graph* fwd = nullptr;
  tcg_graph* bwd = nullptr;              // null when no output required grad at capture
  std::vector<at::Tensor> surface;       // static inputs: the user args, then the parameters
  size_t n_user = 0;
  std::vector<at::Tensor> outputs;       // static outputs (detached)
  std::vector<at::Tensor> grad_outputs;  // per output: its static incoming gradient (undefined:
                                         // the output did not require grad at capture)
  std::vector<at::Tensor> grad_inputs;   // per surface entry: its static gradient, or undefined
  uint64_t generation = 0;               // forward replays so far

  void check_alive() const {
    if (!alive) {
      misuse("graphed callable: it was dropped, and its graphs with it; run backward through its "
             "outputs before dropping it");
    }
  }
};

// If `leaf` is a leaf whose .grad shares storage with `buf`, gives it a private copy of its .grad
// (the next replay writes `buf`).
void unalias_grad(const at::Tensor& leaf, const at::Tensor& buf) {
  if (!leaf.defined() || !buf.defined() || !leaf.requires_grad() || !leaf.is_leaf()) return;
  at::Tensor g = leaf.grad();
  if (g.defined() && g.is_alias_of(buf)) leaf.mutable_grad() = g.clone();
}

struct GraphedFunction : torch::autograd::Function<GraphedFunction> {
  static variable_list forward(AutogradContext* ctx, const c10::intrusive_ptr<GraphedState>& st,
                               at::TensorList inputs) {
    std::lock_guard<std::mutex> lock(st->mu);
    st->check_alive();
    for (size_t i = 0; i < st->n_user; ++i) {
      const at::Tensor& s = st->surface[i];
      if (s.data_ptr() != inputs[i].data_ptr()) s.copy_(inputs[i]);
    }
    replay_graph(st->fwd);
    const uint64_t gen = ++st->generation;
    variable_list outs, nondiff;
    outs.reserve(st->outputs.size());
    for (size_t k = 0; k < st->outputs.size(); ++k) {
      outs.push_back(st->outputs[k].detach());
      if (!st->grad_outputs[k].defined()) nondiff.push_back(outs.back());
    }
    if (!nondiff.empty()) ctx->mark_non_differentiable(nondiff);
    // The user args that are leaves taking a gradient, for unalias_grad before the backward.
    std::vector<at::Tensor> leaves;
    std::vector<int64_t> leaf_index;
    for (size_t i = 0; i < st->n_user; ++i) {
      if (inputs[i].requires_grad() && inputs[i].is_leaf()) {
        leaves.push_back(inputs[i]);
        leaf_index.push_back(static_cast<int64_t>(i));
      }
    }
    ctx->saved_data["state"] =
        c10::IValue::make_capsule(c10::intrusive_ptr<torch::CustomClassHolder>(st));
    ctx->saved_data["generation"] = static_cast<int64_t>(gen);
    ctx->saved_data["leaves"] = c10::IValue(std::move(leaves));
    ctx->saved_data["leaf_index"] = c10::IValue(std::move(leaf_index));
    return outs;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    if (at::GradMode::is_enabled()) {
      misuse("graphed callable: double backward (create_graph) is not supported: its backward "
             "graph computes first-order gradients only");
    }
    auto st = c10::static_intrusive_pointer_cast<GraphedState>(
        ctx->saved_data.at("state").toCapsule());
    const auto gen = static_cast<uint64_t>(ctx->saved_data.at("generation").toInt());
    auto leaves = ctx->saved_data.at("leaves").toTensorVector();
    auto leaf_index = ctx->saved_data.at("leaf_index").toIntVector();
    std::lock_guard<std::mutex> lock(st->mu);
    st->check_alive();
    if (gen != st->generation) {
      misuse("graphed callable: its forward ran " + std::to_string(st->generation - gen) +
             " more time(s) before this backward, and every forward overwrites the activations "
             "the backward graph reads; run backward after each forward (a callable used twice "
             "in one step needs one graphed callable per use)");
    }
    if (st->bwd == nullptr) misuse("graphed callable: no backward graph (no output required grad)");
    if (grads.size() != st->outputs.size()) misuse("graphed callable: gradient count unlike the outputs'");
    for (size_t k = 0; k < grads.size(); ++k) {
      const at::Tensor& buf = st->grad_outputs[k];
      if (!buf.defined()) continue;
      if (!grads[k].defined()) {
        buf.zero_();
      } else if (grads[k].data_ptr() != buf.data_ptr()) {
        buf.copy_(grads[k]);
      }
    }
    for (size_t l = 0; l < leaves.size() && l < leaf_index.size(); ++l) {
      unalias_grad(leaves[l], st->grad_inputs.at(static_cast<size_t>(leaf_index[l])));
    }
    for (size_t j = st->n_user; j < st->surface.size(); ++j) unalias_grad(st->surface[j], st->grad_inputs[j]);
    replay_graph(st->bwd);
    variable_list out;
    out.reserve(1 + st->surface.size());
    out.emplace_back();  // the state argument takes no gradient
    for (const auto& g : st->grad_inputs) out.push_back(g.defined() ? g.detach() : at::Tensor());
    return out;
  }
};

}  // namespace

struct tcg_graphed {
  c10::intrusive_ptr<GraphedState> state;
};

extern "C" {

tcg_status tcg_graphed_new(tcg_graph* fwd, tcg_graph* bwd, tcg_tensor* surface, size_t n_surface,
                           size_t n_user, tcg_tensor* outputs, size_t n_out, tcg_tensor* grad_outputs,
                           tcg_tensor* grad_inputs, tcg_graphed** out) {
  return guard([&] {
    require_cuda();
    if (fwd == nullptr) misuse("graphed callable: no forward graph");
    if (n_user > n_surface) misuse("graphed callable: more user args than static inputs");
    auto st = c10::make_intrusive<GraphedState>();
    st->fwd = fwd;
    st->surface = tensor_list(surface, n_surface);
    st->n_user = n_user;
    st->outputs = tensor_list(outputs, n_out);
    bool any_grad = false;
    for (size_t k = 0; k < n_out; ++k) {
      st->grad_outputs.push_back(tcg::tensor_or_undefined(grad_outputs[k]));
      any_grad = any_grad || st->grad_outputs.back().defined();
    }
    for (size_t j = 0; j < n_surface; ++j) st->grad_inputs.push_back(tcg::tensor_or_undefined(grad_inputs[j]));
    if (any_grad && bwd == nullptr) misuse("graphed callable: outputs require grad but there is no backward graph");
    st->bwd = any_grad ? bwd : nullptr;
    *out = new tcg_graphed{std::move(st)};
  });
}

void tcg_graphed_free(tcg_graphed* g) {
  if (g == nullptr) return;
  try {
    {
      std::lock_guard<std::mutex> lock(g->state->mu);
      g->state->alive = false;
      g->state->fwd = nullptr;
      g->state->bwd = nullptr;
    }
    delete g;
  } catch (...) {
  }
}

tcg_status tcg_graphed_apply(tcg_graphed* g, tcg_tensor* inputs, size_t n, tcg_tensor* out, size_t n_out) {
  return guard([&] {
    for (size_t k = 0; k < n_out; ++k) out[k] = nullptr;
    const auto& st = g->state;
    if (n != st->surface.size()) {
      misuse("graphed callable: " + std::to_string(n) + " inputs given, " +
             std::to_string(st->surface.size()) + " expected (user args, then parameters)");
    }
    if (n_out != st->outputs.size()) misuse("graphed callable: output slots unlike the outputs");
    auto ins = tensor_list(inputs, n);
    variable_list outs = GraphedFunction::apply(st, at::TensorList(ins));
    std::vector<std::unique_ptr<at::Tensor>> made(n_out);
    for (size_t k = 0; k < n_out; ++k) made[k] = std::make_unique<at::Tensor>(std::move(outs[k]));
    for (size_t k = 0; k < n_out; ++k) out[k] = made[k].release();
  });
}

}  // extern "C"
