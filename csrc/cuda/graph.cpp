// CUDA graphs (CUDA builds): at::cuda::CUDAGraph plus the failure paths libtorch 2.11 leaves
// open. See tcg.h for the contract of each function.
#include "cuda_shim.h"

#include <ATen/core/CachingHostAllocator.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/version.h>

#include <cstdlib>
#include <optional>

// The shim derives from at::cuda::CUDAGraph and reads and writes its protected members
// (graph_, has_graph_, capture_ended_, capture_dev_, mempool_id_, capture_stream_,
// captured_generator_states_) and CUDAGeneratorState::capturing_, to tear down a failed capture
// completely: libtorch 2.11's reset() releases the pool only after a successful capture_end and
// leaves the generators in capture mode. Those members are not API; they were checked against
// the 2.11 headers and sources. Another libtorch must be checked again before this compiles.
static_assert(TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR == 11,
              "csrc/cuda/graph.cpp reaches into at::cuda::CUDAGraph internals as of libtorch "
              "2.11; check them against this libtorch's CUDAGraph.h/.cpp, then update this check");

// error.cpp spells these codes as numbers (it builds without CUDA headers).
static_assert(cudaErrorMemoryAllocation == 2, "error.cpp's kCudaErrorMemoryAllocation");
static_assert(cudaErrorStreamCaptureUnsupported == 900, "error.cpp's capture error range");
static_assert(cudaErrorStreamCaptureWrongThread == 908, "error.cpp's capture error range");

using namespace tcg;

namespace {

// Collects libtorch warnings (TORCH_WARN) raised while tearing down, instead of letting the
// default handler print them: library code does not print. They go into the error message.
struct collect_warnings : c10::WarningHandler {
  std::string text;
  void process(const c10::Warning& w) override {
    try {
      if (!text.empty()) text += "; ";
      text += w.msg();
    } catch (...) {
    }
  }
};

}  // namespace

// The shim's graph. The base graph is always created with keep_graph = true, so libtorch's
// capture_end only ends the capture; instantiating (and, for graphs that do not keep their
// cudaGraph_t, destroying it) happens here, where a failure is torn down in the right order.
struct tcg_graph : at::cuda::CUDAGraph {
  explicit tcg_graph(bool keep) : at::cuda::CUDAGraph(/*keep_graph=*/true), keep(keep) {}
  bool keep;
  bool capturing = false;  // capture_begin succeeded, capture not yet ended or aborted
  bool captured = false;   // a capture ended successfully and was not reset since

  c10::DeviceIndex capture_device() const { return capture_stream_.device_index(); }

  void begin(c10::MempoolId_t pool, cudaStreamCaptureMode mode) {
    // capture_dev_ is set by capture_begin once its own checks passed: teardown() uses it to
    // know whether the allocator holds a pool reference for this capture.
    capture_dev_ = UNDEFINED_DEVICE;
    capture_begin(pool, mode);
  }

  void end() {
    capture_end();  // has_graph_ and capture_ended_ are set from here on: reset() owns them
    if (failpoint("graph_instantiate")) {
      throw exception(TCG_ERROR, "injected failure at graph_instantiate (tcg_testing_fail_next)");
    }
    if (!keep) {
      instantiate();
      check_cuda(cudaGraphDestroy(graph_), "cudaGraphDestroy");
      graph_ = nullptr;
      has_graph_ = false;
    }
  }

  // After cudaGraphExecUpdate made this graph's executable run `other`'s work: this graph takes
  // over `other`'s capture (its cudaGraph_t, pool reference, capture stream and RNG generator
  // states with their whole-graph increments), `other` takes this graph's old one and is reset
  // (releasing it). The generator states' sets of registered graphs are edited in place, never
  // through unregister_graph, which frees the states' device seed and offset (still read by
  // the captured kernels) when its set empties.
  void adopt_capture_of(tcg_graph* other) {
    std::swap(graph_, other->graph_);
    std::swap(has_graph_, other->has_graph_);
    std::swap(mempool_id_, other->mempool_id_);
    std::swap(capture_stream_, other->capture_stream_);
    std::swap(capture_id_, other->capture_id_);
    std::swap(capture_dev_, other->capture_dev_);
    std::swap(captured_generator_states_, other->captured_generator_states_);
    for (auto& entry : captured_generator_states_) entry.first->registered_graphs_.insert(this);
    for (auto& entry : other->captured_generator_states_) entry.first->registered_graphs_.insert(other);
    for (auto& entry : other->captured_generator_states_) {
      if (captured_generator_states_.count(entry.first) == 0) entry.first->registered_graphs_.erase(this);
    }
    for (auto& entry : captured_generator_states_) {
      if (other->captured_generator_states_.count(entry.first) == 0) entry.first->registered_graphs_.erase(other);
    }
    if (!keep && has_graph_) {  // this graph does not keep a cudaGraph_t: drop the adopted one
      check_cuda(cudaGraphDestroy(graph_), "cudaGraphDestroy");
      graph_ = nullptr;
      has_graph_ = false;
    }
    other->reset();
    other->captured = false;
  }

