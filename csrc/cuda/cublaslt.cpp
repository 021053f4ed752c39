// The cuBLASLt functions the shim calls (linear_own.cpp), forwarded at run time to the
// libcublasLt that libtorch_cuda has already loaded, as cudart.cpp does for the CUDA runtime:
// no NEEDED entry of the binary's own, the very library instance ATen's matmuls use. Compiled
// with -fvisibility=hidden, in CUDA builds only (build.rs).
#include <cublasLt.h>

#include "cuda_shim.h"

namespace {
void* resolve(const char* name) { return tcg::loaded_symbol("libcublasLt.so", name); }
}  // namespace

bool tcg::cublaslt_loaded() { return resolve("cublasLtMatmul") != nullptr; }

#define TCG_FORWARD_LT(name, params, args)                                     \
  extern "C" cublasStatus_t name params {                                      \
    using Fn = cublasStatus_t(*) params;                                       \
    static Fn fn = reinterpret_cast<Fn>(resolve(#name));                       \
    if (fn == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;                   \
    return fn args;                                                            \
  }

TCG_FORWARD_LT(cublasLtMatmulDescCreate, (cublasLtMatmulDesc_t * d, cublasComputeType_t c, cudaDataType_t s),
               (d, c, s))
TCG_FORWARD_LT(cublasLtMatmulDescDestroy, (cublasLtMatmulDesc_t d), (d))
TCG_FORWARD_LT(cublasLtMatmulDescSetAttribute,
               (cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t a, const void* buf, size_t n), (d, a, buf, n))
TCG_FORWARD_LT(cublasLtMatrixLayoutCreate,
               (cublasLtMatrixLayout_t * l, cudaDataType t, uint64_t rows, uint64_t cols, int64_t ld),
               (l, t, rows, cols, ld))
TCG_FORWARD_LT(cublasLtMatrixLayoutDestroy, (cublasLtMatrixLayout_t l), (l))
TCG_FORWARD_LT(cublasLtMatrixLayoutSetAttribute,
               (cublasLtMatrixLayout_t l, cublasLtMatrixLayoutAttribute_t a, const void* buf, size_t n), (l, a, buf, n))
TCG_FORWARD_LT(cublasLtMatmulPreferenceCreate, (cublasLtMatmulPreference_t * p), (p))
TCG_FORWARD_LT(cublasLtMatmulPreferenceDestroy, (cublasLtMatmulPreference_t p), (p))
TCG_FORWARD_LT(cublasLtMatmulPreferenceSetAttribute,
               (cublasLtMatmulPreference_t p, cublasLtMatmulPreferenceAttributes_t a, const void* buf, size_t n),
               (p, a, buf, n))
TCG_FORWARD_LT(cublasLtMatmulAlgoGetHeuristic,
               (cublasLtHandle_t h, cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t dd, cublasLtMatmulPreference_t p, int n,
                cublasLtMatmulHeuristicResult_t* r, int* found),
               (h, d, a, b, c, dd, p, n, r, found))
TCG_FORWARD_LT(cublasLtMatmul,
               (cublasLtHandle_t h, cublasLtMatmulDesc_t d, const void* alpha, const void* a, cublasLtMatrixLayout_t ad,
                const void* b, cublasLtMatrixLayout_t bd, const void* beta, const void* c, cublasLtMatrixLayout_t cd,
                void* dd, cublasLtMatrixLayout_t ddd, const cublasLtMatmulAlgo_t* algo, void* ws, size_t wss,
                cudaStream_t s),
               (h, d, alpha, a, ad, b, bd, beta, c, cd, dd, ddd, algo, ws, wss, s))
TCG_FORWARD_LT(cublasLtMatmulAlgoCheck,
               (cublasLtHandle_t h, cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t dd, const cublasLtMatmulAlgo_t* algo,
                cublasLtMatmulHeuristicResult_t* r),
               (h, d, a, b, c, dd, algo, r))

// 0 where the library is not loaded (no GEMM of the crate's has run through it).
extern "C" size_t cublasLtGetVersion(void) {
  using Fn = size_t (*)(void);
  static Fn fn = reinterpret_cast<Fn>(resolve("cublasLtGetVersion"));
  return fn == nullptr ? 0 : fn();
}
