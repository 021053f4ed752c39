// Process groups over libtorch's own c10d and NCCL (CUDA builds with NCCL headers; otherwise
// csrc/no_dist.cpp). Built with -DUSE_C10D_NCCL, as libtorch itself was.
#include "cuda_shim.h"

#include <c10/cuda/CUDAGuard.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <cstdlib>
#include <memory>

using namespace tcg;

struct tcg_pg {
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::ProcessGroupNCCL> pg;
  int rank;
  int size;
  c10::DeviceIndex device;
};

namespace {

std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v == nullptr || *v == '\0' ? fallback : std::string(v);
}

int env_int(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') misuse(std::string("process group from the environment: ") + name + " is not set (launch with torchrun)");
  return std::stoi(v);
}

tcg_pg* make_pg(c10::intrusive_ptr<c10d::Store> store, int rank, int size, int device, int64_t timeout_ms) {
  require_cuda();
  if (rank < 0 || size <= 0 || rank >= size) misuse("invalid rank " + std::to_string(rank) + " of " + std::to_string(size));
  auto dev = checked_device(device);
  c10::cuda::set_device(dev);
  auto opts = c10d::ProcessGroupNCCL::Options::create();
  opts->timeout = std::chrono::milliseconds(timeout_ms);
  auto pg = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, opts);
  return new tcg_pg{std::move(store), std::move(pg), rank, size, dev};
}

void check_device(tcg_pg* p, const at::Tensor& t) {
  if (!t.is_cuda() || t.get_device() != p->device) {
    misuse("collective tensor must be on cuda:" + std::to_string(p->device) + " (this rank's device)");
  }
}

}  // namespace

extern "C" {

int tcg_dist_available(void) { return 1; }

tcg_status tcg_pg_new_from_env(int64_t timeout_ms, tcg_pg** out) {
  return guard([&] {
    int rank = env_int("RANK"), size = env_int("WORLD_SIZE");
    if (rank < 0 || size <= 0 || rank >= size) misuse("invalid RANK " + std::to_string(rank) + " of WORLD_SIZE " + std::to_string(size));
    int local = std::stoi(env_or("LOCAL_RANK", "0"));
    std::string host = env_or("MASTER_ADDR", "127.0.0.1");
    c10d::TCPStoreOptions so;
    so.port = static_cast<std::uint16_t>(env_int("MASTER_PORT"));
    so.timeout = std::chrono::milliseconds(timeout_ms);
    std::string agent = env_or("TORCHELASTIC_USE_AGENT_STORE", "");
    if (agent == "True" || agent == "true" || agent == "1") {
      so.isServer = false;  // torchrun's agent hosts the store
    } else {
      so.isServer = rank == 0;
      so.numWorkers = size;
      so.multiTenant = true;
    }
    c10::intrusive_ptr<c10d::Store> tcp = c10::make_intrusive<c10d::TCPStore>(host, so);
    // the restart count keeps an earlier attempt's keys apart
    auto store = c10::make_intrusive<c10d::PrefixStore>(
        "tcg_pg/" + env_or("TORCHELASTIC_RESTART_COUNT", "0"), tcp);
    *out = make_pg(store, rank, size, local, timeout_ms);
  });
}

tcg_status tcg_pg_new_tcp(const char* host, int port, int rank, int size, int device, int64_t timeout_ms,
                          tcg_pg** out) {
  return guard([&] {
    if (rank < 0 || size <= 0 || rank >= size) misuse("invalid rank " + std::to_string(rank) + " of " + std::to_string(size));
    c10d::TCPStoreOptions so;
    so.port = static_cast<std::uint16_t>(port);
    so.isServer = rank == 0;
    so.numWorkers = size;
    so.multiTenant = true;
    so.timeout = std::chrono::milliseconds(timeout_ms);
    c10::intrusive_ptr<c10d::Store> tcp = c10::make_intrusive<c10d::TCPStore>(std::string(host), so);
    *out = make_pg(tcp, rank, size, device, timeout_ms);
  });
}

void tcg_pg_free(tcg_pg* p) {
  if (p == nullptr) return;
  try {
    p->pg->shutdown();
  } catch (...) {
  }
  try {
    delete p;
  } catch (...) {
  }
}

tcg_status tcg_pg_info(tcg_pg* p, int* rank, int* size, int* device) {
  return guard([&] {
    *rank = p->rank;
    *size = p->size;
    *device = p->device;
  });
}

// op: 0 sum, 1 average. The current stream waits for the result (no host wait): capturable.
tcg_status tcg_pg_allreduce(tcg_pg* p, tcg_tensor t, int op) {
  return guard([&] {
    std::vector<at::Tensor> v{tensor_ref(t)};
    check_device(p, v[0]);
    c10d::AllreduceOptions o;
    o.reduceOp = op == 1 ? c10d::ReduceOp(c10d::ReduceOp::AVG) : c10d::ReduceOp(c10d::ReduceOp::SUM);
    p->pg->allreduce(v, o)->wait();
  });
}

tcg_status tcg_pg_broadcast(tcg_pg* p, tcg_tensor t, int root) {
  return guard([&] {
    std::vector<at::Tensor> v{tensor_ref(t)};
    check_device(p, v[0]);
    c10d::BroadcastOptions o;
    o.rootRank = root;
    p->pg->broadcast(v, o)->wait();
  });
}

tcg_status tcg_pg_barrier(tcg_pg* p) {
  return guard([&] {
    c10d::BarrierOptions o;
    o.device_ids = {p->device};
    p->pg->barrier(o)->wait();
  });
}

}  // extern "C"
