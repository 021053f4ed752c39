// The head's GEMMs with the cross-entropy folded in (ce_head_gemm.h), CUTLASS 3 kernels for sm_90
// (cutlass_gemm.cuh's) and the pass over the rows between them.
//
// The forward: CUTLASS's ping-pong GEMM on 128 × 128 tiles whose epilogue, before it stores the
// tile, rounds each logit to bf16, finds each row's maximum in the tile (the four lanes that hold a
// row's 128 values together), and replaces the logits by e = 2^(x · log2e - k), summing them: the
// exponential once per logit, in the warp group's epilogue that runs beside the other's mainloop.
// The backward GEMMs: CUTLASS's mainloop with A read into registers (wgmma's register-sourced A),
// each copy of A from shared memory multiplied by the factors 2^(k - K) of its rows' tiles (one
// bf16 pair multiply per two values; exact, the factors being powers of two): the input
// gradient's A is e (its k the vocabulary), the weight gradient's eᵀ (loaded transposed by
// ldmatrix). Cooperative on 128 × 192 tiles.
//
// On an H200 at the 124 M Llama's head ([12288, 768] → 32,000, alone, full clock, µs): the forward
// GEMM 903-939 against 859-911 for the same kernel writing the logits (cuBLAS's: 831); the rows'
// pass 38; the input gradient 785-823 against 735-752 for the same GEMM unscaled; the weight
// gradient 987-1047 against 769-794 (with the factors replaced by a constant: 821), its factors
// changing every k-tile. docs/linear-loss.md has the step's figures.
#include "ce_head_gemm.h"

#include <cuda_bf16.h>

#include "cutlass_gemm.cuh"

namespace tcg::ce_head_gemm {
namespace {

using namespace tcg::cutlass_gemm;

constexpr float kLog2e = 1.4426950408889634f;

__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// ---------------------------------------------------------------------------------------------
// The forward's epilogue: CUTLASS's collective epilogue `Base`, with its arguments carrying the
// stats' pointer and the problem's size, whose store first turns the tile's accumulators into e.

template <class Base>
struct ExpEpilogue : Base {
  struct Arguments : Base::Arguments {
    float2* stats;
    int32_t rows, vocab;
  };
  struct Params : Base::Params {
    float2* stats;
    int32_t rows, vocab;
  };

  template <class ProblemShape>
  static constexpr Params to_underlying_arguments(ProblemShape const& problem, Arguments const& args, void* workspace) {
    return Params{Base::to_underlying_arguments(problem, args, workspace), args.stats, args.rows, args.vocab};
  }

  CUTLASS_HOST_DEVICE ExpEpilogue(Params const& params, typename Base::TensorStorage& storage)
      : Base(params, storage), stats_(params.stats), rows_(params.rows), vocab_(params.vocab) {}

  template <class ProblemShapeMNKL, class TileShapeMNK, class TileCoordMNKL, class AccEngine, class AccLayout,
            class TiledMma>
  CUTLASS_DEVICE auto store(typename Base::LoadPipeline load_pipeline,
                            typename Base::LoadPipelineState load_state, typename Base::StorePipeline store_pipeline,
                            typename Base::StorePipelineState store_state, ProblemShapeMNKL problem,
                            TileShapeMNK tile_shape, TileCoordMNKL tile_coord, cute::Tensor<AccEngine, AccLayout> acc,
                            TiledMma tiled_mma, int thread_idx, typename Base::TensorStorage& storage,
                            int subtile_idx = -1) {
    exp_tile(acc, tiled_mma, thread_idx, static_cast<int>(get<0>(tile_coord)), static_cast<int>(get<1>(tile_coord)));
    return Base::store(load_pipeline, load_state, store_pipeline, store_state, problem, tile_shape, tile_coord, acc,
                       tiled_mma, thread_idx, storage, subtile_idx);
  }

