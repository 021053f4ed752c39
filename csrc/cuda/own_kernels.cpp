// The crate's own kernels as one library (see own_kernels.h).
#include "own_kernels.h"

#include "gelu_gemm.h"
#include "swiglu_gemm.h"
#include "wgrad_gemm.h"
#include "ce_head_gemm.h"
#include "rotary_gemm.h"

#include "../kernels.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <iterator>
#include <map>
#include <mutex>
#include <tuple>
#include <vector>

#include "cuda_shim.h"
#include "own_kernel_list.h"

#ifdef TCG_OWN_KERNELS
// The fat binaries, embedded by the file build.rs generates.
extern "C" const unsigned char tcg_optim_kernels_fatbin[];
extern "C" const unsigned char tcg_norm_kernels_fatbin[];
extern "C" const unsigned char tcg_loss_kernels_fatbin[];
extern "C" const unsigned char tcg_rotary_kernels_fatbin[];
extern "C" const unsigned char tcg_swiglu_kernels_fatbin[];
extern "C" const unsigned char tcg_gelu_kernels_fatbin[];
extern "C" const unsigned char tcg_embedding_kernels_fatbin[];
extern "C" const unsigned char tcg_linear_kernels_fatbin[];
#endif

namespace tcg::own {
namespace {

// The dtypes of own_kernel_list.h's lists.
#define TCG_TYPE(T) at::ScalarType::T,
#define TCG_TYPE_PAIR(B, Y) std::pair{at::ScalarType::B, at::ScalarType::Y},
#define TCG_VEC(B, Y, V) V,
constexpr at::ScalarType kOptimTypes[] = {TCG_OPTIM_TYPES(TCG_TYPE)};
constexpr std::pair<at::ScalarType, at::ScalarType> kNormTypes[] = {TCG_NORM_TYPES(TCG_TYPE_PAIR)};
constexpr int kNormVecs[] = {TCG_NORM_VECS(TCG_VEC, Float, Float)};
constexpr at::ScalarType kLossTypes[] = {TCG_LOSS_TYPES(TCG_TYPE)};
constexpr at::ScalarType kRotaryTypes[] = {TCG_ROTARY_TYPES(TCG_TYPE)};
constexpr at::ScalarType kSwigluTypes[] = {TCG_SWIGLU_TYPES(TCG_TYPE)};
constexpr at::ScalarType kGeluTypes[] = {TCG_GELU_TYPES(TCG_TYPE)};
constexpr at::ScalarType kEmbeddingTypes[] = {TCG_EMBEDDING_TYPES(TCG_TYPE)};
constexpr at::ScalarType kSplitTypes[] = {TCG_SPLIT_TYPES(TCG_TYPE)};
#define TCG_SINGLE(N, BINARY) {#N, #BINARY},
// (name, the fat binary that holds it)
const std::pair<const char*, const char*> kSingleKernels[] = {TCG_SINGLE_KERNELS(TCG_SINGLE)};
#undef TCG_SINGLE
#undef TCG_TYPE
#undef TCG_TYPE_PAIR
#undef TCG_VEC

// Every kernel of each fat binary, by name.
std::vector<std::string> optim_kernel_names() {
  std::vector<std::string> names;
  for (at::ScalarType t : kOptimTypes) {
    for (bool adamw : {false, true}) {
      for (bool amsgrad : {false, true}) names.push_back(adam_kernel(t, adamw, amsgrad));
    }
    for (bool momentum : {false, true}) names.push_back(sgd_kernel(t, momentum));
  }
  return names;
}

std::vector<std::string> norm_kernel_names() {
  std::vector<std::string> names;
  for (auto [b, y] : kNormTypes) {
    for (int v : kNormVecs) {
      for (Pass pass : {Pass::Forward, Pass::Backward}) names.push_back(norm_kernel(pass, b, y, v));
    }
  }
  return names;
}

std::vector<std::string> loss_kernel_names() {
  std::vector<std::string> names;
  for (at::ScalarType t : kLossTypes) {
    for (Pass pass : {Pass::Forward, Pass::Backward}) names.push_back(loss_kernel(pass, t));
  }
  return names;
}

std::vector<std::string> rotary_kernel_names() {
  std::vector<std::string> names;
  for (at::ScalarType t : kRotaryTypes) names.push_back(rotary_kernel(t));
  return names;
}

std::vector<std::string> swiglu_kernel_names() {
  std::vector<std::string> names;
  for (at::ScalarType t : kSwigluTypes) {
    for (Pass pass : {Pass::Forward, Pass::Backward}) names.push_back(swiglu_kernel(pass, t));
  }
  return names;
}

std::vector<std::string> gelu_kernel_names() {
  std::vector<std::string> names;
  for (at::ScalarType t : kGeluTypes) {
    for (bool tanh : {false, true}) {
      for (Pass pass : {Pass::Forward, Pass::Backward}) names.push_back(gelu_kernel(pass, t, tanh));
    }
  }
  return names;
}

std::vector<std::string> embedding_kernel_names() {
  std::vector<std::string> names;
  for (at::ScalarType t : kEmbeddingTypes) {
    for (bool scan : {false, true}) names.push_back(embedding_kernel(t, scan));
  }
  return names;
}

std::vector<std::string> linear_kernel_names() {
  std::vector<std::string> names;
  for (at::ScalarType t : kSplitTypes) names.push_back(split_kernel(t));
  return names;
}

// The loaded libraries, their kernels, and what each device made of them. One per process,
// never unloaded (kernels may be captured in graphs that live until exit).
struct Library {
  std::mutex mu;
  std::vector<cudaLibrary_t> libs;
  std::string error;  // why a library did not load (or was not built)
  std::map<std::string, cudaKernel_t> kernels;
  std::map<int, std::string> device_error;  // per device checked: "" when usable
  std::map<int, std::string> cutlass_gemms_error;  // the same for the MLPs' CUTLASS GEMMs
  // resident_blocks' answers, per (kernel, device, threads): asked once, not at every launch
  std::map<std::tuple<std::string, int, unsigned>, int64_t> resident;
};

Library& library() {
  static Library* l = [] {
    auto* l = new Library();
#ifdef TCG_OWN_KERNELS
    // each fat binary by its name (TCG_SINGLE_KERNELS's), with its kernels
    const std::tuple<const char*, const unsigned char*, std::vector<std::string>> images[] = {
        {"optim", tcg_optim_kernels_fatbin, optim_kernel_names()},
        {"norm", tcg_norm_kernels_fatbin, norm_kernel_names()},
        {"loss", tcg_loss_kernels_fatbin, loss_kernel_names()},
        {"rotary", tcg_rotary_kernels_fatbin, rotary_kernel_names()},
        {"swiglu", tcg_swiglu_kernels_fatbin, swiglu_kernel_names()},
        {"gelu", tcg_gelu_kernels_fatbin, gelu_kernel_names()},
        {"embedding", tcg_embedding_kernels_fatbin, embedding_kernel_names()},
        {"linear", tcg_linear_kernels_fatbin, linear_kernel_names()}};
    for (const auto& [binary, image, listed] : images) {
      // its families' kernels and its single ones: asked of it only (no probing of the others)
      std::vector<std::string> names = listed;
      for (const auto& [name, holder] : kSingleKernels) {
        if (std::string(holder) == binary) names.emplace_back(name);
      }
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
  // the CUTLASS GEMMs (gelu_gemm.h, swiglu_gemm.h, wgrad_gemm.h, ce_head_gemm.h, rotary_gemm.h),
  // loaded now too: sm_90 only
  std::string gemm_why = "built without CUTLASS's headers";
#ifdef TCG_CUTLASS_GEMMS
  const auto* p = at::cuda::getDeviceProperties(static_cast<c10::DeviceIndex>(device));
  if (p->major != 9 || p->minor != 0) {
    gemm_why = "built for sm_90 only (this GPU is sm_" + std::to_string(p->major) + std::to_string(p->minor) + ")";
  } else {
    gemm_why = tcg::gelu_gemm::prepare();
    if (gemm_why.empty()) gemm_why = tcg::swiglu_gemm::prepare();
    if (gemm_why.empty()) gemm_why = tcg::wgrad_gemm::prepare();
    if (gemm_why.empty()) gemm_why = tcg::ce_head_gemm::prepare();
    if (gemm_why.empty()) gemm_why = tcg::rotary_gemm::prepare();
  }
#endif
  l.cutlass_gemms_error[device] = gemm_why;
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

namespace {

// Whether the kernels launch as programmatic dependents on `device`: on sm_90 and later, unless
// TCH_CUDA_GRAPHS_DEPENDENT_LAUNCH=0 (read once).
bool dependent_launch(int device) {
  static const bool off = [] {
    const char* v = std::getenv("TCH_CUDA_GRAPHS_DEPENDENT_LAUNCH");
    return v != nullptr && std::string(v) == "0";
  }();
  return !off && at::cuda::getDeviceProperties(static_cast<c10::DeviceIndex>(device))->major >= 9;
}

}  // namespace

void launch_kernel(cudaKernel_t k, int device, dim3 grid, dim3 block, void** args, const char* name) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.stream = at::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device)).stream();
  cudaLaunchAttribute attr[1]{};
  if (dependent_launch(device)) {
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    config.attrs = attr;
    config.numAttrs = 1;
  }
  check_cuda(cudaLaunchKernelExC(&config, reinterpret_cast<const void*>(k), args), name);
}

std::string cutlass_gemms_unavailable(int device) {
  const std::string why = kernels::unavailable(device);  // checks the device, the GEMMs with it
  if (!why.empty()) return why;
  Library& l = library();
  std::lock_guard<std::mutex> lock(l.mu);
  return l.cutlass_gemms_error.at(device);
}

void launch(const std::string& name, int device, dim3 blocks, unsigned threads, void* params) {
  cudaKernel_t k = kernel(name.c_str(), device);
  void* args[] = {params};
  launch_kernel(k, device, blocks, dim3(threads), args, name.c_str());
}

int64_t sm_count(int device) {
  return at::cuda::getDeviceProperties(static_cast<c10::DeviceIndex>(device))->multiProcessorCount;
}

int64_t resident_blocks(const std::string& name, int device, unsigned threads) {
  Library& l = library();
  const auto key = std::make_tuple(name, device, threads);
  {
    std::lock_guard<std::mutex> lock(l.mu);
    auto it = l.resident.find(key);
    if (it != l.resident.end()) return it->second;
  }
  cudaKernel_t k = kernel(name.c_str(), device);
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  int blocks = 0;
  check_cuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, reinterpret_cast<const void*>(k),
                                                          static_cast<int>(threads), 0),
             name.c_str());
  const int64_t n = std::max(blocks, 1);
  std::lock_guard<std::mutex> lock(l.mu);
  l.resident.emplace(key, n);
  return n;
}

