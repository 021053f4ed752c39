// The head's GEMMs with the cross-entropy folded in (ce_head_gemm.h), CUTLASS 3 kernels for sm_90
// (cutlass_gemm.cuh's) and the pass over the rows between them.
//
// The forward: CUTLASS's ping-pong GEMM on 128 × 128 tiles whose epilogue, before it stores the
// tile, rounds each logit to bf16, finds each row's maximum in the tile (the four lanes that hold a
// row's 128 values together), and replaces the logits by e = 2^(x · log2e - k), summing them: the
// exponential once per logit, in the warp group's epilogue that runs beside the other's mainloop.
// k is 0 while the tile's maximum lies in a window around 0 (a language model's logits do), so
// that a row's tiles share it and the backward's GEMMs read e as it lies: the input gradient
// f ⊙ (e · w) (cooperative, 128 × 192 tiles, f applied in the epilogue) and the weight gradient
// eᵀ · (f · h) (wgrad_gemm.h's). The rows' pass rescales the rows whose tiles' k differ, in place.
//
// On an H200 at the 124 M Llama's head ([12288, 768] → 32,000, alone, full clock, µs): the forward
// GEMM 912-934 (the same kernel writing the logits: 859-911; cuBLAS's: 831-962; cooperative 128 ×
// 128 and 256 × 128 tiles, other rasterings and swizzles: 915-1246); the rows' pass 45-50 (86 with
// 2% of the rows rescaled); the input gradient 745-758; the weight gradient 771-786. Per-tile
// factors applied where the backward GEMMs load e instead (a register-sourced A, every tile's own
// k): 793 and 989. docs/linear-loss.md has the step's figures.
#include "ce_head_gemm.h"

#include <cuda_bf16.h>

#include "cutlass_gemm.cuh"

namespace tcg::ce_head_gemm {
namespace {

using namespace tcg::cutlass_gemm;

constexpr float kLog2e = 1.4426950408889634f;

// The window of a tile's maximum (log2 units, ceiling) in which its exponent k is 0: e up to
// 2^kHighExp, a row's sum up to 2^(kHighExp + 15) at 32,000 classes, so f = inv_count · 2^(K - L)
// leaves bf16(f · h) in its normal range for any |h| above 2^-49; e of a tile whose maximum is at
// -kLowExp keeps the values down to 62 binades below it.
constexpr float kHighExp = 48.0f, kLowExp = 64.0f;

__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// ---------------------------------------------------------------------------------------------
// The forward's epilogue edit (cutlass_gemm.cuh's EditingEpilogue): the tile's accumulators
// turned into e, with the stats' pointer and the problem's size.

struct ExpEdit {
  float2* stats;
  int32_t rows, vocab;

