// tch-cuda-graphs C shim. See tcg.h for the contract: every extern "C" function catches every
// C++ exception (TCG_TRY) and reports it through a status and a thread-local message.
#include "tcg.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#ifndef TCG_NO_CUDA
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <ATen/cuda/CUDAGraph.h>
#include <ATen/cuda/MemPool.h>
#include <ATen/core/CachingHostAllocator.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

namespace {

thread_local std::string last_error;
thread_local bool has_error = false;

tcg_status fail(tcg_status status, std::string msg) {
  last_error = std::move(msg);
  has_error = true;
  return status;
}

// A status-carrying exception the shim throws itself.
struct tcg_exception : std::exception {
  tcg_status status;
  std::string msg;
  tcg_exception(tcg_status s, std::string m) : status(s), msg(std::move(m)) {}
  const char* what() const noexcept override { return msg.c_str(); }
};

[[noreturn]] void misuse(const std::string& msg) { throw tcg_exception(TCG_MISUSE, msg); }

at::Tensor& tensor_ref(tcg_tensor t) {
  if (t == nullptr) misuse("null tensor pointer");
  return *static_cast<at::Tensor*>(t);
}

std::vector<at::Tensor> tensor_list(tcg_tensor* ts, size_t n) {
  std::vector<at::Tensor> v;
  v.reserve(n);
  for (size_t i = 0; i < n; ++i) v.push_back(tensor_ref(ts[i]));
  return v;
}

}  // namespace

#define TCG_TRY(...)                                                            \
  try {                                                                         \
    __VA_ARGS__;                                                                    \
    return TCG_OK;                                                              \
  } catch (const tcg_exception& e) {                                            \
    return fail(e.status, e.msg);                                               \
  } catch (const c10::Error& e) {                                               \
    return fail(TCG_ERROR, e.what_without_backtrace());                         \
  } catch (const std::exception& e) {                                           \
    return fail(TCG_ERROR, e.what());                                           \
  } catch (...) {                                                               \
    return fail(TCG_ERROR, "unknown C++ exception in tch-cuda-graphs shim");    \
  }