 private:
  // The accumulators of a 128 × 128 tile in wgmma's layout ((2 columns, 2 row halves, column
  // groups), atoms along m, one atom along n): each row's 128 values lie with the four lanes of a
  // quad, 32 each.
  template <class Acc, class Mma>
  CUTLASS_DEVICE void exp_tile(Acc& acc, Mma const& mma, int thread_idx, int m_tile, int n_tile) const {
    constexpr int kAtomsM = decltype(size<1>(acc))::value;
    constexpr int kGroups = decltype(size<0, 2>(acc))::value;
    static_assert(decltype(size<2>(acc))::value == 1 && decltype(size<0, 0>(acc))::value == 2 &&
                      decltype(size<0, 1>(acc))::value == 2,
                  "the accumulators of one wgmma atom along n");
    const auto coords = mma.get_slice(thread_idx).partition_C(make_identity_tensor(Shape<_128, _128>{}));
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
          a0 = col < vocab_ ? __uint_as_float(u << 16) : -INFINITY;
          a1 = col + 1 < vocab_ ? __uint_as_float(u & 0xffff0000u) : -INFINITY;
          mx = fmaxf(mx, fmaxf(a0, a1));
        }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        k[m][h] = ceilf(mx * kLog2e);
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
        const int row = m_tile * 128 + static_cast<int>(get<0>(coords(make_coord(make_coord(0, h, 0), m, 0))));
        if ((thread_idx & 3) == 0 && row < rows_) {
          stats_[static_cast<int64_t>(n_tile) * rows_ + row] = make_float2(k[m][h], sum);
        }
      }
    }
  }

  float2* stats_;
  int32_t rows_, vocab_;
};

using FwdTile = Shape<_128, _128, _64>;
using FwdKernel =
    Kernel<FwdTile, RowMajor, ColumnMajor, RowMajor, cutlass::epilogue::fusion::LinearCombination<E, float, void, float>,
           Pingpong>;
using FwdEpilogue = ExpEpilogue<FwdKernel::Epilogue>;
using FwdGemm = cutlass::gemm::device::GemmUniversalAdapter<cutlass::gemm::kernel::GemmUniversal<
    Shape<int, int, int, int>, FwdKernel::Mainloop, FwdEpilogue, cutlass::gemm::PersistentScheduler>>;

// ---------------------------------------------------------------------------------------------
// The backward GEMMs' mainloop: CUTLASS's register-sourced-A mainloop `Base` whose mma applies the
// factors to A after each copy from shared memory. Which factor an element takes depends on its
// tile's position, which the mainloop is not told: the kernels run CUTLASS's static persistent
// scheduler rastered along n without swizzling (set in their arguments), so the CTA's i-th tile
// is the linear index blockIdx.x + blockIdx.y · gridDim.x + i · (the grid's size), m = index / the
// tiles along n.

// Which operand A is: e [rows, vocab] (the input gradient; k runs over the vocabulary) or eᵀ
// [vocab, rows] (the weight gradient; m runs over the vocabulary, k over the rows).
enum class Operand { E, ET };

// A load issued where it stands, among the mainloop's own asm statements: the factors are loaded
// k-tiles ahead of their use, and a plain load the compiler may move down to it.
__device__ __forceinline__ uint32_t load_now(const void* p) {
  uint32_t v;
  asm volatile("ld.global.nc.b32 %0, [%1];" : "=r"(v) : "l"(p));
  return v;
}
__device__ __forceinline__ uint32_t load_now_u16(const void* p) {
  uint16_t v;
  asm volatile("ld.global.nc.b16 %0, [%1];" : "=h"(v) : "l"(p));
  return v;
}

template <class Base, Operand kOperand>
struct FactorMainloop : Base {
  using typename Base::MainloopPipeline;
  using typename Base::PipelineState;
  using typename Base::TensorStorage;
  using typename Base::TiledMma;
  using typename Base::SmemLayoutA;
  using typename Base::GmmaSmemLayoutB;
  using typename Base::InternalSmemCopyAtomA;
  using typename Base::TileShape;
  using BaseMainloop = Base;
  static constexpr bool TransposeB = Base::TransposeB;

