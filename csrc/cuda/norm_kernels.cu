// The crate's fused normalization kernels: LayerNorm and RMSNorm with the residual add and the
// dropout of the branch folded in, forward and backward, fp32 math, fp32 / bf16 / fp16 in and
// out (see norm_params.h for what each computes). Forward: one warp per row, 4 values per lane
// and load, the row held in registers (VEC groups of 4 per lane). Backward: one block of 32·VEC
// threads per row, one group of 4 per thread, the next row's loads in flight while the block
// reduces one; the weight and bias gradients are summed per block
// in registers (and the branch bias's, the sum of the branch gradient), then across blocks by a
// small finishing kernel (a fixed order: deterministic).
//
// Compiled by nvcc into a fat binary that build.rs embeds in the shim; the launcher
// (norm_own.cpp) launches the extern "C" kernels by name.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "dependent_launch.cuh"
#include "norm_params.h"
#include "col_sum.cuh"
#include "own_kernel_list.h"
#include "vec_io.cuh"

namespace tcg::norm {
namespace {

using tcg::cuda::load4;
using tcg::cuda::load_raw4;
using tcg::cuda::Raw4;
using tcg::cuda::store4;
using tcg::cuda::widen;

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) v += __shfl_xor_sync(0xffffffffu, v, m);
  return v;
}

// Philox4x32-10 (Salmon et al. 2011), as curand computes it.
__device__ __forceinline__ uint4 philox(uint4 c, uint2 k) {
#pragma unroll
  for (int r = 0; r < 10; ++r) {
    const unsigned lo0 = c.x * 0xD2511F53u, hi0 = __umulhi(c.x, 0xD2511F53u);
    const unsigned lo1 = c.z * 0xCD9E8D57u, hi1 = __umulhi(c.z, 0xCD9E8D57u);
    c = make_uint4(hi1 ^ c.y ^ k.x, lo1, hi0 ^ c.w ^ k.y, lo0);
    k.x += 0x9E3779B9u;
    k.y += 0xBB67AE85u;
  }
  return c;
}

// The seed and offset a kernel draws with (read from the device inside a captured graph).
__device__ __forceinline__ void unpack(const at::PhiloxCudaState& s, uint64_t* seed, uint64_t* offset) {
  if (s.captured_) {
    *seed = static_cast<uint64_t>(*s.seed_.ptr);
    *offset = static_cast<uint64_t>(*s.offset_.ptr) + s.offset_intragraph_;
  } else {
    *seed = s.seed_.val;
    *offset = s.offset_.val;
  }
}

// The dropout factors (0 or scale) of elements e .. e + 3 (e a multiple of 4).
__device__ __forceinline__ float4 keep4(uint64_t seed, uint64_t offset, uint64_t e, float keep, float scale) {
  const uint64_t g = e >> 2, o = offset >> 2;
  const uint4 r = philox(make_uint4(static_cast<unsigned>(o), static_cast<unsigned>(o >> 32),
                                    static_cast<unsigned>(g), static_cast<unsigned>(g >> 32)),
                         make_uint2(static_cast<unsigned>(seed), static_cast<unsigned>(seed >> 32)));
  const float k = 1.0f / 16777216.0f;  // 24 random bits to [0, 1)
  return make_float4(static_cast<float>(r.x >> 8) * k < keep ? scale : 0.0f,
                     static_cast<float>(r.y >> 8) * k < keep ? scale : 0.0f,
                     static_cast<float>(r.z >> 8) * k < keep ? scale : 0.0f,
                     static_cast<float>(r.w >> 8) * k < keep ? scale : 0.0f);
}

// Four floats of a parameter (gamma, beta, a bias), read by many rows of the launch, through the
// read-only data cache (ld.global.nc). (The compiler still keeps them after the previous group's
// store: the branches on which parameters there are stand between.)
__device__ __forceinline__ float4 param4(const float* p) { return __ldg(reinterpret_cast<const float4*>(p)); }

