// Conditional nodes (CUDA builds, CUDA 12.3+ drivers): an IF or WHILE node added to the capture
// under way on the current stream, its body captured on a second stream straight into the node's
// body graph (cudaStreamBeginCaptureToGraph), its condition set on the device by the own kernel
// tcg_cond_set (cond_kernels.cuh) from a 0-d tensor. See tcg.h for the contract.
//
// The recipe, checked on an H200 with libtorch 2.11: the handle is created on
// the capture's graph with no default (the setter kernel, captured just before the node, assigns
// it at every launch); the body stream's allocations go to a pool of their own (the capture's
// pool is taken by libtorch's capture: beginAllocateToPool refuses a second recording to it),
// kept alive with the graph by the caller; a body may hold only kernels, memsets, memcopies,
// child graphs and conditionals (no event nodes: no fork to another stream inside a body).
#include "cuda_shim.h"
#include "own_kernels.h"

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>

using namespace tcg;

namespace {

int dtype_code(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kBool:
    case at::kByte: return 0;
    case at::kInt: return 1;
    case at::kLong: return 2;
    case at::kFloat: return 3;
    case at::kDouble: return 4;
    default:
      misuse(std::string("conditional node: the condition must be bool, uint8, int32, int64, float32 or float64, not ") +
             c10::toString(t.scalar_type()));
  }
}

void require_driver() {
  int version = 0;
  check_cuda(cudaDriverGetVersion(&version), "cudaDriverGetVersion");
  if (version < 12030) {
    throw exception(TCG_UNSUPPORTED, "conditional nodes need a CUDA 12.3 driver or newer (this one is " +
                                         std::to_string(version / 1000) + "." +
                                         std::to_string((version % 1000) / 10) + ")");
  }
}

}  // namespace

struct tcg_cond {
  tcg_cond_kind type = TCG_COND_IF;
  c10::DeviceIndex device = 0;
  CUDAStream outer;
  CUDAStream body;
  c10::MempoolId_t pool{0, 0};
  cudaGraphConditionalHandle handle = 0;
  cudaKernel_t setter = nullptr;
  at::Tensor cond, counter, hit;
  int64_t max_iters = 0;
  bool capturing = false;  // the body capture is under way
  bool routing = false;    // body allocations go to `pool`

  tcg_cond(CUDAStream o, CUDAStream b) : outer(o), body(b) {}

  void launch_setter(int mode, cudaStream_t s) {
    void* cond_ptr = cond.data_ptr();
    int code = dtype_code(cond);
    int* counter_ptr = counter.defined() ? counter.data_ptr<int>() : nullptr;
    int* hit_ptr = hit.defined() ? hit.data_ptr<int>() : nullptr;
    long long max = max_iters;
    void* args[] = {&handle, &cond_ptr, &code, &mode, &counter_ptr, &max, &hit_ptr};
    check_cuda(cudaLaunchKernel(reinterpret_cast<const void*>(setter), dim3(1), dim3(1), args, 0, s),
               "conditional setter launch");
  }

  // Ends what begin started that is still open, in reverse; never throws. Idempotent.
  void close() noexcept {
    if (capturing) {
      cudaGraph_t g = nullptr;
      (void)cudaStreamEndCapture(body.stream(), &g);  // g is the node's body graph: CUDA owns it
      (void)cudaGetLastError();
      capturing = false;
    }
    if (routing) {
      try {
        c10::cuda::CUDACachingAllocator::endAllocateToPool(device, pool);
        c10::cuda::CUDACachingAllocator::releasePool(device, pool);  // the caller's hold keeps it
      } catch (...) {
      }
      routing = false;
    }
    try {
      c10::cuda::setCurrentCUDAStream(outer);
    } catch (...) {
    }
  }
};