extern "C" {

char* tcg_take_last_error(void) {
  if (!has_error) return nullptr;
  char* s = static_cast<char*>(std::malloc(last_error.size() + 1));
  if (s != nullptr) std::memcpy(s, last_error.c_str(), last_error.size() + 1);
  has_error = false;
  last_error.clear();
  return s;
}

void tcg_string_free(char* s) { std::free(s); }

// ---------------------------------------------------------------- fused optimizers (CPU+CUDA)

tcg_status tcg_fused_sgd(tcg_tensor* params, tcg_tensor* grads, tcg_tensor* bufs, size_t n,
                         size_t n_bufs, double weight_decay, double momentum, tcg_tensor lr,
                         double dampening, int nesterov, int maximize, int is_first_step) {
  TCG_TRY({
    if (n_bufs != 0 && n_bufs != n) misuse("momentum buffers must be empty or one per parameter");
    auto p = tensor_list(params, n);
    auto g = tensor_list(grads, n);
    auto b = tensor_list(bufs, n_bufs);
    at::_fused_sgd_(p, g, b, weight_decay, momentum, tensor_ref(lr), dampening, nesterov != 0,
                    maximize != 0, is_first_step != 0);
  })
}

tcg_status tcg_fused_adam(int adamw, tcg_tensor* params, tcg_tensor* grads, tcg_tensor* exp_avgs,
                          tcg_tensor* exp_avg_sqs, tcg_tensor* max_exp_avg_sqs, size_t n_max,
                          tcg_tensor* steps, size_t n, tcg_tensor lr, double beta1, double beta2,
                          double weight_decay, double eps, int amsgrad, int maximize) {
  TCG_TRY({
    if (amsgrad != 0 && n_max != n) misuse("amsgrad needs one max_exp_avg_sq per parameter");
    auto p = tensor_list(params, n);
    auto g = tensor_list(grads, n);
    auto m = tensor_list(exp_avgs, n);
    auto v = tensor_list(exp_avg_sqs, n);
    auto vmax = tensor_list(max_exp_avg_sqs, n_max);
    auto s = tensor_list(steps, n);
    if (adamw != 0) {
      at::_fused_adamw_(p, g, m, v, vmax, s, tensor_ref(lr), beta1, beta2, weight_decay, eps,
                        amsgrad != 0, maximize != 0);
    } else {
      at::_fused_adam_(p, g, m, v, vmax, s, tensor_ref(lr), beta1, beta2, weight_decay, eps,
                       amsgrad != 0, maximize != 0);
    }
  })
}

tcg_status tcg_grads_set_to_none(tcg_tensor* params, size_t n) {
  TCG_TRY({
    for (size_t i = 0; i < n; ++i) tensor_ref(params[i]).mutable_grad().reset();
  })
}

tcg_status tcg_clip_grad_norm(tcg_tensor* grads, size_t n, double max_norm, double norm_type,
                              tcg_tensor* total_out) {
  TCG_TRY({
    auto g = tensor_list(grads, n);
    if (g.empty()) misuse("clip_grad_norm: no gradients (call backward first)");
    auto norms = at::_foreach_norm(g, norm_type);
    at::Tensor total = at::linalg_vector_norm(at::stack(norms), norm_type);
    // clamp(max_norm / (total + 1e-6), max=1): stays on the device, no host sync.
    at::Tensor coef = at::clamp_max(at::reciprocal(total + 1e-6) * max_norm, 1.0);
    at::_foreach_mul_(g, coef);
    *total_out = new at::Tensor(std::move(total));
  })
}

#ifdef TCG_NO_CUDA
// ---------------------------------------------------------------- built without CUDA

#define TCG_NO_CUDA_BODY \
  return fail(TCG_NO_CUDA, "tch-cuda-graphs was built against a libtorch without CUDA: CUDA graphs are unavailable")

int tcg_built_with_cuda(void) { return 0; }
tcg_status tcg_device_count(int* out) { *out = 0; return TCG_OK; }
tcg_status tcg_current_device(int*) { TCG_NO_CUDA_BODY; }
tcg_status tcg_device_synchronize(int) { TCG_NO_CUDA_BODY; }
tcg_status tcg_stream_from_pool(int, int, tcg_stream*) { TCG_NO_CUDA_BODY; }
tcg_status tcg_stream_current(int, tcg_stream*) { TCG_NO_CUDA_BODY; }
tcg_status tcg_stream_default(int, tcg_stream*) { TCG_NO_CUDA_BODY; }
tcg_status tcg_stream_set_current(tcg_stream) { TCG_NO_CUDA_BODY; }
tcg_status tcg_stream_synchronize(tcg_stream) { TCG_NO_CUDA_BODY; }
tcg_status tcg_stream_wait_stream(tcg_stream, tcg_stream) { TCG_NO_CUDA_BODY; }
tcg_status tcg_stream_capture_status(tcg_stream, int*) { TCG_NO_CUDA_BODY; }
tcg_status tcg_stream_guard_new(tcg_stream, tcg_stream_guard**) { TCG_NO_CUDA_BODY; }
void tcg_stream_guard_free(tcg_stream_guard*) {}
tcg_status tcg_graph_new(int, tcg_graph**) { TCG_NO_CUDA_BODY; }
void tcg_graph_free(tcg_graph*) {}
tcg_status tcg_graph_capture_begin(tcg_graph*, tcg_pool_id, int) { TCG_NO_CUDA_BODY; }
tcg_status tcg_graph_capture_end(tcg_graph*) { TCG_NO_CUDA_BODY; }
tcg_status tcg_graph_capture_abort(tcg_graph*, int*) { TCG_NO_CUDA_BODY; }
tcg_status tcg_graph_instantiate(tcg_graph*) { TCG_NO_CUDA_BODY; }
tcg_status tcg_graph_replay(tcg_graph*) { TCG_NO_CUDA_BODY; }
tcg_status tcg_graph_upload(tcg_graph*) { TCG_NO_CUDA_BODY; }
tcg_status tcg_graph_reset(tcg_graph*) { TCG_NO_CUDA_BODY; }
tcg_status tcg_graph_pool(tcg_graph*, tcg_pool_id*) { TCG_NO_CUDA_BODY; }
tcg_status tcg_graph_debug_dump(tcg_graph*, const char*) { TCG_NO_CUDA_BODY; }
tcg_status tcg_graph_enable_debug_mode(tcg_graph*) { TCG_NO_CUDA_BODY; }
tcg_status tcg_graph_node_count(tcg_graph*, size_t*) { TCG_NO_CUDA_BODY; }
tcg_status tcg_graph_node_kinds(tcg_graph*, size_t*, size_t) { TCG_NO_CUDA_BODY; }
tcg_status tcg_graph_pool_handle(tcg_pool_id*) { TCG_NO_CUDA_BODY; }
tcg_status tcg_mempool_new(tcg_mempool**) { TCG_NO_CUDA_BODY; }
void tcg_mempool_free(tcg_mempool*) {}
tcg_status tcg_mempool_id(tcg_mempool*, tcg_pool_id*) { TCG_NO_CUDA_BODY; }
tcg_status tcg_mempool_use_count(tcg_mempool*, int*) { TCG_NO_CUDA_BODY; }
tcg_status tcg_memory_stats(int, tcg_memory_stats*) { TCG_NO_CUDA_BODY; }
tcg_status tcg_reset_peak_stats(int) { TCG_NO_CUDA_BODY; }
tcg_status tcg_pool_memory(int, tcg_pool_id, int64_t*, int64_t*) { TCG_NO_CUDA_BODY; }
tcg_status tcg_empty_cache(void) { TCG_NO_CUDA_BODY; }

#else
// ---------------------------------------------------------------- CUDA

}  // extern "C"

