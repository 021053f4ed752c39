// The crate's bias + GELU kernels: gelu(x + b) forward in one pass, and backward in one pass that
// writes the input gradient and sums the bias gradient per block as it goes (see gelu_params.h),
// fp32 math, bf16 / fp16 / fp32 in and out, the exact (erf) form and the tanh approximation.
// The tanh form is ATen's formula (ActivationGeluKernel.cu), written the same way. The exact form
// is x · Φ(x) through the normal distribution's tail (see tail_of): ATen's 0.5 · (1 + erf(x/√2))
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
#include "gelu_params.h"
#include "own_kernel_list.h"
#include "vec_io.cuh"

namespace tcg::gelu {
namespace {

using tcg::cuda::add4;
using tcg::cuda::exp2_ftz;
using tcg::cuda::load4;
using tcg::cuda::rcp_approx;
using tcg::cuda::store4;

constexpr float kAlpha = 0.70710678118654752440f;                       // 1/√2
constexpr float kBetaTanh = 1.41421356237309504880f * 1.12837916709551257390f * 0.5f;  // √(2/π)
constexpr float kKappa = 0.044715f;
constexpr float kHalfLog2e = -0.72134752044448170368f;                  // -log2(e) / 2
constexpr float kInvSqrt2Pi = 0.39894228040143267794f;                  // 1/√(2π)

// The normal distribution's tail, Q(|x|) = 0.5 · erfc(|x|/√2) = e^(-x²/2) · t · S(t) with
// t = 1 / (1 + |x|/(2√2)) (Numerical Recipes' erfc substitution) and S a degree-8 polynomial in t
// fitted to 0.5 · erfcx(z) / t over |x| ≤ 14.8 (relative error 4.3e-8 in float64), so that Q keeps
// its relative accuracy however small. Returns t · S(t) and E = e^(-x²/2): Q = tS · E, and the
// density φ(x) = E / √(2π). E is the hardware's exponential with results below 2^-126 flushed to
// 0 (|x| > 13.2, where x · Φ(x) is below 2^-126 · 0.4, subnormal in float32). In float32 against
// the exact values (x from -14.5 to 14.5): x · Φ(x) within 2.4e-7 absolute and 8e-6 relative
// where it is a normal number, Φ(x) + x · φ(x) within 2e-7 absolute; one bf16 ulp from the exact
// values rounded, both.
struct Tail {
  float ts, e;
};
// SHORT: S of degree 5 (fitted the same way; relative error 2.4e-5 in float64), for the forward
// where it writes 16 bits: x · Φ(x) is then within 2.4e-5 of its value relative (1.2e-5 above
// 0), a twentieth of a half-precision rounding (2^-11) and a 160th of a bf16 one, for 3 fused
// multiply-adds a value fewer (the bf16 forward at [12288, 3072]: 47.5 µs against 50.6). The
// backward keeps degree 8: near the derivative's root (x ≈ -0.75) its absolute error is what
// shows, and a float32 output keeps it too.
template <bool SHORT = false>
__device__ __forceinline__ Tail tail_of(float x) {
  const float t = rcp_approx(fmaf(fabsf(x), 0.5f * kAlpha, 1.0f));
  float s;
  if constexpr (SHORT) {
    s = -2.735698727e-02f;
    s = fmaf(s, t, -9.704154444e-03f);
    s = fmaf(s, t, 1.576618712e-01f);
    s = fmaf(s, t, 9.131268987e-02f);
    s = fmaf(s, t, 1.474986046e-01f);
    s = fmaf(s, t, 1.405759787e-01f);
  } else {
    s = -2.959677763e-02f;
    s = fmaf(s, t, 1.425919384e-01f);
    s = fmaf(s, t, -2.442314923e-01f);
    s = fmaf(s, t, 1.397574395e-01f);
    s = fmaf(s, t, -1.381245907e-02f);
    s = fmaf(s, t, 1.015552506e-01f);
    s = fmaf(s, t, 1.214982420e-01f);
    s = fmaf(s, t, 1.411950439e-01f);
    s = fmaf(s, t, 1.410427839e-01f);
  }
  return {t * s, exp2_ftz(x * (x * kHalfLog2e))};
}

template <bool TANH, bool SHORT = false>
__device__ __forceinline__ float gelu(float x) {
  if constexpr (TANH) {
    const float x_cube = x * x * x;
    const float inner = kBetaTanh * (x + kKappa * x_cube);
    return 0.5f * x * (1.0f + tanhf(inner));
  } else {  // x · Φ(x): x · Q(-x) = (x · tS) · E below 0 (no cancellation), x - x · Q(x) above
    const Tail q = tail_of<SHORT>(x);
    const float r = (x * q.ts) * q.e;
    return x < 0.0f ? r : x - r;
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
  } else {  // Φ(x) + x · φ(x)
    const Tail q = tail_of(x);
    const float tail = q.ts * q.e;
    return dy * ((x < 0.0f ? tail : 1.0f - tail) + (x * kInvSqrt2Pi) * q.e);
  }
}

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