  struct Arguments : Base::Arguments {
    const uint16_t* fac;
    int32_t fac_tiles, fac_rows, tiles_n;
  };
  struct Params : Base::Params {
    const uint16_t* fac;
    int32_t fac_tiles, fac_rows, tiles_n;
  };

  template <class ProblemShape>
  static constexpr Params to_underlying_arguments(ProblemShape const& problem, Arguments const& args, void* workspace) {
    return Params{Base::to_underlying_arguments(problem, args, workspace), args.fac, args.fac_tiles, args.fac_rows,
                  args.tiles_n};
  }

  // The factors of one k-tile for this thread's registers of A, as bf16 pairs, loaded two
  // k-tiles ahead of their use (loaded before each multiply, the input gradient took 1050 µs;
  // a k-tile ahead, 796; the weight gradient, whose factors change every k-tile, 1047 a k-tile
  // ahead and 987 two).
  // A k-block's registers come in fours per wgmma atom along m, (m, k), (m + 8, k), (m, k + 8),
  // (m + 8, k + 8), each holding the values at k and k + 1: the input gradient's factor is its
  // register's row's in the k-tile's tile of the vocabulary (two a four, the same in every
  // k-block); the weight gradient's the pair of rows (k, k + 1) in the CTA's tile of the vocabulary
  // (two a k-block, the same for every atom along m).
  template <int kRegs, int kBlocks>
  struct Factors {
    static_assert(kRegs % 4 == 0, "registers in fours");
    static constexpr int kCount = kOperand == Operand::E ? kRegs / 2 : 2 * kBlocks;
    uint32_t v[kCount];
    CUTLASS_DEVICE uint32_t at(int b, int i) const {
      return kOperand == Operand::E ? v[(i / 4) * 2 + (i & 1)] : v[b * 2 + ((i & 3) >> 1)];
    }
  };

  template <int kRegs, int kBlocks, class Coords>
  CUTLASS_DEVICE static Factors<kRegs, kBlocks> load_factors(Coords const& coords, int m0, int k0, Params const& p) {
    Factors<kRegs, kBlocks> f;
    if constexpr (kOperand == Operand::E) {
      const int64_t tile = cute::min(k0 / kTile, p.fac_tiles - 1);
      CUTLASS_PRAGMA_UNROLL
      for (int s = 0; s < Factors<kRegs, kBlocks>::kCount; ++s) {
        const int i = (s / 2) * 4 + (s & 1);  // the slot's first register
        const int m = m0 + static_cast<int>(get<0>(coords(2 * i)));
        const uint32_t x = load_now_u16(p.fac + tile * p.fac_rows + m);
        f.v[s] = x | (x << 16);
      }
    } else {
      const uint16_t* base = p.fac + static_cast<int64_t>(m0 / kTile) * p.fac_rows;
      CUTLASS_PRAGMA_UNROLL
      for (int b = 0; b < kBlocks; ++b) {
        CUTLASS_PRAGMA_UNROLL
        for (int s = 0; s < 2; ++s) {
          const int k = cute::min(k0 + b * 16 + static_cast<int>(get<1>(coords(4 * s))), p.fac_rows - 2);
          f.v[b * 2 + s] = load_now(base + k);
        }
      }
      // a k-tile further into L1: these factors change every k-tile
      asm volatile("prefetch.global.L1 [%0];" ::"l"(base + cute::min(k0 + kBlocks * 16, p.fac_rows - 2)));
    }
    return f;
  }

