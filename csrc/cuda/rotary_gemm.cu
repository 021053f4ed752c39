// The fused q | k | v projection with rotary embeddings in its epilogue (rotary_gemm.h), a
// CUTLASS 3 kernel for sm_90 (cutlass_gemm.cuh's): CUTLASS's ping-pong GEMM on 128 × 128 tiles
// whose epilogue, before it stores a tile, rounds each value to bf16 and rotates the pairs of q's
// and k's heads in place in the accumulators. In wgmma's accumulator layout a thread holds two
// adjacent columns of each row it touches, so an interleaved pair (2i, 2i+1) never leaves its
// thread: the rotation needs no exchange, only the tables' cos and sin.
//
// On an H200 at the 124 M Llama's wqkv ([12288, 768] → 20 heads of 64, 16 rotated; alone, µs):
// 54-58, where the same kernel without the rotation takes 38-39 (as cuBLAS's GEMM; its output
// equal to cuBLAS's bit for bit) and the rotary kernel's pass after it about 14 in place. The
// rotation's cost is the tables' loads: each angle loaded as its pair is rotated, 111; a row's
// angles loaded first, one load each from tables in the natural order, 63-72.
#include "rotary_gemm.h"

#include <cuda_bf16.h>
#include <math_constants.h>

#include "cutlass_gemm.cuh"

namespace tcg::rotary_gemm {
namespace {

using namespace tcg::cutlass_gemm;

// The rounding of a bf16 GEMM's output, back in float32.
__device__ __forceinline__ float rounded(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }

// The epilogue's edit (cutlass_gemm.cuh's EditingEpilogue): the tile's q and k pairs rotated in
// the accumulators, with what it reads beside them (rotary_gemm.h's Forward's fields).
struct Rope {
  const float* cos;
  const float* sin;
  int64_t offset, positions;
  int32_t seq, rot_cols;

