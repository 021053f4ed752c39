// The process-group handle shared by csrc/cuda/dist.cpp (groups, collectives, the bounded device
// wait) and csrc/cuda/grad_buckets.cpp (gradient buckets fed by autograd hooks). Internal.
#pragma once
#include "cuda_shim.h"

#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

#include <atomic>

struct tcg_pg {
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::ProcessGroupNCCL> pg;
  int rank;
  int size;
  c10::DeviceIndex device;
  // set once tcg_pg_wait_device gave up and aborted the communicators: every later collective
  // is refused (NCCL's communicators are gone)
  std::atomic<bool> aborted{false};
};

namespace tcg {

// Whether NCCL_GRAPH_MIXING_SUPPORT=0 is set (read once). NCCL then captures collectives without
// the bookkeeping that lets graph launches and other NCCL launches of one communicator be
// outstanding together (faster captured collectives), and is correct only if no non-captured
// NCCL launch follows a graph launch that has not finished, whatever the streams.
bool graph_mixing_off();
// Under graph_mixing_off(), outside a capture: the host waits for the group's device (every graph
// replay queued there) before an eager collective; otherwise nothing.
void settle_before_eager_collective(tcg_pg* p);
// Refuses a collective on an aborted group, or on a tensor not on the group's device; settles
// the device first (settle_before_eager_collective).
void check_collective(tcg_pg* p, const at::Tensor& t);

// The NCCL calls the shim makes itself, looked up once in the libnccl that libtorch_cuda loaded
// (the shim does not link NCCL); each null where that NCCL has none. Signatures as nccl.h 2.28;
// all return an ncclResult_t, 0 on success.
struct NcclApi {
  int (*comm_revoke)(void* comm, int flags) = nullptr;  // NCCL >= 2.28
  int (*mem_alloc)(void** ptr, size_t size) = nullptr;
  int (*mem_free)(void* ptr) = nullptr;
  int (*comm_register)(void* comm, void* buff, size_t size, void** handle) = nullptr;
  int (*comm_deregister)(void* comm, void* handle) = nullptr;
  int (*window_register)(void* comm, void* buff, size_t size, void** win, int flags) = nullptr;  // >= 2.27
  int (*window_deregister)(void* comm, void* win) = nullptr;
  const char* (*error_string)(int result) = nullptr;

  static const NcclApi& get();
  // Throws TCG_DIST naming `what` and NCCL's message when `result` is not success.
  void check(int result, const char* what) const;
};

}  // namespace tcg