  // A's registers of k-block `b`, multiplied in place by their factors (one bf16 pair multiply a
  // register: exact, the factors being powers of two).
  template <class Frag, int kRegs, int kBlocks>
  CUTLASS_DEVICE static void apply(Frag&& frag, int b, Factors<kRegs, kBlocks> const& f) {
    auto regs = cute::recast<uint32_t>(frag);
    static_assert(decltype(cute::size(regs))::value == kRegs, "registers a k-block");
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < kRegs; ++i) {
      const uint32_t f2 = f.at(b, i);
      uint32_t v = regs(i);
      const __nv_bfloat162 r =
          __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&v), *reinterpret_cast<const __nv_bfloat162*>(&f2));
      regs(i) = *reinterpret_cast<const uint32_t*>(&r);
    }
  }

  // CUTLASS's MainloopSm90TmaGmmaRmemAWarpSpecialized::mma (3.x), with `apply` after each copy
  // of A and the transposition of B (never taken for bf16) left out.
  template <class FrgTensorC>
  CUTLASS_DEVICE void mma(MainloopPipeline pipeline, PipelineState smem_pipe_read, FrgTensorC& accum, int k_tile_count,
                          int thread_idx, TensorStorage& shared_tensors, Params const& params) {
    static_assert(!TransposeB, "bf16 B is not transposed");
    using namespace cute;
    constexpr int kBlkM = decltype(size<0>(TileShape{}))::value;
    constexpr int kBlkK = decltype(size<2>(TileShape{}))::value;

    // this tile's m (see above) and the first k of each k-tile
    const int64_t index = int64_t(blockIdx.x) + int64_t(blockIdx.y) * gridDim.x +
                          int64_t(tiles_done_++) * (int64_t(gridDim.x) * gridDim.y * gridDim.z);
    const int m0 = static_cast<int>(index / params.tiles_n) * kBlkM;
    int k0 = 0;

    Tensor sA_ = make_tensor(make_smem_ptr(shared_tensors.smem_A.data()), SmemLayoutA{});
    Tensor sA = as_position_independent_swizzle_tensor(sA_);
    Tensor gmma_sB_position_dependent = make_tensor(make_smem_ptr(shared_tensors.smem_B.data()), GmmaSmemLayoutB{});

    TiledMma tiled_mma;
    constexpr int MmaWarpGroups = size(TiledMma{}) / cutlass::NumThreadsPerWarpGroup;
    Layout warp_group_thread_layout = make_layout(Int<MmaWarpGroups>{}, Int<cutlass::NumThreadsPerWarpGroup>{});
    int warp_group_idx = __shfl_sync(0xFFFFFFFF, thread_idx / cutlass::NumThreadsPerWarpGroup, 0);
    auto mma_thread_slice = tiled_mma.get_thread_slice(thread_idx);
    auto mma_warpgroup_slice = tiled_mma.get_slice(warp_group_thread_layout(warp_group_idx));

    Tensor tCrA = mma_thread_slice.partition_fragment_A(sA(_, _, Int<0>{}));
    Tensor tCsB = mma_warpgroup_slice.partition_B(gmma_sB_position_dependent);
    Tensor tCrB = mma_warpgroup_slice.make_fragment_B(tCsB);
    // (m, k) within the tile of each of this thread's A values
    Tensor tCcA = mma_thread_slice.partition_A(make_identity_tensor(make_shape(Int<kBlkM>{}, Int<kBlkK>{})));

    auto smem_tiled_copy_A = make_tiled_copy_A(InternalSmemCopyAtomA{}, tiled_mma);
    auto smem_thr_copy_A = smem_tiled_copy_A.get_thread_slice(thread_idx);
    Tensor tCrA_copy_view = smem_thr_copy_A.retile_D(tCrA);
    Tensor tCsA_copy_view = smem_thr_copy_A.partition_S(sA);
    CUTE_STATIC_ASSERT_V(size<2>(tCrA) > _2{}, "RS loops require more than 2 MMA k-iterations for correctness.");

    constexpr int kRegs = decltype(size(tCrA(_, _, 0)))::value / 2;
    constexpr int kBlocks = decltype(size<2>(tCrA))::value;
    const auto coords = tCcA(_, _, 0);  // k-block 0's; k-block b's lie 16 b further along k
    // the factors of this k-tile, the next and the one after (their loads two k-tiles ahead)
    Factors<kRegs, kBlocks> cur = load_factors<kRegs, kBlocks>(coords, m0, 0, params);
    Factors<kRegs, kBlocks> next = load_factors<kRegs, kBlocks>(coords, m0, kBlkK, params);
    Factors<kRegs, kBlocks> after = load_factors<kRegs, kBlocks>(coords, m0, 2 * kBlkK, params);
    const auto load_a = [&](int k_block, int stage, Factors<kRegs, kBlocks> const& f) {
      copy(smem_tiled_copy_A, tCsA_copy_view(_, _, k_block, stage), tCrA_copy_view(_, _, k_block));
      apply(tCrA(_, _, k_block), k_block, f);
    };

    PipelineState smem_pipe_release = smem_pipe_read;
    tiled_mma.accumulate_ = GMMA::ScaleOut::Zero;
    warpgroup_fence_operand(accum);

    cutlass::ConsumerToken barrier_token = {cutlass::BarrierStatus::WaitAgain};
    // first k tile
    {
      barrier_token = pipeline.consumer_try_wait(smem_pipe_read);
      pipeline.consumer_wait(smem_pipe_read, barrier_token);
      int read_stage = smem_pipe_read.index();
      ++smem_pipe_read;
      barrier_token = pipeline.consumer_try_wait(smem_pipe_read);
      load_a(0, read_stage, cur);
      CUTLASS_PRAGMA_UNROLL
      for (int k_block = 0; k_block < size<2>(tCrA) - 1; ++k_block) {
        load_a(k_block + 1, read_stage, cur);
        warpgroup_arrive();
        cute::gemm(tiled_mma, tCrA(_, _, k_block), tCrB(_, _, k_block, read_stage), accum);
        if (k_block == 0) tiled_mma.accumulate_ = GMMA::ScaleOut::One;
        warpgroup_commit_batch();
      }
      warpgroup_wait<2>();
      warpgroup_arrive();
      cute::gemm(tiled_mma, tCrA(_, _, size<2>(tCrA) - 1), tCrB(_, _, size<2>(tCrA) - 1, read_stage), accum);
      warpgroup_commit_batch();
      --k_tile_count;
      if (k_tile_count == 0) return;
      pipeline.consumer_wait(smem_pipe_read, barrier_token);
      k0 += kBlkK;
      cur = next;
      next = after;
      after = load_factors<kRegs, kBlocks>(coords, m0, k0 + 2 * kBlkK, params);
      load_a(0, smem_pipe_read.index(), cur);
      warpgroup_wait<2>();
    }

    warpgroup_fence_operand(accum);
    CUTLASS_PRAGMA_NO_UNROLL
    for (; k_tile_count > 1; --k_tile_count) {
      int read_stage = smem_pipe_read.index();
      ++smem_pipe_read;
      warpgroup_fence_operand(accum);
      CUTLASS_PRAGMA_UNROLL
      for (int k_block = 0; k_block < size<2>(tCrA); ++k_block) {
        if (k_block == 0) barrier_token = pipeline.consumer_try_wait(smem_pipe_read);
        if (k_block == size<2>(tCrA) - 1) {
          pipeline.consumer_wait(smem_pipe_read, barrier_token);
          load_a(0, smem_pipe_read.index(), next);
        } else {
          load_a(k_block + 1, read_stage, cur);
        }
        warpgroup_arrive();
        cute::gemm(tiled_mma, tCrA(_, _, k_block), tCrB(_, _, k_block, read_stage), accum);
        warpgroup_commit_batch();
        warpgroup_wait<2>();
        if (k_block == 1) {
          pipeline.consumer_release(smem_pipe_release);
          ++smem_pipe_release;
        }
      }
      k0 += kBlkK;
      cur = next;
      next = after;
      after = load_factors<kRegs, kBlocks>(coords, m0, k0 + 2 * kBlkK, params);
      warpgroup_fence_operand(accum);
    }

    warpgroup_fence_operand(accum);
    {
      int read_stage = smem_pipe_read.index();
      warpgroup_fence_operand(accum);
      CUTLASS_PRAGMA_UNROLL
      for (int k_block = 0; k_block < size<2>(tCrA) - 1; ++k_block) {
        load_a(k_block + 1, read_stage, cur);
        warpgroup_arrive();
        cute::gemm(tiled_mma, tCrA(_, _, k_block), tCrB(_, _, k_block, read_stage), accum);
        tiled_mma.accumulate_ = GMMA::ScaleOut::One;
        warpgroup_commit_batch();
        warpgroup_wait<2>();
        if (k_block == 1) {
          pipeline.consumer_release(smem_pipe_release);
          ++smem_pipe_release;
        }
      }
      warpgroup_arrive();
      cute::gemm(tiled_mma, tCrA(_, _, size<2>(tCrA) - 1), tCrB(_, _, size<2>(tCrA) - 1, read_stage), accum);
      warpgroup_commit_batch();
    }
    warpgroup_fence_operand(accum);
  }

 private:
  int tiles_done_ = 0;
};

