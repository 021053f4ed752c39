// The crate's rotary-embedding kernel: q and k rotated in one launch, forward and backward (the
// backward is the same rotation with sin negated), v of a fused q | k | v projection copied in
// the same launch where there is one (into or out of the packed layout), fp32 math, bf16 / fp16
// / fp32 in and out (see rotary_params.h). One thread per 4 pairs of a head's row (8 values: a
// 4-value load from each half of the row, so that a warp's loads and stores are whole sectors)
// and per token of its block's run; which head and which pairs a thread holds is worked out
// once, not per value (the index arithmetic had made the kernel bound by its instructions, at a
// third of DRAM's bandwidth). Products and sums use the _rn intrinsics (no fused multiply-add),
// so the result equals ATen's element-wise composition on the same tables bit for bit in fp32.
//
// Compiled by nvcc into a fat binary that build.rs embeds in the shim; the launcher
// (rotary_own.cpp) launches the extern "C" kernels by name.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math_constants.h>

#include "dependent_launch.cuh"
#include "own_kernel_list.h"
#include "rotary_params.h"
#include "vec_io.cuh"

namespace tcg::rotary {
namespace {

using tcg::cuda::load4;
using tcg::cuda::load_raw4;
using tcg::cuda::Raw4;
using tcg::cuda::store4;
using tcg::cuda::widen;

// Two floats at p (8-byte aligned).
__device__ __forceinline__ float2 load2(const float* p) { return *reinterpret_cast<const float2*>(p); }

__device__ __forceinline__ void rotate(float x0, float x1, float c, float s, float* o0, float* o1) {
  *o0 = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
  *o1 = __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c));
}

// Item j of every token (of q's, k's and v's heads × D/8 groups): its part's pointers at its head,
// its group and the block's first token (b0, t0), the part's token strides and the step from a
// sequence's last token to the next sequence's first (32-bit: the launcher checks that every
// part spans fewer than 2^31 elements), its group g: values 4g..4g+3 at x and D/2 + 4g..D/2 +
// 4g + 3 at x + D/2 in both layouts (so that a warp's threads read and write whole sectors; pairs
// across the two groups when half-split, two pairs within each when interleaved). Fixed for a
// thread over the tokens it visits: no division per value.
template <typename T>
struct Item {
  const T* x;
  T* out;
  int32_t stride_t, out_t, x_wrap, o_wrap;
  int g;
  bool copy;  // v: copied, not rotated
};

template <typename T>
__device__ __forceinline__ Item<T> item_of(const Params& a, int j, int b0, int t0) {
  const int groups = a.dim / 8;
  const int slot = j / groups;
  const int which = slot < a.q.heads ? 0 : slot < a.q.heads + a.k.heads ? 1 : 2;
  const Part p = which == 0 ? a.q : which == 1 ? a.k : a.v;  // a copy: no indexing of the parameters
  const int h = slot - (which == 0 ? 0 : which == 1 ? a.q.heads : a.q.heads + a.k.heads);
  Item<T> it;
  it.g = j - slot * groups;
  it.x = static_cast<const T*>(p.x) + (h * p.stride_h + b0 * p.stride_b + t0 * p.stride_t + 4 * it.g);
  it.out = static_cast<T*>(p.out) + (h * p.out_h + b0 * p.out_b + t0 * p.out_t + 4 * it.g);
  it.stride_t = static_cast<int32_t>(p.stride_t);
  it.out_t = static_cast<int32_t>(p.out_t);
  it.x_wrap = static_cast<int32_t>(p.stride_b - a.seq * p.stride_t);
  it.o_wrap = static_cast<int32_t>(p.out_b - a.seq * p.out_t);
  it.copy = which == 2;
  return it;
}

// The cos and sin of an item's 4 angles at position pos (NaN past the tables' rows).
template <typename T>
__device__ __forceinline__ void angles(const Params& a, const Item<T>& it, int64_t pos, float4* c, float4* s) {
  if (pos < 0 || pos >= a.positions) {
    *c = *s = make_float4(CUDART_NAN_F, CUDART_NAN_F, CUDART_NAN_F, CUDART_NAN_F);
    return;
  }
  const int64_t row = pos * (a.dim / 2);
  if (a.half_split) {  // angles 4g..4g+3, one per pair (i, i + D/2)
    *c = load4<float>(a.cos + row + 4 * it.g);
    *s = load4<float>(a.sin + row + 4 * it.g);
  } else {  // angles 2g, 2g+1 (the first group's pairs) and D/4 + 2g, D/4 + 2g + 1 (the second's)
    const float2 c0 = load2(a.cos + row + 2 * it.g), c1 = load2(a.cos + row + a.dim / 4 + 2 * it.g);
    const float2 s0 = load2(a.sin + row + 2 * it.g), s1 = load2(a.sin + row + a.dim / 4 + 2 * it.g);
    *c = make_float4(c0.x, c0.y, c1.x, c1.y);
    *s = make_float4(s0.x, s0.y, s1.x, s1.y);
  }
}

