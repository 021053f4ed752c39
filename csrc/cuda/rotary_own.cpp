// The launcher of the crate's rotary-embedding kernel (rotary_kernels.cu, loaded by
// own_kernels.cpp) and the autograd functions around it: q and k rotated in one launch forward,
// their gradients in one launch backward (the transposed rotation: sin negated); the same
// reading a fused q | k | v projection, v copied in the launch, the backward writing the packed
// gradient; and the projection itself with the rotation, q and k rotated in the GEMM's epilogue
// (rotary_gemm.h) or in place in its output, the backward the packed gradient's launch and the
// linear layer's GEMMs.
#include "../rotary_own.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <array>

#include "../kernels.h"
#include "cuda_shim.h"
#include "lt_matmul.h"
#include "own_kernels.h"
#include "rotary_gemm.h"
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

// Keeps what packed_grad() reads back: the packed tensor's sizes (under `sizes_key`), the
// offset, the layout and the head counts.
void save_packing(AutogradContext* ctx, const char* sizes_key, at::IntArrayRef sizes, const QkvWhere& w) {
  ctx->saved_data[sizes_key] = sizes.vec();
  ctx->saved_data["offset"] = w.offset;
  ctx->saved_data["half_split"] = w.half_split;
  ctx->saved_data["heads"] = w.heads;
  ctx->saved_data["kv_heads"] = w.kv_heads;
}

// The packed gradient [B, T, heads + 2 kv_heads, D] of q | k | v from their gradients `grads`
// (zeros where none came), the rotation transposed, in one launch; undefined where no gradient
// came. `r` gives the tables and device offset; the rest comes from save_packing().
at::Tensor packed_grad(AutogradContext* ctx, const variable_list& grads, const char* sizes_key, Rotation r) {
  const auto it = std::find_if(grads.begin(), grads.end(), [](const at::Tensor& g) { return g.defined(); });
  if (it == grads.end()) return at::Tensor();
  const auto options = it->options();
  at::Tensor dqkv = at::empty(ctx->saved_data.at(sizes_key).toIntVector(), options);
  const auto [sq, sk, sv] = split_qkv(dqkv, ctx->saved_data.at("heads").toInt(), ctx->saved_data.at("kv_heads").toInt());
  const at::Tensor dq = grad_or_zeros(grads.at(0), sq.sizes(), options);
  const at::Tensor dk = grad_or_zeros(grads.at(1), sk.sizes(), options);
  const at::Tensor dv = grad_or_zeros(grads.at(2), sv.sizes(), options);
  r.offset = ctx->saved_data.at("offset").toInt();
  r.half_split = ctx->saved_data.at("half_split").toBool();
  launch(dq, part_of(dq, sq), part_of(dk, sk), part_of(dv, sv), r);
  return dqkv;
}

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
    save_packing(ctx, "qkv_sizes", qkv.sizes(), w);
    return {q_out, k_out, v_out};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    if (at::GradMode::is_enabled()) misuse("rotary: double backward (create_graph) is not supported");
    auto saved = ctx->get_saved_variables();
    const at::Tensor dqkv = packed_grad(ctx, grads, "qkv_sizes", Rotation{saved[0], saved[1], saved[2], 0, false, true});
    return {dqkv, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// The linear layer's settings beside the rotation's: its shadows, compute dtype and
// weight-gradient mode.
struct ProjectArgs {
  QkvWhere where;
  at::Tensor shadow_w, shadow_b, cos_gemm, sin_gemm;
  at::ScalarType dt;
  bool fp32_wgrad;
};

// y2 [N, out] = x2 · wcᵀ with q's and k's pairs rotated in the GEMM's epilogue (rotary_gemm.h),
// where that kernel takes these operands: bf16, interleaved pairs, heads of its dimension, no
// bias, the permuted tables given, CUTLASS's GEMMs loaded. Undefined where it
// does not (nothing ran).
at::Tensor rotated_in_gemm(const at::Tensor& x2, const at::Tensor& wc, int64_t seq, const at::Tensor& cos,
                           const ProjectArgs& a) {
#ifdef TCG_CUTLASS_GEMMS
  const int device = x2.get_device();
  const int64_t slots = a.where.heads + 2 * a.where.kv_heads;
  if (!a.cos_gemm.defined() || a.dt != at::kBFloat16 || a.where.half_split ||
      wc.size(0) != slots * tcg::rotary_gemm::kHeadDim || !own::cutlass_gemms_unavailable(device).empty()) {
    return at::Tensor();
  }
  at::Tensor y2 = at::empty({x2.size(0), wc.size(0)}, x2.options());
  const tcg::rotary_gemm::Forward f{x2.data_ptr(),
                                    wc.data_ptr(),
                                    y2.data_ptr(),
                                    a.cos_gemm.data_ptr<float>(),
                                    a.sin_gemm.data_ptr<float>(),
                                    a.where.offset,
                                    cos.size(0),
                                    static_cast<int32_t>(x2.size(0)),
                                    static_cast<int32_t>(wc.size(0)),
                                    static_cast<int32_t>(wc.size(1)),
                                    static_cast<int32_t>(seq),
                                    static_cast<int32_t>((a.where.heads + a.where.kv_heads) * tcg::rotary_gemm::kHeadDim)};
  if (*tcg::rotary_gemm::unsupported(f) != '\0') return at::Tensor();
  check_cuda(tcg::rotary_gemm::forward(f, static_cast<int>(own::sm_count(device)),
                                       at::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device)).stream()),
             "rotary projection: the GEMM with rotary embeddings in its epilogue");
  return y2;