// A backward GEMM: A (bf16, layout LA) through registers with the factors, B (bf16, row-major)
// from shared memory, cooperative on 128 × 192 tiles, D in layout RowMajor of ED by `Fusion`.
template <Operand kOperand, class LA, class Fusion, class ED>
struct BackwardKernel {
  using Tile = Shape<_128, _192, _64>;
  static constexpr int kAlignD = 16 / static_cast<int>(sizeof(ED));
  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Tile, Shape<_1, _1, _1>,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, RowMajor, kAlignD, ED, RowMajor, kAlignD,
      Cooperative::Epilogue, Fusion>::CollectiveOp;
  static constexpr auto kMajorA = std::is_same_v<LA, RowMajor> ? GMMA::Major::K : GMMA::Major::MN;
  using TiledMma = decltype(make_tiled_mma(GMMA::rs_op_selector<E, E, float, Tile, GMMA::Major::K, GMMA::Major::MN>(),
                                           Layout<Shape<_2, _1, _1>>{}));
  using SmemA = decltype(cutlass::gemm::collective::detail::rs_smem_selector<kMajorA, E, decltype(get<0>(Tile{})),
                                                                             decltype(get<2>(Tile{})), false>());
  using SmemB = decltype(cutlass::gemm::collective::detail::rs_smem_selector<GMMA::Major::MN, E, decltype(get<1>(Tile{})),
                                                                             decltype(get<2>(Tile{})), false>());
  // A's copy from shared memory: vector loads along k, or ldmatrix's transposing load where A is
  // m-major (eᵀ: vector loads of single values there took 1.6 times as long)
  using CopyA = std::conditional_t<std::is_same_v<LA, RowMajor>, cute::AutoVectorizingCopy, cute::SM75_U16x8_LDSM_T>;
  static constexpr int kStages = (232448 - static_cast<int>(sizeof(typename Epilogue::SharedStorage)) - 1024) /
                                 ((size<0>(Tile{}) + size<1>(Tile{})) * size<2>(Tile{}) * 2 + 64);
  using Base = cutlass::gemm::collective::CollectiveMma<
      cutlass::gemm::MainloopSm90TmaGmmaRmemAWarpSpecialized<kStages, Shape<_1, _1, _1>, Cooperative::Mainloop>, Tile,
      E, cutlass::gemm::TagToStrideA_t<LA>, E, cutlass::gemm::TagToStrideB_t<RowMajor>, TiledMma, cute::SM90_TMA_LOAD,
      SmemA, Copy_Atom<CopyA, E>, cute::identity, cute::SM90_TMA_LOAD, SmemB, void, cute::identity>;
  using Mainloop = FactorMainloop<Base, kOperand>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<cutlass::gemm::kernel::GemmUniversal<
      Shape<int, int, int, int>, Mainloop, Epilogue, cutlass::gemm::PersistentScheduler>>;
};

