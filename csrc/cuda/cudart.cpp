// The CUDA runtime functions that the shim (and libtorch's inline header code it includes)
// calls, forwarded at run time to the libcudart that libtorch_cuda has already loaded.
//
// Why: linking libcudart directly would give every binary a NEEDED entry of its own for
// libcudart.so.<major>, which must then be found on the binary's own library path (it lives
// beside torch in pip installs, not beside libtorch). Forwarding needs only libtorch's path,
// and uses the very runtime instance libtorch uses, whatever its version: the library is found
// among those already loaded, never by a hard-coded name. This file is compiled with -fvisibility=hidden: the
// definitions bind only the shim's own references and are never exported, so libtorch keeps
// calling libcudart directly.
// Compiled in CUDA builds only (build.rs).
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <link.h>

#include <cstring>

namespace {

struct Wanted {
  const char* prefix;  // the file name's start, e.g. "libcudart.so"
  const char* path;    // what was found
};

// dl_iterate_phdr callback: the path of the first loaded object whose file name starts with
// the wanted prefix (libtorch_cuda's own dependency, whatever its major version).
int find_loaded(struct dl_phdr_info* info, size_t, void* data) {
  auto* wanted = static_cast<Wanted*>(data);
  const char* path = info->dlpi_name;
  if (path == nullptr) return 0;
  const char* base = std::strrchr(path, '/');
  base = base == nullptr ? path : base + 1;
  if (std::strncmp(base, wanted->prefix, std::strlen(wanted->prefix)) != 0) return 0;
  wanted->path = path;
  return 1;
}

}  // namespace

namespace tcg {

// `name` from the library libtorch_cuda loaded whose file name starts with `lib_prefix`: found in
// the global scope when libtorch_cuda was loaded by the dynamic linker (the usual case); otherwise
// (libtorch dlopen'ed with RTLD_LOCAL, as Python does) among the loaded objects. Null if neither.
void* loaded_symbol(const char* lib_prefix, const char* name) {
  void* p = dlsym(RTLD_DEFAULT, name);
  if (p == nullptr) {
    Wanted wanted{lib_prefix, nullptr};
    dl_iterate_phdr(find_loaded, &wanted);
    void* lib = wanted.path == nullptr ? nullptr : dlopen(wanted.path, RTLD_LAZY | RTLD_NOLOAD);
    if (lib != nullptr) p = dlsym(lib, name);
  }
  return p;
}

}  // namespace tcg

namespace {
void* resolve(const char* name) { return tcg::loaded_symbol("libcudart.so", name); }
}  // namespace

