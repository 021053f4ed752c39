// Weight shadows (CPU and CUDA builds): sets of low-precision copies of float32 CUDA parameters,
// each set owned by its handle (no registry), refreshed by one multi-tensor copy
// (`_foreach_copy_`) of the parameters whose shadow is stale, and read by the linear layer
// (linear.cpp) instead of autocast's per-use cast while the set is active on the thread. libtorch's own
// autocast cache cannot be filled from outside (its map is private), and it must be off inside a
// captured graph; a shadow is a cast cache that lives across replays. The shadow of a parameter
// is attached to autograd by ShadowFunction, whose backward is the cast's (the gradient cast back
// to the parameter's dtype), so a step reading shadows equals the step casting at each use, bit
// for bit.
#include "shadow.h"
#include "shim.h"

#include <ATen/autocast_mode.h>
#include <torch/csrc/autograd/custom_function.h>

#include <map>
#include <memory>
#include <unordered_map>
#include <vector>

using tcg::guard;
using tcg::misuse;
using tcg::tensor_ref;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

namespace {

// A set of shadows: each float32 CUDA parameter given, its copy in one dtype. Owned by its
// tcg_shadows handles and by the thread that reads it while active, so freeing a handle never
// leaves a reader with a dangling set.
struct Set {
  at::ScalarType dtype;
  std::vector<at::Tensor> params, shadows;                // in the order given
  std::unordered_map<const c10::TensorImpl*, size_t> index;  // parameter -> its place
  // What each shadow holds: its parameter's version and data pointer then (`set_data` replaces
  // the data without a new version).
  std::vector<std::pair<int64_t, const void*>> held;
  // Whether a layer asked for each shadow (tcg::shadow::lookup) since the set was made.
  std::vector<char> asked;
  // Shadows dropped by tcg_shadows_keep_asked, kept allocated while the set lives: a graph
  // captured before may still write them.
  std::vector<at::Tensor> retired;
};

std::pair<int64_t, const void*> version_of(const at::Tensor& t) {
  return {static_cast<int64_t>(t._version()), t.const_data_ptr()};
}

// Whether shadow k no longer holds its parameter.
bool stale(const Set& set, size_t k) { return version_of(set.params[k]) != set.held[k]; }

// Where `param` is in `set` (set.params.size(): not there).
size_t place_of(const Set& set, const at::Tensor& param) {
  if (!param.defined()) return set.params.size();
  auto it = set.index.find(param.unsafeGetTensorImpl());
  return it == set.index.end() ? set.params.size() : it->second;
}

// The shadow of `param` in `set` (undefined: it has none).
at::Tensor shadow_in(const Set& set, const at::Tensor& param) {
  const size_t k = place_of(set, param);
  return k < set.shadows.size() ? set.shadows[k] : at::Tensor();
}

}  // namespace

struct tcg_shadows {
  std::shared_ptr<Set> set;
};

namespace {

// The set tcg_linear_forward reads on this thread (none: null).
thread_local std::shared_ptr<Set> active;

// The shadow of `param` in the active set, if it has one (marked as asked for); a set of
// another dtype than autocast's is refused rather than passed over.
at::Tensor shadow_of(const at::Tensor& param, at::ScalarType dtype) {
  if (!active) return at::Tensor();
  if (active->dtype != dtype) {
    misuse(std::string("weight shadows are ") + c10::toString(active->dtype) + " but CUDA autocast runs " +
           c10::toString(dtype) + ": make them in the autocast dtype");
  }
  const size_t k = place_of(*active, param);
  if (k >= active->shadows.size()) return at::Tensor();
  active->asked[k] = 1;
  return active->shadows[k];
}

// The shadow, passed to ShadowFunction as a plain value: not an autograd input.
struct ShadowRef {
  at::Tensor t;
};

// The shadow as a differentiable stand-in for the parameter: forward hands out a new handle on
// the shadow's storage (no kernel), backward casts the gradient back, as autocast's cast would.
struct ShadowFunction : torch::autograd::Function<ShadowFunction> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& param, ShadowRef shadow) {
    ctx->saved_data["dtype"] = static_cast<int64_t>(param.scalar_type());
    return {shadow.t.detach()};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto dtype = static_cast<at::ScalarType>(ctx->saved_data.at("dtype").toInt());
    at::Tensor g = grads.at(0);
    return {g.defined() ? g.to(dtype) : g, at::Tensor()};
  }
};

}  // namespace