#else
  (void)x2, (void)wc, (void)seq, (void)cos, (void)a;
  return at::Tensor();
#endif
}

// x · weightᵀ (+ bias) read as q | k | v, q and k rotated in the GEMM's epilogue or in place
// after it, at positions from the host offset on: one autograd node for the projection and the
// rotation. Its outputs are views of the GEMM's output (no copy of v, no
// second tensor of q's and k's); backward, the rotary kernel packs the gradients into the
// output's gradient and the linear layer's GEMMs (linear_own.cpp's) run on it. Saves what the
// linear layer alone saves (x and the weight in the compute dtype) and the tables.
struct ProjectedQkv : torch::autograd::Function<ProjectedQkv> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                               const std::optional<at::Tensor>& bias_arg, const at::Tensor& cos, const at::Tensor& sin,
                               ProjectArgs a) {
    const at::Tensor bias = bias_arg.value_or(at::Tensor());
    c10::cuda::CUDAGuard guard(x.device());
    const at::Tensor x2 = tcg::lt::in_dtype(x, at::Tensor(), a.dt).contiguous().view({-1, x.size(-1)});
    const at::Tensor wc = tcg::lt::in_dtype(weight, a.shadow_w, a.dt).contiguous();
    at::Tensor y2;
    if (!bias.defined()) y2 = rotated_in_gemm(x2, wc, x.size(1), cos, a);
    const bool in_gemm = y2.defined();
    if (!in_gemm) y2 = tcg::lt::linear(x2, wc, tcg::lt::in_dtype(bias, a.shadow_b, a.dt));
    const at::Tensor qkv = y2.view({x.size(0), x.size(1), a.where.heads + 2 * a.where.kv_heads, -1});
    auto [q, k, v] = split_qkv(qkv, a.where.heads, a.where.kv_heads);
    // in place: each of the kernel's threads writes only the values it has read
    if (!in_gemm) {
      launch(q, part_of(q, q), part_of(k, k), Part{},
             Rotation{cos, sin, at::Tensor(), a.where.offset, a.where.half_split, false});
    }
    ctx->save_for_backward({x2, wc, cos, sin});
    save_packing(ctx, "qkv_sizes", qkv.sizes(), a.where);
    ctx->saved_data["x_sizes"] = x.sizes().vec();
    ctx->saved_data["has_bias"] = bias.defined();
    ctx->saved_data["fp32_wgrad"] = a.fp32_wgrad;
    ctx->saved_data["x_dtype"] = static_cast<int64_t>(x.scalar_type());
    ctx->saved_data["w_dtype"] = static_cast<int64_t>(weight.scalar_type());
    ctx->saved_data["b_dtype"] = static_cast<int64_t>(bias.defined() ? bias.scalar_type() : at::kFloat);
    return {q, k, v};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    if (at::GradMode::is_enabled()) misuse("rotary: double backward (create_graph) is not supported");
    auto saved = ctx->get_saved_variables();
    const at::Tensor &x2 = saved[0], &wc = saved[1];
    variable_list out(6);  // one per forward argument
    const at::Tensor dqkv =
        packed_grad(ctx, grads, "qkv_sizes", Rotation{saved[2], saved[3], at::Tensor(), 0, false, true});
    if (!dqkv.defined()) return out;
    c10::cuda::CUDAGuard guard(x2.device());
    const auto dtype_of = [&](const char* key) { return static_cast<at::ScalarType>(ctx->saved_data.at(key).toInt()); };
    const at::Tensor dy2 = dqkv.view({-1, wc.size(0)});
    // needs_input_grad counts the tensors given (an absent bias is not one)
    const bool want_b = ctx->saved_data.at("has_bias").toBool() && ctx->needs_input_grad(2);
    const at::ScalarType wt =
        tcg::lt::weight_grad_type(ctx->saved_data.at("fp32_wgrad").toBool(), dtype_of("w_dtype"), x2.scalar_type());
    auto [dx, dw, db] =
        tcg::lt::linear_grads(x2, wc, dy2, ctx->needs_input_grad(0), ctx->needs_input_grad(1), want_b, wt);
    if (dx.defined()) out[0] = dx.view(ctx->saved_data.at("x_sizes").toIntVector()).to(dtype_of("x_dtype"));
    if (dw.defined()) out[1] = dw.to(dtype_of("w_dtype"));
    if (db.defined()) out[2] = db.to(dtype_of("b_dtype"));
    return out;
  }
};

