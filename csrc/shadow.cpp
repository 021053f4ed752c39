// Weight shadows (CPU and CUDA builds): a low-precision copy of each registered float32 CUDA
// parameter, refreshed by one multi-tensor copy (`_foreach_copy_`) at the start of each step that
// asks for them, and read by the linear layer (linear.cpp) instead of autocast's per-use cast. libtorch's own
// autocast cache cannot be filled from outside (its map is private), and it must be off inside a
// captured graph; a shadow is a cast cache that lives across replays. The shadow of a parameter
// is attached to autograd by ShadowFunction, whose backward is the cast's (the gradient cast back
// to the parameter's dtype), so a step reading shadows equals the step casting at each use, bit
// for bit.
#include "shadow.h"
#include "shim.h"

#include <ATen/autocast_mode.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <vector>

using tcg::guard;
using tcg::misuse;
using tcg::tensor_ref;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

namespace {

struct Entry {
  at::Tensor param;
  at::Tensor shadow;
  uint64_t order;  // registration order: refreshes walk the entries in it
};

std::mutex mu;
std::map<const c10::TensorImpl*, Entry>& entries() {
  static auto* m = new std::map<const c10::TensorImpl*, Entry>();  // never destroyed
  return *m;
}
uint64_t next_order = 0;
thread_local bool active = false;

// The shadow of `param` in `dtype`, if it has one.
at::Tensor shadow_of(const at::Tensor& param, at::ScalarType dtype) {
  if (!param.defined()) return at::Tensor();
  std::lock_guard<std::mutex> lock(mu);
  auto it = entries().find(param.unsafeGetTensorImpl());
  if (it == entries().end() || it->second.shadow.scalar_type() != dtype) return at::Tensor();
  return it->second.shadow;
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

}  // namespace tcg::shadow

extern "C" {

tcg_status tcg_shadow_register(tcg_tensors params, tcg_dtype dtype, size_t* made) {
  return guard([&] {
    *made = 0;
    if (dtype != TCG_DTYPE_HALF && dtype != TCG_DTYPE_BFLOAT16) misuse("weight shadows: dtype must be Half or BFloat16");
    const auto st = static_cast<at::ScalarType>(dtype);
    auto ps = tcg::tensor_list(params);
    for (const auto& p : ps) {
      if (tcg::capturing_on(p)) misuse("weight shadows: make them outside a capture");
    }
    at::NoGradGuard no_grad;
    std::lock_guard<std::mutex> lock(mu);
    for (const auto& p : ps) {
      if (!p.defined() || !p.is_cuda() || p.scalar_type() != at::kFloat) continue;
      auto& e = entries()[p.unsafeGetTensorImpl()];
      if (e.shadow.defined() && e.shadow.scalar_type() == st) continue;
      e = Entry{p, p.detach().to(st).contiguous().view(p.sizes()), next_order++};
      ++*made;
    }
  });
}

tcg_status tcg_shadow_unregister(tcg_tensors params) {
  return guard([&] {
    auto ps = tcg::tensor_list(params);
    std::lock_guard<std::mutex> lock(mu);
    for (const auto& p : ps) {
      if (p.defined()) entries().erase(p.unsafeGetTensorImpl());
    }
  });
}

tcg_status tcg_shadow_refresh(size_t* refreshed) {
  return guard([&] {
    *refreshed = 0;
    std::map<std::pair<int, int>, std::vector<std::pair<uint64_t, Entry>>> by;  // (device, dtype)
    {
      std::lock_guard<std::mutex> lock(mu);
      for (const auto& [impl, e] : entries()) by[{e.param.get_device(), static_cast<int>(e.shadow.scalar_type())}].push_back({e.order, e});
    }
    at::NoGradGuard no_grad;
    for (auto& [key, list] : by) {
      std::sort(list.begin(), list.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
      std::vector<at::Tensor> dst, src;
      for (const auto& [order, e] : list) {
        dst.push_back(e.shadow);
        src.push_back(e.param.detach());
      }
      at::_foreach_copy_(dst, src);
      *refreshed += dst.size();
    }
  });
}

tcg_status tcg_shadow_set_active(bool on, bool* was) {
  return guard([&] {
    *was = active;
    active = on;
  });
}

}  // extern "C"