namespace {

// A WHILE node's iteration counter and its "max_iters reached" flag.
void set_counter(tcg_cond& st, tcg_tensor counter, tcg_tensor hit) {
  if (counter == nullptr || hit == nullptr) misuse("conditional node: a WHILE node needs its counter and flag");
  st.counter = tensor_ref(counter);
  st.hit = tensor_ref(hit);
  for (const auto* t : {&st.counter, &st.hit}) {
    if (t->device() != st.cond.device() || t->scalar_type() != at::kInt || t->numel() < 1) {
      misuse("conditional node: the counter and flag must be int32 on the condition's device");
    }
  }
}

// Into the graph being captured on st.outer: the handle, the setter that assigns it at every
// launch, and the conditional node after them (the stream's capture continues after the node).
// Returns the node's body graph.
cudaGraph_t add_node(tcg_cond& st) {
  cudaStream_t outer = st.outer.stream();
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  cudaGraph_t graph = nullptr;
  check_cuda(cudaStreamGetCaptureInfo(outer, &status, nullptr, &graph, nullptr, nullptr, nullptr),
             "cudaStreamGetCaptureInfo");
  check_cuda(cudaGraphConditionalHandleCreate(&st.handle, graph, 0, 0), "cudaGraphConditionalHandleCreate");
  st.launch_setter(st.type == TCG_COND_IF_NOT ? 2 : 0, outer);  // captured: assigns the handle at every launch
  const cudaGraphNode_t* deps = nullptr;
  const cudaGraphEdgeData* edges = nullptr;
  size_t n = 0;
  check_cuda(cudaStreamGetCaptureInfo(outer, &status, nullptr, &graph, &deps, &edges, &n), "cudaStreamGetCaptureInfo");
  cudaGraphNodeParams params{};
  params.type = cudaGraphNodeTypeConditional;
  params.conditional.handle = st.handle;
  params.conditional.type = st.type == TCG_COND_WHILE ? cudaGraphCondTypeWhile : cudaGraphCondTypeIf;
  params.conditional.size = 1;
  cudaGraphNode_t node = nullptr;
  check_cuda(cudaGraphAddNode(&node, graph, deps, edges, n, &params), "cudaGraphAddNode (conditional)");
  check_cuda(cudaStreamUpdateCaptureDependencies(outer, &node, nullptr, 1, cudaStreamSetCaptureDependencies),
             "cudaStreamUpdateCaptureDependencies");
  return params.conditional.phGraph_out[0];
}

// The body's capture on st.body into `body_graph`, its allocations routed to the body's pool;
// the body stream becomes current.
void begin_body(tcg_cond& st, cudaGraph_t body_graph) {
  cudaStream_t bs = st.body.stream();
  c10::cuda::CUDACachingAllocator::beginAllocateToPool(st.device, st.pool, [bs](cudaStream_t s) { return s == bs; });
  st.routing = true;
  cudaError_t e = cudaStreamBeginCaptureToGraph(bs, body_graph, nullptr, nullptr, 0, cudaStreamCaptureModeRelaxed);
  if (e != cudaSuccess) {
    st.close();
    check_cuda(e, "cudaStreamBeginCaptureToGraph");
  }
  st.capturing = true;
  c10::cuda::setCurrentCUDAStream(st.body);
}

}  // namespace

extern "C" {

// Long on purpose: the checks, then the node's set-up in the order CUDA requires it, each step
// undone by the state's destructor if a later one fails; split, the order would be harder to see.
tcg_status tcg_cond_begin(tcg_cond_kind type, tcg_tensor cond, tcg_pool_id body_pool, int64_t max_iters, tcg_tensor counter,
                          tcg_tensor hit, tcg_cond** out) {
  return guard([&] {
    *out = nullptr;
    require_cuda();
    if (type != TCG_COND_IF && type != TCG_COND_WHILE && type != TCG_COND_IF_NOT) {
      misuse("conditional node: unknown kind " + std::to_string(static_cast<int>(type)));
    }
    const at::Tensor& c = tensor_ref(cond);
    if (!c.is_cuda() || c.numel() != 1) misuse("conditional node: the condition must be one value on a CUDA device");
    (void)dtype_code(c);
    if (body_pool.first == 0 && body_pool.second == 0) misuse("conditional node: a pool for the body is needed");
    require_driver();
    const auto dev = c.device().index();
    c10::cuda::CUDAGuard device_guard(dev);
    auto outer = c10::cuda::getCurrentCUDAStream(dev);
    if (capture_status_of(outer.stream()) != 1) {
      misuse("conditional node: only inside a capture (the current stream is not capturing)");
    }
    cudaKernel_t setter = own::kernel("tcg_cond_set", dev);  // TCG_SINGLE_KERNELS
    auto body = c10::cuda::getStreamFromPool(false, dev);
    if (body == outer) body = c10::cuda::getStreamFromPool(false, dev);
    auto st = std::make_unique<tcg_cond>(outer, body);
    st->type = type;
    st->device = dev;
    st->pool = c10::MempoolId_t{body_pool.first, body_pool.second};
    st->setter = setter;
    st->cond = c;
    st->max_iters = max_iters;
    if (type == TCG_COND_WHILE) set_counter(*st, counter, hit);
    cudaGraph_t body_graph = add_node(*st);
    begin_body(*st, body_graph);
    *out = st.release();
  });
}

tcg_status tcg_cond_end(tcg_cond* c) {
  return guard([&] {
    if (!c->capturing) misuse("conditional node: its body is not being captured");
    c10::cuda::CUDAGuard device_guard(c->device);
    try {
      if (c->type == TCG_COND_WHILE) c->launch_setter(1, c->body.stream());
      cudaGraph_t g = nullptr;
      cudaError_t e = cudaStreamEndCapture(c->body.stream(), &g);
      c->capturing = false;
      check_cuda(e, "cudaStreamEndCapture (conditional body)");
    } catch (...) {
      c->close();
      throw;
    }
    c->close();
  });
}

void tcg_cond_free(tcg_cond* c) {
  if (c == nullptr) return;
  c->close();
  try {
    delete c;
  } catch (...) {
  }
}

}  // extern "C"
