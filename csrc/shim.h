// Internal helpers shared by the shim's translation units (not part of the C API).
//
// The rule every extern "C" function follows: its body runs inside tcg::guard(), which catches
// every C++ exception (`...` included), turns it into a status by its type, and stores its
// message in the thread-local slot. guard() itself is noexcept, so nothing crosses the FFI
// boundary even if storing the message fails.
#pragma once
#include "tcg.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <exception>
#include <string>
#include <utility>
#include <vector>

namespace tcg {

// A status-carrying exception the shim throws itself.
struct exception : std::exception {
  tcg_status status;
  std::string msg;
  exception(tcg_status s, std::string m) : status(s), msg(std::move(m)) {}
  const char* what() const noexcept override { return msg.c_str(); }
};

[[noreturn]] inline void misuse(const std::string& msg) { throw exception(TCG_MISUSE, msg); }

// Stores `msg` as this thread's last error and returns `status`. Never throws.
tcg_status fail(tcg_status status, const char* msg) noexcept;

// The status and message of the exception being handled (call only inside a catch block).
tcg_status fail_current_exception() noexcept;

// Runs `f`; returns TCG_OK, or the status of whatever it threw.
template <class F>
tcg_status guard(F&& f) noexcept {
  try {
    f();
    return TCG_OK;
  } catch (...) {
    return fail_current_exception();
  }
}

// Parameters whose .grad must keep its storage (a view into a gradient bucket, see
// cuda/grad_buckets.cpp): tcg_grads_set_to_none zeroes their gradients in place instead.
// Marked by the higher layer that made the views; kept here, below it. Never throws.
void keep_grad(const at::Tensor& param, bool on) noexcept;
bool grad_kept(const at::Tensor& param) noexcept;

// Whether the current CUDA stream of `t`'s device is capturing (false for CPU tensors and in
// builds without CUDA). Defined in cuda/device.cpp, or no_cuda.cpp.
bool capturing_on(const at::Tensor& t);

// Fault injection (tests only): true once if tcg_testing_fail_next(point) armed this point.
bool failpoint(const char* point) noexcept;

inline at::Tensor& tensor_ref(tcg_tensor t) {
  if (t == nullptr) misuse("null tensor pointer");
  return *static_cast<at::Tensor*>(t);
}

// An optional tensor argument: the tensor, or an undefined one for NULL.
inline at::Tensor tensor_or_undefined(tcg_tensor t) { return t == nullptr ? at::Tensor() : tensor_ref(t); }

inline std::vector<at::Tensor> tensor_list(const tcg_tensor* ts, size_t n) {
  if (ts == nullptr && n != 0) misuse("null tensor list");
  std::vector<at::Tensor> v;
  v.reserve(n);
  for (size_t i = 0; i < n; ++i) v.push_back(tensor_ref(ts[i]));
  return v;
}

inline std::vector<at::Tensor> tensor_list(tcg_tensors ts) { return tensor_list(ts.data, ts.len); }

}  // namespace tcg