namespace {

using c10::cuda::CUDAStream;
using MempoolId = c10::MempoolId_t;

void require_cuda() {
  if (c10::cuda::device_count() <= 0) {
    throw tcg_exception(TCG_NO_CUDA,
                        "no CUDA device is available (libtorch has CUDA, but the driver reports "
                        "no device: check the driver and CUDA_VISIBLE_DEVICES)");
  }
}

c10::DeviceIndex checked_device(int device) {
  require_cuda();
  if (device < 0 || device >= c10::cuda::device_count()) {
    throw tcg_exception(TCG_MISUSE, "CUDA device index " + std::to_string(device) +
                                        " is out of range (" +
                                        std::to_string(c10::cuda::device_count()) +
                                        " devices)");
  }
  return static_cast<c10::DeviceIndex>(device);
}

tcg_stream pack(const CUDAStream& s) {
  auto d = s.unwrap().pack3();
  return tcg_stream{d.stream_id, d.device_index, static_cast<int8_t>(d.device_type)};
}

CUDAStream unpack(tcg_stream s) {
  require_cuda();
  if (static_cast<c10::DeviceType>(s.device_type) != c10::DeviceType::CUDA) {
    misuse("not a CUDA stream");
  }
  return CUDAStream(CUDAStream::UNCHECKED,
                    c10::Stream::unpack3(s.id, s.device_index, c10::DeviceType::CUDA));
}

void check_cuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    throw tcg_exception(TCG_ERROR, std::string(what) + ": " + cudaGetErrorString(err));
  }
}

int capture_status_of(cudaStream_t s) {
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  check_cuda(cudaStreamIsCapturing(s, &st), "cudaStreamIsCapturing");
  switch (st) {
    case cudaStreamCaptureStatusNone: return 0;
    case cudaStreamCaptureStatusActive: return 1;
    default: return 2;
  }
}

}  // namespace

// The shim's graph: at::cuda::CUDAGraph plus the bookkeeping its failure paths need. Deriving
// gives access to the protected state (pool id, device, stream) that libtorch 2.11's reset()
// does not clean up after a failed capture.
struct tcg_graph : at::cuda::CUDAGraph {
  explicit tcg_graph(bool keep) : at::cuda::CUDAGraph(keep), keep(keep) {}
  bool keep;
  bool capturing = false;  // capture_begin succeeded, capture not yet ended or aborted
  bool captured = false;   // a capture ended successfully and was not reset since

  void begin(c10::MempoolId_t pool, cudaStreamCaptureMode mode) {
    // capture_dev_ is set by capture_begin once its own checks passed: teardown() uses it to
    // know whether the allocator holds a pool reference for this capture.
    capture_dev_ = UNDEFINED_DEVICE;
    graph_ = nullptr;  // capture_end(keep_graph=false) destroys graph_ without clearing it
    capture_begin(pool, mode);
  }

