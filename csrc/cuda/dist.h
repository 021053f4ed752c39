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

// Refuses a collective on an aborted group, or on a tensor not on the group's device.
void check_collective(tcg_pg* p, const at::Tensor& t);

}  // namespace tcg