  // The accumulators of a tile 128 columns wide in wgmma's layout ((2 columns, 2 row halves,
  // column groups), atoms along m, one atom along n): each row's 128 values lie with the four lanes
  // of a quad, 32 each.
  template <class Acc, class Mma, class TileShapeMNK>
  CUTLASS_DEVICE void operator()(Acc& acc, Mma const& mma, TileShapeMNK tile_shape, int thread_idx, int m_tile,
                                 int n_tile) const {
    constexpr int kAtomsM = decltype(size<1>(acc))::value;
    constexpr int kGroups = decltype(size<0, 2>(acc))::value;
    static_assert(decltype(size<2>(acc))::value == 1 && decltype(size<0, 0>(acc))::value == 2 &&
                      decltype(size<0, 1>(acc))::value == 2,
                  "the accumulators of one wgmma atom along n");
    static_assert(decltype(size<1>(tile_shape))::value == kTile, "tiles kTile columns wide");
    constexpr int kBlkM = decltype(size<0>(tile_shape))::value;
    const auto coords = mma.get_slice(thread_idx).partition_C(make_identity_tensor(take<0, 2>(tile_shape)));
    const int col0 = n_tile * kTile;
    float k[kAtomsM][2];
    CUTLASS_PRAGMA_UNROLL
    for (int m = 0; m < kAtomsM; ++m) {
      CUTLASS_PRAGMA_UNROLL
      for (int h = 0; h < 2; ++h) {
        float mx = -INFINITY;
        CUTLASS_PRAGMA_UNROLL
        for (int g = 0; g < kGroups; ++g) {
          float& a0 = acc(make_coord(make_coord(0, h, g), m, 0));
          float& a1 = acc(make_coord(make_coord(1, h, g), m, 0));
          // the logits as a bf16 GEMM writes them: one packed rounding per pair
          const __nv_bfloat162 p = __floats2bfloat162_rn(a0, a1);
          const uint32_t u = *reinterpret_cast<const uint32_t*>(&p);
          const int col = col0 + static_cast<int>(get<1>(coords(make_coord(make_coord(0, h, g), m, 0))));
          a0 = col < vocab ? __uint_as_float(u << 16) : -INFINITY;
          a1 = col + 1 < vocab ? __uint_as_float(u & 0xffff0000u) : -INFINITY;
          mx = fmaxf(mx, fmaxf(a0, a1));
        }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        // 0 while the tile's maximum lies in the window (so that a row's tiles share their k and
        // the backward's GEMMs read e as it is), else the maximum's ceiling
        const float top = ceilf(mx * kLog2e);
        k[m][h] = top >= -kLowExp && top <= kHighExp ? 0.0f : top;
      }
    }
    CUTLASS_PRAGMA_UNROLL
    for (int m = 0; m < kAtomsM; ++m) {
      CUTLASS_PRAGMA_UNROLL
      for (int h = 0; h < 2; ++h) {
        float sum = 0.0f;
        CUTLASS_PRAGMA_UNROLL
        for (int g = 0; g < kGroups; ++g) {
          CUTLASS_PRAGMA_UNROLL
          for (int c = 0; c < 2; ++c) {
            float& a = acc(make_coord(make_coord(c, h, g), m, 0));
            a = ex2(__fmaf_rn(a, kLog2e, -k[m][h]));  // 2^-inf = 0 past the last column
            sum += a;
          }
        }
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        const int row = m_tile * kBlkM + static_cast<int>(get<0>(coords(make_coord(make_coord(0, h, 0), m, 0))));
        if ((thread_idx & 3) == 0 && row < rows) {
          stats[static_cast<int64_t>(n_tile) * rows + row] = make_float2(k[m][h], sum);
        }
      }
    }
  }
};

using FwdTile = Shape<_128, _128, _64>;
using FwdKernel =
    Kernel<FwdTile, RowMajor, ColumnMajor, RowMajor, cutlass::epilogue::fusion::LinearCombination<E, float, void, float>,
           Pingpong>;
using FwdGemm = cutlass::gemm::device::GemmUniversalAdapter<cutlass::gemm::kernel::GemmUniversal<
    Shape<int, int, int, int>, FwdKernel::Mainloop, EditingEpilogue<FwdKernel::Epilogue, ExpEdit>,
    cutlass::gemm::PersistentScheduler>>;

// ---------------------------------------------------------------------------------------------
// The input gradient: dh = f ⊙ (e · w), e [rows, vocab] as A, w [vocab, c] as B (n-major), the
// per-row factor (a column vector broadcast along n) times the float32 accumulator, rounded once.
// Cooperative on 128 × 192 tiles. (The weight gradient eᵀ · xs is wgrad_gemm.h's GEMM.)
using GradTile = Shape<_128, _192, _64>;
using RowScale = cutlass::epilogue::fusion::Sm90EVT<
    cutlass::epilogue::fusion::Sm90Compute<cutlass::multiplies, E, float, cutlass::FloatRoundStyle::round_to_nearest>,
    cutlass::epilogue::fusion::Sm90ColBroadcast<0, GradTile, float, float, Stride<_1, _0, int64_t>>,
    cutlass::epilogue::fusion::Sm90AccFetch>;
using InputGradGemm = Kernel<GradTile, RowMajor, RowMajor, RowMajor, RowScale, Cooperative>::Gemm;

// ---------------------------------------------------------------------------------------------
// The rows' pass: a block takes 32 rows. Its warps first split the tiles between them, a lane a row
// (the stats read along rows, as they lie), then take a row each in turn: the rescaling of a row
// whose tiles' exponents differ, then its features.

constexpr int kRowsWarps = 8;

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// A row's e multiplied by 2^(k - K), k its tile's exponent (exact but where the product falls
// below bf16's normal range): afterwards every e of the row is 2^(x · log2e - K). A warp, 8 values
// a lane at a time (vocab a multiple of 8), four groups' loads issued before the first store (a
// tile at a time, 4 values a lane, a 12,288-row head with 2% of its rows rescaled took 213 µs).
__device__ void rescale_row(__nv_bfloat16* e, const float2* stats, int64_t stride, int vocab, float k_row, int lane) {
  constexpr int kAhead = 4;
  for (int i0 = lane * 8; i0 < vocab; i0 += 32 * 8 * kAhead) {
    uint4 v[kAhead];
    float s[kAhead];
    CUTLASS_PRAGMA_UNROLL
    for (int u = 0; u < kAhead; ++u) {
      const int i = i0 + u * 32 * 8;
      if (i < vocab) {
        v[u] = *reinterpret_cast<const uint4*>(e + i);
        s[u] = ldexpf(1.0f, static_cast<int>(stats[(i / kTile) * stride].x - k_row));
      }
    }
    CUTLASS_PRAGMA_UNROLL
    for (int u = 0; u < kAhead; ++u) {
      const int i = i0 + u * 32 * 8;
      if (i >= vocab) break;
      __nv_bfloat162* p = reinterpret_cast<__nv_bfloat162*>(&v[u]);
      CUTLASS_PRAGMA_UNROLL
      for (int q = 0; q < 4; ++q) {
        const float2 x = __bfloat1622float2(p[q]);
        p[q] = __floats2bfloat162_rn(x.x * s[u], x.y * s[u]);
      }
      *reinterpret_cast<uint4*>(e + i) = v[u];
    }
  }
}

__global__ void __launch_bounds__(32 * kRowsWarps) rows_kernel(Rows a) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
  const int first = blockIdx.x * 32;
  const int n_tiles = tiles(a.vocab);
  const float2* stats = static_cast<const float2*>(a.stats);
  __shared__ float part[kRowsWarps][32], low[kRowsWarps][32], log2_sums[32], fs[32], ks[32];
  __shared__ bool uniform[32];