template <typename TB, typename TY, int VEC>
__device__ void forward(const Forward& a) {
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (row >= a.rows) return;
  const int cols = a.cols;
  const int64_t base = row * cols;
  uint64_t seed = 0, offset = 0;
  if (a.dropout) unpack(a.philox, &seed, &offset);
  const float* branch_bias = a.branch_bias == nullptr ? nullptr : a.branch_bias + (row % a.bias_rows) * cols;
  // every group's loads first, in flight together, then the sums and the stores (the stores of
  // the residual stream may alias its loads, so the compiler keeps a load after an earlier
  // group's store: loading group by group, a row waited on VEC round trips to memory)
  float4 v[VEC];
  Raw4<TB> br[VEC];
#pragma unroll
  for (int i = 0; i < VEC; ++i) {
    const int c = (lane + 32 * i) * 4;
    if (c < cols) {
      if (a.res != nullptr) v[i] = load4<float>(a.res + base + c);
      if (a.branch != nullptr) br[i] = load_raw4<TB>(static_cast<const TB*>(a.branch) + base + c);
    }
  }
  float sum = 0.0f;
#pragma unroll
  for (int i = 0; i < VEC; ++i) {
    const int c = (lane + 32 * i) * 4;
    if (c < cols) {
      float4 x = v[i];
      if (a.branch != nullptr) {
        float4 b = widen<TB>(br[i]);
        if (branch_bias != nullptr) {
          const float4 bb = param4(branch_bias + c);
          b = make_float4(b.x + bb.x, b.y + bb.y, b.z + bb.z, b.w + bb.w);
        }
        if (a.dropout) {
          const float4 m = keep4(seed, offset, static_cast<uint64_t>(base + c), a.keep, a.scale);
          b = make_float4(b.x * m.x, b.y * m.y, b.z * m.z, b.w * m.w);
        }
        // without a residual stream, the branch is where it starts
        x = a.res != nullptr ? make_float4(x.x + b.x, x.y + b.y, x.z + b.z, x.w + b.w) : b;
        store4<float>(a.res_out + base + c, x);
      }
      v[i] = x;
      sum += (x.x + x.y) + (x.z + x.w);
    }
  }
  const float inv = 1.0f / static_cast<float>(cols);
  const float mean = a.rms ? 0.0f : warp_sum(sum) * inv;
  float sq = 0.0f;
#pragma unroll
  for (int i = 0; i < VEC; ++i) {
    if ((lane + 32 * i) * 4 < cols) {
      const float d0 = v[i].x - mean, d1 = v[i].y - mean, d2 = v[i].z - mean, d3 = v[i].w - mean;
      sq += (d0 * d0 + d1 * d1) + (d2 * d2 + d3 * d3);
    }
  }
  const float rstd = rsqrtf(warp_sum(sq) * inv + a.eps);
#pragma unroll
  for (int i = 0; i < VEC; ++i) {
    const int c = (lane + 32 * i) * 4;
    if (c < cols) {
      const float4 g = a.gamma ? param4(a.gamma + c) : make_float4(1.f, 1.f, 1.f, 1.f);
      const float4 b = a.beta ? param4(a.beta + c) : make_float4(0.f, 0.f, 0.f, 0.f);
      const float4 y = make_float4((v[i].x - mean) * rstd * g.x + b.x, (v[i].y - mean) * rstd * g.y + b.y,
                                   (v[i].z - mean) * rstd * g.z + b.z, (v[i].w - mean) * rstd * g.w + b.w);
      store4<TY>(static_cast<TY*>(a.y) + base + c, y);
    }
  }
  if (lane == 0) {
    a.mean[row] = mean;
    a.rstd[row] = rstd;
  }
}

// The backward: one block of 32·VEC threads per row, one group of 4 columns per thread (the
// row's two sums reduced per warp, then across the block's warps through shared memory in warp
// order: deterministic), the rows of a block strided over the grid, one at a time, each row's
// loads issued before the previous row's sums and stores, so that they are in flight while the
// block waits at its barrier (two rows at a time, both loaded, then both reduced and stored, left
// DRAM idle at each barrier: 30.2 µs at [16384, 384] and 44.2 at [12288, 768] with dropout,
// against 28.9 and 41.0 so). Each thread sums its columns' weight and bias gradients over its
// block's rows in registers, in row order, and writes them once, as the block's partials. A thread
// holds a few groups, not a row's worth: few registers, so many rows in flight per SM (the kernel
// is bound by memory; one warp per row holding the row in registers ran at 25% occupancy and
// about half of DRAM's bandwidth).
template <typename TY>
struct BwdRow {
  float4 x, r;   // the row's input and the stream's gradient (0 without one)
  Raw4<TY> dy;   // the output's gradient, as loaded
  float mean, rstd;
};

