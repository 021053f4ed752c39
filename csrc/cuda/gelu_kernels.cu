// The crate's bias + GELU kernels: gelu(x + b) forward in one pass, and backward in one pass that
// writes the input gradient and sums the bias gradient per block as it goes (see gelu_params.h),
// fp32 math, bf16 / fp16 / fp32 in and out, the exact (erf) form and the tanh approximation.
// The tanh form is ATen's formula (ActivationGeluKernel.cu), written the same way. The exact form
// is x · Φ(x) through the normal distribution's tail (gelu_math.cuh's tail_of, which the MLP's
// GEMM epilogues share, gelu_gemm.cu): ATen's 0.5 · (1 + erf(x/√2))
// costs about 30 instructions a value (erff's branch-free polynomials) and made both kernels
// bound by their arithmetic; it also loses Φ's relative accuracy for x < 0, where 1 + erf cancels
// (ATen's float32 GELU is 0 from x ≈ -5.9 on, 255 bf16 ulp from the exact value at its worst).
//
// Compiled by nvcc into a fat binary that build.rs embeds in the shim; the launcher
// (gelu_own.cpp) launches the extern "C" kernels by name.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "dependent_launch.cuh"
#include "col_sum.cuh"
#include "fast_math.cuh"
#include "gelu_math.cuh"
#include "gelu_params.h"
#include "own_kernel_list.h"
#include "vec_io.cuh"

namespace tcg::gelu {
namespace {

using tcg::cuda::add4;
using tcg::cuda::load4;
using tcg::cuda::store4;

// Runs body(k, at) for this thread's rows: the block's rows are blockIdx.y, + gridDim.y, ...; R
// of them at a time, first `load(k, at)` for each (their loads in flight together), then
// `body(k, at)`. `at` is the element offset of the thread's 4 columns in the row, stepped on from
// row to row (a 64-bit product per access had been a tenth of the kernels' instructions).
template <int R, class Load, class Body>
__device__ __forceinline__ void for_rows(int64_t rows, int64_t f, int64_t c, Load load, Body body) {
  const int64_t stride = gridDim.y, step = stride * f;
  int64_t at = static_cast<int64_t>(blockIdx.y) * f + c;
  for (int64_t first = blockIdx.y; first < rows; first += R * stride, at += R * step) {
#pragma unroll
    for (int k = 0; k < R; ++k) {
      if (first + k * stride < rows) load(k, at + k * step);
    }
#pragma unroll
    for (int k = 0; k < R; ++k) {
      if (first + k * stride < rows) body(k, at + k * step);
    }
  }
}

template <typename T, bool TANH, bool SHORT = !std::is_same_v<T, float>>
__device__ void forward(const Forward& a) {
  const int64_t c = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * 4;
  if (c >= a.f) return;
  const float4 b = a.bias != nullptr ? load4<float>(a.bias + c) : make_float4(0.f, 0.f, 0.f, 0.f);
  const T* x = static_cast<const T*>(a.x);
  T* y = static_cast<T*>(a.y);
  float4 v[kFwdRows];
  for_rows<kFwdRows>(
      a.rows, a.f, c, [&](int k, int64_t at) { v[k] = load4<T>(x + at); },
      [&](int k, int64_t at) {
        const float4 z = add4(v[k], b);
        store4<T>(y + at, make_float4(gelu<TANH, SHORT>(z.x), gelu<TANH, SHORT>(z.y), gelu<TANH, SHORT>(z.z),
                                      gelu<TANH, SHORT>(z.w)));
      });
}

// The thread's bias gradient is summed in registers and written once, as its block's partial.
template <typename T, bool TANH>
__device__ void backward(const Backward& a) {
  const int64_t c = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * 4;
  if (c >= a.f) return;
  const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
  const float4 b = a.bias != nullptr ? load4<float>(a.bias + c) : zero;
  const T* x = static_cast<const T*>(a.x);
  const T* dy = static_cast<const T*>(a.dy);
  T* dx = static_cast<T*>(a.dx);
  float4 acc = zero, xv[kBwdRows], dv[kBwdRows];
  for_rows<kBwdRows>(
      a.rows, a.f, c,
      [&](int k, int64_t at) {
        xv[k] = load4<T>(x + at);
        dv[k] = load4<T>(dy + at);
      },
      [&](int k, int64_t at) {
        const float4 z = add4(xv[k], b);
        const float4 g = make_float4(gelu_grad<TANH>(dv[k].x, z.x), gelu_grad<TANH>(dv[k].y, z.y),
                                     gelu_grad<TANH>(dv[k].z, z.z), gelu_grad<TANH>(dv[k].w, z.w));
        store4<T>(dx + at, g);
        acc = add4(acc, g);
      });
  if (a.part != nullptr) store4<float>(a.part + static_cast<int64_t>(blockIdx.y) * a.f + c, acc);
}

}  // namespace
}  // namespace tcg::gelu

// The kernels of own_kernel_list.h's TCG_GELU_TYPES and TCG_GELU_FORMS, and the finish.
#define TCG_GELU_KERNELS(N, FORM, TANH)                                                              \
  extern "C" __global__ void __launch_bounds__(tcg::gelu::kThreads)                                  \
      tcg_gelu_fwd_##N##_##FORM(const tcg::gelu::Forward a) { tcg::cuda::wait_prior();                                        \
    tcg::gelu::forward<TCG_CUDA_TYPE(N), TANH>(a);                                                   \
  }                                                                                                  \
  extern "C" __global__ void __launch_bounds__(tcg::gelu::kThreads)                               \
      tcg_gelu_bwd_##N##_##FORM(const tcg::gelu::Backward a) { tcg::cuda::wait_prior();                                       \
    tcg::gelu::backward<TCG_CUDA_TYPE(N), TANH>(a);                                                  \
  }
#define TCG_GELU_KERNELS_FOR(N) TCG_GELU_FORMS(TCG_GELU_KERNELS, N)
TCG_GELU_TYPES(TCG_GELU_KERNELS_FOR)

extern "C" __global__ void __launch_bounds__(tcg::cuda::kColSumThreads) tcg_gelu_finish(const tcg::gelu::Finish a) { tcg::cuda::wait_prior();
  tcg::cuda::sum_columns<1>(a.part, a.sum, a.blocks, a.cols);
}
