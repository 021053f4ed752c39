// Normalization layers with the residual add and dropout folded in (CPU and CUDA builds): the
// C API over the crate's fused kernels (cuda/norm_own.cpp) and the same computation in ATen's
// operators, for every input those kernels do not take.
#include "kernels.h"
#include "norm_own.h"
#include "shim.h"

#include <ATen/autocast_mode.h>

#include <memory>

using tcg::guard;
using tcg::misuse;
using tcg::tensor_ref;

namespace {

// The dtype of y: the CUDA autocast dtype while autocast is on for a CUDA input, else res's.
at::ScalarType out_dtype(const at::Tensor& res, tcg_norm_out out) {
  if (out == TCG_NORM_OUT_AUTOCAST && res.is_cuda() && at::autocast::is_autocast_enabled(at::kCUDA)) {
    return at::autocast::get_autocast_dtype(at::kCUDA);
  }
  return res.scalar_type();
}

// ATen's operators: x = res + dropout(branch + branch_bias) (without res, the dropout alone);
// y = layer_norm(x) or rms_norm(x), in out's dtype.
std::pair<at::Tensor, at::Tensor> composite(const tcg::norm::Inputs& in, const tcg::norm::Options& o) {
  const at::Tensor &res = in.res, &branch = in.branch, &weight = in.weight, &bias = in.bias;
  at::Tensor x = res;
  if (branch.defined()) {
    const bool drop = o.train && o.dropout > 0.0;
    const at::Tensor b = in.branch_bias.defined() ? branch + in.branch_bias : branch;
    const at::Tensor dropped = drop ? at::dropout(b, o.dropout, true) : b;
    x = res.defined() ? res + dropped : dropped;
  }
  const std::vector<int64_t> shape = {x.size(-1)};
  at::Tensor y = o.rms ? at::rms_norm(x, shape, weight.defined() ? std::optional<at::Tensor>(weight) : std::nullopt, o.eps)
                       : at::layer_norm(x, shape, weight, bias, o.eps);
  if (y.scalar_type() != o.out) y = y.to(o.out);
  return {branch.defined() ? x : at::Tensor(), y};
}

}  // namespace

extern "C" {

tcg_status tcg_norm_forward(const tcg_norm_inputs* in, const tcg_norm_options* opts, tcg_kernels kernels,
                            tcg_tensor* out_res, tcg_tensor* out_y, bool* ran_own) {
  return guard([&] {
    *out_res = nullptr;
    *out_y = nullptr;
    *ran_own = false;
    if (in == nullptr || opts == nullptr) misuse("norm: null inputs or options");
    const tcg::norm::Inputs t{tcg::tensor_or_undefined(in->res), tcg::tensor_or_undefined(in->branch),
                              tcg::tensor_or_undefined(in->branch_bias), tcg::tensor_or_undefined(in->weight),
                              tcg::tensor_or_undefined(in->bias)};
    const at::Tensor &branch = t.branch, &weight = t.weight, &bias = t.bias;
    if (!t.res.defined() && !branch.defined()) misuse("norm: neither a residual stream nor a branch");
    // the residual stream, or the branch that starts it: what gives the shape and y's dtype
    const at::Tensor& res = t.res.defined() ? t.res : branch;
    if (opts->kind != TCG_NORM_LAYER && opts->kind != TCG_NORM_RMS) misuse("norm: unknown kind");
    if (opts->kind == TCG_NORM_RMS && bias.defined()) misuse("norm: RMSNorm takes no bias");
    if (!(opts->dropout >= 0.0 && opts->dropout < 1.0)) misuse("norm: dropout must be in [0, 1)");
    if (res.dim() < 1) misuse("norm: the input needs at least one dimension");
    if (branch.defined() && branch.sizes() != res.sizes()) misuse("norm: the branch's shape differs from the input's");
    const int64_t d = res.size(-1);
    if (t.branch_bias.defined() && !branch.defined()) misuse("norm: a branch bias without a branch");
    // the branch bias: [d], or the branch's trailing dimensions ([T, d] of a [B, T, d] branch: a
    // row per position), broadcast over the rest as `branch + branch_bias` is
    const at::Tensor& bb = t.branch_bias;
    if (bb.defined() && bb.dim() > 1 &&
        (bb.dim() > res.dim() || bb.sizes() != res.sizes().slice(res.dim() - bb.dim()))) {
      misuse("norm: the branch bias's shape " + c10::str(bb.sizes()) + " is not the input's last " +
             std::to_string(bb.dim()) + " dimensions (the input is " + c10::str(res.sizes()) + ")");
    }
    const auto check_width = [&](const at::Tensor& p, const std::string& what) {
      if (p.defined() && (p.dim() != 1 || p.size(0) != d)) {
        misuse("norm: the input's last dimension (dimension " + std::to_string(res.dim() - 1) + ", size " +
               std::to_string(d) + ") differs from " + what + " (" + std::to_string(p.numel()) + ")");
      }
    };
    check_width(weight, "the norm's width");
    check_width(bias, "the norm's width");
    if (bb.defined() && bb.dim() <= 1) check_width(bb, "the branch bias's width");
    tcg::norm::Options o{opts->kind == TCG_NORM_RMS, opts->eps, opts->dropout, opts->train,
                         out_dtype(res, opts->out)};
    const bool own = tcg::kernels::own(kernels, "norm", [&] { return tcg::norm::unsupported(t, o); });
    auto [x, y] = own ? tcg::norm::fused(t, o) : composite(t, o);
    auto y_out = std::make_unique<at::Tensor>(std::move(y));
    std::unique_ptr<at::Tensor> x_out;
    if (x.defined()) x_out = std::make_unique<at::Tensor>(std::move(x));
    *out_y = y_out.release();
    *out_res = x_out.release();
    *ran_own = own;
  });
}

}  // extern "C"