  // Tears down everything a started capture holds. Never throws.
  // Returns whether CUDA had invalidated the capture.
  bool teardown() noexcept {
    bool invalidated = false;
    try {
      cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
      if (cudaStreamIsCapturing(capture_stream_.stream(), &st) == cudaSuccess &&
          st != cudaStreamCaptureStatusNone) {
        invalidated = st == cudaStreamCaptureStatusInvalidated;
        cudaGraph_t dangling = nullptr;
        (void)cudaStreamEndCapture(capture_stream_.stream(), &dangling);
        if (dangling != nullptr) (void)cudaGraphDestroy(dangling);
      }
      (void)cudaGetLastError();
      if (!capture_ended_ && capture_dev_ != UNDEFINED_DEVICE) {
        // libtorch's capture_end threw before it stopped routing allocations to the pool (or
        // it never got there): stop routing and drop the reference capture_begin took, so
        // the pool can be freed (libtorch's reset() only releases after a good capture_end).
        try {
          c10::cuda::CUDACachingAllocator::endAllocateToPool(capture_dev_, mempool_id_);
        } catch (...) {
        }
        try {
          at::getHostAllocator(at::kCUDA)->end_allocate_to_pool(mempool_id_);
        } catch (...) {
        }
        try {
          c10::cuda::CUDACachingAllocator::releasePool(capture_dev_, mempool_id_);
        } catch (...) {
        }
        try {
          at::getHostAllocator(at::kCUDA)->release_pool(mempool_id_);
        } catch (...) {
        }
      }
      if (!has_graph_ && graph_ != nullptr) {
        (void)cudaGraphDestroy(graph_);  // made by this capture's cudaStreamEndCapture
      }
      graph_ = nullptr;
      // capture_begin put the RNG generators registered with this graph into capture mode
      // (capture_prologue); only a successful capture_end takes them out of it. Left on, every
      // later random op outside capture fails ("Offset increment outside graph capture").
      for (auto& entry : captured_generator_states_) {
        entry.first->capturing_ = false;  // what capture_epilogue() does first (not exported)
      }
      reset();  // generator capture states, the capturing-graphs map, graph and exec
    } catch (...) {
    }
    (void)cudaGetLastError();
    capture_dev_ = UNDEFINED_DEVICE;
    capturing = false;
    captured = false;
    return invalidated;
  }
};

struct tcg_stream_guard {
  c10::cuda::CUDAStreamGuard guard;
  explicit tcg_stream_guard(CUDAStream s) : guard(s) {}
};

struct tcg_mempool {
  at::cuda::MemPool pool;
};

