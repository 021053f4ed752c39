// The launcher of the crate's fused cross-entropy kernels (loss_kernels.cu, loaded by
// own_kernels.cpp) and the autograd function around them: the forward saves the logits, the
// targets, each row's log-sum-exp and the reciprocal count of the rows counted (on the device, so a
// captured graph reads each replay's own); the backward writes the logits' gradient in one pass.
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
  return logits.size(1) % 4 == 0 && reinterpret_cast<uintptr_t>(logits.data_ptr()) % 16 == 0;
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

// The targets, passed as a plain value: not an autograd input.
struct Targets {
  at::Tensor t;
  int64_t ignore_index;
};

struct FusedCrossEntropy : torch::autograd::Function<FusedCrossEntropy> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& logits, Targets targets) {
    const int device = logits.get_device();
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
    const int64_t rows = logits.size(0), cols = logits.size(1);
    const auto f32 = logits.options().dtype(at::kFloat);
    at::Tensor lse = at::empty({rows}, f32), row_loss = at::empty({rows}, f32);
    at::Tensor loss = at::empty({}, f32), inv_count = at::empty({}, f32);
    const bool vec = vectorized(logits);
    const Grid g = grid_for(rows, cols, vec);
    Forward p{logits.data_ptr(), targets.t.data_ptr<int64_t>(), lse.data_ptr<float>(), row_loss.data_ptr<float>(),
              rows, cols, targets.ignore_index, vec ? 1 : 0, g.warp_rows ? 1 : 0};
    own::launch(own::loss_kernel(own::Pass::Forward, logits.scalar_type()), device, g.blocks, g.threads, &p);
    Finish f{row_loss.data_ptr<float>(), targets.t.data_ptr<int64_t>(), loss.data_ptr<float>(),
             inv_count.data_ptr<float>(), rows, targets.ignore_index};
    own::launch("tcg_ce_finish", device, 1, kFinishThreads, &f);
    ctx->save_for_backward({logits, targets.t, lse, inv_count});
    ctx->saved_data["ignore_index"] = targets.ignore_index;
    return {loss};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    if (at::GradMode::is_enabled()) misuse("cross_entropy: double backward (create_graph) is not supported");
    auto saved = ctx->get_saved_variables();
    const at::Tensor &logits = saved[0], &targets = saved[1], &lse = saved[2], &inv_count = saved[3];
    at::Tensor g = grads.at(0);
    if (!g.defined()) return {at::Tensor(), at::Tensor()};
    const int device = logits.get_device();
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
    g = g.to(at::kFloat).contiguous();
    const int64_t rows = logits.size(0), cols = logits.size(1);
    at::Tensor dlogits = at::empty_like(logits);
    const bool vec = vectorized(logits);
    const Grid grid = grid_for(rows, cols, vec);
    Backward p{logits.data_ptr(), targets.data_ptr<int64_t>(), lse.data_ptr<float>(), g.data_ptr<float>(),
               inv_count.data_ptr<float>(), dlogits.data_ptr(), rows, cols, ctx->saved_data.at("ignore_index").toInt(),
               vec ? 1 : 0, grid.warp_rows ? 1 : 0};
    own::launch(own::loss_kernel(own::Pass::Backward, logits.scalar_type()), device, grid.blocks, grid.threads, &p);
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
  return kernels::unavailable(logits.get_device());
}

at::Tensor cross_entropy(const at::Tensor& logits, const at::Tensor& targets, int64_t ignore_index) {
  return FusedCrossEntropy::apply(logits, Targets{targets, ignore_index})[0];
}

}  // namespace tcg::loss