// Writes one item read as (u, v) at o: rotated by the angles' cos c and sin s (sin negated in the
// backward), or copied.
template <typename T>
__device__ __forceinline__ void store_item(const Params& a, const Item<T>& it, float4 u, float4 v, float4 c, float4 s,
                                           T* o) {
  const int half = a.dim / 2;
  if (it.copy) {
    store4<T>(o, u);
    store4<T>(o + half, v);
    return;
  }
  if (a.negate_sin) s = make_float4(-s.x, -s.y, -s.z, -s.w);
  float4 ou, ov;
  if (a.half_split) {
    rotate(u.x, v.x, c.x, s.x, &ou.x, &ov.x);
    rotate(u.y, v.y, c.y, s.y, &ou.y, &ov.y);
    rotate(u.z, v.z, c.z, s.z, &ou.z, &ov.z);
    rotate(u.w, v.w, c.w, s.w, &ou.w, &ov.w);
  } else {
    rotate(u.x, u.y, c.x, s.x, &ou.x, &ou.y);
    rotate(u.z, u.w, c.y, s.y, &ou.z, &ou.w);
    rotate(v.x, v.y, c.z, s.z, &ov.x, &ov.y);
    rotate(v.z, v.w, c.w, s.w, &ov.z, &ov.w);
  }
  store4<T>(o, ou);
  store4<T>(o + half, ov);
}

// A block's threads cover a token's items (j = threadIdx.x, + blockDim.x, ...) over the block's
// run of consecutive tokens, the pointers stepped on from token to token (no division, no
// 64-bit product per token: the index arithmetic had made the kernel bound by its
// instructions). A thread loads kTokens tokens' values and angles before it writes any of them,
// so that all those loads are in flight together (an output either does not overlap its input
// or is that input itself, rotated in place: a value is written only by the thread that read it). At the 124 M Llama-style model's packed q | k | v (12 × 1024
// tokens, 20 heads of 64, bf16, 63 MB moved), on an H200: 24.9 µs with one token's values ahead
// and each token's angles loaded just before its stores; 19.8 with two tokens (a copy of the same
// bytes: 17.7); four and eight held more registers, so fewer blocks, and took 21.6 and 22.5.
constexpr int kTokens = 2;

template <typename T>
__device__ void rotary(const Params& a) {
  const int per_token = (a.q.heads + a.k.heads + a.v.heads) * (a.dim / 8);
  const int tokens = a.batch * a.seq;  // the launcher's check: every part's elements fit 32 bits
  const int run = (tokens + static_cast<int>(gridDim.x) - 1) / static_cast<int>(gridDim.x);
  const int first = static_cast<int>(blockIdx.x) * run;
  const int last = min(tokens, first + run);
  if (first >= last) return;
  const int64_t offset = a.offset + (a.offset_dev ? *a.offset_dev : 0);
  const int b0 = first / a.seq, t0 = first - b0 * a.seq;
  const int half = a.dim / 2;
  const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int j = threadIdx.x; j < per_token; j += blockDim.x) {
    const Item<T> it = item_of<T>(a, j, b0, t0);
    const T* x = it.x;
    T* o = it.out;
    int t = t0;
    for (int token = first; token < last; token += kTokens) {
      Raw4<T> u[kTokens], v[kTokens];
      float4 c[kTokens], s[kTokens];
      T* out[kTokens];
#pragma unroll
      for (int k = 0; k < kTokens; ++k) {
        out[k] = o;
        c[k] = s[k] = zero;
        if (token + k < last) {
          u[k] = load_raw4<T>(x);
          v[k] = load_raw4<T>(x + half);
          if (!it.copy) angles<T>(a, it, offset + t, &c[k], &s[k]);
          x += it.stride_t;
          o += it.out_t;
          if (++t == a.seq) {  // the next sequence's first token
            t = 0;
            x += it.x_wrap;
            o += it.o_wrap;
          }
        }
      }
#pragma unroll
      for (int k = 0; k < kTokens; ++k) {
        if (token + k < last) store_item<T>(a, it, widen<T>(u[k]), widen<T>(v[k]), c[k], s[k], out[k]);
      }
    }
  }
}

}  // namespace
}  // namespace tcg::rotary

// The kernels of own_kernel_list.h's TCG_ROTARY_TYPES: tcg_rotary_<dtype of q and k>.
#define TCG_ROTARY_KERNEL(N)                                                                         \
  extern "C" __global__ void __launch_bounds__(tcg::rotary::kThreads) tcg_rotary_##N(const tcg::rotary::Params a) { tcg::cuda::wait_prior(); \
    tcg::rotary::rotary<TCG_CUDA_TYPE(N)>(a);                                                       \
  }
TCG_ROTARY_TYPES(TCG_ROTARY_KERNEL)
