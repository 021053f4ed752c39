// Devices and streams (CUDA builds).
#include "cuda_shim.h"

#include <c10/cuda/CUDAGuard.h>

#include <memory>

using namespace tcg;

struct tcg_stream_guard {
  c10::cuda::CUDAStreamGuard guard;
  explicit tcg_stream_guard(CUDAStream s) : guard(s) {}
};

struct tcg_event {
  cudaEvent_t ev = nullptr;
  c10::DeviceIndex device = 0;
  ~tcg_event() {
    if (ev != nullptr) {
      c10::cuda::CUDAGuard g(device);
      (void)cudaEventDestroy(ev);
      (void)cudaGetLastError();
    }
  }
};

extern "C" {

bool tcg_device_built_with_cuda(void) { return true; }

tcg_status tcg_device_count(int* out) {
  return guard([&] { *out = static_cast<int>(c10::cuda::device_count()); });
}

tcg_status tcg_device_current(int* out) {
  return guard([&] {
    require_cuda();
    *out = static_cast<int>(c10::cuda::current_device());
  });
}

tcg_status tcg_device_synchronize(int device) {
  return guard([&] {
    c10::cuda::CUDAGuard g(checked_device(device));
    c10::cuda::device_synchronize();
  });
}

tcg_status tcg_stream_from_pool(int device, bool high_priority, tcg_stream* out) {
  return guard(
      [&] { *out = pack(c10::cuda::getStreamFromPool(high_priority, checked_device(device))); });
}

tcg_status tcg_stream_current(int device, tcg_stream* out) {
  return guard([&] { *out = pack(c10::cuda::getCurrentCUDAStream(checked_device(device))); });
}

tcg_status tcg_stream_default(int device, tcg_stream* out) {
  return guard([&] { *out = pack(c10::cuda::getDefaultCUDAStream(checked_device(device))); });
}

tcg_status tcg_stream_synchronize(tcg_stream s) {
  return guard([&] { unpack(s).synchronize(); });
}

tcg_status tcg_stream_wait_stream(tcg_stream waiter, tcg_stream waitee) {
  return guard([&] {
    auto w = unpack(waiter);
    auto e = unpack(waitee);
    if (w == e) return;
    c10::cuda::CUDAGuard g(e.device_index());
    cudaEvent_t ev = nullptr;
    check_cuda(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cudaEventCreate");
    cudaError_t err = cudaEventRecord(ev, e.stream());
    if (err == cudaSuccess) err = cudaStreamWaitEvent(w.stream(), ev, 0);
    (void)cudaEventDestroy(ev);
    check_cuda(err, "stream wait");
  });
}

tcg_status tcg_stream_capture_status(tcg_stream s, tcg_capture_status* out) {
  return guard([&] { *out = static_cast<tcg_capture_status>(capture_status_of(unpack(s).stream())); });
}

tcg_status tcg_stream_guard_new(tcg_stream s, tcg_stream_guard** out) {
  return guard([&] { *out = new tcg_stream_guard(unpack(s)); });
}

void tcg_stream_guard_free(tcg_stream_guard* g) {
  try {
    delete g;
  } catch (...) {
  }
}

tcg_status tcg_event_new(int device, tcg_event** out) {
  return guard([&] {
    auto dev = checked_device(device);
    c10::cuda::CUDAGuard g(dev);
    auto e = std::make_unique<tcg_event>();
    e->device = dev;
    check_cuda(cudaEventCreateWithFlags(&e->ev, cudaEventDisableTiming), "cudaEventCreate");
    *out = e.release();
  });
}

void tcg_event_free(tcg_event* e) {
  try {
    delete e;
  } catch (...) {
  }
}

tcg_status tcg_event_record(tcg_event* e, tcg_stream s) {
  return guard([&] {
    auto st = unpack(s);
    if (st.device_index() != e->device) misuse("event and stream are on different devices");
    c10::cuda::CUDAGuard g(e->device);
    check_cuda(cudaEventRecord(e->ev, st.stream()), "cudaEventRecord");
  });
}

tcg_status tcg_stream_wait_event(tcg_stream s, tcg_event* e) {
  return guard([&] {
    auto st = unpack(s);
    c10::cuda::CUDAGuard g(st.device_index());
    check_cuda(cudaStreamWaitEvent(st.stream(), e->ev, 0), "cudaStreamWaitEvent");
  });
}

tcg_status tcg_event_synchronize(tcg_event* e) {
  return guard([&] { check_cuda(cudaEventSynchronize(e->ev), "cudaEventSynchronize"); });
}

}  // extern "C"

bool tcg::capturing_on(const at::Tensor& t) {
  if (!t.is_cuda()) return false;
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  auto stream = at::cuda::getCurrentCUDAStream(t.device().index());
  check_cuda(cudaStreamIsCapturing(stream.stream(), &st), "cudaStreamIsCapturing");
  return st != cudaStreamCaptureStatusNone;
}
