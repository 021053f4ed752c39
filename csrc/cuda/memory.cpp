// Pools and the caching allocator's figures (CUDA builds). Every entry point initializes CUDA
// lazily (require_cuda), so each may be the first CUDA call of a process, as in PyTorch.
#include "cuda_shim.h"

#include <ATen/core/CachingHostAllocator.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>

#include <algorithm>
#include <vector>

using namespace tcg;
using MempoolId = c10::MempoolId_t;

namespace {

at::HostAllocator* host_allocator() { return at::getHostAllocator(at::kCUDA); }

// One reference on `id` in the device allocator. A pool at use count 0 ("freeable") cannot be
// referenced again (internal assert, thrown as c10::Error, before anything changed); emptying
// the device cache of that pool erases it when none of its blocks is still allocated.
void incref_device(c10::DeviceIndex dev, MempoolId id) {
  try {
    c10::cuda::CUDACachingAllocator::createOrIncrefPool(dev, id);
  } catch (const c10::Error&) {
    c10::cuda::CUDACachingAllocator::emptyCache(id);
    c10::cuda::CUDACachingAllocator::createOrIncrefPool(dev, id);
  }
}

// The same in the pinned host allocator, whose interface increments only through
// begin_allocate_to_pool (with a filter that routes nothing) and end_allocate_to_pool.
void incref_host(MempoolId id) {
  auto once = [&] {
    host_allocator()->begin_allocate_to_pool(id, [](c10::Stream) { return false; });
    host_allocator()->end_allocate_to_pool(id);
  };
  try {
    once();
  } catch (const c10::Error&) {
    host_allocator()->empty_cache();
    once();
  }
}

[[noreturn]] void freeable(c10::DeviceIndex device, MempoolId id, const c10::Error& e) {
  misuse("cannot hold pool (" + std::to_string(id.first) + ", " + std::to_string(id.second) +
         ") on cuda:" + std::to_string(device) +
         ": every graph and MemPool that held it is gone, but tensors allocated in it are still "
         "alive, so libtorch keeps it only to free it; drop them or use a fresh pool "
         "(graph_pool_handle) (libtorch: " + e.what_without_backtrace() + ")");
}

}  // namespace

namespace tcg {

pool_hold::pool_hold(c10::DeviceIndex device, MempoolId id, bool empty_on_release)
    : device_(device), id_(id), empty_on_release_(empty_on_release) {
  try {
    incref_device(device_, id_);
  } catch (const c10::Error& e) {
    freeable(device_, id_, e);
  }
  try {
    incref_host(id_);
  } catch (const c10::Error& e) {
    c10::cuda::CUDACachingAllocator::releasePool(device_, id_);
    freeable(device_, id_, e);
  }
}

pool_hold::~pool_hold() {
  try {
    host_allocator()->release_pool(id_);
  } catch (...) {
  }
  try {
    c10::cuda::CUDACachingAllocator::releasePool(device_, id_);
    // a no-op for a pool that something else (a graph) still holds
    if (empty_on_release_) c10::cuda::CUDACachingAllocator::emptyCache(id_);
  } catch (...) {
  }
}

}  // namespace tcg

struct tcg_pool_hold {
  tcg::pool_hold hold;
};

extern "C" {

tcg_status tcg_pool_id_new(tcg_pool_id* out) {
  return guard([&] {
    require_cuda();
    auto id = at::cuda::graph_pool_handle();
    *out = tcg_pool_id{id.first, id.second};
  });
}

tcg_status tcg_pool_hold_new(int device, tcg_pool_id pool, tcg_pool_hold** out) {
  return guard([&] {
    require_cuda();
    auto dev = device < 0 ? c10::cuda::current_device() : checked_device(device);
    if (pool.first != 0 && pool.second != 0) misuse("invalid pool id: both halves are set");
    MempoolId id{pool.first, pool.second};
    if (id == MempoolId{0, 0}) id = at::cuda::graph_pool_handle();
    *out = new tcg_pool_hold{tcg::pool_hold(dev, id, /*empty_on_release=*/true)};
  });
}

void tcg_pool_hold_free(tcg_pool_hold* p) {
  try {
    delete p;
  } catch (...) {
  }
}

tcg_status tcg_pool_hold_id(tcg_pool_hold* p, tcg_pool_id* out, int* device) {
  return guard([&] {
    auto id = p->hold.id();
    *out = tcg_pool_id{id.first, id.second};
    *device = p->hold.device();
  });
}

tcg_status tcg_pool_hold_use_count(tcg_pool_hold* p, int* out) {
  return guard([&] {
    *out = c10::cuda::CUDACachingAllocator::getPoolUseCount(p->hold.device(), p->hold.id());
  });
}

tcg_status tcg_memory_stats(int device, tcg_mem_stats* out) {
  return guard([&] {
    auto s = c10::cuda::CUDACachingAllocator::getDeviceStats(checked_device(device));
    constexpr auto agg = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    out->allocated = s.allocated_bytes[agg].current;
    out->allocated_peak = s.allocated_bytes[agg].peak;
    out->reserved = s.reserved_bytes[agg].current;
    out->reserved_peak = s.reserved_bytes[agg].peak;
    out->active = s.active_bytes[agg].current;
    out->alloc_retries = s.num_alloc_retries;
    out->ooms = s.num_ooms;
  });
}

tcg_status tcg_memory_reset_peak(int device) {
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

tcg_status tcg_pool_blocks(int device, tcg_pool_id pool, tcg_pool_block* out, size_t cap, size_t* n) {
  return guard([&] {
    auto dev = checked_device(device);
    auto snap = c10::cuda::CUDACachingAllocator::snapshot(MempoolId{0, 0}, false);
    std::vector<const c10::CachingDeviceAllocator::SegmentInfo*> segs;
    for (const auto& seg : snap.segments) {
      if (seg.device == dev && seg.owner_private_pool_id.first == pool.first &&
          seg.owner_private_pool_id.second == pool.second) {
        segs.push_back(&seg);
      }
    }
    std::sort(segs.begin(), segs.end(), [](auto a, auto b) { return a->address < b->address; });
    size_t count = 0;
    for (const auto* seg : segs) {
      uint64_t offset = 0;
      for (const auto& b : seg->blocks) {
        if (count < cap) {
          out[count] = tcg_pool_block{seg->address, seg->total_size, offset, b.size,
                                      b.requested_size, b.allocated, seg->is_large};
        }
        offset += b.size;
        ++count;
      }
    }
    *n = count;
  });
}

tcg_status tcg_memory_host_empty_cache(void) {
  return guard([&] {
    require_cuda();
    host_allocator()->empty_cache();
  });
}

tcg_status tcg_memory_empty_cache(void) {
  return guard([&] {
    require_cuda();
    c10::cuda::CUDACachingAllocator::emptyCache();
  });
}

}  // extern "C"
