// Pools and the caching allocator's figures (CUDA builds). Every entry point initializes CUDA
// lazily (require_cuda), so each may be the first CUDA call of a process, as in PyTorch.
#include "cuda_shim.h"

#include <ATen/cuda/CUDAGraph.h>
#include <ATen/cuda/MemPool.h>
#include <c10/cuda/CUDACachingAllocator.h>

using namespace tcg;
using MempoolId = c10::MempoolId_t;

struct tcg_mempool {
  at::cuda::MemPool pool;
};

extern "C" {

tcg_status tcg_graph_pool_handle(tcg_pool_id* out) {
  return guard([&] {
    require_cuda();
    auto id = at::cuda::graph_pool_handle();
    *out = tcg_pool_id{id.first, id.second};
  });
}

tcg_status tcg_mempool_new(tcg_mempool** out) {
  return guard([&] {
    require_cuda();
    *out = new tcg_mempool{at::cuda::MemPool()};
  });
}

void tcg_mempool_free(tcg_mempool* p) {
  try {
    delete p;
  } catch (...) {
  }
}

tcg_status tcg_mempool_id(tcg_mempool* p, tcg_pool_id* out) {
  return guard([&] {
    auto id = p->pool.id();
    *out = tcg_pool_id{id.first, id.second};
  });
}

tcg_status tcg_mempool_use_count(tcg_mempool* p, int* out) {
  return guard([&] { *out = p->pool.use_count(); });
}

tcg_status tcg_memory_stats(int device, tcg_mem_stats* out) {
  return guard([&] {
    auto s = c10::cuda::CUDACachingAllocator::getDeviceStats(checked_device(device));
    constexpr auto agg = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    out->allocated_current = s.allocated_bytes[agg].current;
    out->allocated_peak = s.allocated_bytes[agg].peak;
    out->reserved_current = s.reserved_bytes[agg].current;
    out->reserved_peak = s.reserved_bytes[agg].peak;
    out->active_current = s.active_bytes[agg].current;
    out->num_alloc_retries = s.num_alloc_retries;
    out->num_ooms = s.num_ooms;
  });
}

tcg_status tcg_reset_peak_stats(int device) {
  return guard([&] { c10::cuda::CUDACachingAllocator::resetPeakStats(checked_device(device)); });
}

tcg_status tcg_pool_memory(int device, tcg_pool_id pool, int64_t* reserved, int64_t* allocated) {
  return guard([&] {
    auto dev = checked_device(device);
    auto snap = c10::cuda::CUDACachingAllocator::snapshot(MempoolId{0, 0}, false);
    int64_t r = 0, a = 0;
    for (const auto& seg : snap.segments) {
      if (seg.device != dev) continue;
      if (seg.owner_private_pool_id.first != pool.first ||
          seg.owner_private_pool_id.second != pool.second) {
        continue;
      }
      r += static_cast<int64_t>(seg.total_size);
      a += static_cast<int64_t>(seg.allocated_size);
    }
    *reserved = r;
    *allocated = a;
  });
}

tcg_status tcg_empty_cache(void) {
  return guard([&] {
    require_cuda();
    c10::cuda::CUDACachingAllocator::emptyCache();
  });
}

}  // extern "C"