// dh = f ⊙ acc: the per-row factor (a column vector broadcast along n) times the accumulator.
using RowScale = cutlass::epilogue::fusion::Sm90EVT<
    cutlass::epilogue::fusion::Sm90Compute<cutlass::multiplies, E, float, cutlass::FloatRoundStyle::round_to_nearest>,
    cutlass::epilogue::fusion::Sm90ColBroadcast<0, Shape<_128, _192, _64>, float, float, Stride<_1, _0, int64_t>>,
    cutlass::epilogue::fusion::Sm90AccFetch>;
using InputGradGemm = BackwardKernel<Operand::E, RowMajor, RowScale, E>::Gemm;
using WeightGradGemm = BackwardKernel<Operand::ET, ColumnMajor,
                                      cutlass::epilogue::fusion::LinearCombination<float, float, void, float>, float>::Gemm;

// A backward GEMM's arguments but for its epilogue: D [m, n] = A [m, k] · B [k, n] in the
// kernel's layouts (packed), A scaled by the factors of `rows` rows of `vocab` classes, and the
// scheduler as the factor mainloop assumes it (rastered along n, no swizzle).
template <class Gemm>
typename Gemm::Arguments backward_args(int m, int n, int k, const void* a, const void* b, const void* fac, int rows,
                                       int vocab, int sm_count) {
  using K = typename Gemm::GemmKernel;
  using Mainloop = typename K::CollectiveMainloop;
  typename Gemm::Arguments args{};
  args.mode = cutlass::gemm::GemmUniversalMode::kGemm;
  args.problem_shape = {m, n, k, 1};
  typename Mainloop::Arguments& ml = args.mainloop;
  static_cast<typename Mainloop::BaseMainloop::Arguments&>(ml) = {
      static_cast<const E*>(a), cutlass::make_cute_packed_stride(typename K::StrideA{}, make_shape(m, k, 1)),
      static_cast<const E*>(b), cutlass::make_cute_packed_stride(typename K::StrideB{}, make_shape(n, k, 1))};
  ml.fac = static_cast<const uint16_t*>(fac);
  ml.fac_tiles = tiles(vocab);
  ml.fac_rows = fac_rows(rows);
  constexpr int kBlkN = decltype(size<1>(typename K::TileShape{}))::value;
  ml.tiles_n = (n + kBlkN - 1) / kBlkN;
  args.hw_info.sm_count = sm_count;
  using Options = cutlass::gemm::kernel::detail::PersistentTileSchedulerSm90Params::RasterOrderOptions;
  args.scheduler.raster_order = Options::AlongN;
  args.scheduler.max_swizzle_size = 1;
  return args;
}

