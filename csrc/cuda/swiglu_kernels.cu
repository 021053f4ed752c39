// The crate's SwiGLU kernels: silu(gate) · up read from the fused [gate | up] projection in one
// pass, and both gradients written into one [dgate | dup] tensor in one more (see
// swiglu_params.h), fp32 math, bf16 / fp16 / fp32 in and out. One thread per 4 columns of a
// row, grid-strided. The _rn intrinsics keep each operation rounded on its own (no fused
// multiply-add), as ATen's separate kernels round them.
//
// Compiled by nvcc into a fat binary that build.rs embeds in the shim; the launcher
// (swiglu_own.cpp) launches the extern "C" kernels by name.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "own_kernel_list.h"
#include "swiglu_params.h"
#include "vec_io.cuh"

namespace tcg::swiglu {
namespace {

using tcg::cuda::load4;
using tcg::cuda::store4;

__device__ __forceinline__ float silu(float g) { return __fdiv_rn(g, __fadd_rn(1.0f, expf(-g))); }

// Both gradients of one element; exp(-gate) computed once for the sigmoid and the SiLU (the
// same rounding as computing each on its own).
__device__ __forceinline__ void grads(float g, float u, float d, float* dg, float* du) {
  const float denom = __fadd_rn(1.0f, expf(-g));
  const float sig = __fdiv_rn(1.0f, denom);
  *du = __fmul_rn(d, __fdiv_rn(g, denom));
  *dg = __fmul_rn(__fmul_rn(__fmul_rn(d, u), sig), __fadd_rn(1.0f, __fmul_rn(g, __fsub_rn(1.0f, sig))));
}

// Item i of the grid-stride loops: 4 columns of one row of h [rows, 2F]; its row and first
// column, and gate and up as floats. I: the index type, 32-bit where the items fit (its
// division is a few instructions; a 64-bit one, dozens).
template <typename T, typename I>
__device__ __forceinline__ void load_item(const T* h_all, int64_t f, I i, int64_t* row, int64_t* col, float4* g,
                                          float4* u) {
  const I groups = static_cast<I>(f / 4);
  *row = static_cast<int64_t>(i / groups);
  *col = static_cast<int64_t>(i % groups) * 4;
  const T* h = h_all + *row * 2 * f;
  *g = load4<T>(h + *col);
  *u = load4<T>(h + f + *col);
}

// Runs `body(i)` for this thread's items of the grid-stride loop over `items`.
template <typename I, class Body>
__device__ __forceinline__ void for_items(int64_t items, Body body) {
  const I n = static_cast<I>(items);
  for (I i = static_cast<I>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += static_cast<I>(gridDim.x) * blockDim.x) {
    body(i);
  }
}

template <typename T, typename I>
__device__ __forceinline__ void forward_items(const Forward& a, int64_t items) {
  for_items<I>(items, [&](I i) {
    int64_t row, col;
    float4 g, u;
    load_item<T>(static_cast<const T*>(a.h), a.f, i, &row, &col, &g, &u);
    const float4 o = make_float4(__fmul_rn(silu(g.x), u.x), __fmul_rn(silu(g.y), u.y), __fmul_rn(silu(g.z), u.z),
                                 __fmul_rn(silu(g.w), u.w));
    store4<T>(static_cast<T*>(a.out) + row * a.f + col, o);
  });
}

// Calls body(I{}) with the index type of a grid-stride loop over `items`: 32 bits where every
// thread index it reaches (below items + the grid's size) fits, else 64.
template <class Body>
__device__ __forceinline__ void with_index_type(int64_t items, Body body) {
  if (items + static_cast<int64_t>(gridDim.x) * blockDim.x <= UINT32_MAX) {
    body(uint32_t{});
  } else {
    body(int64_t{});
  }
}

template <typename T>
__device__ void forward(const Forward& a) {
  const int64_t items = a.rows * (a.f / 4);
  with_index_type(items, [&](auto index) { forward_items<T, decltype(index)>(a, items); });
}

template <typename T, typename I>
__device__ __forceinline__ void backward_items(const Backward& a, int64_t items) {
  for_items<I>(items, [&](I i) {
    int64_t row, col;
    float4 g, u;
    load_item<T>(static_cast<const T*>(a.h), a.f, i, &row, &col, &g, &u);
    const float4 d = load4<T>(static_cast<const T*>(a.dout) + row * a.f + col);
    float4 dg, du;
    grads(g.x, u.x, d.x, &dg.x, &du.x);
    grads(g.y, u.y, d.y, &dg.y, &du.y);
    grads(g.z, u.z, d.z, &dg.z, &du.z);
    grads(g.w, u.w, d.w, &dg.w, &du.w);
    T* dh = static_cast<T*>(a.dh) + row * 2 * a.f;
    store4<T>(dh + col, dg);
    store4<T>(dh + a.f + col, du);
  });
}

template <typename T>
__device__ void backward(const Backward& a) {
  const int64_t items = a.rows * (a.f / 4);
  with_index_type(items, [&](auto index) { backward_items<T, decltype(index)>(a, items); });
}

}  // namespace
}  // namespace tcg::swiglu

// The kernels of own_kernel_list.h's TCG_SWIGLU_TYPES.
#define TCG_SWIGLU_KERNELS(N)                                                                        \
  extern "C" __global__ void __launch_bounds__(tcg::swiglu::kThreads) tcg_swiglu_fwd_##N(const tcg::swiglu::Forward a) { \
    tcg::swiglu::forward<TCG_CUDA_TYPE(N)>(a);                                                      \
  }                                                                                                 \
  extern "C" __global__ void __launch_bounds__(tcg::swiglu::kThreads) tcg_swiglu_bwd_##N(const tcg::swiglu::Backward a) { \
    tcg::swiglu::backward<TCG_CUDA_TYPE(N)>(a);                                                     \
  }
TCG_SWIGLU_TYPES(TCG_SWIGLU_KERNELS)
