// The launcher of the crate's rotary-embedding kernel (rotary_kernels.cu, loaded by
// own_kernels.cpp) and the autograd functions around it: q and k rotated in one launch forward,
// their gradients in one launch backward (the transposed rotation: sin negated); and the same
// reading a fused q | k | v projection, v copied in the launch, the backward writing the packed
// gradient.
#include "../rotary_own.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <array>

#include "../kernels.h"
#include "cuda_shim.h"
#include "own_kernels.h"
#include "rotary_params.h"

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

namespace tcg::rotary {
namespace {

Part part_of(const at::Tensor& x, const at::Tensor& out) {
  return Part{x.data_ptr(), out.data_ptr(), x.stride(0), x.stride(1), x.stride(2),
              out.stride(0), out.stride(1), out.stride(2), static_cast<int32_t>(x.size(2))};
}

// What every launch of a call shares: the tables, the positions, the layout, the pass.
struct Rotation {
  at::Tensor cos, sin, offset_dev;
  int64_t offset;
  bool half_split, backward;
};

// One launch over q and k (rotated) and v (copied; Part{} where there is none); q gives the batch,
// sequence and head dimension.
void launch(const at::Tensor& q, const Part& pq, const Part& pk, const Part& pv, const Rotation& r) {
  const int device = q.get_device();
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  Params p{};
  p.q = pq;
  p.k = pk;
  p.v = pv;
  p.cos = r.cos.data_ptr<float>();
  p.sin = r.sin.data_ptr<float>();
  p.offset_dev = r.offset_dev.defined() ? r.offset_dev.data_ptr<int64_t>() : nullptr;
  p.offset = r.offset;
  p.positions = r.cos.size(0);
  p.batch = static_cast<int32_t>(q.size(0));
  p.seq = static_cast<int32_t>(q.size(1));
  p.dim = static_cast<int32_t>(q.size(3));
  p.half_split = r.half_split ? 1 : 0;
  p.negate_sin = r.backward ? 1 : 0;
  // a block's threads: one per item of a token (whole warps, at most kThreads); the blocks: as
  // many as the SMs hold at once (one wave: each block's run of tokens as long as it can be, for
  // its loads of the next token to overlap the current one's)
  const int64_t per_token = (pq.heads + pk.heads + pv.heads) * q.size(3) / 8;
  const int64_t tokens = q.size(0) * q.size(1);
  if (per_token > 0 && tokens > 0) {
    const std::string name = own::rotary_kernel(q.scalar_type());
    const auto threads = static_cast<unsigned>(std::min<int64_t>((per_token + 31) / 32 * 32, kThreads));
    const int64_t blocks =
        std::min<int64_t>(tokens, own::sm_count(device) * own::resident_blocks(name, device, threads));
    own::launch(name, device, static_cast<unsigned>(blocks), threads, &p);
  }
}

// q and k rotated into new contiguous tensors.
std::pair<at::Tensor, at::Tensor> rotated(const at::Tensor& q, const at::Tensor& k, const Rotation& r) {
  at::Tensor q_out = at::empty(q.sizes(), q.options()), k_out = at::empty(k.sizes(), k.options());
  launch(q, part_of(q, q_out), part_of(k, k_out), Part{}, r);
  return {q_out, k_out};
}

// A gradient as given, or zeros of `sizes` where none came (contiguous either way).
at::Tensor grad_or_zeros(const at::Tensor& g, at::IntArrayRef sizes, const at::TensorOptions& options) {
  return g.defined() ? g.contiguous() : at::zeros(sizes, options);
}

// The host offset and the layout, passed as plain values (not autograd inputs).
struct Where {
  int64_t offset;
  bool half_split;
};

struct FusedRotary : torch::autograd::Function<FusedRotary> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                               const at::Tensor& sin, const std::optional<at::Tensor>& offset_arg, Where w) {
    const at::Tensor offset_dev = offset_arg.value_or(at::Tensor());
    auto [q_out, k_out] = rotated(q, k, Rotation{cos, sin, offset_dev, w.offset, w.half_split, false});
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
    const at::Tensor &dq_in = grads.at(0), &dk_in = grads.at(1);
    if (!dq_in.defined() && !dk_in.defined()) return variable_list(6);
    const auto options = (dq_in.defined() ? dq_in : dk_in).options();
    const at::Tensor dq = grad_or_zeros(dq_in, ctx->saved_data.at("q_sizes").toIntVector(), options);
    const at::Tensor dk = grad_or_zeros(dk_in, ctx->saved_data.at("k_sizes").toIntVector(), options);
    auto [gq, gk] = rotated(dq, dk, Rotation{saved[0], saved[1], saved[2], ctx->saved_data.at("offset").toInt(),
                                             ctx->saved_data.at("half_split").toBool(), true});
    return {dq_in.defined() ? gq : at::Tensor(), dk_in.defined() ? gk : at::Tensor(), at::Tensor(), at::Tensor(),
            at::Tensor(), at::Tensor()};
  }
};

