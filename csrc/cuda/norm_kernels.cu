// The crate's fused normalization kernels: LayerNorm and RMSNorm with the residual add and the
// dropout of the branch folded in, forward and backward, fp32 math, fp32 / bf16 / fp16 in and
// out (see norm_params.h for what each computes). One warp per row, 4 values per lane and load,
// the row held in registers (VEC groups of 4 per lane); the weight and bias gradients are summed
// per block in shared memory, then across blocks by a small finishing kernel (a fixed order:
// deterministic).
//
// Compiled by nvcc into a fat binary that build.rs embeds in the shim; the launcher
// (norm_own.cpp) launches the extern "C" kernels by name.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "norm_params.h"
#include "own_kernel_list.h"
#include "vec_io.cuh"

namespace tcg::norm {
namespace {

using tcg::cuda::load4;
using tcg::cuda::store4;

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

template <typename TB, typename TY, int VEC>
__device__ void forward(const Forward& a) {
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (row >= a.rows) return;
  const int cols = a.cols;
  const int64_t base = row * cols;
  uint64_t seed = 0, offset = 0;
  if (a.dropout) unpack(a.philox, &seed, &offset);
  float4 v[VEC];
  float sum = 0.0f;
#pragma unroll
  for (int i = 0; i < VEC; ++i) {
    const int c = (lane + 32 * i) * 4;
    if (c < cols) {
      float4 x = load4<float>(a.res + base + c);
      if (a.branch != nullptr) {
        float4 b = load4<TB>(static_cast<const TB*>(a.branch) + base + c);
        if (a.dropout) {
          const float4 m = keep4(seed, offset, static_cast<uint64_t>(base + c), a.keep, a.scale);
          b = make_float4(b.x * m.x, b.y * m.y, b.z * m.z, b.w * m.w);
        }
        x = make_float4(x.x + b.x, x.y + b.y, x.z + b.z, x.w + b.w);
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
      const float4 g = a.gamma ? load4<float>(a.gamma + c) : make_float4(1.f, 1.f, 1.f, 1.f);
      const float4 b = a.beta ? load4<float>(a.beta + c) : make_float4(0.f, 0.f, 0.f, 0.f);
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

// One warp per row, the rows of a block strided over the grid. Each warp sums its rows' weight
// and bias gradients in its own stretch of shared memory (a lane owns its columns there, so no
// atomics and few registers), then the block adds its warps' sums in order.
// One row's normalized input xh and weighted gradient g (the lane's VEC groups of 4), for rows
// up to 768 wide (VEC 6) the residual stream's gradient dres too (loaded with the rest, so that
// all of the row's loads are in flight before the row's sums wait on them; the widest rows load
// it in backward_store, as three arrays of 8 would cost occupancy: measured slower on an H200),
// the row's sums of g and g·xh for this lane, and the warp's weight and bias gradient sums
// (acc[0], acc[1]; the bias's only where there is a bias) accumulated.
template <int VEC>
constexpr bool kPrefetchDres = VEC <= 6;

template <typename TY, int VEC>
__device__ __forceinline__ void backward_load(const Backward& a, int64_t base, float mean, float rstd, int lane,
                                              float4 (&xh)[VEC], float4 (&g)[VEC], float4 (&dres)[VEC],
                                              float4 (*acc)[VEC * 32], float* sum_g, float* sum_gx) {
#pragma unroll
  for (int i = 0; i < VEC; ++i) {
    const int c = (lane + 32 * i) * 4;
    if (kPrefetchDres<VEC> && c < a.cols && a.dres != nullptr) dres[i] = load4<float>(a.dres + base + c);
  }
#pragma unroll
  for (int i = 0; i < VEC; ++i) {
    const int c = (lane + 32 * i) * 4;
    if (c < a.cols) {
      const float4 x = load4<float>(a.x + base + c);
      xh[i] = make_float4((x.x - mean) * rstd, (x.y - mean) * rstd, (x.z - mean) * rstd, (x.w - mean) * rstd);
      const float4 dy = a.dy ? load4<TY>(static_cast<const TY*>(a.dy) + base + c) : make_float4(0.f, 0.f, 0.f, 0.f);
      const float4 w = a.gamma ? load4<float>(a.gamma + c) : make_float4(1.f, 1.f, 1.f, 1.f);
      g[i] = make_float4(dy.x * w.x, dy.y * w.y, dy.z * w.z, dy.w * w.w);
      float4& ag = acc[0][lane + 32 * i];
      ag = make_float4(ag.x + dy.x * xh[i].x, ag.y + dy.y * xh[i].y, ag.z + dy.z * xh[i].z, ag.w + dy.w * xh[i].w);
      if (a.part_beta != nullptr) {
        float4& ab = acc[1][lane + 32 * i];
        ab = make_float4(ab.x + dy.x, ab.y + dy.y, ab.z + dy.z, ab.w + dy.w);
      }
      *sum_g += (g[i].x + g[i].y) + (g[i].z + g[i].w);
      *sum_gx += (g[i].x * xh[i].x + g[i].y * xh[i].y) + (g[i].z * xh[i].z + g[i].w * xh[i].w);
    }
  }
}

// One row's input gradient (plus the residual stream's gradient), and the branch's (through
// the dropout mask), from the row's means mg of g and mgx of g·xh.
template <typename TB, int VEC>
__device__ __forceinline__ void backward_store(const Backward& a, int64_t base, float rstd, float mg, float mgx, int lane,
                                               const float4 (&xh)[VEC], const float4 (&g)[VEC], const float4 (&dres)[VEC],
                                               uint64_t seed, uint64_t offset) {
#pragma unroll
  for (int i = 0; i < VEC; ++i) {
    const int c = (lane + 32 * i) * 4;
    if (c < a.cols) {
      float4 d = make_float4(rstd * (g[i].x - mg - xh[i].x * mgx), rstd * (g[i].y - mg - xh[i].y * mgx),
                             rstd * (g[i].z - mg - xh[i].z * mgx), rstd * (g[i].w - mg - xh[i].w * mgx));
      if (a.dres != nullptr) {
        const float4 r = kPrefetchDres<VEC> ? dres[i] : load4<float>(a.dres + base + c);
        d = make_float4(d.x + r.x, d.y + r.y, d.z + r.z, d.w + r.w);
      }
      store4<float>(a.dx + base + c, d);
      if (a.dbranch != nullptr) {
        float4 db = d;
        if (a.dropout) {
          const float4 m = keep4(seed, offset, static_cast<uint64_t>(base + c), a.keep, a.scale);
          db = make_float4(d.x * m.x, d.y * m.y, d.z * m.z, d.w * m.w);
        }
        store4<TB>(static_cast<TB*>(a.dbranch) + base + c, db);
      }
    }
  }
}

// The block's partial weight and bias gradients: its warps' sums, added in warp order.
template <int VEC>
__device__ __forceinline__ void backward_partials(const Backward& a, const float4 (&s_acc)[kWarps][2][VEC * 32]) {
  __syncthreads();
  const float* acc = reinterpret_cast<const float*>(s_acc);
  constexpr int stride = 2 * VEC * 32 * 4;  // floats per warp
  for (int c = threadIdx.x; c < a.cols; c += blockDim.x) {
    float sg = 0.0f, sb = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      sg += acc[w * stride + c];
      sb += acc[w * stride + VEC * 32 * 4 + c];
    }
    if (a.part_gamma != nullptr) a.part_gamma[static_cast<int64_t>(blockIdx.x) * a.cols + c] = sg;
    if (a.part_beta != nullptr) a.part_beta[static_cast<int64_t>(blockIdx.x) * a.cols + c] = sb;
  }
}

template <typename TB, typename TY, int VEC>
__device__ void backward(const Backward& a) {
  __shared__ float4 s_acc[kWarps][2][VEC * 32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const float inv = 1.0f / static_cast<float>(a.cols);
  uint64_t seed = 0, offset = 0;
  if (a.dropout) unpack(a.philox, &seed, &offset);
#pragma unroll
  for (int i = 0; i < VEC; ++i) s_acc[warp][0][lane + 32 * i] = s_acc[warp][1][lane + 32 * i] = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + warp; row < a.rows;
       row += static_cast<int64_t>(gridDim.x) * kWarps) {
    const int64_t base = row * a.cols;
    const float mean = a.mean[row], rstd = a.rstd[row];
    float4 xh[VEC], g[VEC], dres[VEC];
    float sum_g = 0.0f, sum_gx = 0.0f;
    backward_load<TY, VEC>(a, base, mean, rstd, lane, xh, g, dres, s_acc[warp], &sum_g, &sum_gx);
    const float mg = a.rms ? 0.0f : warp_sum(sum_g) * inv;
    const float mgx = warp_sum(sum_gx) * inv;
    backward_store<TB, VEC>(a, base, rstd, mg, mgx, lane, xh, g, dres, seed, offset);
  }
  backward_partials<VEC>(a, s_acc);
}

__device__ void finish(const Finish& a) {
  __shared__ float s[2][kFinishThreads / kFinishCols][kFinishCols + 1];
  const int lane = threadIdx.x % kFinishCols, part = threadIdx.x / kFinishCols;
  constexpr int parts = kFinishThreads / kFinishCols;
  const int c = blockIdx.x * kFinishCols + lane;
  float sg = 0.0f, sb = 0.0f;
  if (c < a.cols) {
    for (int b = part; b < a.blocks; b += parts) {
      const int64_t at = static_cast<int64_t>(b) * a.cols + c;
      if (a.part_gamma) sg += a.part_gamma[at];
      if (a.part_beta) sb += a.part_beta[at];
    }
  }
  s[0][part][lane] = sg;
  s[1][part][lane] = sb;
  __syncthreads();
  if (part == 0 && c < a.cols) {
    for (int p = 1; p < parts; ++p) {
      sg += s[0][p][lane];
      sb += s[1][p][lane];
    }
    if (a.dgamma) a.dgamma[c] = sg;
    if (a.dbeta) a.dbeta[c] = sb;
  }
}

}  // namespace
}  // namespace tcg::norm

// The kernels of own_kernel_list.h's TCG_NORM_TYPES and TCG_NORM_VECS, and the finish.
#define TCG_NORM_KERNELS(NB, NY, V)                                                                \
  extern "C" __global__ void __launch_bounds__(tcg::norm::kWarps * 32)                               \
      tcg_norm_fwd_##NB##_##NY##_v##V(const tcg::norm::Forward a) {                                    \
    tcg::norm::forward<TCG_CUDA_TYPE(NB), TCG_CUDA_TYPE(NY), V>(a);                                    \
  }                                                                                                    \
  extern "C" __global__ void __launch_bounds__(tcg::norm::kWarps * 32)                               \
      tcg_norm_bwd_##NB##_##NY##_v##V(const tcg::norm::Backward a) {                                   \
    tcg::norm::backward<TCG_CUDA_TYPE(NB), TCG_CUDA_TYPE(NY), V>(a);                                   \
  }
#define TCG_NORM_KERNELS_FOR(NB, NY) TCG_NORM_VECS(TCG_NORM_KERNELS, NB, NY)
TCG_NORM_TYPES(TCG_NORM_KERNELS_FOR)

extern "C" __global__ void __launch_bounds__(tcg::norm::kFinishThreads) tcg_norm_finish(const tcg::norm::Finish a) {
  tcg::norm::finish(a);
}
