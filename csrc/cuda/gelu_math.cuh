// GELU's two forms and their derivatives, one float32 value at a time, as the crate computes
// them: in the bias + GELU kernels (gelu_kernels.cu) and in the epilogues of the MLP's GEMMs
// (gelu_gemm.cu), so that both paths compute the same function. The tanh form is ATen's formula
// (ActivationGeluKernel.cu), written the same way; the exact form is x · Φ(x) through the normal
// distribution's tail (tail_of).
#pragma once
#include "fast_math.cuh"

namespace tcg::gelu {

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
  const float t = tcg::cuda::rcp_approx(fmaf(fabsf(x), 0.5f * kAlpha, 1.0f));
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
  return {t * s, tcg::cuda::exp2_ftz(x * (x * kHalfLog2e))};
}

// x · Φ(x) from the tail at x: x · Q(-x) = (x · tS) · E below 0 (no cancellation), x - x · Q(x)
// above.
__device__ __forceinline__ float gelu_of_tail(float x, Tail q) {
  const float r = (x * q.ts) * q.e;
  return x < 0.0f ? r : x - r;
}

// GELU's derivative Φ(x) + x · φ(x) from the tail at x.
__device__ __forceinline__ float gelu_grad_of_tail(float x, Tail q) {
  const float tail = q.ts * q.e;
  return (x < 0.0f ? tail : 1.0f - tail) + (x * kInvSqrt2Pi) * q.e;
}

template <bool TANH, bool SHORT = false>
__device__ __forceinline__ float gelu(float x) {
  if constexpr (TANH) {
    const float x_cube = x * x * x;
    const float inner = kBetaTanh * (x + kKappa * x_cube);
    return 0.5f * x * (1.0f + tanhf(inner));
  } else {
    return gelu_of_tail(x, tail_of<SHORT>(x));
  }
}

// GELU's exact form and its derivative at x together, from one evaluation of the tail: `value` is
// gelu<false, SHORT>(x) bit for bit, `grad` is gelu_grad<false>(1, x) with the tail of degree
// SHORT's (for the GEMM's forward, which keeps the derivative, not x, for its backward).
struct ValueAndGrad {
  float value, grad;
};
template <bool SHORT>
__device__ __forceinline__ ValueAndGrad gelu_and_grad(float x) {
  const Tail q = tail_of<SHORT>(x);
  return {gelu_of_tail(x, q), gelu_grad_of_tail(x, q)};
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
    return dy * gelu_grad_of_tail(x, tail_of(x));
  }
}

}  // namespace tcg::gelu