// ---------------------------------------------------------------------------------------------
// The rows' pass: a block takes 32 rows. Its warps first split the tiles between them, a lane a row
// (the stats and the factors read and written along rows, as they lie), then take a row each in
// turn over its features.

constexpr int kRowsWarps = 8;

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__global__ void __launch_bounds__(32 * kRowsWarps) rows_kernel(Rows a) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
  const int first = blockIdx.x * 32;
  const int n_tiles = tiles(a.vocab), padded = fac_rows(a.rows);
  const float2* stats = static_cast<const float2*>(a.stats);
  uint16_t* fac = static_cast<uint16_t*>(a.fac);
  __shared__ float part[kRowsWarps][32], log2_sums[32], fs[32];

  const int row = first + lane;
  const bool real = row < a.rows;
  // K: the largest k of the row's tiles
  float k_max = -INFINITY;
  if (real) {
    for (int t = warp; t < n_tiles; t += kRowsWarps) k_max = fmaxf(k_max, stats[static_cast<int64_t>(t) * a.rows + row].x);
  }
  part[warp][lane] = k_max;
  __syncthreads();
  k_max = -INFINITY;
  for (int w = 0; w < kRowsWarps; ++w) k_max = fmaxf(k_max, part[w][lane]);
  __syncthreads();
  // Σ e 2^(k - K), and the factors 2^(k - K) (0 for the padding rows, whose A values are 0 too)
  float sum = 0.0f;
  if (real) {
    for (int t = warp; t < n_tiles; t += kRowsWarps) {
      const float2 st = stats[static_cast<int64_t>(t) * a.rows + row];
      const float scale = ldexpf(1.0f, static_cast<int>(st.x - k_max));
      sum += st.y * scale;
      fac[static_cast<int64_t>(t) * padded + row] = __bfloat16_as_ushort(__float2bfloat16_rn(scale));
    }
  } else if (row < padded) {
    for (int t = warp; t < n_tiles; t += kRowsWarps) fac[static_cast<int64_t>(t) * padded + row] = 0;
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
  }
  __syncthreads();

  // a warp a row: the loss, the target's e, xs = bf16(f · h)
  for (int j = warp; j < 32 && first + j < a.rows; j += kRowsWarps) {
    const int r = first + j;
    const float log2_sum = log2_sums[j], f = fs[j];
    const int64_t target = a.targets[r];
    const bool ignored = target == a.ignore_index || target < 0 || target >= a.vocab;
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
        // e - 2^(L - k) at the target: f · fac · that is inv_count · (p - 1)
        __nv_bfloat16* e = static_cast<__nv_bfloat16*>(a.e) + static_cast<int64_t>(r) * a.vocab + target;
        const float k = stats[(target / kTile) * a.rows + r].x;
        *e = __float2bfloat16_rn(__bfloat162float(*e) - exp2f(log2_sum - k));
      }
    }
  }
}

}  // namespace