// The elements from a tensor's first to its last, 1 + Σ (size - 1) · stride (strides positive).
int64_t span(const at::Tensor& t) {
  int64_t last = 0;
  for (int64_t d = 0; d < t.dim(); ++d) last += (t.size(d) - 1) * t.stride(d);
  return t.numel() == 0 ? 0 : last + 1;
}

}  // namespace

namespace {

// The kernel's conditions on the dtype, the head dimension and the tables.
std::string kernel_unsupported(at::ScalarType dt, int64_t head_dim, const Inputs& in) {
  if (!own::rotary_builds(dt)) return std::string("dtype ") + c10::toString(dt);
  if (head_dim % 8 != 0) return "the head dimension (" + std::to_string(head_dim) + ") is not a multiple of 8";
  if (!in.cos.is_contiguous() || !in.sin.is_contiguous() || !own::aligned16(in.cos) || !own::aligned16(in.sin)) {
    return "the tables are not contiguous and 16-byte aligned";
  }
  return "";
}

}  // namespace

std::string unsupported(const Inputs& in) {
  if (!in.q.is_cuda()) return "q is not on a CUDA device";
  if (std::string why = kernel_unsupported(in.q.scalar_type(), in.q.size(3), in); !why.empty()) return why;
  for (const at::Tensor* t : {&in.q, &in.k}) {
    if (t->stride(3) != 1 || t->stride(0) % 8 != 0 || t->stride(1) % 8 != 0 || t->stride(2) % 8 != 0 || !own::aligned16(*t)) {
      return "q or k: the last dimension is not contiguous, or a row is not 16-byte aligned";
    }
  }
  // the kernel's offsets are 32-bit: q, k, and v after k where q and k are views of a fused
  // projection, each span fewer than 2^31 elements
  if (span(in.q) > INT32_MAX || span(in.k) + in.k.size(2) * in.k.size(3) > INT32_MAX) {
    return "more elements than the kernel indexes";
  }
  return kernels::unavailable(in.q.get_device());
}

std::string project_unsupported(const Projection& p, const Inputs& in) {
  if (std::string why = tcg::linear::unsupported(p.ops); !why.empty()) return why;
  const at::ScalarType dt = tcg::lt::compute_dtype(p.ops.x, p.ops.weight);
  if (std::string why = kernel_unsupported(dt, p.head_dim, in); !why.empty()) return why;
  // the kernel's 32-bit offsets
  if (p.ops.x.numel() / p.ops.x.size(-1) * p.ops.weight.size(0) > INT32_MAX) return "more elements than the kernel indexes";
  return kernels::unavailable(p.ops.x.get_device());
}

std::array<at::Tensor, 3> fused_project_qkv(const Projection& p, bool fp32_wgrad, const Inputs& in) {
  const auto opt = [](const at::Tensor& t) { return t.defined() ? std::optional<at::Tensor>(t) : std::nullopt; };
  const ProjectArgs a{QkvWhere{in.offset, in.half_split, p.heads, p.kv_heads},
                      p.ops.shadow_w,
                      p.ops.shadow_b,
                      p.cos_gemm,
                      p.sin_gemm,
                      tcg::lt::compute_dtype(p.ops.x, p.ops.weight),
                      fp32_wgrad};
  variable_list out = ProjectedQkv::apply(p.ops.x, p.ops.weight, opt(p.ops.bias), in.cos, in.sin, a);
  return {out[0], out[1], out[2]};
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