  const int row = first + lane;
  const bool real = row < a.rows;
  // K: the largest k of the row's tiles (and the smallest: is the row uniform?)
  float k_max = -INFINITY, k_min = INFINITY;
  if (real) {
    for (int t = warp; t < n_tiles; t += kRowsWarps) {
      const float k = stats[static_cast<int64_t>(t) * a.rows + row].x;
      k_max = fmaxf(k_max, k);
      k_min = fminf(k_min, k);
    }
  }
  part[warp][lane] = k_max;
  low[warp][lane] = k_min;
  __syncthreads();
  k_max = -INFINITY;
  k_min = INFINITY;
  for (int w = 0; w < kRowsWarps; ++w) {
    k_max = fmaxf(k_max, part[w][lane]);
    k_min = fminf(k_min, low[w][lane]);
  }
  __syncthreads();
  // Σ e 2^(k - K)
  float sum = 0.0f;
  if (real) {
    for (int t = warp; t < n_tiles; t += kRowsWarps) {
      const float2 st = stats[static_cast<int64_t>(t) * a.rows + row];
      sum += st.y * ldexpf(1.0f, static_cast<int>(st.x - k_max));
    }
  }
  part[warp][lane] = sum;
  __syncthreads();
  if (warp == 0 && real) {
    sum = 0.0f;
    for (int w = 0; w < kRowsWarps; ++w) sum += part[w][lane];
    const float log2_sum = k_max + log2f(sum);  // L = log2 Σ 2^(x log2e)
    const int64_t target = a.targets[row];
    const bool ignored = target == a.ignore_index || target < 0 || target >= a.vocab;
    log2_sums[lane] = log2_sum;
    fs[lane] = ignored ? 0.0f : *a.inv_count * exp2f(k_max - log2_sum);
    ks[lane] = k_max;
    uniform[lane] = k_min == k_max;
  }
  __syncthreads();