namespace tcg::shadow {

at::Tensor lookup(const at::Tensor& param) {
  if (!param.defined() || !active || !param.is_cuda() || !at::autocast::is_autocast_enabled(at::kCUDA)) return at::Tensor();
  return shadow_of(param, at::autocast::get_autocast_dtype(at::kCUDA));
}

at::Tensor read(const at::Tensor& param) {
  at::Tensor s = lookup(param);
  if (!s.defined()) return param;
  if (!at::GradMode::is_enabled() || !param.requires_grad()) return s.detach();
  return ShadowFunction::apply(param, ShadowRef{s})[0];
}

std::vector<at::Tensor> of(const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> out;
  if (!active) return out;
  bool any = false;
  for (const auto& p : params) {
    out.push_back(shadow_in(*active, p));
    any = any || out.back().defined();
  }
  if (!any) out.clear();
  return out;
}

void written(const std::vector<at::Tensor>& params) {
  if (!active) return;
  for (const auto& p : params) {
    const size_t k = place_of(*active, p);
    if (k < active->held.size()) active->held[k] = version_of(p);
  }
}

}  // namespace tcg::shadow

extern "C" {

tcg_status tcg_shadows_new(tcg_tensors params, tcg_dtype dtype, tcg_shadows** out, size_t* count) {
  return guard([&] {
    *out = nullptr;
    *count = 0;
    if (dtype != TCG_DTYPE_HALF && dtype != TCG_DTYPE_BFLOAT16) misuse("weight shadows: dtype must be Half or BFloat16");
    auto set = std::make_shared<Set>();
    set->dtype = static_cast<at::ScalarType>(dtype);
    auto ps = tcg::tensor_list(params);
    for (const auto& p : ps) {
      if (tcg::capturing_on(p)) misuse("weight shadows: make them outside a capture");
    }
    at::NoGradGuard no_grad;
    for (const auto& p : ps) {
      if (!p.defined() || !p.is_cuda() || p.scalar_type() != at::kFloat || p.is_inference()) continue;
      if (!set->index.emplace(p.unsafeGetTensorImpl(), set->params.size()).second) continue;  // given twice
      set->params.push_back(p);  // the parameter itself: a later set_data is followed
      set->shadows.push_back(p.detach().to(set->dtype).contiguous().view(p.sizes()));
      set->held.push_back(version_of(p));
      set->asked.push_back(0);
    }
    *count = set->params.size();
    *out = new tcg_shadows{std::move(set)};
  });
}

void tcg_shadows_free(tcg_shadows* s) { delete s; }

tcg_status tcg_shadows_refresh(tcg_shadows* s) {
  return guard([&] {
    if (s == nullptr) misuse("weight shadows: null handle");
    Set& set = *s->set;
    std::map<int, std::pair<std::vector<at::Tensor>, std::vector<at::Tensor>>> by_device;
    std::vector<size_t> copied;
    for (size_t k = 0; k < set.params.size(); ++k) {
      if (!stale(set, k)) continue;
      auto& [dst, src] = by_device[set.params[k].get_device()];
      dst.push_back(set.shadows[k]);
      src.push_back(set.params[k].detach());
      copied.push_back(k);
    }
    at::NoGradGuard no_grad;
    for (auto& [device, lists] : by_device) at::_foreach_copy_(lists.first, lists.second);
    for (size_t k : copied) set.held[k] = version_of(set.params[k]);
  });
}

tcg_status tcg_shadows_stale(tcg_shadows* s, size_t* count) {
  return guard([&] {
    *count = 0;
    if (s == nullptr) misuse("weight shadows: null handle");
    const Set& set = *s->set;
    for (size_t k = 0; k < set.params.size(); ++k) *count += stale(set, k) ? 1 : 0;
  });
}

tcg_status tcg_shadows_keep_asked(tcg_shadows* s, size_t* count) {
  return guard([&] {
    *count = 0;
    if (s == nullptr) misuse("weight shadows: null handle");
    if (active == s->set) misuse("weight shadows: keep the asked-for shadows while the set is not read");
    Set& set = *s->set;
    Set kept;
    kept.dtype = set.dtype;
    kept.retired = std::move(set.retired);
    for (size_t k = 0; k < set.params.size(); ++k) {
      if (!set.asked[k]) {
        kept.retired.push_back(std::move(set.shadows[k]));
        continue;
      }
      kept.index.emplace(set.params[k].unsafeGetTensorImpl(), kept.params.size());
      kept.params.push_back(std::move(set.params[k]));
      kept.shadows.push_back(std::move(set.shadows[k]));
      kept.held.push_back(set.held[k]);
      kept.asked.push_back(1);
    }
    set = std::move(kept);
    *count = set.params.size();
  });
}

tcg_status tcg_shadows_activate(tcg_shadows* s, tcg_shadows** previous) {
  return guard([&] {
    *previous = active ? new tcg_shadows{active} : nullptr;
    active = s == nullptr ? nullptr : s->set;
  });
}

}  // extern "C"
