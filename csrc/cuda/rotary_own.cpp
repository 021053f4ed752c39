// The launcher of the crate's rotary-embedding kernel (rotary_kernels.cu, loaded by
// own_kernels.cpp) and the autograd function around it: q and k rotated in one launch forward,
// their gradients in one launch backward (the transposed rotation: sin negated).
#include "../rotary_own.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>

#include "../kernels.h"
#include "cuda_shim.h"
#include "own_kernels.h"
#include "rotary_params.h"

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

namespace tcg::rotary {
namespace {

Part part_of(const at::Tensor& x, const at::Tensor& out) {
  return Part{x.data_ptr(), out.data_ptr(), x.stride(0), x.stride(1), x.stride(2), static_cast<int32_t>(x.size(2))};
}

// One launch over q and k into new contiguous tensors; `backward`: the transposed rotation.
std::pair<at::Tensor, at::Tensor> launch(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                                         const at::Tensor& sin, const at::Tensor& offset_dev, int64_t offset,
                                         bool half_split, bool backward) {
  const int device = q.get_device();
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  at::Tensor q_out = at::empty(q.sizes(), q.options()), k_out = at::empty(k.sizes(), k.options());
  Params p{};
  p.q = part_of(q, q_out);
  p.k = part_of(k, k_out);
  p.cos = cos.data_ptr<float>();
  p.sin = sin.data_ptr<float>();
  p.offset_dev = offset_dev.defined() ? offset_dev.data_ptr<int64_t>() : nullptr;
  p.offset = offset;
  p.positions = cos.size(0);
  p.batch = static_cast<int32_t>(q.size(0));
  p.seq = static_cast<int32_t>(q.size(1));
  p.dim = static_cast<int32_t>(q.size(3));
  p.half_split = half_split ? 1 : 0;
  p.negate_sin = backward ? 1 : 0;
  const int64_t items = (q.numel() + k.numel()) / 8;
  if (items > 0) {
    const int64_t blocks = std::min<int64_t>((items + kThreads - 1) / kThreads, own::sm_count(device) * 16);
    own::launch(own::rotary_kernel(q.scalar_type()), device, static_cast<unsigned>(blocks), kThreads, &p);
  }
  return {q_out, k_out};
}

// The host offset, passed as a plain value (not an autograd input).
struct Where {
  int64_t offset;
  bool half_split;
};

struct FusedRotary : torch::autograd::Function<FusedRotary> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                               const at::Tensor& sin, const std::optional<at::Tensor>& offset_arg, Where w) {
    const at::Tensor offset_dev = offset_arg.value_or(at::Tensor());
    auto [q_out, k_out] = launch(q, k, cos, sin, offset_dev, w.offset, w.half_split, false);
    ctx->save_for_backward({cos, sin, offset_dev});
    ctx->saved_data["q_sizes"] = q.sizes().vec();
    ctx->saved_data["k_sizes"] = k.sizes().vec();
    ctx->saved_data["offset"] = w.offset;
    ctx->saved_data["half_split"] = w.half_split;
    return {q_out, k_out};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    if (at::GradMode::is_enabled()) misuse("rotary: double backward (create_graph) is not supported");
    auto saved = ctx->get_saved_variables();
    at::Tensor dq = grads.at(0), dk = grads.at(1);
    if (!dq.defined() && !dk.defined()) return {at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
    const auto options = (dq.defined() ? dq : dk).options();
    dq = dq.defined() ? dq.contiguous() : at::zeros(ctx->saved_data.at("q_sizes").toIntVector(), options);
    dk = dk.defined() ? dk.contiguous() : at::zeros(ctx->saved_data.at("k_sizes").toIntVector(), options);
    auto [gq, gk] = launch(dq, dk, saved[0], saved[1], saved[2], ctx->saved_data.at("offset").toInt(),
                           ctx->saved_data.at("half_split").toBool(), true);
    return {grads.at(0).defined() ? gq : at::Tensor(), grads.at(1).defined() ? gk : at::Tensor(), at::Tensor(),
            at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

std::string unsupported(const Inputs& in) {
  if (!in.q.is_cuda()) return "q is not on a CUDA device";
  if (!own::rotary_builds(in.q.scalar_type())) return std::string("dtype ") + c10::toString(in.q.scalar_type());
  if (in.q.size(3) % 8 != 0) return "the head dimension (" + std::to_string(in.q.size(3)) + ") is not a multiple of 8";
  for (const at::Tensor* t : {&in.q, &in.k}) {
    if (t->stride(3) != 1 || t->stride(0) % 8 != 0 || t->stride(1) % 8 != 0 || t->stride(2) % 8 != 0 || !own::aligned16(*t)) {
      return "q or k: the last dimension is not contiguous, or a row is not 16-byte aligned";
    }
  }
  if (!in.cos.is_contiguous() || !in.sin.is_contiguous() || !own::aligned16(in.cos) || !own::aligned16(in.sin)) {
    return "the tables are not contiguous and 16-byte aligned";
  }
  if (in.q.numel() > INT32_MAX || in.k.numel() > INT32_MAX || in.q.size(1) > INT32_MAX) {
    return "more elements than the kernel indexes";
  }
  return kernels::unavailable(in.q.get_device());
}

std::pair<at::Tensor, at::Tensor> fused(const Inputs& in) {
  const auto offset_dev = in.offset_dev.defined() ? std::optional<at::Tensor>(in.offset_dev) : std::nullopt;
  variable_list out = FusedRotary::apply(in.q, in.k, in.cos, in.sin, offset_dev, Where{in.offset, in.half_split});
  return {out[0], out[1]};
}

}  // namespace tcg::rotary
