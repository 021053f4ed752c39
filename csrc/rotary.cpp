// Rotary position embeddings (CPU and CUDA builds): the C API over the crate's kernel
// (cuda/rotary_own.cpp) and ATen's element-wise composition for every input it does not take.
#include "kernels.h"
#include "rotary_own.h"
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
  for (const at::Tensor* t : {&in.cos, &in.sin}) {
    if (t->dim() != 2 || t->size(1) != q.size(3) / 2 || t->scalar_type() != at::kFloat || t->device() != q.device()) {
      misuse("rotary: the tables must be [positions, head_dim / 2] float32 on q's device");
    }
  }
  if (in.cos.size(0) != in.sin.size(0)) misuse("rotary: the cos and sin tables differ in length");
  if (in.offset_dev.defined()) {
    if (in.offset_dev.dim() != 0 || in.offset_dev.scalar_type() != at::kLong || in.offset_dev.device() != q.device()) {
      misuse("rotary: a device position offset must be a 0-d int64 tensor on q's device");
    }
  } else if (in.offset < 0 || in.offset + q.size(1) > in.cos.size(0)) {
    throw tcg::exception(TCG_MISUSE, "rotary: positions " + std::to_string(in.offset) + ".." +
                                         std::to_string(in.offset + q.size(1)) + " past the table's " +
                                         std::to_string(in.cos.size(0)));
  }
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

}  // extern "C"