// q, k and v of a packed [B, T, H + 2KV, D] tensor: views along the head dimension.
std::array<at::Tensor, 3> split_qkv(const at::Tensor& qkv, int64_t heads, int64_t kv_heads) {
  return {qkv.narrow(2, 0, heads), qkv.narrow(2, heads, kv_heads), qkv.narrow(2, heads + kv_heads, kv_heads)};
}

struct QkvWhere {
  int64_t offset;
  bool half_split;
  int64_t heads, kv_heads;
};

// The fused projection's q | k | v in, q and k rotated and v copied out, one launch each way; the
// backward writes the packed gradient directly (no concatenation of dq, dk and dv).
struct FusedRotaryQkv : torch::autograd::Function<FusedRotaryQkv> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& sin,
                               const std::optional<at::Tensor>& offset_arg, QkvWhere w) {
    const at::Tensor offset_dev = offset_arg.value_or(at::Tensor());
    const auto [q, k, v] = split_qkv(qkv, w.heads, w.kv_heads);
    at::Tensor q_out = at::empty(q.sizes(), q.options()), k_out = at::empty(k.sizes(), k.options());
    at::Tensor v_out = at::empty(v.sizes(), v.options());
    launch(q, part_of(q, q_out), part_of(k, k_out), part_of(v, v_out),
           Rotation{cos, sin, offset_dev, w.offset, w.half_split, false});
    ctx->save_for_backward({cos, sin, offset_dev});
    ctx->saved_data["qkv_sizes"] = qkv.sizes().vec();
    ctx->saved_data["offset"] = w.offset;
    ctx->saved_data["half_split"] = w.half_split;
    ctx->saved_data["heads"] = w.heads;
    ctx->saved_data["kv_heads"] = w.kv_heads;
    return {q_out, k_out, v_out};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    if (at::GradMode::is_enabled()) misuse("rotary: double backward (create_graph) is not supported");
    auto saved = ctx->get_saved_variables();
    const auto it = std::find_if(grads.begin(), grads.end(), [](const at::Tensor& g) { return g.defined(); });
    if (it == grads.end()) return variable_list(5);
    const auto options = it->options();
    at::Tensor dqkv = at::empty(ctx->saved_data.at("qkv_sizes").toIntVector(), options);
    const auto [sq, sk, sv] = split_qkv(dqkv, ctx->saved_data.at("heads").toInt(), ctx->saved_data.at("kv_heads").toInt());
    const at::Tensor dq = grad_or_zeros(grads.at(0), sq.sizes(), options);
    const at::Tensor dk = grad_or_zeros(grads.at(1), sk.sizes(), options);
    const at::Tensor dv = grad_or_zeros(grads.at(2), sv.sizes(), options);
    launch(dq, part_of(dq, sq), part_of(dk, sk), part_of(dv, sv),
           Rotation{saved[0], saved[1], saved[2], ctx->saved_data.at("offset").toInt(),
                    ctx->saved_data.at("half_split").toBool(), true});
    return {dqkv, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// The elements from a tensor's first to its last, 1 + Σ (size - 1) · stride (strides positive).
int64_t span(const at::Tensor& t) {
  int64_t last = 0;
  for (int64_t d = 0; d < t.dim(); ++d) last += (t.size(d) - 1) * t.stride(d);
  return t.numel() == 0 ? 0 : last + 1;
}

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
  // the kernel's offsets are 32-bit: q, k, and v after k where q and k are views of a fused
  // projection, each span fewer than 2^31 elements
  if (span(in.q) > INT32_MAX || span(in.k) + in.k.size(2) * in.k.size(3) > INT32_MAX) {
    return "more elements than the kernel indexes";
  }
  return kernels::unavailable(in.q.get_device());
}

std::array<at::Tensor, 3> fused_qkv(const at::Tensor& qkv, int64_t heads, int64_t kv_heads, const Inputs& in) {
  const auto offset_dev = in.offset_dev.defined() ? std::optional<at::Tensor>(in.offset_dev) : std::nullopt;
  variable_list out =
      FusedRotaryQkv::apply(qkv, in.cos, in.sin, offset_dev, QkvWhere{in.offset, in.half_split, heads, kv_heads});
  return {out[0], out[1], out[2]};
}

std::pair<at::Tensor, at::Tensor> fused(const Inputs& in) {
  const auto offset_dev = in.offset_dev.defined() ? std::optional<at::Tensor>(in.offset_dev) : std::nullopt;
  variable_list out = FusedRotary::apply(in.q, in.k, in.cos, in.sin, offset_dev, Where{in.offset, in.half_split});
  return {out[0], out[1]};
}

}  // namespace tcg::rotary