template <typename TB, typename TY, int VEC>
__device__ void backward(const Backward& a) {
  __shared__ float s_sum[2][2][VEC];  // [row parity][sum of g, sum of g·xh][warp]
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int c = threadIdx.x * 4;
  const bool active = c < a.cols;
  const float inv = 1.0f / static_cast<float>(a.cols);
  const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
  uint64_t seed = 0, offset = 0;
  if (a.dropout) unpack(a.philox, &seed, &offset);
  const float4 w = active && a.gamma != nullptr ? load4<float>(a.gamma + c) : make_float4(1.f, 1.f, 1.f, 1.f);
  float4 acc_g = zero, acc_b = zero, acc_bb = zero;
  const int64_t stride = gridDim.x;
  BwdRow<TY> next{};
  const auto fetch = [&](int64_t row) {
    if (active && row < a.rows) {
      const int64_t at = row * a.cols + c;
      next.mean = a.mean[row];
      next.rstd = a.rstd[row];
      next.r = a.dres != nullptr ? load4<float>(a.dres + at) : zero;
      next.x = load4<float>(a.x + at);
      if (a.dy != nullptr) next.dy = load_raw4<TY>(static_cast<const TY*>(a.dy) + at);
    }
  };
  fetch(blockIdx.x);
  int parity = 0;
  for (int64_t row = blockIdx.x; row < a.rows; row += stride, parity ^= 1) {
    const BwdRow<TY> cur = next;
    fetch(row + stride);
    float4 xh = zero, g = zero;
    float sum_g = 0.0f, sum_gx = 0.0f;
    if (active) {
      const float4 dy = a.dy != nullptr ? widen<TY>(cur.dy) : zero;
      const float rs = cur.rstd, mean = cur.mean;
      xh = make_float4((cur.x.x - mean) * rs, (cur.x.y - mean) * rs, (cur.x.z - mean) * rs, (cur.x.w - mean) * rs);
      g = make_float4(dy.x * w.x, dy.y * w.y, dy.z * w.z, dy.w * w.w);
      acc_g = make_float4(acc_g.x + dy.x * xh.x, acc_g.y + dy.y * xh.y, acc_g.z + dy.z * xh.z, acc_g.w + dy.w * xh.w);
      acc_b = make_float4(acc_b.x + dy.x, acc_b.y + dy.y, acc_b.z + dy.z, acc_b.w + dy.w);
      sum_g = (g.x + g.y) + (g.z + g.w);
      sum_gx = (g.x * xh.x + g.y * xh.y) + (g.z * xh.z + g.w * xh.w);
    }
    sum_g = warp_sum(sum_g);
    sum_gx = warp_sum(sum_gx);
    if (lane == 0) {
      s_sum[parity][0][warp] = sum_g;
      s_sum[parity][1][warp] = sum_gx;
    }
    // One barrier a row: the other parity's slots are rewritten only after the next barrier,
    // which every warp reaches after reading these.
    __syncthreads();
    float total_g = 0.0f, total_gx = 0.0f;
#pragma unroll
    for (int v = 0; v < VEC; ++v) {
      total_g += s_sum[parity][0][v];
      total_gx += s_sum[parity][1][v];
    }
    const float mg = a.rms ? 0.0f : total_g * inv;
    const float mgx = total_gx * inv;
    if (active) {
      const int64_t at = row * a.cols + c;
      const float rs = cur.rstd;
      const float4 r = cur.r;
      const float4 d = make_float4(rs * (g.x - mg - xh.x * mgx) + r.x, rs * (g.y - mg - xh.y * mgx) + r.y,
                                   rs * (g.z - mg - xh.z * mgx) + r.z, rs * (g.w - mg - xh.w * mgx) + r.w);
      if (a.dx != nullptr) store4<float>(a.dx + at, d);
      if (a.dbranch != nullptr) {
        float4 db = d;
        if (a.dropout) {
          const float4 m = keep4(seed, offset, static_cast<uint64_t>(at), a.keep, a.scale);
          db = make_float4(d.x * m.x, d.y * m.y, d.z * m.z, d.w * m.w);
        }
        store4<TB>(static_cast<TB*>(a.dbranch) + at, db);
        acc_bb = make_float4(acc_bb.x + db.x, acc_bb.y + db.y, acc_bb.z + db.z, acc_bb.w + db.w);
      }
    }
  }
  if (active) {
    const int64_t part = static_cast<int64_t>(blockIdx.x) * a.cols + c;
    const float4 acc[kFinishSums] = {acc_g, acc_b, acc_bb};
#pragma unroll
    for (int k = 0; k < kFinishSums; ++k) {
      if (a.part[k] != nullptr) store4<float>(a.part[k] + part, acc[k]);
    }
  }
}

}  // namespace
}  // namespace tcg::norm

// The kernels of own_kernel_list.h's TCG_NORM_TYPES and TCG_NORM_VECS, and the finish.
#define TCG_NORM_KERNELS(NB, NY, V)                                                                \
  extern "C" __global__ void __launch_bounds__(tcg::norm::kWarps * 32)                               \
      tcg_norm_fwd_##NB##_##NY##_v##V(const tcg::norm::Forward a) { tcg::cuda::wait_prior();                                    \
    tcg::norm::forward<TCG_CUDA_TYPE(NB), TCG_CUDA_TYPE(NY), V>(a);                                    \
  }                                                                                                    \
  extern "C" __global__ void __launch_bounds__(32 * V)                                               \
      tcg_norm_bwd_##NB##_##NY##_v##V(const tcg::norm::Backward a) { tcg::cuda::wait_prior();                                   \
    tcg::norm::backward<TCG_CUDA_TYPE(NB), TCG_CUDA_TYPE(NY), V>(a);                                   \
  }
#define TCG_NORM_KERNELS_FOR(NB, NY) TCG_NORM_VECS(TCG_NORM_KERNELS, NB, NY)
TCG_NORM_TYPES(TCG_NORM_KERNELS_FOR)

extern "C" __global__ void __launch_bounds__(tcg::cuda::kColSumThreads) tcg_norm_finish(const tcg::norm::Finish a) { tcg::cuda::wait_prior();
  tcg::cuda::sum_columns<tcg::norm::kFinishSums>(a.part, a.sum, a.blocks, a.cols);
}
