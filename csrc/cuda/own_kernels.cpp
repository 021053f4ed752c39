// The crate's own kernels as one library (see own_kernels.h).
#include "own_kernels.h"

#include "../kernels.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include <atomic>
#include <map>
#include <mutex>
#include <vector>

#include "cuda_shim.h"

#ifdef TCG_OWN_KERNELS
// The fat binaries, embedded by the file build.rs generates.
extern "C" const unsigned char tcg_optim_kernels_fatbin[];
extern "C" const unsigned char tcg_norm_kernels_fatbin[];
extern "C" const unsigned char tcg_loss_kernels_fatbin[];
#endif

namespace tcg::own {
namespace {

// Every kernel of each fat binary, by name (see the end of each *_kernels.cu).
std::vector<std::string> optim_kernel_names() {
  std::vector<std::string> names;
  for (const char* t : {"f32", "f64", "f16", "bf16"}) {
    for (const char* mode : {"adam", "adamw"}) {
      for (const char* ams : {"0", "1"}) {
        names.push_back(std::string("tcg_adam_") + t + "_" + mode + "_" + ams);
      }
    }
    for (const char* depth : {"2", "3"}) names.push_back(std::string("tcg_sgd_") + t + "_" + depth);
  }
  names.push_back("tcg_cond_set");  // cond_kernels.cuh
  return names;
}

std::vector<std::string> norm_kernel_names() {
  std::vector<std::string> names;
  for (const char* b : {"f32", "bf16", "f16"}) {
    for (const char* y : {"f32", "bf16", "f16"}) {
      for (const char* v : {"_v4", "_v8"}) {
        names.push_back(std::string("tcg_norm_fwd_") + b + "_" + y + v);
        names.push_back(std::string("tcg_norm_bwd_") + b + "_" + y + v);
      }
    }
  }
  names.push_back("tcg_norm_finish");
  return names;
}

// The loaded libraries, their kernels, and what each device made of them. One per process,
// never unloaded (kernels may be captured in graphs that live until exit).
std::vector<std::string> loss_kernel_names() {
  std::vector<std::string> names;
  for (const char* t : {"f32", "bf16", "f16"}) {
    names.push_back(std::string("tcg_ce_fwd_") + t);
    names.push_back(std::string("tcg_ce_bwd_") + t);
  }
  names.push_back("tcg_ce_finish");
  return names;
}

struct Library {
  std::mutex mu;
  std::vector<cudaLibrary_t> libs;
  std::string error;  // why a library did not load (or was not built)
  std::map<std::string, cudaKernel_t> kernels;
  std::map<int, std::string> device_error;  // per device checked: "" when usable
};

Library& library() {
  static Library* l = [] {
    auto* l = new Library();
#ifdef TCG_OWN_KERNELS
    const std::pair<const unsigned char*, std::vector<std::string>> images[] = {
        {tcg_optim_kernels_fatbin, optim_kernel_names()},
        {tcg_norm_kernels_fatbin, norm_kernel_names()},
        {tcg_loss_kernels_fatbin, loss_kernel_names()}};
    for (const auto& [image, names] : images) {
      cudaLibrary_t lib = nullptr;
      cudaError_t e = cudaLibraryLoadData(&lib, image, nullptr, nullptr, 0, nullptr, nullptr, 0);
      if (e != cudaSuccess) {
        (void)cudaGetLastError();
        l->error = std::string("loading their fat binary failed: ") + cudaGetErrorString(e);
        return l;
      }
      l->libs.push_back(lib);
      for (const auto& name : names) {
        cudaKernel_t k = nullptr;
        e = cudaLibraryGetKernel(&k, lib, name.c_str());
        if (e != cudaSuccess) {
          (void)cudaGetLastError();
          l->error = "kernel " + name + " missing: " + cudaGetErrorString(e);
          return l;
        }
        l->kernels[name] = k;
      }
    }
#else
    l->error = std::string("not built into this binary: ") + TCG_OWN_KERNELS_MISSING;
#endif
    return l;
  }();
  return *l;
}

const char* const kNotDuringCapture =
    "not loaded on this device yet, and a capture is under way (make the optimizer or the fused "
    "layers, or run one step, outside the capture)";

// Whether the current stream of `device` is capturing.
bool capturing(int device) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  auto stream = at::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device));
  (void)cudaStreamIsCapturing(stream.stream(), &status);
  return status != cudaStreamCaptureStatusNone;
}

// Whether library() has been made (its load is never first tried inside a capture).
std::atomic<bool> library_made{false};

// Checks (once per device) that every kernel loads on `device`, so that no lazy loading happens
// later inside a capture. Returns why not, or "". Never first inside a capture (loading there
// may be refused, and the refusal must not stick): the optimizers check when they are made.
std::string check_device(Library& l, int device) {
  std::lock_guard<std::mutex> lock(l.mu);
  if (!l.error.empty()) return l.error;
  auto it = l.device_error.find(device);
  if (it != l.device_error.end()) return it->second;
  std::string why;
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  if (capturing(device)) return kNotDuringCapture;
  for (const auto& [name, k] : l.kernels) {
    cudaFuncAttributes attr{};
    cudaError_t e = cudaFuncGetAttributes(&attr, reinterpret_cast<const void*>(k));
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      const auto* p = at::cuda::getDeviceProperties(static_cast<c10::DeviceIndex>(device));
      why = "no code for this GPU (sm_" + std::to_string(p->major) + std::to_string(p->minor) +
            ") in their fat binary: " + cudaGetErrorString(e) +
            " (rebuild with TCH_CUDA_GRAPHS_CUDA_ARCHS naming it)";
      break;
    }
  }
  l.device_error[device] = why;
  return why;
}

}  // namespace

cudaKernel_t kernel(const char* name, int device) {
  std::string why = kernels::unavailable(device);
  if (!why.empty()) throw exception(TCG_UNSUPPORTED, std::string("the crate's own kernels: ") + why);
  Library& l = library();
  std::lock_guard<std::mutex> lock(l.mu);
  auto it = l.kernels.find(name);
  if (it == l.kernels.end()) throw exception(TCG_UNSUPPORTED, std::string("own kernel ") + name + " missing");
  return it->second;
}

void launch(const std::string& name, int device, unsigned blocks, unsigned threads, void* params) {
  cudaKernel_t k = kernel(name.c_str(), device);
  void* args[] = {params};
  auto stream = at::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device));
  check_cuda(cudaLaunchKernel(reinterpret_cast<const void*>(k), dim3(blocks), dim3(threads), args, 0,
                              stream.stream()),
             name.c_str());
}

const char* float_name(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return "f32";
    case at::kBFloat16: return "bf16";
    case at::kHalf: return "f16";
    default: return nullptr;
  }
}

}  // namespace tcg::own

// The kernels family's questions (kernels.h), answered by the library above.
namespace tcg::kernels {

bool built() {
#ifdef TCG_OWN_KERNELS
  return true;
#else
  return false;
#endif
}

std::string unavailable(int device) {
  require_cuda();
  checked_device(device);
  if (!own::library_made.load() && own::capturing(device)) return own::kNotDuringCapture;
  own::Library& l = own::library();
  own::library_made.store(true);
  return own::check_device(l, device);
}

}  // namespace tcg::kernels