  // Tears down everything a started capture holds, and the graph and executable it made.
  // Never throws. Returns whether CUDA had invalidated the capture; libtorch warnings raised on
  // the way are appended to *warnings.
  // Long on purpose: one ordered list of independent clean-up steps, each in its own try, so
  // that a failing step never skips the ones after it.
  bool teardown(std::string* warnings) noexcept {
    bool invalidated = false;
    collect_warnings collected;
    {
      c10::WarningUtils::WarningHandlerGuard quiet(&collected);
      try {
        c10::cuda::CUDAGuard device(capture_stream_.device_index());
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
        // Once capture_end set has_graph_, reset() below destroys graph_. Before that, a graph_
        // that capture_end's cudaStreamEndCapture wrote before it threw is ours to destroy.
        if (!has_graph_) {
          if (graph_ != nullptr) (void)cudaGraphDestroy(graph_);
          graph_ = nullptr;
        }
        // capture_begin put the RNG generators registered with this graph into capture mode
        // (capture_prologue); only a successful capture_end takes them out of it. Left on,
        // every later random op fails ("Offset increment outside graph capture").
        for (auto& entry : captured_generator_states_) {
          entry.first->capturing_ = false;  // what capture_epilogue() does first (not exported)
        }
        reset();  // pool reference, generator capture states, graph_ and the executable
      } catch (...) {
      }
      (void)cudaGetLastError();
    }
    if (warnings != nullptr && !collected.text.empty()) {
      try {
        *warnings += " (libtorch warned during teardown: " + collected.text + ")";
      } catch (...) {
      }
    }
    capture_dev_ = UNDEFINED_DEVICE;
    capturing = false;
    captured = false;
    return invalidated;
  }
};

void tcg::replay_graph(tcg_graph* g) {
  if (g == nullptr || !g->captured) misuse("replay before a successful capture");
  g->replay();
}

