// The crate's rotary-embedding kernel: q and k rotated in one launch, forward and backward (the
// backward is the same rotation with sin negated), v of a fused q | k | v projection copied in
// the same launch where there is one (into or out of the packed layout), fp32 math, bf16 / fp16 / fp32 in and out (see
// rotary_params.h). One thread per 4 pairs of one row (8 values: two 4-value loads), the tables
// read 4 angles at a time. Products and sums use the _rn intrinsics (no fused multiply-add), so
// the result equals ATen's element-wise composition on the same tables bit for bit in fp32.
//
// Compiled by nvcc into a fat binary that build.rs embeds in the shim; the launcher
// (rotary_own.cpp) launches the extern "C" kernels by name.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math_constants.h>

#include "own_kernel_list.h"
#include "rotary_params.h"
#include "vec_io.cuh"

namespace tcg::rotary {
namespace {

using tcg::cuda::load4;
using tcg::cuda::store4;

__device__ __forceinline__ void rotate(float x0, float x1, float c, float s, float* o0, float* o1) {
  *o0 = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
  *o1 = __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c));
}

// The first and second 4-value group of item g: interleaved, values 8g..8g+7 (pairs within
// each group of 4); half-split, values 4g..4g+3 and D/2 + 4g..D/2 + 4g + 3 (pairs across the
// two). Over g < D/8 they cover each value of a row once.
__device__ __forceinline__ void groups_of(const Params& a, int g, int64_t* first, int64_t* second) {
  *first = a.half_split ? 4 * g : 8 * g;
  *second = a.half_split ? a.dim / 2 + 4 * g : 8 * g + 4;
}

template <typename T>
__device__ void rotary(const Params& a) {
  const int groups = a.dim / 8;  // 4 pairs per thread
  const int64_t row_items = static_cast<int64_t>(a.batch) * a.seq * groups;
  const int64_t q_items = row_items * a.q.heads, k_items = row_items * a.k.heads, v_items = row_items * a.v.heads;
  const int64_t offset = a.offset + (a.offset_dev ? *a.offset_dev : 0);
  for (int64_t item = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; item < q_items + k_items + v_items;
       item += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int which = item < q_items ? 0 : item < q_items + k_items ? 1 : 2;
    const Part& part = which == 0 ? a.q : which == 1 ? a.k : a.v;
    // 32-bit unsigned division (each part holds at most INT32_MAX values: the launcher's
    // check), several times cheaper than 64-bit
    uint32_t r = static_cast<uint32_t>(item - (which == 0 ? 0 : which == 1 ? q_items : q_items + k_items));
    const int g = static_cast<int>(r % static_cast<uint32_t>(groups));
    r /= static_cast<uint32_t>(groups);
    const int h = static_cast<int>(r % static_cast<uint32_t>(part.heads));
    r /= static_cast<uint32_t>(part.heads);
    const int t = static_cast<int>(r % static_cast<uint32_t>(a.seq));
    const int b = static_cast<int>(r / static_cast<uint32_t>(a.seq));
    const int64_t in = b * part.stride_b + t * part.stride_t + h * part.stride_h;
    const int64_t out = b * part.out_b + t * part.out_t + h * part.out_h;
    int64_t first, second;
    groups_of(a, g, &first, &second);
    const float4 u = load4<T>(static_cast<const T*>(part.x) + in + first);
    const float4 v = load4<T>(static_cast<const T*>(part.x) + in + second);
    T* o = static_cast<T*>(part.out) + out;
    if (which == 2) {  // v: copied
      store4<T>(o + first, u);
      store4<T>(o + second, v);
      continue;
    }
    const int64_t pos = offset + t;
    float4 c, s;
    if (pos < 0 || pos >= a.positions) {
      c = s = make_float4(CUDART_NAN_F, CUDART_NAN_F, CUDART_NAN_F, CUDART_NAN_F);
    } else {
      c = load4<float>(a.cos + pos * (a.dim / 2) + 4 * g);
      s = load4<float>(a.sin + pos * (a.dim / 2) + 4 * g);
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
    store4<T>(o + first, ou);
    store4<T>(o + second, ov);
  }
}

}  // namespace
}  // namespace tcg::rotary

// The kernels of own_kernel_list.h's TCG_ROTARY_TYPES: tcg_rotary_<dtype of q and k>.
#define TCG_ROTARY_KERNEL(N)                                                                         \
  extern "C" __global__ void __launch_bounds__(tcg::rotary::kThreads) tcg_rotary_##N(const tcg::rotary::Params a) { \
    tcg::rotary::rotary<TCG_CUDA_TYPE(N)>(a);                                                       \
  }
TCG_ROTARY_TYPES(TCG_ROTARY_KERNEL)