const char* prepare() {
  const char* why = prepare_all<FwdGemm, InputGradGemm, WeightGradGemm>();
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
  using K = FwdGemm::GemmKernel;
  typename FwdGemm::Arguments args{};
  args.mode = cutlass::gemm::GemmUniversalMode::kGemm;
  args.problem_shape = {a.rows, a.vocab, a.c, 1};
  args.mainloop = {static_cast<const E*>(a.h), cutlass::make_cute_packed_stride(typename K::StrideA{}, make_shape(a.rows, a.c, 1)),
                   static_cast<const E*>(a.w), cutlass::make_cute_packed_stride(typename K::StrideB{}, make_shape(a.vocab, a.c, 1))};
  const auto sd = cutlass::make_cute_packed_stride(typename K::StrideD{}, make_shape(a.rows, a.vocab, 1));
  typename FwdEpilogue::Arguments& epi = args.epilogue;
  static_cast<typename FwdKernel::Epilogue::Arguments&>(epi) = {{}, nullptr, sd, static_cast<E*>(a.e), sd};
  epi.thread.alpha = 1.0f;
  epi.thread.beta = 0.0f;
  epi.stats = static_cast<float2*>(a.stats);
  epi.rows = a.rows;
  epi.vocab = a.vocab;
  args.hw_info.sm_count = sm_count;
  return run<FwdGemm>(args, stream);
}

cudaError_t rows_pass(const Rows& a, cudaStream_t stream) {
  const int blocks = fac_rows(a.rows) / 32;
  rows_kernel<<<blocks, 32 * kRowsWarps, 0, stream>>>(a);
  return cudaGetLastError();
}

cudaError_t input_grad(const InputGrad& a, int sm_count, cudaStream_t stream) {
  auto args = backward_args<InputGradGemm>(a.rows, a.c, a.vocab, a.e, a.w, a.fac, a.rows, a.vocab, sm_count);
  const auto sd = cutlass::make_cute_packed_stride(typename InputGradGemm::GemmKernel::StrideD{}, make_shape(a.rows, a.c, 1));
  args.epilogue = {{}, nullptr, sd, static_cast<E*>(a.dh), sd};
  args.epilogue.thread = {{a.f, 0.0f, {}}, {}, {}};
  return run<InputGradGemm>(args, stream);
}

cudaError_t weight_grad(const WeightGrad& a, int sm_count, cudaStream_t stream) {
  auto args = backward_args<WeightGradGemm>(a.vocab, a.c, a.rows, a.e, a.xs, a.fac, a.rows, a.vocab, sm_count);
  const auto sd = cutlass::make_cute_packed_stride(typename WeightGradGemm::GemmKernel::StrideD{}, make_shape(a.vocab, a.c, 1));
  args.epilogue = {{}, nullptr, sd, a.dw, sd};
  args.epilogue.thread.alpha = 1.0f;
  args.epilogue.thread.beta = 0.0f;
  return run<WeightGradGemm>(args, stream);
}

}  // namespace tcg::ce_head_gemm
