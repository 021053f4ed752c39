// The embedding (CPU and CUDA builds): the C API over the crate's path (cuda/embedding_own.cpp:
// ATen's gather forward, the crate's deterministic backward) and ATen's at::embedding for every
// input that path does not take.
#include "embedding_own.h"
#include "kernels.h"
#include "shim.h"

#include <memory>
#include <tuple>

using tcg::guard;
using tcg::misuse;
using tcg::tensor_ref;

extern "C" {

tcg_status tcg_embedding(tcg_tensor weight_handle, tcg_tensor indices_handle, int64_t padding_idx, tcg_kernels kernels,
                         tcg_tensor* out, tcg_tensor* tie, bool* ran_own) {
  return guard([&] {
    *out = nullptr;
    if (tie != nullptr) *tie = nullptr;
    *ran_own = false;
    const at::Tensor& weight = tensor_ref(weight_handle);
    const at::Tensor& indices = tensor_ref(indices_handle);
    if (weight.dim() != 2) misuse("embedding: the weight must be a matrix [num_embeddings, embedding_dim]");
    if (indices.scalar_type() != at::kLong && indices.scalar_type() != at::kInt) {
      misuse(std::string("embedding: the indices must be int64 or int32, not ") + c10::toString(indices.scalar_type()));
    }
    if (padding_idx >= weight.size(0)) {
      misuse("embedding: padding_idx " + std::to_string(padding_idx) + " is past the " + std::to_string(weight.size(0)) +
             " rows");
    }
    const bool own = tcg::kernels::own(kernels, "embedding", [&] { return tcg::embedding::unsupported(weight, indices); });
    at::Tensor y, tied;
    if (own) {
      std::tie(y, tied) = tcg::embedding::fused(weight, indices, padding_idx, tie != nullptr);
    } else {
      y = at::embedding(weight, indices, padding_idx, false, false);
    }
    auto y_handle = std::make_unique<at::Tensor>(std::move(y));
    if (tie != nullptr && tied.defined()) *tie = std::make_unique<at::Tensor>(std::move(tied)).release();
    *out = y_handle.release();
    *ran_own = own;
  });
}

}  // extern "C"