extern "C" {

tcg_status tcg_graph_new(bool keep_graph, tcg_graph** out) {
  return guard([&] {
    require_cuda();
    *out = new tcg_graph(keep_graph);
  });
}

void tcg_graph_free(tcg_graph* g) {
  if (g == nullptr) return;
  try {
    if (g->capturing) g->teardown(nullptr);
    collect_warnings collected;  // the destructor's reset() warns instead of throwing
    c10::WarningUtils::WarningHandlerGuard quiet(&collected);
    delete g;
  } catch (...) {
  }
}

tcg_status tcg_graph_capture_begin(tcg_graph* g, tcg_pool_id pool, tcg_capture_mode mode) {
  return guard([&] {
    require_cuda();
    if (g->capturing) misuse("capture_begin: this graph is already capturing");
    if (g->captured) misuse("capture_begin: this graph already holds a capture; reset() it first");
    if (pool.first != 0 && pool.second != 0) misuse("invalid pool id: both halves are set");
    cudaStreamCaptureMode m;
    switch (mode) {
      case TCG_CAPTURE_MODE_GLOBAL: m = cudaStreamCaptureModeGlobal; break;
      case TCG_CAPTURE_MODE_THREAD_LOCAL: m = cudaStreamCaptureModeThreadLocal; break;
      case TCG_CAPTURE_MODE_RELAXED: m = cudaStreamCaptureModeRelaxed; break;
      default: misuse("invalid capture mode " + std::to_string(static_cast<int>(mode)));
    }
    auto stream = c10::cuda::getCurrentCUDAStream();
    if (stream == c10::cuda::getDefaultCUDAStream()) {
      misuse("CUDA graphs must be captured on a non-default stream");
    }
    if (capture_status_of(stream.stream()) != 0) {
      misuse("capture_begin: the current stream is already capturing");
    }
    c10::MempoolId_t id{pool.first, pool.second};
    // A shared pool whose holders are all gone is "freeable": libtorch's capture_begin would
    // trip an internal assert taking a reference on it, after setting capture_dev_, so that
    // teardown would release a reference never taken. A hold taken first reopens such a pool
    // (or refuses it, with TCG_MISUSE, before anything started); the capture then holds its own.
    std::optional<pool_hold> reopened;
    if (id != c10::MempoolId_t{0, 0}) {
      reopened.emplace(c10::cuda::current_device(), id, /*empty_on_release=*/false);
    }
    // cuBLAS and cuBLASLt handles and their workspaces for this thread and the capture stream,
    // made now, outside the capture: cublasCreate cannot run inside one (it fails with
    // CUBLAS_STATUS_NOT_INITIALIZED), so a capture whose matmul is the process's first would
    // fail, and a workspace made inside would be carved from the graph's pool. ATen's getters
    // make each once per (thread, device) and (handle, stream), then return it.
    (void)at::cuda::getCurrentCUDABlasHandle();
    (void)at::cuda::getCurrentCUDABlasLtHandle();
    (void)at::cuda::getCUDABlasLtWorkspace();
    try {
      g->begin(id, m);
    } catch (...) {
      g->teardown(nullptr);
      throw;
    }
    g->capturing = true;
  });
}

tcg_status tcg_graph_capture_end(tcg_graph* g) {
  return guard([&] {
    if (!g->capturing) misuse("capture_end without capture_begin");
    // Read before capture_end: a capture CUDA invalidated is reported as such whatever
    // libtorch throws while ending it.
    bool invalidated = capture_status_of(c10::cuda::getCurrentCUDAStream().stream()) == 2;
    try {
      g->end();
      g->capturing = false;
      g->captured = true;
      return;
    } catch (...) {
      tcg_status status = fail_current_exception();
      char* msg = tcg_error_take_last();
      std::string text = "capture_end failed: ";
      text += msg == nullptr ? "" : msg;
      std::free(msg);
      invalidated = g->teardown(&text) || invalidated;
      throw exception(invalidated ? TCG_CAPTURE_INVALIDATED : status, text);
    }
  });
}

tcg_status tcg_graph_capture_abort(tcg_graph* g, bool* was_invalidated) {
  return guard([&] {
    *was_invalidated = false;
    if (!g->capturing) return;
    *was_invalidated = g->teardown(nullptr);
  });
}

tcg_status tcg_graph_instantiate(tcg_graph* g) {
  return guard([&] {
    if (!g->captured) misuse("instantiate before a successful capture");
    if (!g->keep) {
      misuse("instantiate() is for graphs created with keep_graph; this one was instantiated at capture_end");
    }
    g->instantiate();
  });
}

tcg_status tcg_graph_replay(tcg_graph* g) {
  return guard([&] {
    if (!g->captured) misuse("replay before a successful capture");
    g->replay();
  });
}

tcg_status tcg_graph_upload(tcg_graph* g) {
  return guard([&] {
    if (!g->captured) misuse("upload before a successful capture");
    // The executable belongs to the capture device: upload there, on its current stream.
    auto dev = g->capture_device();
    c10::cuda::CUDAGuard device(dev);
    cudaGraphExec_t exec = nullptr;
    try {
      exec = g->raw_cuda_graph_exec();
    } catch (const c10::Error&) {
      g->instantiate();  // a kept graph not replayed yet
      exec = g->raw_cuda_graph_exec();
    }
    check_cuda(cudaGraphUpload(exec, c10::cuda::getCurrentCUDAStream(dev).stream()),
               "cudaGraphUpload");
  });
}

tcg_status tcg_graph_update_from(tcg_graph* g, tcg_graph* other, bool* updated, int* result) {
  return guard([&] {
    *updated = false;
    *result = 0;
    if (g == other) misuse("update_from: a graph cannot update from itself");
    if (!g->captured || !other->captured) misuse("update_from: both graphs must hold a successful capture");
    if (!other->keep) {
      misuse("update_from: the other graph must keep its cudaGraph_t (CudaGraph::with_keep_graph(true))");
    }
    if (g->capture_device() != other->capture_device()) misuse("update_from: the graphs were captured on different devices");
    c10::cuda::CUDAGuard device(g->capture_device());
    try {
      (void)g->raw_cuda_graph_exec();
    } catch (const c10::Error&) {
      g->instantiate();  // a kept graph not replayed yet: nothing to update without an executable
    }
    cudaGraphExecUpdateResultInfo info{};
    cudaError_t err = cudaGraphExecUpdate(g->raw_cuda_graph_exec(), other->raw_cuda_graph(), &info);
    *result = static_cast<int>(info.result);
    if (err == cudaErrorGraphExecUpdateFailure) {
      (void)cudaGetLastError();  // not performed: the executable is unchanged
      return;
    }
    check_cuda(err, "cudaGraphExecUpdate");
    g->adopt_capture_of(other);
    *updated = true;
  });
}

tcg_status tcg_graph_reset(tcg_graph* g) {
  return guard([&] {
    if (g->capturing) misuse("reset during a capture; end or abort it first");
    g->reset();
    g->captured = false;
  });
}

tcg_status tcg_graph_pool(tcg_graph* g, tcg_pool_id* out) {
  return guard([&] {
    if (!g->captured) misuse("pool() before a successful capture");
    auto id = g->pool();
    *out = tcg_pool_id{id.first, id.second};
  });
}

tcg_status tcg_graph_debug_dump(tcg_graph* g, const char* path) {
  return guard([&] {
    if (!g->captured) misuse("debug_dump before a successful capture");
    if (!g->keep) misuse("debug_dump needs a graph created with keep_graph(true)");
    check_cuda(cudaGraphDebugDotPrint(g->raw_cuda_graph(), path, cudaGraphDebugDotFlagsVerbose),
               "cudaGraphDebugDotPrint");
  });
}

tcg_status tcg_graph_node_count(tcg_graph* g, size_t* out) {
  return guard([&] {
    if (!g->captured) misuse("node_count before a successful capture");
    if (!g->keep) misuse("node queries need a graph created with keep_graph(true)");
    size_t n = 0;
    check_cuda(cudaGraphGetNodes(g->raw_cuda_graph(), nullptr, &n), "cudaGraphGetNodes");
    *out = n;
  });
}

tcg_status tcg_graph_node_kinds(tcg_graph* g, tcg_node_kinds* out) {
  return guard([&] {
    if (!g->captured) misuse("node_kinds before a successful capture");
    if (!g->keep) misuse("node queries need a graph created with keep_graph(true)");
    cudaGraph_t raw = g->raw_cuda_graph();
    size_t count = 0;
    check_cuda(cudaGraphGetNodes(raw, nullptr, &count), "cudaGraphGetNodes");
    std::vector<cudaGraphNode_t> nodes(count);
    if (count > 0) check_cuda(cudaGraphGetNodes(raw, nodes.data(), &count), "cudaGraphGetNodes");
    tcg_node_kinds k{};
    for (size_t i = 0; i < count; ++i) {
      cudaGraphNodeType t;
      check_cuda(cudaGraphNodeGetType(nodes[i], &t), "cudaGraphNodeGetType");
      switch (t) {
        case cudaGraphNodeTypeKernel: k.kernel++; break;
        case cudaGraphNodeTypeMemcpy: k.memcpy++; break;
        case cudaGraphNodeTypeMemset: k.memset++; break;
        case cudaGraphNodeTypeHost: k.host++; break;
        case cudaGraphNodeTypeGraph: k.graph++; break;
        case cudaGraphNodeTypeEmpty: k.empty++; break;
        case cudaGraphNodeTypeWaitEvent:
        case cudaGraphNodeTypeEventRecord: k.event++; break;
        case cudaGraphNodeTypeMemAlloc:
        case cudaGraphNodeTypeMemFree: k.mem_alloc_free++; break;
        default: k.other++; break;  // semaphores, conditionals, anything newer
      }
    }
    *out = k;
  });
}

}  // extern "C"
