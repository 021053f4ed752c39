// The crate's bias + GELU kernels: gelu(x + b) forward in one pass, and backward in one pass that
// writes the input gradient and sums the bias gradient per block as it goes (see gelu_params.h),
// fp32 math, bf16 / fp16 / fp32 in and out, the exact (erf) form and the tanh approximation.
// The formulas are ATen's (ActivationGeluKernel.cu), written the same way.
//
// Compiled by nvcc into a fat binary that build.rs embeds in the shim; the launcher
// (gelu_own.cpp) launches the extern "C" kernels by name.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "col_sum.cuh"
#include "gelu_params.h"
#include "own_kernel_list.h"
#include "vec_io.cuh"

namespace tcg::gelu {
namespace {

using tcg::cuda::load4;
using tcg::cuda::store4;

constexpr float kAlpha = 0.70710678118654752440f;                       // 1/√2
constexpr float kBetaErf = 1.12837916709551257390f * kAlpha * 0.5f;     // 2/√π · 1/√2 · 1/2
constexpr float kBetaTanh = 1.41421356237309504880f * 1.12837916709551257390f * 0.5f;  // √(2/π)
constexpr float kKappa = 0.044715f;

template <bool TANH>
__device__ __forceinline__ float gelu(float x) {
  if constexpr (TANH) {
    const float x_cube = x * x * x;
    const float inner = kBetaTanh * (x + kKappa * x_cube);
    return 0.5f * x * (1.0f + tanhf(inner));
  } else {
    return x * 0.5f * (1.0f + erff(x * kAlpha));
  }
}

template <bool TANH>
__device__ __forceinline__ float gelu_grad(float dy, float x) {
  if constexpr (TANH) {
    const float x_sq = x * x;
    const float x_cube = x_sq * x;
    const float inner = kBetaTanh * (x + kKappa * x_cube);
    const float tanh_inner = tanhf(inner);
    const float left = 0.5f * x;
    const float right = 1.0f + tanh_inner;
    const float left_derivative = 0.5f * right;
    const float tanh_derivative = 1.0f - tanh_inner * tanh_inner;
    const float inner_derivative = kBetaTanh * (1.0f + 3.0f * kKappa * x_sq);
    const float right_derivative = left * tanh_derivative * inner_derivative;
    return dy * (left_derivative + right_derivative);
  } else {
    const float cdf = 0.5f * (1.0f + erff(x * kAlpha));
    const float pdf = expf(-0.5f * x * x) * kBetaErf;
    return dy * (cdf + x * pdf);
  }
}

__device__ __forceinline__ float4 add4(float4 a, float4 b) {
  return make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
}

// Runs body(k, row, at) for this thread's rows: the block's rows are blockIdx.y, + gridDim.y,
// ...; R of them at a time, first `load(k, at)` for each (their loads in flight together), then
// `body(k, at)`. `at` is the element offset of the thread's 4 columns in the row.
template <int R, class Load, class Body>
__device__ __forceinline__ void for_rows(int64_t rows, int64_t f, int64_t c, Load load, Body body) {
  const int64_t stride = gridDim.y;
  for (int64_t first = blockIdx.y; first < rows; first += R * stride) {
#pragma unroll
    for (int k = 0; k < R; ++k) {
      const int64_t row = first + k * stride;
      if (row < rows) load(k, row * f + c);
    }
#pragma unroll
    for (int k = 0; k < R; ++k) {
      const int64_t row = first + k * stride;
      if (row < rows) body(k, row * f + c);
    }
  }
}

template <typename T, bool TANH>
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
        store4<T>(y + at, make_float4(gelu<TANH>(z.x), gelu<TANH>(z.y), gelu<TANH>(z.z), gelu<TANH>(z.w)));
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
      tcg_gelu_fwd_##N##_##FORM(const tcg::gelu::Forward a) {                                        \
    tcg::gelu::forward<TCG_CUDA_TYPE(N), TANH>(a);                                                   \
  }                                                                                                  \
  extern "C" __global__ void __launch_bounds__(tcg::gelu::kThreads)                               \
      tcg_gelu_bwd_##N##_##FORM(const tcg::gelu::Backward a) {                                       \
    tcg::gelu::backward<TCG_CUDA_TYPE(N), TANH>(a);                                                  \
  }
#define TCG_GELU_KERNELS_FOR(N) TCG_GELU_FORMS(TCG_GELU_KERNELS, N)
TCG_GELU_TYPES(TCG_GELU_KERNELS_FOR)

extern "C" __global__ void __launch_bounds__(tcg::cuda::kColSumThreads) tcg_gelu_finish(const tcg::gelu::Finish a) {
  tcg::cuda::sum_columns<1>(a.part, a.sum, a.blocks, a.cols);
}
