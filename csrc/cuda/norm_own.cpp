// The launcher of the crate's fused normalization kernels (norm_kernels.cu, loaded by
// own_kernels.cpp) and the autograd function around them: the forward saves what was
// normalized (x), the row statistics and the dropout generator state; the backward draws the
// dropout mask again from that state (inside a captured graph the state is read on the device,
// so every replay's backward sees its own forward's mask), then sums the weight, bias and branch
// bias gradients in a fixed order.
#include "../norm_own.h"

#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <mutex>

#include "col_sum.h"
#include "cuda_shim.h"
#include "norm_params.h"
#include "../kernels.h"
#include "own_kernel_list.h"
#include "own_kernels.h"

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

namespace tcg::norm {
namespace {

// The kernel variant for rows `cols` wide: the fewest groups of 4 values per lane that hold the
// row (TCG_NORM_VECS, in increasing order): each group held costs registers for the whole row,
// and registers cost occupancy.
#define TCG_VEC(B, Y, V) V,
constexpr int kVecs[] = {TCG_NORM_VECS(TCG_VEC, Float, Float)};
#undef TCG_VEC
int vec(int64_t cols) {
  for (int v : kVecs) {
    if (cols <= 32 * 4 * v) return v;
  }
  return kMaxVec;
}

// The generator state for one draw of the dropout mask (4 offsets: one Philox counter step).
at::PhiloxCudaState philox_state(int device) {
  auto* gen = at::check_generator<at::CUDAGeneratorImpl>(
      at::cuda::detail::getDefaultCUDAGenerator(static_cast<c10::DeviceIndex>(device)));
  std::lock_guard<std::mutex> lock(gen->mutex_);
  return gen->philox_cuda_state(4);
}

// The generator state as saved data (four integers; the pointers of a captured state stay valid
// as long as the generator, which lives until exit).
std::vector<int64_t> pack(const at::PhiloxCudaState& s) {
  return {static_cast<int64_t>(s.seed_.val), static_cast<int64_t>(s.offset_.val),
          static_cast<int64_t>(s.offset_intragraph_), s.captured_ ? 1 : 0};
}

at::PhiloxCudaState unpack_state(const std::vector<int64_t>& v) {
  at::PhiloxCudaState s;
  s.seed_.val = static_cast<uint64_t>(v.at(0));
  s.offset_.val = static_cast<uint64_t>(v.at(1));
  s.offset_intragraph_ = static_cast<uint64_t>(v.at(2));
  s.captured_ = v.at(3) != 0;
  return s;
}

struct FusedNorm : torch::autograd::Function<FusedNorm> {
  // The optional tensors are std::optional: autograd's Function records the device of every
  // tensor argument, which an undefined at::Tensor does not have.
  static variable_list forward(AutogradContext* ctx, const std::optional<at::Tensor>& res_arg,
                               const std::optional<at::Tensor>& branch_arg,
                               const std::optional<at::Tensor>& branch_bias_arg,
                               const std::optional<at::Tensor>& weight_arg,
                               const std::optional<at::Tensor>& bias_arg, Options o) {
    const at::Tensor res = res_arg.value_or(at::Tensor());
    const at::Tensor branch_given = branch_arg.value_or(at::Tensor());
    const at::Tensor branch_bias = branch_bias_arg.value_or(at::Tensor());
    const at::Tensor weight = weight_arg.value_or(at::Tensor());
    const at::Tensor bias = bias_arg.value_or(at::Tensor());
    const bool dropout = branch_given.defined() && o.train && o.dropout > 0.0;
    // A float32 branch that starts the stream unchanged (no residual, dropout or bias) is the
    // stream itself: normalized as a residual would be, not copied; its gradient is what the
    // kernel writes for a residual's.
    const bool starts_as_is = !res.defined() && !dropout && !branch_bias.defined();
    const at::Tensor lead = res.defined() ? res : branch_given;
    const at::Tensor branch = starts_as_is ? at::Tensor() : branch_given;
    const int device = lead.get_device();
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
    const int64_t cols = lead.size(-1), rows = lead.numel() / std::max<int64_t>(cols, 1);
    const bool has_branch = branch.defined();
    const at::ScalarType branch_type = has_branch ? branch.scalar_type() : at::kFloat;
    at::Tensor x = has_branch ? at::empty(lead.sizes(), lead.options().dtype(at::kFloat)) : lead;
    at::Tensor y = at::empty(lead.sizes(), lead.options().dtype(o.out));
    at::Tensor mean = at::empty({rows}, lead.options().dtype(at::kFloat));
    at::Tensor rstd = at::empty({rows}, lead.options().dtype(at::kFloat));
    Forward p{};
    p.res = res.defined() ? res.data_ptr<float>() : has_branch ? nullptr : lead.data_ptr<float>();
    p.branch = has_branch ? branch.data_ptr() : nullptr;
    p.branch_bias = branch_bias.defined() ? branch_bias.data_ptr<float>() : nullptr;
    p.bias_rows = branch_bias.defined() ? std::max<int64_t>(1, branch_bias.numel() / std::max<int64_t>(cols, 1)) : 1;
    p.gamma = weight.defined() ? weight.data_ptr<float>() : nullptr;
    p.beta = bias.defined() ? bias.data_ptr<float>() : nullptr;
    p.res_out = has_branch ? x.data_ptr<float>() : nullptr;
    p.y = y.data_ptr();
    p.mean = mean.data_ptr<float>();
    p.rstd = rstd.data_ptr<float>();
    p.rows = rows;
    p.cols = static_cast<int32_t>(cols);
    p.rms = o.rms ? 1 : 0;
    p.eps = static_cast<float>(o.eps);
    p.keep = static_cast<float>(1.0 - o.dropout);
    p.scale = static_cast<float>(1.0 / (1.0 - o.dropout));
    p.dropout = dropout ? 1 : 0;
    if (dropout) p.philox = philox_state(device);
    if (rows > 0) {
      const std::string name = own::norm_kernel(own::Pass::Forward, branch_type, o.out, vec(cols));
      own::launch(name, device, static_cast<unsigned>((rows + kWarps - 1) / kWarps), kWarps * 32, &p);
    }
    ctx->save_for_backward({x, mean, rstd, weight});
    ctx->saved_data["philox"] = c10::IValue(pack(p.philox));
    ctx->saved_data["dropout"] = dropout;
    ctx->saved_data["has_branch"] = has_branch;
    ctx->saved_data["has_res"] = res.defined();
    ctx->saved_data["stream_out"] = branch_given.defined();
    ctx->saved_data["has_bias"] = bias.defined();
    ctx->saved_data["has_branch_bias"] = branch_bias.defined();
    // a bias of several rows (one per position): its gradient is summed over the batch from the
    // branch gradient, as autograd sums a broadcast add's (float32 branches only: unsupported())
    ctx->saved_data["branch_bias_sizes"] = branch_bias.defined() && p.bias_rows > 1 ? branch_bias.sizes().vec()
                                                                                      : std::vector<int64_t>{};
    ctx->saved_data["rms"] = o.rms;
    ctx->saved_data["keep"] = static_cast<double>(p.keep);
    ctx->saved_data["scale"] = static_cast<double>(p.scale);
    ctx->saved_data["branch_type"] = static_cast<int64_t>(branch_type);
    // without a branch, x is res itself: only y is an output; a branch starting the stream
    // as it is is returned as the stream (autograd makes it a view with this node's gradient)
    if (!branch_given.defined()) return {y};
    return {x, y};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    if (at::GradMode::is_enabled()) misuse("fused norm: double backward (create_graph) is not supported");
    auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &mean = saved[1], &rstd = saved[2], &weight = saved[3];
    const bool has_branch = ctx->saved_data.at("has_branch").toBool();
    const bool has_res = ctx->saved_data.at("has_res").toBool();
    const bool stream_out = ctx->saved_data.at("stream_out").toBool();
    const bool dropout = ctx->saved_data.at("dropout").toBool();
    const bool has_bias = ctx->saved_data.at("has_bias").toBool();
    const bool has_branch_bias = ctx->saved_data.at("has_branch_bias").toBool();
    const std::vector<int64_t> bias_rows_sizes = ctx->saved_data.at("branch_bias_sizes").toIntVector();
    const bool bias_per_row = !bias_rows_sizes.empty();
    const auto branch_type = static_cast<at::ScalarType>(ctx->saved_data.at("branch_type").toInt());
    at::Tensor dres = stream_out ? grads.at(0) : at::Tensor();
    at::Tensor dy = grads.at(stream_out ? 1 : 0);
    const int device = x.get_device();
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
    const int64_t cols = x.size(-1), rows = x.numel() / std::max<int64_t>(cols, 1);
    if (dy.defined()) dy = (own::norm_builds(branch_type, dy.scalar_type()) ? dy : dy.to(at::kFloat)).contiguous();
    if (dres.defined()) dres = dres.to(at::kFloat).contiguous();
    // the gradient of what the kernel read as the residual: res, or a branch starting the stream as it is
    const bool residual_read = has_res || !has_branch;
    at::Tensor dx = residual_read ? at::empty_like(x) : at::Tensor();
    at::Tensor dbranch = has_branch ? at::empty(x.sizes(), x.options().dtype(branch_type)) : at::Tensor();
    const int64_t sms = own::sm_count(device);
    const int v = vec(cols);
    // at least kBwdMinRows rows a block: fewer blocks' partials to write and sum where the rows are few
    const int64_t blocks =
        std::max<int64_t>(1, std::min<int64_t>((rows + kBwdMinRows - 1) / kBwdMinRows, bwd_blocks_per_sm(v) * sms));
    // the weight, bias and branch-bias gradients (Finish's order): per-block partials, then sums
    const bool summed[kFinishSums] = {weight.defined(), has_bias, has_branch_bias && !bias_per_row};
    at::Tensor part[kFinishSums], sum[kFinishSums];
    Backward p{};
    Finish f{};
    for (int k = 0; k < kFinishSums; ++k) {
      if (!summed[k]) continue;
      part[k] = at::empty({blocks, cols}, x.options());
      sum[k] = at::empty({cols}, x.options());
      p.part[k] = part[k].data_ptr<float>();
      f.part[k] = p.part[k];
      f.sum[k] = sum[k].data_ptr<float>();
    }
    p.dy = dy.defined() ? dy.data_ptr() : nullptr;
    p.dres = dres.defined() ? dres.data_ptr<float>() : nullptr;
    p.x = x.data_ptr<float>();
    p.mean = mean.data_ptr<float>();
    p.rstd = rstd.data_ptr<float>();
    p.gamma = weight.defined() ? weight.data_ptr<float>() : nullptr;
    p.dx = residual_read ? dx.data_ptr<float>() : nullptr;
    p.dbranch = has_branch ? dbranch.data_ptr() : nullptr;
    p.rows = rows;
    p.cols = static_cast<int32_t>(cols);
    p.rms = ctx->saved_data.at("rms").toBool() ? 1 : 0;
    p.keep = static_cast<float>(ctx->saved_data.at("keep").toDouble());
    p.scale = static_cast<float>(ctx->saved_data.at("scale").toDouble());
    p.dropout = dropout ? 1 : 0;
    p.philox = unpack_state(ctx->saved_data.at("philox").toIntVector());
    const at::ScalarType y_type = dy.defined() ? dy.scalar_type() : at::kFloat;
    own::launch(own::norm_kernel(own::Pass::Backward, branch_type, y_type, v), device,
           static_cast<unsigned>(blocks), 32 * v, &p);
    if (summed[0] || summed[1] || summed[2]) {
      f.blocks = static_cast<int32_t>(blocks);
      f.cols = static_cast<int32_t>(cols);
      own::launch("tcg_norm_finish", device, static_cast<unsigned>((cols + cuda::kColSumCols - 1) / cuda::kColSumCols),
                  cuda::kColSumThreads, &f);
    }
    if (bias_per_row) sum[2] = at::sum_to(dbranch, bias_rows_sizes);
    if (!has_res) return {at::Tensor(), has_branch ? dbranch : dx, sum[2], sum[0], sum[1], at::Tensor()};
    return {dx, dbranch, sum[2], sum[0], sum[1], at::Tensor()};
  }
};

}  // namespace

std::string unsupported(const Inputs& in, const Options& o) {
  const at::Tensor& branch = in.branch;
  // the residual stream, or the branch that starts it
  const at::Tensor& res = in.res.defined() ? in.res : branch;
  if (!res.is_cuda()) return "the input is not on a CUDA device";
  if (res.scalar_type() != at::kFloat) return "the residual stream (or the branch starting it) is not float32";
  const int64_t cols = res.size(-1);
  if (cols % 4 != 0 || cols > kMaxCols || cols == 0) {
    return "the last dimension (" + std::to_string(cols) + ") is not a multiple of 4 up to " + std::to_string(kMaxCols);
  }
  if (!own::norm_builds(at::kFloat, o.out)) return std::string("output dtype ") + c10::toString(o.out);
  if (!res.is_contiguous() || !own::aligned16(res)) return "the input is not contiguous and 16-byte aligned";
  if (branch.defined()) {
    if (branch.device() != res.device()) return "the branch is on another device";
    if (!own::norm_builds(branch.scalar_type(), o.out)) {
      return std::string("branch dtype ") + c10::toString(branch.scalar_type()) + " with output dtype " + c10::toString(o.out);
    }
    if (!branch.is_contiguous() || !own::aligned16(branch)) return "the branch is not contiguous and 16-byte aligned";
  }
  if (in.branch_bias.defined() && in.branch_bias.numel() > cols && branch.scalar_type() != at::kFloat) {
    return "a branch bias of several rows (one per position) with a branch that is not float32";
  }
  for (const at::Tensor* p : {&in.weight, &in.bias, &in.branch_bias}) {
    if (!p->defined()) continue;
    if (p->device() != res.device() || p->scalar_type() != at::kFloat || !p->is_contiguous() || !own::aligned16(*p)) {
      return "weight, bias and branch bias must be contiguous float32 on the input's device";
    }
  }
  return kernels::unavailable(res.get_device());
}

std::pair<at::Tensor, at::Tensor> fused(const Inputs& in, const Options& o) {
  auto opt = [](const at::Tensor& t) { return t.defined() ? std::optional<at::Tensor>(t) : std::nullopt; };
  variable_list out = FusedNorm::apply(opt(in.res), opt(in.branch), opt(in.branch_bias), opt(in.weight), opt(in.bias), o);
  if (out.size() == 1) return {at::Tensor(), out[0]};
  return {out[0], out[1]};
}

}  // namespace tcg::norm
