// The launcher of the crate's SwiGLU kernels (swiglu_kernels.cu, loaded by own_kernels.cpp) and
// the autograd function around them: one pass forward reading [gate | up], one pass backward
// writing [dgate | dup].
#include "../swiglu_own.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>

#include "../kernels.h"
#include "cuda_shim.h"
#include "own_kernels.h"
#include "swiglu_params.h"

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

namespace tcg::swiglu {
namespace {

// One block per kThreads / lanes_for(f) rows (a thread per 4 values of a row), at most 16 an SM.
unsigned blocks_for(int64_t rows, int64_t f, int device) {
  const int64_t rows_per_block = kThreads / lanes_for(f);
  return static_cast<unsigned>(
      std::clamp<int64_t>((rows + rows_per_block - 1) / rows_per_block, 1, own::sm_count(device) * 16));
}

struct FusedSwiGLU : torch::autograd::Function<FusedSwiGLU> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& h) {
    ctx->save_for_backward({h});
    return {forward_kernel(h)};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    if (at::GradMode::is_enabled()) misuse("swiglu: double backward (create_graph) is not supported");
    const at::Tensor h = ctx->get_saved_variables()[0];
    const at::Tensor& d = grads.at(0);
    if (!d.defined()) return {at::Tensor()};
    return {backward_kernel(h, d.to(h.scalar_type()).contiguous())};
  }
};

}  // namespace

at::Tensor forward_kernel(const at::Tensor& h) {
  const int device = h.get_device();
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  const int64_t f = h.size(-1) / 2, rows = h.numel() / std::max<int64_t>(2 * f, 1);
  std::vector<int64_t> sizes = h.sizes().vec();
  sizes.back() = f;
  at::Tensor out = at::empty(sizes, h.options());
  Forward p{h.data_ptr(), out.data_ptr(), rows, f};
  if (rows * f > 0) {
    own::launch(own::swiglu_kernel(own::Pass::Forward, h.scalar_type()), device, blocks_for(rows, f, device), kThreads,
                &p);
  }
  return out;
}

at::Tensor backward_kernel(const at::Tensor& h, const at::Tensor& d) {
  const int device = h.get_device();
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  const int64_t f = h.size(-1) / 2, rows = h.numel() / std::max<int64_t>(2 * f, 1);
  at::Tensor dh = at::empty_like(h);
  Backward p{h.data_ptr(), d.data_ptr(), dh.data_ptr(), rows, f};
  if (rows * f > 0) {
    own::launch(own::swiglu_kernel(own::Pass::Backward, h.scalar_type()), device, blocks_for(rows, f, device),
                kThreads, &p);
  }
  return dh;
}

std::string unsupported(const at::Tensor& h) {
  if (!h.is_cuda()) return "the input is not on a CUDA device";
  if (!own::swiglu_builds(h.scalar_type())) return std::string("dtype ") + c10::toString(h.scalar_type());
  if ((h.size(-1) / 2) % 4 != 0) return "half the last dimension is not a multiple of 4";
  if (!h.is_contiguous() || !own::aligned16(h)) {
    return "the input is not contiguous and 16-byte aligned";
  }
  return kernels::unavailable(h.get_device());
}

at::Tensor fused(const at::Tensor& h) { return FusedSwiGLU::apply(h)[0]; }

}  // namespace tcg::swiglu
