// The launcher of the crate's fused cross-entropy kernels (loss_kernels.cu, loaded by
// own_kernels.cpp) and the autograd function around them. Where the loss will be differentiated
// (grad mode on, logits that require grad), the forward counts the rows first and writes the
// gradient for a loss gradient of 1 as it reads each row, and saves only that gradient; the
// backward scales it in place where the loss's gradient is not 1 (a device check: a captured
// graph reads each replay's own) and hands it on, so a second backward through it is refused.
// Where no backward can come, the forward writes no gradient.
#include "../loss_own.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>

#include "cuda_shim.h"
#include "loss_params.h"
#include "../kernels.h"
#include "own_kernels.h"

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

namespace tcg::loss {
namespace {

// 4-value loads: every row 16-byte aligned for them.
bool vectorized(const at::Tensor& logits) {
  return logits.size(1) % 4 == 0 && own::aligned16(logits);
}

// How the rows are spread: a warp per row for narrow rows (kWarpRowsPerBlock to a block), else a
// block per row of enough threads for one load each, a multiple of 32, at most kMaxThreads.
struct Grid {
  unsigned blocks, threads;
  bool warp_rows;
};

Grid grid_for(int64_t rows, int64_t cols, bool vec) {
  const int64_t items = vec ? (cols + 3) / 4 : cols;
  if (items <= kWarpRowItems) {
    return {static_cast<unsigned>((rows + kWarpRowsPerBlock - 1) / kWarpRowsPerBlock), 32 * kWarpRowsPerBlock, true};
  }
  return {static_cast<unsigned>(rows), static_cast<unsigned>(std::clamp<int64_t>((items + 31) / 32 * 32, 32, kMaxThreads)),
          false};
}

// The targets, passed as a plain value: not an autograd input; and whether the forward writes
// the gradient.
struct Targets {
  at::Tensor t;
  int64_t ignore_index;
  bool write_grad;
};

struct FusedCrossEntropy : torch::autograd::Function<FusedCrossEntropy> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& logits, Targets targets) {
    const int device = logits.get_device();
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
    const int64_t rows = logits.size(0), cols = logits.size(1);
    const auto f32 = logits.options().dtype(at::kFloat);
    at::Tensor row_loss = at::empty({rows}, f32), loss = at::empty({}, f32);
    const bool vec = vectorized(logits);
    const Grid g = grid_for(rows, cols, vec);
    at::Tensor dlogits, inv_count;
    if (targets.write_grad) {
      dlogits = at::empty_like(logits);
      inv_count = at::empty({}, f32);
      Count c{targets.t.data_ptr<int64_t>(), inv_count.data_ptr<float>(), rows, targets.ignore_index};
      own::launch("tcg_ce_count", device, 1, kFinishThreads, &c);
    }
    Forward p{logits.data_ptr(), targets.t.data_ptr<int64_t>(), row_loss.data_ptr<float>(), rows, cols,
              targets.ignore_index, vec ? 1 : 0, g.warp_rows ? 1 : 0,
              dlogits.defined() ? inv_count.data_ptr<float>() : nullptr, dlogits.defined() ? dlogits.data_ptr() : nullptr};
    own::launch(own::loss_kernel(own::Pass::Forward, logits.scalar_type()), device, g.blocks, g.threads, &p);
    Finish f{row_loss.data_ptr<float>(), targets.t.data_ptr<int64_t>(), loss.data_ptr<float>(), rows,
             targets.ignore_index};
    own::launch("tcg_ce_finish", device, 1, kFinishThreads, &f);
    ctx->saved_data["dlogits"] = dlogits;  // undefined where no backward can come
    return {loss};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    if (at::GradMode::is_enabled()) misuse("cross_entropy: double backward (create_graph) is not supported");
    at::Tensor g = grads.at(0);
    if (!g.defined()) return {at::Tensor(), at::Tensor()};
    c10::IValue& written = ctx->saved_data["dlogits"];
    at::Tensor dlogits = written.isTensor() ? written.toTensor() : at::Tensor();
    if (!dlogits.defined()) misuse("cross_entropy: a second backward through the fused loss is not supported");
    written = at::Tensor();  // handed on: a second backward would scale it twice
    const int device = dlogits.get_device();
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
    g = g.to(at::kFloat).contiguous();
    const int64_t n = dlogits.numel();
    const int64_t blocks = std::min<int64_t>((n + 4 * kScaleThreads - 1) / (4 * kScaleThreads), kScaleBlocks);
    Scale p{dlogits.data_ptr(), g.data_ptr<float>(), n};
    own::launch(own::loss_kernel(own::Pass::Backward, dlogits.scalar_type()), device, static_cast<unsigned>(blocks),
                kScaleThreads, &p);
    return {dlogits, at::Tensor()};
  }
};

}  // namespace

std::string unsupported(const at::Tensor& logits, const at::Tensor& targets) {
  if (!logits.is_cuda()) return "the logits are not on a CUDA device";
  if (targets.device() != logits.device()) return "the targets are on another device";
  if (!own::loss_builds(logits.scalar_type())) return std::string("logits dtype ") + c10::toString(logits.scalar_type());
  if (!logits.is_contiguous() || !targets.is_contiguous()) return "the logits or targets are not contiguous";
  if (logits.size(0) == 0 || logits.size(1) == 0) return "no rows or no classes";
  if (logits.size(0) > INT32_MAX) return "more rows than a grid holds";
  if (logits.size(1) > (int64_t{1} << 30)) return "rows of more than 2^30 classes (the kernels index a row in 32 bits)";
  return kernels::unavailable(logits.get_device());
}

at::Tensor cross_entropy(const at::Tensor& logits, const at::Tensor& targets, int64_t ignore_index) {
  const bool write_grad = at::GradMode::is_enabled() && logits.requires_grad();
  return FusedCrossEntropy::apply(logits, Targets{targets, ignore_index, write_grad})[0];
}

}  // namespace tcg::loss
