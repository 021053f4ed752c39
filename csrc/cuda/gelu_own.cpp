// The launcher of the crate's bias + GELU kernels (gelu_kernels.cu, loaded by own_kernels.cpp)
// and the autograd function around them: one pass forward, one pass backward that also sums the
// bias gradient per block of rows, then a small kernel summing those in a fixed order.
#include "../gelu_own.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>

#include "../kernels.h"
#include "col_sum.h"
#include "cuda_shim.h"
#include "gelu_params.h"
#include "own_kernels.h"

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

namespace tcg::gelu {
namespace {

// Both passes' grid: the columns (4 a thread) across x, the rows strided over y, about `per_sm`
// blocks an SM in all, and at least kMinRows rows a block.
dim3 grid(int64_t rows, int64_t f, int device, int64_t per_sm) {
  const int64_t tiles = (f / 4 + kThreads - 1) / kThreads;
  const int64_t most = std::min<int64_t>((rows + kMinRows - 1) / kMinRows, 65535);
  const int64_t splits = std::clamp<int64_t>((own::sm_count(device) * per_sm + tiles - 1) / tiles, 1, std::max<int64_t>(most, 1));
  return dim3(static_cast<unsigned>(tiles), static_cast<unsigned>(splits));
}

struct FusedGelu : torch::autograd::Function<FusedGelu> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const std::optional<at::Tensor>& bias_arg,
                               bool tanh) {
    const at::Tensor bias = bias_arg.value_or(at::Tensor());
    const int device = x.get_device();
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
    const int64_t f = x.size(-1), rows = x.numel() / std::max<int64_t>(f, 1);
    at::Tensor y = at::empty_like(x);
    Forward p{x.data_ptr(), bias.defined() ? bias.data_ptr<float>() : nullptr, y.data_ptr(), rows, f};
    if (rows * f > 0) {
      own::launch(own::gelu_kernel(own::Pass::Forward, x.scalar_type(), tanh), device,
                  grid(rows, f, device, kBlocksPerSm), kThreads, &p);
    }
    ctx->save_for_backward({x, bias});
    ctx->saved_data["tanh"] = tanh;
    return {y};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    if (at::GradMode::is_enabled()) misuse("gelu: double backward (create_graph) is not supported");
    auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &bias = saved[1];
    at::Tensor dy = grads.at(0);
    if (!dy.defined()) return {at::Tensor(), at::Tensor(), at::Tensor()};
    const int device = x.get_device();
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
    dy = dy.to(x.scalar_type()).contiguous();
    const int64_t f = x.size(-1), rows = x.numel() / std::max<int64_t>(f, 1);
    at::Tensor dx = at::empty_like(x);
    at::Tensor dbias = bias.defined() ? at::empty({f}, bias.options()) : at::Tensor();
    if (rows * f == 0) {
      if (bias.defined()) dbias.zero_();
      return {dx, dbias, at::Tensor()};
    }
    // the backward: as many blocks as the SMs hold at once (one wave), so that the bias
    // gradient's partials, one row a block in y, are as few as can be
    const bool tanh = ctx->saved_data.at("tanh").toBool();
    const std::string name = own::gelu_kernel(own::Pass::Backward, x.scalar_type(), tanh);
    const dim3 blocks = grid(rows, f, device, own::resident_blocks(name, device, kThreads));
    at::Tensor part = bias.defined() ? at::empty({static_cast<int64_t>(blocks.y), f}, x.options().dtype(at::kFloat)) : at::Tensor();
    Backward p{x.data_ptr(), bias.defined() ? bias.data_ptr<float>() : nullptr, dy.data_ptr(), dx.data_ptr(),
               bias.defined() ? part.data_ptr<float>() : nullptr, rows, f};
    own::launch(name, device, blocks, kThreads, &p);
    if (bias.defined()) {
      Finish fin{{part.data_ptr<float>()}, {dbias.data_ptr<float>()}, static_cast<int32_t>(blocks.y), static_cast<int32_t>(f)};
      own::launch("tcg_gelu_finish", device, static_cast<unsigned>((f + cuda::kColSumCols - 1) / cuda::kColSumCols),
                  cuda::kColSumThreads, &fin);
    }
    return {dx, dbias, at::Tensor()};
  }
};

}  // namespace

std::string unsupported(const at::Tensor& x, const at::Tensor& bias) {
  if (!x.is_cuda()) return "the input is not on a CUDA device";
  if (!own::gelu_builds(x.scalar_type())) return std::string("dtype ") + c10::toString(x.scalar_type());
  if (x.size(-1) % 4 != 0) return "the last dimension is not a multiple of 4";
  if (x.size(-1) > INT32_MAX) return "the last dimension is wider than 2^31";
  if (!x.is_contiguous() || !own::aligned16(x)) return "the input is not contiguous and 16-byte aligned";
  if (bias.defined() && (bias.scalar_type() != at::kFloat || !bias.is_contiguous() || !own::aligned16(bias))) {
    return "the bias is not contiguous, 16-byte aligned float32";
  }
  return kernels::unavailable(x.get_device());
}

at::Tensor fused(const at::Tensor& x, const at::Tensor& bias, bool tanh) {
  return FusedGelu::apply(x, bias.defined() ? std::optional<at::Tensor>(bias) : std::nullopt, tanh)[0];
}

}  // namespace tcg::gelu
