// Rotary position embeddings (CPU and CUDA builds): the C API over the crate's kernel
// (cuda/rotary_own.cpp) and ATen's element-wise composition for every input it does not take;
// and the q | k | v projection with the rotation in one node, on the crate's path only (the
// caller composes the linear layer and the rotation elsewhere).
#include "kernels.h"
#include "rotary_own.h"
#include "shadow.h"
#include "shim.h"

#include <array>
#include <limits>
#include <memory>

using tcg::guard;
using tcg::misuse;
using tcg::tensor_ref;

namespace {

// The table rows of positions offset (+ offset_dev) .. + T: [T, D/2], NaN past the table.
at::Tensor rows_at(const at::Tensor& table, const tcg::rotary::Inputs& in, int64_t t) {
  if (!in.offset_dev.defined()) return table.narrow(0, in.offset, t);
  const at::Tensor pos = in.offset_dev + in.offset + at::arange(t, in.offset_dev.options());
  const at::Tensor valid = (pos >= 0).logical_and(pos < table.size(0)).unsqueeze(1);
  const at::Tensor rows = table.index_select(0, pos.clamp(0, table.size(0) - 1));
  return at::where(valid, rows, at::full({}, std::numeric_limits<float>::quiet_NaN(), table.options()));
}

// x rotated by ATen's element-wise operators, fp32 math, in x's dtype.
at::Tensor compose(const at::Tensor& x, const at::Tensor& c, const at::Tensor& s, bool half_split) {
  const int64_t half = x.size(-1) / 2;
  const at::Tensor xf = x.to(at::kFloat);
  const at::Tensor cb = c.view({1, c.size(0), 1, half}), sb = s.view({1, s.size(0), 1, half});
  at::Tensor x0, x1;
  if (half_split) {
    x0 = xf.narrow(-1, 0, half);
    x1 = xf.narrow(-1, half, half);
  } else {
    const at::Tensor pairs = xf.unflatten(-1, {half, 2});
    x0 = pairs.select(-1, 0);
    x1 = pairs.select(-1, 1);
  }
  const at::Tensor o0 = x0 * cb - x1 * sb, o1 = x0 * sb + x1 * cb;
  const at::Tensor out = half_split ? at::cat({o0, o1}, -1) : at::stack({o0, o1}, -1).flatten(-2);
  return out.to(x.scalar_type());
}

// The tables and the offsets for heads of `head_dim` values, `seq` positions from the offset on,
// on `device`.
void check_tables(const tcg::rotary::Inputs& in, int64_t head_dim, int64_t seq, const at::Device& device) {
  for (const at::Tensor* t : {&in.cos, &in.sin}) {
    if (t->dim() != 2 || t->size(1) != head_dim / 2 || t->scalar_type() != at::kFloat || t->device() != device) {
      misuse("rotary: the tables must be [positions, head_dim / 2] float32 on q's device");
    }
  }
  if (in.cos.size(0) != in.sin.size(0)) misuse("rotary: the cos and sin tables differ in length");
  if (in.offset_dev.defined()) {
    if (in.offset_dev.dim() != 0 || in.offset_dev.scalar_type() != at::kLong || in.offset_dev.device() != device) {
      misuse("rotary: a device position offset must be a 0-d int64 tensor on q's device");
    }
  } else if (in.offset < 0 || in.offset + seq > in.cos.size(0)) {
    throw tcg::exception(TCG_MISUSE, "rotary: positions " + std::to_string(in.offset) + ".." +
                                         std::to_string(in.offset + seq) + " past the table's " +
                                         std::to_string(in.cos.size(0)));
  }
}

void check(const tcg::rotary::Inputs& in) {
  const at::Tensor &q = in.q, &k = in.k;
  if (q.dim() != 4 || k.dim() != 4) misuse("rotary: q and k must be [batch, seq, heads, head_dim]");
  if (q.size(0) != k.size(0) || q.size(1) != k.size(1) || q.size(3) != k.size(3)) {
    misuse("rotary: q and k must share batch, sequence and head dimension");
  }
  if (q.size(3) % 2 != 0) misuse("rotary: an odd head dimension (" + std::to_string(q.size(3)) + ") has no pairs to rotate");
  if (q.scalar_type() != k.scalar_type() || !at::isFloatingType(q.scalar_type())) {
    misuse("rotary: q and k must be of one floating dtype");
  }
  if (q.device() != k.device()) misuse("rotary: q and k are on different devices");
  check_tables(in, q.size(3), q.size(1), q.device());
}

}  // namespace