bool aligned16(const at::Tensor& t) { return !t.defined() || reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0; }

template <typename List, typename Item>
bool holds(const List& list, const Item& item) {
  return std::find(std::begin(list), std::end(list), item) != std::end(list);
}

bool optim_builds(at::ScalarType param) { return holds(kOptimTypes, param); }
bool norm_builds(at::ScalarType branch, at::ScalarType out) { return holds(kNormTypes, std::pair{branch, out}); }
bool loss_builds(at::ScalarType logits) { return holds(kLossTypes, logits); }
bool rotary_builds(at::ScalarType t) { return holds(kRotaryTypes, t); }
bool swiglu_builds(at::ScalarType t) { return holds(kSwigluTypes, t); }
bool gelu_builds(at::ScalarType t) { return holds(kGeluTypes, t); }
bool embedding_builds(at::ScalarType t) { return holds(kEmbeddingTypes, t); }
bool split_builds(at::ScalarType t) { return holds(kSplitTypes, t); }

// The names, as own_kernel_list.h documents them; c10::toString spells a dtype as its enumerator.
std::string adam_kernel(at::ScalarType param, bool adamw, bool amsgrad) {
  return std::string("tcg_adam_") + c10::toString(param) + (adamw ? "_adamw_" : "_adam_") + (amsgrad ? "1" : "0");
}

