// Internal helpers of the CUDA translation units (csrc/cuda/*.cpp).
#pragma once
#include "../shim.h"

#include <ATen/Context.h>
#include <ATen/cuda/CUDAContextLight.h>
#include <c10/core/Allocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <string>

namespace tcg {

using c10::cuda::CUDAStream;

// Initializes CUDA lazily (the caching allocator included) the way PyTorch's torch.cuda
// functions do, and fails with TCG_NO_CUDA when the driver reports no device.
inline void require_cuda() {
  // A reference into libtorch_cuda from every CUDA entry point: a binary that uses any of them
  // keeps libtorch_cuda loaded (its hooks are what initializes CUDA), where the linker's
  // --as-needed would otherwise drop it when nothing else names a symbol of it.
  static auto* volatile libtorch_cuda_anchor = &at::cuda::getCurrentDeviceProperties;
  (void)libtorch_cuda_anchor;
  if (c10::cuda::device_count() <= 0) {
    throw exception(TCG_NO_CUDA,
                    "no CUDA device is available (libtorch has CUDA, but the driver reports "
                    "no device: check the driver and CUDA_VISIBLE_DEVICES)");
  }
  at::globalContext().lazyInitDevice(c10::DeviceType::CUDA);  // call_once inside: cheap
}

// `name` from the loaded library whose file name starts with `lib_prefix` ("libcudart.so",
// "libcublasLt.so": those libtorch_cuda brought in), or null. Defined in cudart.cpp.
void* loaded_symbol(const char* lib_prefix, const char* name);

// Whether libcublasLt is loaded in this process (the forwards of cublaslt.cpp can run).
bool cublaslt_loaded();

inline c10::DeviceIndex checked_device(int device) {
  require_cuda();
  if (device < 0 || device >= c10::cuda::device_count()) {
    throw exception(TCG_MISUSE, "CUDA device index " + std::to_string(device) +
                                    " is out of range (" +
                                    std::to_string(c10::cuda::device_count()) + " devices)");
  }
  return static_cast<c10::DeviceIndex>(device);
}

inline tcg_stream pack(const CUDAStream& s) {
  auto d = s.unwrap().pack3();
  return tcg_stream{d.stream_id, d.device_index, static_cast<int8_t>(d.device_type)};
}

inline CUDAStream unpack(tcg_stream s) {
  require_cuda();
  if (static_cast<c10::DeviceType>(s.device_type) != c10::DeviceType::CUDA) {
    misuse("not a CUDA stream");
  }
  return CUDAStream(CUDAStream::UNCHECKED,
                    c10::Stream::unpack3(s.id, s.device_index, c10::DeviceType::CUDA));
}

inline void check_cuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    tcg_status status = TCG_ERROR;
    if (err == cudaErrorMemoryAllocation) status = TCG_OUT_OF_MEMORY;
    if (err >= cudaErrorStreamCaptureUnsupported && err <= cudaErrorStreamCaptureWrongThread) {
      status = TCG_CAPTURE_INVALIDATED;
    }
    throw exception(status, std::string(what) + ": " + cudaGetErrorString(err));
  }
}

// A reference on a pool in both of libtorch's caching allocators, device and pinned host (see
// tcg_pool_hold_new in tcg.h for why). The constructor reopens a pool whose holders are all gone
// if none of its blocks is still allocated, and throws TCG_MISUSE (having changed nothing) if
// some are. With `empty_on_release`, the destructor also returns the pool's cached device
// memory to CUDA when nothing else holds it (as ~at::cuda::MemPool does). Defined in memory.cpp.
class pool_hold {
 public:
  pool_hold(c10::DeviceIndex device, c10::MempoolId_t id, bool empty_on_release);
  ~pool_hold();
  pool_hold(const pool_hold&) = delete;
  pool_hold& operator=(const pool_hold&) = delete;
  c10::DeviceIndex device() const { return device_; }
  c10::MempoolId_t id() const { return id_; }

 private:
  c10::DeviceIndex device_;
  c10::MempoolId_t id_;
  bool empty_on_release_;
};

// 0 none, 1 active, 2 invalidated.
inline int capture_status_of(cudaStream_t s) {
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  check_cuda(cudaStreamIsCapturing(s, &st), "cudaStreamIsCapturing");
  switch (st) {
    case cudaStreamCaptureStatusNone: return 0;
    case cudaStreamCaptureStatusActive: return 1;
    default: return 2;
  }
}

namespace optim {
// A kernel of the crate's own fat binary by name (optim_own.cpp), loaded and checked on
// `device`; throws TCG_UNSUPPORTED with the reason where it cannot run (also when first asked
// during a capture: load it before, see tcg_optim_own_kernels_check).
cudaKernel_t kernel(const char* name, int device);
}  // namespace optim

// Replays a graph of this shim (graph.cpp) on the current stream; throws TCG_MISUSE before a
// successful capture. For the shim's own users of graphs (graphed.cpp).
void replay_graph(tcg_graph* g);

}  // namespace tcg
