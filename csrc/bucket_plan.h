// The layout of gradient buckets (DDP-style), as plain arithmetic: which parameters share a
// bucket and where each lies in its flat buffer. No libtorch, no CUDA: grad_buckets.cpp builds
// its buffers from it, and tcg_buckets_plan (bucket_plan.cpp) hands it to the CPU tests.
#pragma once

#include "tcg.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace tcg::buckets {

// Why `o` names no valid bucket set (grouped with another collective, compression or buffers;
// an unknown enumerator), or "".
inline std::string invalid(const tcg_buckets_options& o) {
  if (o.layout < TCG_BUCKET_LAYOUT_PACKED || o.layout > TCG_BUCKET_LAYOUT_GROUPED) return "unknown bucket layout";
  if (o.collective < TCG_BUCKET_COLLECTIVE_ALL_REDUCE || o.collective > TCG_BUCKET_COLLECTIVE_REDUCE_SCATTER_ALL_GATHER) {
    return "unknown bucket collective";
  }
  if (o.compression < TCG_BUCKET_COMPRESSION_NONE || o.compression > TCG_BUCKET_COMPRESSION_BF16) return "unknown bucket compression";
  if (o.buffers < TCG_BUCKET_BUFFERS_CACHING || o.buffers > TCG_BUCKET_BUFFERS_NCCL_WINDOW) return "unknown bucket buffers";
  if (o.layout == TCG_BUCKET_LAYOUT_GROUPED &&
      (o.collective != TCG_BUCKET_COLLECTIVE_ALL_REDUCE || o.compression != TCG_BUCKET_COMPRESSION_NONE ||
       o.buffers != TCG_BUCKET_BUFFERS_CACHING)) {
    return "the grouped layout all-reduces the gradients where they are: no other collective, compression or buffers";
  }
  return "";
}

struct Planned {
  std::vector<size_t> members;   // parameter indices, in the flat buffer's order
  std::vector<int64_t> offsets;  // each member's offset in the flat buffer (elements)
  int64_t numel = 0;             // the flat buffer's length, padding included
  int64_t used = 0;              // the members' elements and their alignment padding
};

struct Rules {
  int64_t element_bytes = 4;
  int64_t bucket_bytes = 25 << 20;
  int64_t first_bucket_bytes = 0;  // 0: as bucket_bytes
  bool aligned = false;            // each member starts 16-byte aligned (the views layout)
  bool padded = false;             // the length a multiple of world × 16 bytes (reduce-scatter)
  int64_t world = 1;
};

// Buckets of up to `bucket_bytes` over the parameters in reverse order (the order backward
// produces gradients; a parameter larger than a bucket gets one of its own), the first bucket
// up to `first_bucket_bytes` so that communication starts early (PyTorch DDP: 1 MiB).
// `bucket_of[i]`: the bucket of parameter i.
inline std::vector<Planned> plan(const std::vector<int64_t>& numels, const Rules& r, std::vector<size_t>* bucket_of) {
  const int64_t elt = std::max<int64_t>(r.element_bytes, 1);
  const int64_t cap = std::max<int64_t>(r.bucket_bytes, 1);
  const int64_t first_cap = r.first_bucket_bytes > 0 ? r.first_bucket_bytes : cap;
  const int64_t align = std::max<int64_t>(16 / elt, 1);  // elements per 16 bytes
  std::vector<Planned> buckets;
  bucket_of->assign(numels.size(), 0);
  for (size_t i = numels.size(); i-- > 0;) {
    const int64_t numel = numels[i];
    const int64_t limit = buckets.size() == 1 ? first_cap : cap;
    if (buckets.empty() || (!buckets.back().members.empty() && (buckets.back().numel + numel) * elt > limit)) {
      buckets.emplace_back();
    }
    auto& b = buckets.back();
    // aligned (views): each member starts 16-byte aligned; packed: back to back (cat's layout)
    const int64_t at = r.aligned ? (b.numel + align - 1) / align * align : b.numel;
    b.members.push_back(i);
    b.offsets.push_back(at);
    b.numel = at + numel;
    (*bucket_of)[i] = buckets.size() - 1;
  }
  const int64_t chunk = std::max<int64_t>(r.world, 1) * align;
  for (auto& b : buckets) {
    b.used = b.numel;
    // padded (reduce-scatter): every rank's chunk of the same length, each 16-byte aligned
    if (r.padded) b.numel = (b.numel + chunk - 1) / chunk * chunk;
  }
  return buckets;
}

}  // namespace tcg::buckets