std::string sgd_kernel(at::ScalarType param, bool momentum) {
  return std::string("tcg_sgd_") + c10::toString(param) + (momentum ? "_3" : "_2");
}

std::string norm_kernel(Pass pass, at::ScalarType branch, at::ScalarType out, int vec) {
  return std::string(pass == Pass::Forward ? "tcg_norm_fwd_" : "tcg_norm_bwd_") + c10::toString(branch) + "_" +
         c10::toString(out) + "_v" + std::to_string(vec);
}

std::string loss_kernel(Pass pass, at::ScalarType logits) {
  return std::string(pass == Pass::Forward ? "tcg_ce_fwd_" : "tcg_ce_scale_") + c10::toString(logits);
}

std::string rotary_kernel(at::ScalarType t) { return std::string("tcg_rotary_") + c10::toString(t); }

std::string swiglu_kernel(Pass pass, at::ScalarType t) {
  return std::string(pass == Pass::Forward ? "tcg_swiglu_fwd_" : "tcg_swiglu_bwd_") + c10::toString(t);
}

std::string gelu_kernel(Pass pass, at::ScalarType t, bool tanh) {
  return std::string(pass == Pass::Forward ? "tcg_gelu_fwd_" : "tcg_gelu_bwd_") + c10::toString(t) +
         (tanh ? "_tanh" : "_erf");
}

std::string embedding_kernel(at::ScalarType t, bool scan) {
  return std::string(scan ? "tcg_embedding_scan_" : "tcg_embedding_bwd_") + c10::toString(t);
}

std::string split_kernel(at::ScalarType t) { return std::string("tcg_split_bwd_") + c10::toString(t); }

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
