// The launcher of the crate's embedding backward (embedding_kernels.cu, loaded by
// own_kernels.cpp) and the autograd function around it: ATen's gather forward; backward, the
// indices sorted (ATen's stable sort, of 32-bit ids) and one kernel writing every row of the
// weight's gradient, summed in a fixed order (deterministic, no atomics, no zero-fill pass); at a
// small vocabulary, one kernel scanning the ids instead of the sort and its casts. Tied to a head
// (a second output, the weight's alias, takes the head's weight gradient), the kernel adds the
// rows into that gradient in place instead of writing a gradient of its own.
#include "../embedding_own.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <climits>

#include "../kernels.h"
#include "cuda_shim.h"
#include "embedding_params.h"
#include "own_kernels.h"

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

namespace tcg::embedding {
namespace {

// Whether the backward scans the ids instead of sorting them (embedding_params.h's Scan): a small
// vocabulary (vocab · n · column groups at most kScanMaxWork), 64-bit contiguous indices.
bool scans(const at::Tensor& indices, int64_t vocab, int64_t dim) {
  const int64_t n = std::max<int64_t>(indices.numel(), 1), groups = (dim + kScanCols - 1) / kScanCols;
  return vocab <= kScanMaxWork / n / groups && indices.scalar_type() == at::kLong && indices.is_contiguous();
}

// Whether the backward adds its rows into a tied head's weight gradient `dw` in place: autograd
// gave it the weight's shape, dtype and device (the alias's); it must also be dense and 16-byte
// aligned (else autograd's add, as without the tie).
bool adds_into(const at::Tensor& dw) { return dw.defined() && dw.is_contiguous() && own::aligned16(dw); }

struct FusedEmbedding : torch::autograd::Function<FusedEmbedding> {
  // tie: also return the weight as a second output (PyTorch makes it an alias whose gradient
  // comes to this node): the tied head's weight gradient arrives there.
  static variable_list forward(AutogradContext* ctx, const at::Tensor& weight, const at::Tensor& indices,
                               int64_t padding_idx, bool tie) {
    c10::cuda::CUDAGuard guard(weight.device());
    ctx->set_materialize_grads(false);
    at::Tensor y = at::embedding(weight, indices, padding_idx, false, false);
    ctx->save_for_backward({indices});
    ctx->saved_data["padding_idx"] = padding_idx;
    ctx->saved_data["weight_sizes"] = weight.sizes().vec();
    if (tie) return {y, weight};
    return {y};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    if (at::GradMode::is_enabled()) misuse("embedding: double backward (create_graph) is not supported");
    const at::Tensor& g = grads.at(0);
    // the tied head's weight gradient (undefined: no tie, or no head in this backward)
    at::Tensor head = grads.size() > 1 ? grads[1] : at::Tensor();
    const auto result = [](at::Tensor dw) { return variable_list{std::move(dw), at::Tensor(), at::Tensor(), at::Tensor()}; };
    // the saved ids are read only where the embedding's output has a gradient, so a head that
    // takes a tie after this node's backward ran still sends its gradient through
    if (!g.defined()) return result(head);
    const at::Tensor indices = ctx->get_saved_variables()[0];
    const std::vector<int64_t> wsizes = ctx->saved_data.at("weight_sizes").toIntVector();
    const int device = indices.get_device();
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
    const int64_t vocab = wsizes[0], dim = wsizes[1], n = indices.numel();
    const at::Tensor dy = g.contiguous().view({n, dim});
    // the head's gradient is this node's alone (the tie goes to one head, which made it fresh):
    // the rows are added into it where it can take them
    const bool add = adds_into(head);
    at::Tensor dw = add ? head : at::empty({vocab, dim}, dy.options());
    const int64_t padding_idx = ctx->saved_data.at("padding_idx").toInt();
    if (scans(indices, vocab, dim)) {
      // a small vocabulary: a block per row scans the ids, no sort
      const at::Tensor ids = indices.reshape({-1});
      Scan p{ids.data_ptr<int64_t>(), dy.data_ptr(), dw.data_ptr(), n, vocab, padding_idx, static_cast<int32_t>(dim),
             add};
      const dim3 grid(static_cast<unsigned>(vocab), static_cast<unsigned>((dim + kScanCols - 1) / kScanCols));
      own::launch(own::embedding_kernel(dy.scalar_type(), true), device, grid, kScanThreads, &p);
    } else {
      // the ids sorted, stably: a row's positions in increasing order
      const auto [sorted, order] = at::sort(indices.reshape({-1}).to(at::kInt), /*stable=*/true, 0, false);
      // a block's warps share a row where rows average 8 positions or more (a small vocabulary)
      const int32_t per_row = n >= 8 * vocab ? kWarps : 1;
      Backward p{sorted.data_ptr<int32_t>(), order.data_ptr<int64_t>(), dy.data_ptr(), dw.data_ptr(), n, vocab,
                 padding_idx, static_cast<int32_t>(dim), per_row, add};
      const int64_t rows_per_block = kWarps / per_row;
      const int64_t blocks =
          std::clamp<int64_t>((vocab + rows_per_block - 1) / rows_per_block, 1, own::sm_count(device) * 64);
      own::launch(own::embedding_kernel(dy.scalar_type(), false), device, static_cast<unsigned>(blocks), kThreads, &p);
    }
    // a head's gradient the kernel could not add into: autograd's sum, the head's first
    if (head.defined() && !add) dw = head + dw;
    return result(dw);
  }
};

}  // namespace

std::string unsupported(const at::Tensor& weight, const at::Tensor& indices) {
  if (!weight.is_cuda() || indices.device() != weight.device()) {
    return "the weight is not on a CUDA device, or the indices are on another";
  }
  if (!own::embedding_builds(weight.scalar_type())) return std::string("weight dtype ") + c10::toString(weight.scalar_type());
  if (weight.size(1) % 4 != 0 || !weight.is_contiguous() || !own::aligned16(weight)) {
    return "the embedding width (" + std::to_string(weight.size(1)) + ") is not a multiple of 4, or the weight is not contiguous and 16-byte aligned";
  }
  if (weight.size(0) > INT32_MAX || indices.numel() > INT32_MAX) return "more rows or indices than the kernel indexes";
  if (indices.numel() == 0 || weight.numel() == 0) return "no indices, or an empty weight";
  return kernels::unavailable(weight.get_device());
}

std::pair<at::Tensor, at::Tensor> fused(const at::Tensor& weight, const at::Tensor& indices, int64_t padding_idx,
                                        bool tie) {
  tie = tie && at::GradMode::is_enabled() && weight.requires_grad();
  variable_list out = FusedEmbedding::apply(weight, indices, padding_idx, tie);
  return {out[0], tie ? out[1] : at::Tensor()};
}

}  // namespace tcg::embedding
