// Process groups over libtorch's own c10d and NCCL (CUDA builds with NCCL headers; otherwise
// csrc/no_dist.cpp). Built with -DUSE_C10D_NCCL, as libtorch itself was.
#include "dist.h"

#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <dlfcn.h>

#include <chrono>
#include <cstdlib>
#include <memory>
#include <thread>
#include <type_traits>

using namespace tcg;

const NcclApi& tcg::NcclApi::get() {
  static const NcclApi api = [] {
    NcclApi a;
    auto find = [](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(RTLD_DEFAULT, name));
    };
    find(a.comm_revoke, "ncclCommRevoke");
    find(a.mem_alloc, "ncclMemAlloc");
    find(a.mem_free, "ncclMemFree");
    find(a.comm_register, "ncclCommRegister");
    find(a.comm_deregister, "ncclCommDeregister");
    find(a.window_register, "ncclCommWindowRegister");
    find(a.window_deregister, "ncclCommWindowDeregister");
    find(a.error_string, "ncclGetErrorString");
    return a;
  }();
  return api;
}

void tcg::NcclApi::check(int result, const char* what) const {
  if (result != 0) {
    throw exception(TCG_DIST, std::string(what) + " failed: " +
                                  (error_string != nullptr ? error_string(result) : "NCCL error " + std::to_string(result)));
  }
}

bool tcg::graph_mixing_off() {
  static const bool off = [] {
    const char* v = std::getenv("NCCL_GRAPH_MIXING_SUPPORT");
    return v != nullptr && std::string(v) == "0";
  }();
  return off;
}

void tcg::settle_before_eager_collective(tcg_pg* p) {
  if (!graph_mixing_off()) return;
  if (c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None) return;
  c10::cuda::CUDAGuard on_device(p->device);
  c10::cuda::device_synchronize();
}

void tcg::check_collective(tcg_pg* p, const at::Tensor& t) {
  if (p->aborted.load()) {
    throw exception(TCG_DIST, "the process group was aborted after a timeout (a rank stopped responding): make a new one");
  }
  settle_before_eager_collective(p);
  if (!t.is_cuda() || t.get_device() != p->device) {
    misuse("collective tensor must be on cuda:" + std::to_string(p->device) + " (this rank's device)");
  }
}

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

void check_coordinates(int rank, int size) {
  if (rank < 0 || size <= 0 || rank >= size) misuse("invalid rank " + std::to_string(rank) + " of " + std::to_string(size));
}

// The group over `store`; the coordinates were checked by the caller (check_coordinates).
tcg_pg* make_pg(c10::intrusive_ptr<c10d::Store> store, int rank, int size, int device, int64_t timeout_ms) {
  require_cuda();
  auto dev = checked_device(device);
  c10::cuda::set_device(dev);
  auto opts = c10d::ProcessGroupNCCL::Options::create();
  opts->timeout = std::chrono::milliseconds(timeout_ms);
  auto pg = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, opts);
  auto* out = new tcg_pg{};
  out->store = std::move(store);
  out->pg = std::move(pg);
  out->rank = rank;
  out->size = size;
  out->device = dev;
  return out;
}

// Runs a collective on the current stream (asyncOp = false: no side stream, no events, and a
// null Work), or, for an asynchronous Work, makes the current stream wait for it.
void run_on_current_stream(const c10::intrusive_ptr<c10d::Work>& w) {
  if (w) w->wait();
}

// Marks the group aborted and stops its in-flight NCCL work without waiting for any peer.
// ncclCommRevoke stops in-flight operations (the spinning kernels exit) and returns at once.
// Without it, c10d's abort runs on a detached thread: NCCL's abort raises the flag its kernels
// poll first, but then reclaims resources, which waits for good when a peer on this node died.
void abort_group(tcg_pg* p) {
  if (p->aborted.exchange(true)) return;
  if (auto revoke = NcclApi::get().comm_revoke) {
    try {
      c10::cuda::CUDAGuard g(p->device);
      void* comm = reinterpret_cast<void*>(p->pg->getCommPtr());
      if (comm != nullptr) {
        revoke(comm, 0);
        return;
      }
    } catch (...) {
      // fall through to the abort below
    }
  }
  auto pg = p->pg;
  std::thread([pg] {
    try {
      pg->abort();
    } catch (...) {
      // best effort: the group is refused from now on either way
    }
  }).detach();
}

}  // namespace