extern "C" {

tcg_status tcg_rotary_apply(const tcg_rotary_inputs* inputs, int64_t offset, tcg_rotary_layout layout, tcg_kernels kernels,
                            tcg_tensor* q_out, tcg_tensor* k_out, bool* ran_own) {
  return guard([&] {
    *q_out = *k_out = nullptr;
    *ran_own = false;
    if (inputs == nullptr) misuse("rotary: null inputs");
    if (layout != TCG_ROTARY_INTERLEAVED && layout != TCG_ROTARY_HALF_SPLIT) misuse("rotary: unknown layout");
    tcg::rotary::Inputs in{tensor_ref(inputs->q), tensor_ref(inputs->k), tensor_ref(inputs->cos), tensor_ref(inputs->sin),
                           inputs->offset != nullptr ? tensor_ref(inputs->offset) : at::Tensor(), offset,
                           layout == TCG_ROTARY_HALF_SPLIT};
    check(in);
    const bool own = tcg::kernels::own(kernels, "rotary", [&] { return tcg::rotary::unsupported(in); });
    at::Tensor q, k;
    if (own) {
      std::tie(q, k) = tcg::rotary::fused(in);
    } else {
      const at::Tensor c = rows_at(in.cos, in, in.q.size(1)), s = rows_at(in.sin, in, in.q.size(1));
      q = compose(in.q, c, s, in.half_split);
      k = compose(in.k, c, s, in.half_split);
    }
    *q_out = std::make_unique<at::Tensor>(std::move(q)).release();
    *k_out = std::make_unique<at::Tensor>(std::move(k)).release();
    *ran_own = own;
  });
}

tcg_status tcg_rotary_apply_qkv(const tcg_rotary_qkv_inputs* inputs, int64_t offset, tcg_rotary_layout layout,
                                tcg_kernels kernels, tcg_tensor* q_out, tcg_tensor* k_out, tcg_tensor* v_out,
                                bool* ran_own) {
  return guard([&] {
    *q_out = *k_out = *v_out = nullptr;
    *ran_own = false;
    if (inputs == nullptr) misuse("rotary: null inputs");
    if (layout != TCG_ROTARY_INTERLEAVED && layout != TCG_ROTARY_HALF_SPLIT) misuse("rotary: unknown layout");
    const at::Tensor& qkv = tensor_ref(inputs->qkv);
    const int64_t heads = inputs->heads, kv_heads = inputs->kv_heads;
    if (heads < 1 || kv_heads < 1 || qkv.dim() != 4 || qkv.size(2) != heads + 2 * kv_heads) {
      misuse("rotary: qkv must be [batch, seq, heads + 2 kv_heads, head_dim] with heads and kv_heads >= 1");
    }
    // one split (its backward one concatenation, where three narrows would each zero-fill qkv's
    // shape and autograd add the three)
    const std::vector<at::Tensor> parts = qkv.split_with_sizes({heads, kv_heads, kv_heads}, 2);
    const at::Tensor &q = parts[0], &k = parts[1], &v = parts[2];
    tcg::rotary::Inputs in{q, k, tensor_ref(inputs->cos), tensor_ref(inputs->sin),
                           inputs->offset != nullptr ? tensor_ref(inputs->offset) : at::Tensor(), offset,
                           layout == TCG_ROTARY_HALF_SPLIT};
    check(in);
    const bool own = tcg::kernels::own(kernels, "rotary", [&] { return tcg::rotary::unsupported(in); });
    std::array<at::Tensor, 3> out;
    if (own) {
      out = tcg::rotary::fused_qkv(qkv, heads, kv_heads, in);
    } else {
      const at::Tensor c = rows_at(in.cos, in, q.size(1)), s = rows_at(in.sin, in, q.size(1));
      out = {compose(q, c, s, in.half_split), compose(k, c, s, in.half_split), v};
    }
    *q_out = std::make_unique<at::Tensor>(std::move(out[0])).release();
    *k_out = std::make_unique<at::Tensor>(std::move(out[1])).release();
    *v_out = std::make_unique<at::Tensor>(std::move(out[2])).release();
    *ran_own = own;
  });
}

tcg_status tcg_rotary_project_qkv(const tcg_rotary_project_inputs* inputs, int64_t offset, tcg_rotary_layout layout,
                                  tcg_weight_grad wgrad, tcg_kernels kernels, tcg_tensor* q_out, tcg_tensor* k_out,
                                  tcg_tensor* v_out, bool* ran_own) {
  return guard([&] {
    *q_out = *k_out = *v_out = nullptr;
    *ran_own = false;
    if (inputs == nullptr) misuse("rotary projection: null inputs");
    if (layout != TCG_ROTARY_INTERLEAVED && layout != TCG_ROTARY_HALF_SPLIT) misuse("rotary: unknown layout");
    if (wgrad != TCG_WEIGHT_GRAD_ROUNDED && wgrad != TCG_WEIGHT_GRAD_FP32) {
      misuse("rotary projection: unknown weight-gradient mode");
    }
    const at::Tensor& x = tensor_ref(inputs->x);
    const at::Tensor& weight = tensor_ref(inputs->weight);
    const at::Tensor bias = tcg::tensor_or_undefined(inputs->bias);
    const int64_t heads = inputs->heads, kv_heads = inputs->kv_heads;
    if (heads < 1 || kv_heads < 1) misuse("rotary projection: heads and kv_heads must be >= 1");
    if (x.dim() != 3 || weight.dim() != 2 || x.size(2) != weight.size(1) || weight.size(0) % (heads + 2 * kv_heads) != 0) {
      misuse("rotary projection: x must be [batch, seq, in] and the weight [(heads + 2 kv_heads) · head_dim, in]");
    }
    const int64_t head_dim = weight.size(0) / (heads + 2 * kv_heads);
    if (head_dim % 2 != 0) {
      misuse("rotary: an odd head dimension (" + std::to_string(head_dim) + ") has no pairs to rotate");
    }
    if (bias.defined() && (bias.dim() != 1 || bias.size(0) != weight.size(0))) {
      misuse("rotary projection: the bias must be a vector of the weight's out (" + std::to_string(weight.size(0)) + ")");
    }
    const tcg::rotary::Inputs in{at::Tensor(), at::Tensor(), tensor_ref(inputs->cos), tensor_ref(inputs->sin),
                                 at::Tensor(), offset, layout == TCG_ROTARY_HALF_SPLIT};
    check_tables(in, head_dim, x.size(1), x.device());
    const at::Tensor cos_gemm = tcg::tensor_or_undefined(inputs->cos_gemm);
    const at::Tensor sin_gemm = tcg::tensor_or_undefined(inputs->sin_gemm);
    if (cos_gemm.defined() != sin_gemm.defined()) misuse("rotary projection: give both permuted tables or neither");
    for (const at::Tensor* t : {&cos_gemm, &sin_gemm}) {
      if (t->defined() && (t->sizes() != in.cos.sizes() || t->scalar_type() != at::kFloat || t->device() != x.device() ||
                           !t->is_contiguous())) {
        misuse("rotary projection: the permuted tables must be contiguous and of the tables' shape, dtype and device");
      }
    }
    const tcg::rotary::Projection p{{x, weight, bias, tcg::shadow::lookup(weight), tcg::shadow::lookup(bias), {}},
                                    heads,
                                    kv_heads,
                                    head_dim,
                                    cos_gemm,
                                    sin_gemm};
    if (!tcg::kernels::own(kernels, "rotary projection", [&] { return tcg::rotary::project_unsupported(p, in); })) return;
    std::array<at::Tensor, 3> out = tcg::rotary::fused_project_qkv(p, wgrad == TCG_WEIGHT_GRAD_FP32, in);
    *q_out = std::make_unique<at::Tensor>(std::move(out[0])).release();
    *k_out = std::make_unique<at::Tensor>(std::move(out[1])).release();
    *v_out = std::make_unique<at::Tensor>(std::move(out[2])).release();
    *ran_own = true;
  });
}

tcg_status tcg_rotary_permuted_table(tcg_tensor table, tcg_tensor* out) {
  return guard([&] {
    *out = nullptr;
    const at::Tensor& t = tensor_ref(table);
    if (t.dim() != 2 || t.size(1) % 4 != 0 || t.scalar_type() != at::kFloat) {
      misuse("rotary: a table to permute must be [positions, head_dim / 2] float32 with head_dim a multiple of 8");
    }
    // angle i = 4j + q of a row at q · D/8 + j
    at::Tensor p = t.view({t.size(0), t.size(1) / 4, 4}).transpose(1, 2).contiguous().view({t.size(0), t.size(1)});
    *out = std::make_unique<at::Tensor>(std::move(p)).release();
  });
}

}  // extern "C"