  // The accumulators in wgmma's layout ((2 adjacent columns, 2 row halves, column groups of 8),
  // atoms along m, atoms along n): the pair (c = 0, c = 1) of an element is an interleaved pair;
  // group g of a head holds its pair 4 (g mod 8) + q, q the thread's column pair in the group,
  // so a thread's angles for a row are permuted angles 8q .. 8q + 7, shared by the tile's heads.
  // Both row halves' angles are loaded before any pair is rotated.
  template <class Acc, class Mma, class TileShapeMNK>
  CUTLASS_DEVICE void operator()(Acc& acc, Mma const& mma, TileShapeMNK tile_shape, int thread_idx, int m_tile,
                                 int n_tile) const {
    constexpr int kAtomsM = decltype(size<1>(acc))::value;
    constexpr int kAtomsN = decltype(size<2>(acc))::value;
    constexpr int kGroups = decltype(size<0, 2>(acc))::value;
    static_assert(decltype(size<0, 0>(acc))::value == 2 && decltype(size<0, 1>(acc))::value == 2,
                  "wgmma's accumulators: two adjacent columns in two row halves");
    constexpr int kBlkM = decltype(size<0>(tile_shape))::value;
    constexpr int kBlkN = decltype(size<1>(tile_shape))::value;
    static_assert((kBlkN / kAtomsN) % kHeadDim == 0, "whole heads in an atom");
    constexpr int kLoads = kHeadDim / 8;  // a thread's angles per row
    const int col0 = n_tile * kBlkN;
    if (col0 >= rot_cols) return;  // v's columns only
    const auto coords = mma.get_slice(thread_idx).partition_C(make_identity_tensor(take<0, 2>(tile_shape)));
    // the thread's first angle (group 0's pair), and which groups rotate
    const int q = (static_cast<int>(get<1>(coords(make_coord(make_coord(0, 0, 0), 0, 0)))) % kHeadDim) / 2;
    bool rotates[kAtomsN][kGroups];
    CUTLASS_PRAGMA_UNROLL
    for (int n = 0; n < kAtomsN; ++n) {
      CUTLASS_PRAGMA_UNROLL
      for (int g = 0; g < kGroups; ++g) {
        rotates[n][g] = col0 + static_cast<int>(get<1>(coords(make_coord(make_coord(0, 0, g), 0, n)))) < rot_cols;
      }
    }
    CUTLASS_PRAGMA_UNROLL
    for (int m = 0; m < kAtomsM; ++m) {
      float c[2][kLoads], s[2][kLoads];
      CUTLASS_PRAGMA_UNROLL
      for (int h = 0; h < 2; ++h) {
        const int row = m_tile * kBlkM + static_cast<int>(get<0>(coords(make_coord(make_coord(0, h, 0), m, 0))));
        const int64_t pos = row % seq + offset;
        if (pos >= 0 && pos < positions) {
          const float4* cv = reinterpret_cast<const float4*>(cos + pos * (kHeadDim / 2) + q * kLoads);
          const float4* sv = reinterpret_cast<const float4*>(sin + pos * (kHeadDim / 2) + q * kLoads);
          CUTLASS_PRAGMA_UNROLL
          for (int j = 0; j < kLoads / 4; ++j) {
            const float4 a = __ldg(cv + j), b = __ldg(sv + j);
            c[h][4 * j] = a.x, c[h][4 * j + 1] = a.y, c[h][4 * j + 2] = a.z, c[h][4 * j + 3] = a.w;
            s[h][4 * j] = b.x, s[h][4 * j + 1] = b.y, s[h][4 * j + 2] = b.z, s[h][4 * j + 3] = b.w;
          }
        } else {
          CUTLASS_PRAGMA_UNROLL
          for (int j = 0; j < kLoads; ++j) c[h][j] = s[h][j] = CUDART_NAN_F;
        }
      }
      CUTLASS_PRAGMA_UNROLL
      for (int h = 0; h < 2; ++h) {
        CUTLASS_PRAGMA_UNROLL
        for (int n = 0; n < kAtomsN; ++n) {
          CUTLASS_PRAGMA_UNROLL
          for (int g = 0; g < kGroups; ++g) {
            if (!rotates[n][g]) continue;
            const int j = g % kLoads;
            float& a0 = acc(make_coord(make_coord(0, h, g), m, n));
            float& a1 = acc(make_coord(make_coord(1, h, g), m, n));
            const float x0 = rounded(a0), x1 = rounded(a1);
            // the rotary kernel's arithmetic: each product and sum rounded once
            a0 = __fsub_rn(__fmul_rn(x0, c[h][j]), __fmul_rn(x1, s[h][j]));
            a1 = __fadd_rn(__fmul_rn(x0, s[h][j]), __fmul_rn(x1, c[h][j]));
          }
        }
      }
    }
  }
};

using Tile = Shape<_128, _128, _64>;
using FwdKernel =
    Kernel<Tile, RowMajor, ColumnMajor, RowMajor, cutlass::epilogue::fusion::LinearCombination<E, float, void, float>,
           Pingpong>;
using FwdGemm = cutlass::gemm::device::GemmUniversalAdapter<cutlass::gemm::kernel::GemmUniversal<
    Shape<int, int, int, int>, FwdKernel::Mainloop, EditingEpilogue<FwdKernel::Epilogue, Rope>,
    cutlass::gemm::PersistentScheduler>>;

}  // namespace

const char* prepare() { return prepare_all<FwdGemm>(); }

const char* unsupported(const Forward& a) {
  if (a.m <= 0 || a.n <= 0 || a.c <= 0 || a.n % 8 != 0 || a.c % 8 != 0) return "sizes that are not multiples of 8";
  if (a.seq <= 0 || a.rot_cols % kHeadDim != 0 || a.rot_cols > a.n) return "heads that do not fit the projection";
  if (!aligned(a.x) || !aligned(a.w) || !aligned(a.y) || !aligned(a.cos) || !aligned(a.sin)) {
    return "operands not 16-byte aligned";
  }
  return "";
}

cudaError_t forward(const Forward& a, int sm_count, cudaStream_t stream) {
  const Rope rope{a.cos, a.sin, a.offset, a.positions, a.seq, a.rot_cols};
  return run<FwdGemm>(editing_gemm_args<FwdGemm>(a.m, a.n, a.c, a.x, a.w, a.y, rope, sm_count), stream);
}

}  // namespace tcg::rotary_gemm