extern "C" {

bool tcg_pg_available(void) { return true; }

tcg_status tcg_pg_new_from_env(int64_t timeout_ms, tcg_pg** out) {
  return guard([&] {
    int rank = env_int("RANK"), size = env_int("WORLD_SIZE");
    check_coordinates(rank, size);
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
    check_coordinates(rank, size);  // before any store is made: a store waits for the others
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

tcg_status tcg_pg_new_file(const char* path, int rank, int size, int device, int64_t timeout_ms, tcg_pg** out) {
  return guard([&] {
    if (path == nullptr || *path == '\0') misuse("file store: empty path");
    check_coordinates(rank, size);  // before any store is made: a store waits for the others
    auto fs = c10::make_intrusive<c10d::FileStore>(std::string(path), size);
    fs->setTimeout(std::chrono::milliseconds(timeout_ms));
    *out = make_pg(fs, rank, size, device, timeout_ms);
  });
}

void tcg_pg_free(tcg_pg* p) {
  if (p == nullptr) return;
  // An aborted group is left as it is (leaked): its destructor and shutdown may wait for NCCL
  // work of a dead peer, and the process is expected to exit or start over.
  if (p->aborted.load()) return;
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
tcg_status tcg_pg_allreduce(tcg_pg* p, tcg_tensor t, tcg_reduce_op op) {
  return guard([&] {
    std::vector<at::Tensor> v{tensor_ref(t)};
    check_collective(p, v[0]);
    c10d::AllreduceOptions o;
    if (op != TCG_REDUCE_SUM && op != TCG_REDUCE_AVG) misuse("all_reduce: unknown reduce op");
    o.reduceOp = op == TCG_REDUCE_AVG ? c10d::ReduceOp(c10d::ReduceOp::AVG) : c10d::ReduceOp(c10d::ReduceOp::SUM);
    o.asyncOp = false;
    run_on_current_stream(p->pg->allreduce(v, o));
  });
}

tcg_status tcg_pg_broadcast(tcg_pg* p, tcg_tensor t, int root) {
  return guard([&] {
    if (root < 0 || root >= p->size) misuse("broadcast root " + std::to_string(root) + " of " + std::to_string(p->size));
    std::vector<at::Tensor> v{tensor_ref(t)};
    check_collective(p, v[0]);
    c10d::BroadcastOptions o;
    o.rootRank = root;
    o.asyncOp = false;
    run_on_current_stream(p->pg->broadcast(v, o));
  });
}

namespace {
// The flat buffers of reduce-scatter and all-gather: `whole` [size * n], `part` [n].
void check_flat_pair(tcg_pg* p, const at::Tensor& whole, const at::Tensor& part, const char* what) {
  check_collective(p, whole);
  check_collective(p, part);
  if (!whole.is_contiguous() || !part.is_contiguous()) misuse(std::string(what) + ": the buffers must be contiguous");
  if (whole.scalar_type() != part.scalar_type()) misuse(std::string(what) + ": the buffers' dtypes differ");
  if (whole.numel() != part.numel() * p->size) {
    misuse(std::string(what) + ": the whole buffer holds " + std::to_string(whole.numel()) + " values, not " +
           std::to_string(p->size) + " x " + std::to_string(part.numel()));
  }
}
}  // namespace

tcg_status tcg_pg_reduce_scatter(tcg_pg* p, tcg_tensor output, tcg_tensor input, tcg_reduce_op op) {
  return guard([&] {
    at::Tensor out = tensor_ref(output), in = tensor_ref(input);
    check_flat_pair(p, in, out, "reduce_scatter");
    if (op != TCG_REDUCE_SUM && op != TCG_REDUCE_AVG) misuse("reduce_scatter: unknown reduce op");
    c10d::ReduceScatterOptions o;
    o.reduceOp = op == TCG_REDUCE_AVG ? c10d::ReduceOp(c10d::ReduceOp::AVG) : c10d::ReduceOp(c10d::ReduceOp::SUM);
    o.asyncOp = false;
    run_on_current_stream(p->pg->_reduce_scatter_base(out, in, o));
  });
}

tcg_status tcg_pg_all_gather(tcg_pg* p, tcg_tensor output, tcg_tensor input) {
  return guard([&] {
    at::Tensor out = tensor_ref(output), in = tensor_ref(input);
    check_flat_pair(p, out, in, "all_gather");
    c10d::AllgatherOptions o;
    o.asyncOp = false;
    run_on_current_stream(p->pg->_allgather_base(out, in, o));
  });
}

tcg_status tcg_pg_barrier(tcg_pg* p) {
  return guard([&] {
    if (p->aborted.load()) throw exception(TCG_DIST, "the process group was aborted after a timeout");
    settle_before_eager_collective(p);
    c10d::BarrierOptions o;
    o.device_ids = {p->device};
    p->pg->barrier(o)->wait();
  });
}

// The host waits, at most `timeout_ms`, for the work queued so far on the device's current
// stream. A graph replay's NCCL kernels are invisible to c10d's watchdog and spin forever when a
// peer has died; this is the bounded wait for them. On timeout the group is aborted (see
// abort_group: nothing waits for the dead peer) and TCG_DIST_TIMEOUT returned.
tcg_status tcg_pg_wait_device(tcg_pg* p, int64_t timeout_ms) {
  return guard([&] {
    c10::cuda::CUDAGuard g(p->device);
    at::cuda::CUDAEvent done;  // timing off
    done.record(at::cuda::getCurrentCUDAStream(p->device));
    const auto start = std::chrono::steady_clock::now();
    const auto limit = std::chrono::milliseconds(timeout_ms);
    auto nap = std::chrono::microseconds(20);
    while (!done.query()) {
      if (std::chrono::steady_clock::now() - start >= limit) {
        abort_group(p);
        throw exception(TCG_DIST_TIMEOUT, "rank " + std::to_string(p->rank) + ": the device made no progress within " +
                                              std::to_string(timeout_ms) +
                                              " ms (a rank died or stopped calling collectives); the process group "
                                              "was aborted");
      }
      std::this_thread::sleep_for(nap);
      nap = std::min(nap * 2, std::chrono::microseconds(100));
    }
  });
}

// Aborts the group (see abort_group); later collectives are refused.
tcg_status tcg_pg_abort(tcg_pg* p) {
  return guard([&] { abort_group(p); });
}

}  // extern "C"