extern "C" {

int tcg_built_with_cuda(void) { return 1; }

tcg_status tcg_device_count(int* out) {
  TCG_TRY({ *out = static_cast<int>(c10::cuda::device_count()); })
}

tcg_status tcg_current_device(int* out) {
  TCG_TRY({
    require_cuda();
    *out = static_cast<int>(c10::cuda::current_device());
  })
}

tcg_status tcg_device_synchronize(int device) {
  TCG_TRY({
    c10::cuda::CUDAGuard g(checked_device(device));
    c10::cuda::device_synchronize();
  })
}

tcg_status tcg_stream_from_pool(int device, int high_priority, tcg_stream* out) {
  TCG_TRY({ *out = pack(c10::cuda::getStreamFromPool(high_priority != 0, checked_device(device))); })
}

tcg_status tcg_stream_current(int device, tcg_stream* out) {
  TCG_TRY({ *out = pack(c10::cuda::getCurrentCUDAStream(checked_device(device))); })
}

tcg_status tcg_stream_default(int device, tcg_stream* out) {
  TCG_TRY({ *out = pack(c10::cuda::getDefaultCUDAStream(checked_device(device))); })
}

tcg_status tcg_stream_set_current(tcg_stream s) {
  TCG_TRY({ c10::cuda::setCurrentCUDAStream(unpack(s)); })
}

tcg_status tcg_stream_synchronize(tcg_stream s) {
  TCG_TRY({ unpack(s).synchronize(); })
}

tcg_status tcg_stream_wait_stream(tcg_stream waiter, tcg_stream waitee) {
  TCG_TRY({
    auto w = unpack(waiter);
    auto e = unpack(waitee);
    if (w == e) return TCG_OK;
    c10::cuda::CUDAGuard g(e.device_index());
    cudaEvent_t ev = nullptr;
    check_cuda(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cudaEventCreate");
    cudaError_t err = cudaEventRecord(ev, e.stream());
    if (err == cudaSuccess) err = cudaStreamWaitEvent(w.stream(), ev, 0);
    (void)cudaEventDestroy(ev);
    check_cuda(err, "stream wait");
  })
}

tcg_status tcg_stream_capture_status(tcg_stream s, int* out) {
  TCG_TRY({ *out = capture_status_of(unpack(s).stream()); })
}

tcg_status tcg_stream_guard_new(tcg_stream s, tcg_stream_guard** out) {
  TCG_TRY({ *out = new tcg_stream_guard(unpack(s)); })
}

void tcg_stream_guard_free(tcg_stream_guard* g) {
  try {
    delete g;
  } catch (...) {
  }
}

tcg_status tcg_graph_new(int keep_graph, tcg_graph** out) {
  TCG_TRY({
    require_cuda();
    *out = new tcg_graph(keep_graph != 0);
  })
}

void tcg_graph_free(tcg_graph* g) {
  if (g == nullptr) return;
  try {
    if (g->capturing) g->teardown();
    delete g;
  } catch (...) {
  }
}

tcg_status tcg_graph_capture_begin(tcg_graph* g, tcg_pool_id pool, int mode) {
  TCG_TRY({
    require_cuda();
    if (g->capturing) misuse("capture_begin: this graph is already capturing");
    if (g->captured) misuse("capture_begin: this graph already holds a capture; reset() it first");
    if (pool.first != 0 && pool.second != 0) misuse("invalid pool id: both halves are set");
    cudaStreamCaptureMode m;
    switch (mode) {
      case 0: m = cudaStreamCaptureModeGlobal; break;
      case 1: m = cudaStreamCaptureModeThreadLocal; break;
      case 2: m = cudaStreamCaptureModeRelaxed; break;
      default: misuse("invalid capture mode " + std::to_string(mode));
    }
    auto stream = c10::cuda::getCurrentCUDAStream();
    if (stream == c10::cuda::getDefaultCUDAStream()) {
      misuse("CUDA graphs must be captured on a non-default stream");
    }
    if (capture_status_of(stream.stream()) != 0) {
      misuse("capture_begin: the current stream is already capturing");
    }
    try {
      g->begin(MempoolId{pool.first, pool.second}, m);
    } catch (...) {
      g->teardown();
      throw;
    }
    g->capturing = true;
  })
}

tcg_status tcg_graph_capture_end(tcg_graph* g) {
  TCG_TRY({
    if (!g->capturing) misuse("capture_end without capture_begin");
    bool invalidated = false;
    std::string msg;
    try {
      invalidated = capture_status_of(c10::cuda::getCurrentCUDAStream().stream()) == 2;
      g->capture_end();
      g->capturing = false;
      g->captured = true;
      return TCG_OK;
    } catch (const c10::Error& e) {
      msg = e.what_without_backtrace();
    } catch (const std::exception& e) {
      msg = e.what();
    }
    invalidated = g->teardown() || invalidated ||
                  msg.find("invalidated") != std::string::npos;
    throw tcg_exception(invalidated ? TCG_CAPTURE_INVALIDATED : TCG_ERROR,
                        "capture_end failed: " + msg);
  })
}

tcg_status tcg_graph_capture_abort(tcg_graph* g, int* was_invalidated) {
  TCG_TRY({
    *was_invalidated = 0;
    if (!g->capturing) return TCG_OK;
    *was_invalidated = g->teardown() ? 1 : 0;
  })
}

tcg_status tcg_graph_instantiate(tcg_graph* g) {
  TCG_TRY({
    if (!g->captured) misuse("instantiate before a successful capture");
    if (!g->keep) misuse("instantiate() is for graphs created with keep_graph; this one was instantiated at capture_end");
    g->instantiate();
  })
}

tcg_status tcg_graph_replay(tcg_graph* g) {
  TCG_TRY({
    if (!g->captured) misuse("replay before a successful capture");
    g->replay();
  })
}

tcg_status tcg_graph_upload(tcg_graph* g) {
  TCG_TRY({
    if (!g->captured) misuse("upload before a successful capture");
    cudaGraphExec_t exec = nullptr;
    try {
      exec = g->raw_cuda_graph_exec();
    } catch (const c10::Error&) {
      g->instantiate();
      exec = g->raw_cuda_graph_exec();
    }
    check_cuda(cudaGraphUpload(exec, c10::cuda::getCurrentCUDAStream().stream()), "cudaGraphUpload");
  })
}

tcg_status tcg_graph_reset(tcg_graph* g) {
  TCG_TRY({
    if (g->capturing) misuse("reset during a capture; end or abort it first");
    g->reset();
    g->captured = false;
  })
}

tcg_status tcg_graph_pool(tcg_graph* g, tcg_pool_id* out) {
  TCG_TRY({
    if (!g->captured) misuse("pool() before a successful capture");
    auto id = g->pool();
    *out = tcg_pool_id{id.first, id.second};
  })
}

tcg_status tcg_graph_debug_dump(tcg_graph* g, const char* path) {
  TCG_TRY({
    if (!g->captured) misuse("debug_dump before a successful capture");
    if (!g->keep) misuse("debug_dump needs a graph created with keep_graph(true)");
    cudaGraph_t raw = g->raw_cuda_graph();
    check_cuda(cudaGraphDebugDotPrint(raw, path, cudaGraphDebugDotFlagsVerbose), "cudaGraphDebugDotPrint");
  })
}

tcg_status tcg_graph_enable_debug_mode(tcg_graph* g) {
  TCG_TRY({ g->enable_debug_mode(); })
}

tcg_status tcg_graph_node_count(tcg_graph* g, size_t* out) {
  TCG_TRY({
    if (!g->captured) misuse("node_count before a successful capture");
    if (!g->keep) misuse("node queries need a graph created with keep_graph(true)");
    size_t n = 0;
    check_cuda(cudaGraphGetNodes(g->raw_cuda_graph(), nullptr, &n), "cudaGraphGetNodes");
    *out = n;
  })
}

tcg_status tcg_graph_node_kinds(tcg_graph* g, size_t* counts, size_t n) {
  TCG_TRY({
    if (!g->captured) misuse("node_kinds before a successful capture");
    if (!g->keep) misuse("node queries need a graph created with keep_graph(true)");
    cudaGraph_t raw = g->raw_cuda_graph();
    size_t count = 0;
    check_cuda(cudaGraphGetNodes(raw, nullptr, &count), "cudaGraphGetNodes");
    std::vector<cudaGraphNode_t> nodes(count);
    if (count > 0) check_cuda(cudaGraphGetNodes(raw, nodes.data(), &count), "cudaGraphGetNodes");
    for (size_t k = 0; k < n; ++k) counts[k] = 0;
    for (auto node : nodes) {
      cudaGraphNodeType t;
      check_cuda(cudaGraphNodeGetType(node, &t), "cudaGraphNodeGetType");
      auto k = static_cast<size_t>(t);
      if (k < n) counts[k] += 1;
    }
  })
}

tcg_status tcg_graph_pool_handle(tcg_pool_id* out) {
  TCG_TRY({
    require_cuda();
    auto id = at::cuda::graph_pool_handle();
    *out = tcg_pool_id{id.first, id.second};
  })
}

tcg_status tcg_mempool_new(tcg_mempool** out) {
  TCG_TRY({
    require_cuda();
    *out = new tcg_mempool{at::cuda::MemPool()};
  })
}

void tcg_mempool_free(tcg_mempool* p) {
  try {
    delete p;
  } catch (...) {
  }
}

tcg_status tcg_mempool_id(tcg_mempool* p, tcg_pool_id* out) {
  TCG_TRY({
    auto id = p->pool.id();
    *out = tcg_pool_id{id.first, id.second};
  })
}

tcg_status tcg_mempool_use_count(tcg_mempool* p, int* out) {
  TCG_TRY({ *out = p->pool.use_count(); })
}

tcg_status tcg_memory_stats(int device, tcg_mem_stats* out) {
  TCG_TRY({
    auto s = c10::cuda::CUDACachingAllocator::getDeviceStats(checked_device(device));
    constexpr auto agg = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    out->allocated_current = s.allocated_bytes[agg].current;
    out->allocated_peak = s.allocated_bytes[agg].peak;
    out->reserved_current = s.reserved_bytes[agg].current;
    out->reserved_peak = s.reserved_bytes[agg].peak;
    out->active_current = s.active_bytes[agg].current;
    out->num_alloc_retries = s.num_alloc_retries;
    out->num_ooms = s.num_ooms;
  })
}

tcg_status tcg_reset_peak_stats(int device) {
  TCG_TRY({ c10::cuda::CUDACachingAllocator::resetPeakStats(checked_device(device)); })
}

tcg_status tcg_pool_memory(int device, tcg_pool_id pool, int64_t* reserved, int64_t* allocated) {
  TCG_TRY({
    auto dev = checked_device(device);
    auto snap = c10::cuda::CUDACachingAllocator::snapshot(MempoolId{0, 0}, false);
    int64_t r = 0, a = 0;
    for (const auto& seg : snap.segments) {
      if (seg.device != dev) continue;
      if (seg.owner_private_pool_id.first != pool.first ||
          seg.owner_private_pool_id.second != pool.second) continue;
      r += static_cast<int64_t>(seg.total_size);
      a += static_cast<int64_t>(seg.allocated_size);
    }
    *reserved = r;
    *allocated = a;
  })
}

tcg_status tcg_empty_cache(void) {
  TCG_TRY({
    require_cuda();
    c10::cuda::CUDACachingAllocator::emptyCache();
  })
}

#endif  // TCG_NO_CUDA

}  // extern "C"