// `name` forwarded (`fallback` where libcudart is not loaded: nothing is registered, and a call
// reports the runtime missing).
#define TCG_FORWARD_AS(ret, fallback, name, params, args)                      \
  extern "C" ret name params {                                                 \
    using Fn = ret(*) params;                                                  \
    static Fn fn = reinterpret_cast<Fn>(resolve(#name));                       \
    if (fn == nullptr) return fallback;                                        \
    return fn args;                                                            \
  }
#define TCG_FORWARD(name, params, args) TCG_FORWARD_AS(cudaError_t, cudaErrorInitializationError, name, params, args)

TCG_FORWARD(cudaDeviceSynchronize, (void), ())
TCG_FORWARD(cudaGetLastError, (void), ())
TCG_FORWARD(cudaEventCreateWithFlags, (cudaEvent_t* e, unsigned int f), (e, f))
TCG_FORWARD(cudaEventDestroy, (cudaEvent_t e), (e))
TCG_FORWARD(cudaEventElapsedTime, (float* ms, cudaEvent_t a, cudaEvent_t b), (ms, a, b))
TCG_FORWARD(cudaEventQuery, (cudaEvent_t e), (e))
TCG_FORWARD(cudaEventRecord, (cudaEvent_t e, cudaStream_t s), (e, s))
TCG_FORWARD(cudaEventRecordWithFlags, (cudaEvent_t e, cudaStream_t s, unsigned int f), (e, s, f))
TCG_FORWARD(cudaEventSynchronize, (cudaEvent_t e), (e))
TCG_FORWARD(cudaStreamWaitEvent, (cudaStream_t s, cudaEvent_t e, unsigned int f), (s, e, f))
TCG_FORWARD(cudaStreamIsCapturing, (cudaStream_t s, enum cudaStreamCaptureStatus* st), (s, st))
TCG_FORWARD(cudaStreamEndCapture, (cudaStream_t s, cudaGraph_t* g), (s, g))
TCG_FORWARD(cudaGraphDestroy, (cudaGraph_t g), (g))
TCG_FORWARD(cudaGraphUpload, (cudaGraphExec_t e, cudaStream_t s), (e, s))
TCG_FORWARD(cudaGraphExecUpdate, (cudaGraphExec_t e, cudaGraph_t g, cudaGraphExecUpdateResultInfo* info),
            (e, g, info))
TCG_FORWARD(cudaGraphDebugDotPrint, (cudaGraph_t g, const char* p, unsigned int f), (g, p, f))
TCG_FORWARD(cudaGraphGetNodes, (cudaGraph_t g, cudaGraphNode_t* n, size_t* c), (g, n, c))
TCG_FORWARD(cudaGraphNodeGetType, (cudaGraphNode_t n, enum cudaGraphNodeType* t), (n, t))
// conditional nodes (conditional.cpp)
TCG_FORWARD(cudaDriverGetVersion, (int* v), (v))
TCG_FORWARD(cudaStreamGetCaptureInfo,
            (cudaStream_t s, enum cudaStreamCaptureStatus* st, unsigned long long* id, cudaGraph_t* g,
             const cudaGraphNode_t** deps, const cudaGraphEdgeData** edges, size_t* n),
            (s, st, id, g, deps, edges, n))
TCG_FORWARD(cudaGraphConditionalHandleCreate,
            (cudaGraphConditionalHandle * h, cudaGraph_t g, unsigned int v, unsigned int f), (h, g, v, f))
TCG_FORWARD(cudaGraphAddNode,
            (cudaGraphNode_t * node, cudaGraph_t g, const cudaGraphNode_t* deps, const cudaGraphEdgeData* edges,
             size_t n, struct cudaGraphNodeParams* p),
            (node, g, deps, edges, n, p))
TCG_FORWARD(cudaStreamUpdateCaptureDependencies,
            (cudaStream_t s, cudaGraphNode_t* deps, const cudaGraphEdgeData* edges, size_t n, unsigned int f),
            (s, deps, edges, n, f))
TCG_FORWARD(cudaStreamBeginCaptureToGraph,
            (cudaStream_t s, cudaGraph_t g, const cudaGraphNode_t* deps, const cudaGraphEdgeData* edges, size_t n,
             enum cudaStreamCaptureMode m),
            (s, g, deps, edges, n, m))
// the own optimizer kernels (optim_own.cpp)
TCG_FORWARD(cudaLibraryLoadData,
            (cudaLibrary_t * lib, const void* code, enum cudaJitOption* jo, void** jv,
             unsigned int nj, enum cudaLibraryOption* lo, void** lv, unsigned int nl),
            (lib, code, jo, jv, nj, lo, lv, nl))
TCG_FORWARD(cudaLibraryGetKernel, (cudaKernel_t * k, cudaLibrary_t lib, const char* name),
            (k, lib, name))
TCG_FORWARD(cudaFuncGetAttributes, (struct cudaFuncAttributes * attr, const void* f), (attr, f))
TCG_FORWARD(cudaOccupancyMaxActiveBlocksPerMultiprocessor, (int* blocks, const void* f, int threads, size_t smem),
            (blocks, f, threads, smem))
TCG_FORWARD(cudaLaunchKernel,
            (const void* f, dim3 grid, dim3 block, void** args, size_t smem, cudaStream_t s),
            (f, grid, block, args, smem, s))
TCG_FORWARD(cudaLaunchKernelExC, (const cudaLaunchConfig_t* config, const void* f, void** args), (config, f, args))

// gelu_gemm.cu, compiled by nvcc: CUTLASS's host code, and the registration and launch of its
// kernels that nvcc generates (the runtime's internal entry points, declared in crt/host_runtime.h
// and crt/device_functions.h)
TCG_FORWARD(cudaGetDevice, (int* d), (d))
TCG_FORWARD(cudaDeviceGetAttribute, (int* v, enum cudaDeviceAttr a, int d), (v, a, d))
TCG_FORWARD(cudaFuncSetAttribute, (const void* f, enum cudaFuncAttribute a, int v), (f, a, v))
TCG_FORWARD(cudaMemsetAsync, (void* p, int v, size_t n, cudaStream_t s), (p, v, n, s))
TCG_FORWARD(cudaGetDriverEntryPointByVersion,
            (const char* sym, void** func, unsigned int version, unsigned long long flags,
             enum cudaDriverEntryPointQueryResult* status),
            (sym, func, version, flags, status))
TCG_FORWARD(__cudaPopCallConfiguration, (dim3 * grid, dim3* block, size_t* smem, void* stream),
            (grid, block, smem, stream))
TCG_FORWARD(__cudaGetKernel, (cudaKernel_t * k, const void* f), (k, f))
TCG_FORWARD(__cudaLaunchKernel,
            (cudaKernel_t k, dim3 grid, dim3 block, void** args, size_t smem, cudaStream_t s),
            (k, grid, block, args, smem, s))

// the entry points that return something else
TCG_FORWARD_AS(unsigned, 1u, __cudaPushCallConfiguration,
               (dim3 grid, dim3 block, size_t smem, struct CUstream_st* stream), (grid, block, smem, stream))
TCG_FORWARD_AS(void**, nullptr, __cudaRegisterFatBinary, (void* fat), (fat))
TCG_FORWARD_AS(void, void(), __cudaRegisterFatBinaryEnd, (void** h), (h))
TCG_FORWARD_AS(void, void(), __cudaUnregisterFatBinary, (void** h), (h))
TCG_FORWARD_AS(void, void(), __cudaRegisterVar,
               (void** h, char* host, char* device, const char* name, int ext, size_t size, int constant, int global),
               (h, host, device, name, ext, size, constant, global))
TCG_FORWARD_AS(void, void(), __cudaRegisterFunction,
               (void** h, const char* host, char* device, const char* name, int limit, uint3* tid, uint3* bid,
                dim3* bdim, dim3* gdim, int* wsize),
               (h, host, device, name, limit, tid, bid, bdim, gdim, wsize))

extern "C" const char* cudaGetErrorString(cudaError_t err) {
  using Fn = const char* (*)(cudaError_t);
  static Fn fn = reinterpret_cast<Fn>(resolve("cudaGetErrorString"));
  if (fn == nullptr) return "CUDA runtime (libcudart) is not loaded";
  return fn(err);
}