  // a warp a row: its e rescaled to K where its tiles' k differ, the loss, the target's e,
  // xs = bf16(f · h)
  for (int j = warp; j < 32 && first + j < a.rows; j += kRowsWarps) {
    const int r = first + j;
    const float log2_sum = log2_sums[j], f = fs[j], k_row = ks[j];
    const int64_t target = a.targets[r];
    const bool ignored = target == a.ignore_index || target < 0 || target >= a.vocab;
    __nv_bfloat16* e_row = static_cast<__nv_bfloat16*>(a.e) + static_cast<int64_t>(r) * a.vocab;
    if (!uniform[j]) {
      rescale_row(e_row, stats + r, a.rows, a.vocab, k_row, lane);
      __syncwarp();
    }
    const __nv_bfloat16* h = static_cast<const __nv_bfloat16*>(a.h) + static_cast<int64_t>(r) * a.c;
    __nv_bfloat16* xs = static_cast<__nv_bfloat16*>(a.xs) + static_cast<int64_t>(r) * a.c;
    const __nv_bfloat16* w = static_cast<const __nv_bfloat16*>(a.w) + (ignored ? 0 : target) * a.c;
    float dot = 0.0f;
    for (int i = lane * 8; i < a.c; i += 32 * 8) {
      uint4 hv = *reinterpret_cast<const uint4*>(h + i);
      const uint4 wv = *reinterpret_cast<const uint4*>(w + i);
      __nv_bfloat162* hp = reinterpret_cast<__nv_bfloat162*>(&hv);
      const __nv_bfloat162* wp = reinterpret_cast<const __nv_bfloat162*>(&wv);
      CUTLASS_PRAGMA_UNROLL
      for (int q = 0; q < 4; ++q) {
        const float2 x = __bfloat1622float2(hp[q]), y = __bfloat1622float2(wp[q]);
        dot = __fmaf_rn(x.x, y.x, __fmaf_rn(x.y, y.y, dot));
        hp[q] = __floats2bfloat162_rn(x.x * f, x.y * f);
      }
      *reinterpret_cast<uint4*>(xs + i) = hv;
    }
    // the target's logit as the GEMM rounds it (its float32 sum in another order)
    const float x_target = __bfloat162float(__float2bfloat16_rn(warp_sum(dot)));
    if (lane == 0) {
      a.f[r] = f;
      a.row_loss[r] = target == a.ignore_index ? 0.0f
                      : ignored                 ? __int_as_float(0x7fc00000)
                                                : log2_sum / kLog2e - x_target;
      if (!ignored) {
        // e - 2^(L - K) at the target: f times that is inv_count · (p - 1)
        __nv_bfloat16* e = e_row + target;
        *e = __float2bfloat16_rn(__bfloat162float(*e) - exp2f(log2_sum - k_row));
      }
    }
  }
}

}  // namespace

const char* prepare() {
  const char* why = prepare_all<FwdGemm, InputGradGemm>();
  if (*why != '\0') return why;
  const cudaError_t e = cudaFuncSetAttribute(rows_kernel, cudaFuncAttributePreferredSharedMemoryCarveout, 0);
  return e == cudaSuccess ? "" : cudaGetErrorString(e);
}

const char* unsupported(int32_t rows, int32_t vocab, int32_t c, const void* h, const void* w) {
  if (rows <= 0 || vocab <= 0 || c <= 0) return "no rows, classes or features";
  if (vocab % 8 != 0 || c % 8 != 0) return "classes or features not a multiple of 8";
  if (!aligned(h) || !aligned(w)) return "operands not 16-byte aligned";
  return "";
}

cudaError_t forward(const Forward& a, int sm_count, cudaStream_t stream) {
  const ExpEdit edit{static_cast<float2*>(a.stats), a.rows, a.vocab};
  return run<FwdGemm>(editing_gemm_args<FwdGemm>(a.rows, a.vocab, a.c, a.h, a.w, a.e, edit, sm_count), stream);
}

cudaError_t rows_pass(const Rows& a, cudaStream_t stream) {
  rows_kernel<<<(a.rows + 31) / 32, 32 * kRowsWarps, 0, stream>>>(a);
  return cudaGetLastError();
}

cudaError_t input_grad(const InputGrad& a, int sm_count, cudaStream_t stream) {
  auto args = gemm_args<InputGradGemm>(a.rows, a.c, a.vocab, a.e, a.w, a.dh, sm_count);
  args.epilogue.thread = {{a.f, 0.0f, {}}, {}, {}};
  return run<InputGradGemm>(args, stream);
}

}  // namespace tcg::ce_head_gemm
