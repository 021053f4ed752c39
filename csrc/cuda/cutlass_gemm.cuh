// What the crate's CUTLASS GEMMs (gelu_gemm.cu, swiglu_gemm.cu, wgrad_gemm.cu, ce_head_gemm.cu,
// rotary_gemm.cu) share: the kernel type for sm_90 (TMA loads, a warp-specialized mainloop, one
// CTA per cluster, bf16 operands, float32 accumulators, an epilogue visitor tree writing bf16 D),
// the arguments of a GEMM without C, its launch, and an epilogue that edits the accumulators
// before it stores them. Included by nvcc-compiled sources only (CUTLASS's headers).
#pragma once
#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/epilogue/fusion/operations.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/gemm/kernel/gemm_universal.hpp>
#include <cutlass/util/packed_stride.hpp>

#include <cstdint>
#include <type_traits>

namespace tcg::cutlass_gemm {

using namespace cute;
using E = cutlass::bfloat16_t;
using RowMajor = cutlass::layout::RowMajor;
using ColumnMajor = cutlass::layout::ColumnMajor;

// The warp-specialized schedules: two consumer warp groups on one tile (cooperative), or each on
// a tile of its own, one's epilogue running beside the other's mainloop (ping-pong).
struct Cooperative {
  using Mainloop = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
  using Epilogue = cutlass::epilogue::TmaWarpSpecializedCooperative;
};
struct Pingpong {
  using Mainloop = cutlass::gemm::KernelTmaWarpSpecializedPingpong;
  using Epilogue = cutlass::epilogue::TmaWarpSpecialized;
};

// A GEMM kernel: its mainloop (bf16 A and B in the layouts given, float32 accumulators) and the
// epilogue `Fusion` writing D (bf16 unless `ED` says otherwise) in layout LD, for a tile shape and
// schedule, one CTA per cluster.
template <class Tile, class LA, class LB, class LD, class Fusion, class Schedule = Cooperative, class ED = E>
struct Kernel {
  static constexpr int kAlignD = 16 / static_cast<int>(sizeof(ED));
  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Tile, Shape<_1, _1, _1>,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, LD, kAlignD, ED, LD, kAlignD,
      typename Schedule::Epilogue, Fusion>::CollectiveOp;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, E, LA, 8, E, LB, 8, float, Tile, Shape<_1, _1, _1>,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
      typename Schedule::Mainloop>::CollectiveOp;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<
      cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Mainloop, Epilogue, cutlass::gemm::PersistentScheduler>>;
};

template <class Gemm>
using Args = typename Gemm::Arguments;

inline bool aligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// The arguments every one of these GEMMs takes: D [M, N] = A [M, K] · B [K, N] in Gemm's layouts
// (packed), no C, on `sm_count` SMs.
template <class Gemm>
Args<Gemm> gemm_args(int m, int n, int k, const void* a, const void* b, void* d, int sm_count) {
  using K = typename Gemm::GemmKernel;
  const auto sd = cutlass::make_cute_packed_stride(typename K::StrideD{}, make_shape(m, n, 1));
  Args<Gemm> args{cutlass::gemm::GemmUniversalMode::kGemm,
                  {m, n, k, 1},
                  {static_cast<const E*>(a), cutlass::make_cute_packed_stride(typename K::StrideA{}, make_shape(m, k, 1)),
                   static_cast<const E*>(b), cutlass::make_cute_packed_stride(typename K::StrideB{}, make_shape(n, k, 1))},
                  {{}, nullptr, sd, static_cast<typename K::CollectiveEpilogue::ElementD*>(d), sd}};
  args.hw_info.sm_count = sm_count;
  return args;
}

// Runs `args` on `stream` (none of these kernels takes a workspace).
template <class Gemm>
cudaError_t run(const Args<Gemm>& args, cudaStream_t stream) {
  Gemm gemm;
  if (gemm.can_implement(args) != cutlass::Status::kSuccess) return cudaErrorInvalidValue;
  if (gemm.initialize(args, nullptr, stream) != cutlass::Status::kSuccess) return cudaErrorInvalidValue;
  if (gemm.run(stream) != cutlass::Status::kSuccess) {
    const cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? cudaErrorLaunchFailure : e;
  }
  return cudaSuccess;
}

// Loads `Gemm`'s kernel (cudaFuncSetAttribute needs it) and sets its shared memory, as
// GemmUniversalAdapter::initialize does again at each call.
template <class Gemm>
cudaError_t prepare_one() {
  using K = typename Gemm::GemmKernel;
  return cudaFuncSetAttribute(cutlass::device_kernel<K>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              static_cast<int>(K::SharedStorageSize));
}

// An epilogue tree's store node: `Store` (CUTLASS's aux store node) stores what `Split` makes of
// its children's values, and the node passes on the rest: Split{}(stored, passed, inputs...) per
// element, in float32 (the GEMMs' epilogues that compute two results from one evaluation: GELU's
// value and derivative; SwiGLU's two gradients).
template <class Store, class Split>
struct SplitStore : Store {
  using Store::Store;

  template <class Callbacks>
  struct ConsumerStoreCallbacks : Callbacks {
    CUTLASS_DEVICE explicit ConsumerStoreCallbacks(Callbacks&& c) : Callbacks(cute::move(c)) {}

    template <typename ElementAccumulator, int FragmentSize, class... Inputs>
    CUTLASS_DEVICE auto visit(cutlass::Array<ElementAccumulator, FragmentSize> const& frg_acc, int epi_v, int epi_m,
                              int epi_n, Inputs const&... inputs) {
      cutlass::Array<float, FragmentSize> stored, passed;
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < FragmentSize; ++i) Split{}(stored[i], passed[i], float(inputs[i])...);
      Callbacks::visit(frg_acc, epi_v, epi_m, epi_n, stored);
      return passed;
    }
  };

  template <bool ReferenceSrc, class... Args>
  CUTLASS_DEVICE auto get_consumer_store_callbacks(cutlass::epilogue::fusion::ConsumerStoreArgs<Args...> const& args) {
    auto store = Store::template get_consumer_store_callbacks<ReferenceSrc>(args);
    return ConsumerStoreCallbacks<decltype(store)>(cute::move(store));
  }
};

// SplitStore over CUTLASS's aux store of `Element` (rounded to nearest, 16-byte vectors of 8
// values, no null pointer): the store node of every tree here that stores one result and passes
// another on.
template <class Element, class Split, int Stages, class EpilogueTile, class StrideMNL, class SmemLayoutAtom,
          class CopyOpR2S>
using SplitAuxStore =
    SplitStore<cutlass::epilogue::fusion::Sm90AuxStore<Stages, EpilogueTile, Element,
                                                       cutlass::FloatRoundStyle::round_to_nearest, StrideMNL,
                                                       SmemLayoutAtom, CopyOpR2S, 8, /*EnableNullptr=*/false>,
               Split>;

// CUTLASS's collective epilogue `Base` whose store first hands the tile's float32 accumulators
// to `Edit` to change in place: the GEMMs whose epilogue works on a tile's values together (a
// row's maximum and sum: ce_head_gemm.cu's exponentials; a pair of columns: rotary_gemm.cu's
// rotation). `Edit` is plain data carried in the epilogue's arguments and parameters, with
//   template <class Acc, class Mma, class TileShapeMNK>
//   CUTLASS_DEVICE void operator()(Acc& acc, Mma const& mma, TileShapeMNK tile, int thread_idx,
//                                  int m_tile, int n_tile) const;
// (the accumulators in wgmma's layout; mma.get_slice(thread_idx).partition_C of the tile's
// identity gives each one's coordinates).
template <class Base, class Edit>
struct EditingEpilogue : Base {
  using BaseArguments = typename Base::Arguments;
  struct Arguments : Base::Arguments {
    Edit edit;
  };
  struct Params : Base::Params {
    Edit edit;
  };

  template <class ProblemShape>
  static constexpr Params to_underlying_arguments(ProblemShape const& problem, Arguments const& args, void* workspace) {
    return Params{Base::to_underlying_arguments(problem, args, workspace), args.edit};
  }

  CUTLASS_HOST_DEVICE EditingEpilogue(Params const& params, typename Base::TensorStorage& storage)
      : Base(params, storage), edit_(params.edit) {}

  template <class ProblemShapeMNKL, class TileShapeMNK, class TileCoordMNKL, class AccEngine, class AccLayout,
            class TiledMma>
  CUTLASS_DEVICE auto store(typename Base::LoadPipeline load_pipeline,
                            typename Base::LoadPipelineState load_state, typename Base::StorePipeline store_pipeline,
                            typename Base::StorePipelineState store_state, ProblemShapeMNKL problem,
                            TileShapeMNK tile_shape, TileCoordMNKL tile_coord, cute::Tensor<AccEngine, AccLayout> acc,
                            TiledMma tiled_mma, int thread_idx, typename Base::TensorStorage& storage,
                            int subtile_idx = -1) {
    edit_(acc, tiled_mma, tile_shape, thread_idx, static_cast<int>(get<0>(tile_coord)),
          static_cast<int>(get<1>(tile_coord)));
    return Base::store(load_pipeline, load_state, store_pipeline, store_state, problem, tile_shape, tile_coord, acc,
                       tiled_mma, thread_idx, storage, subtile_idx);
  }

 private:
  Edit edit_;
};

// The arguments of a GEMM of `Gemm` (built on EditingEpilogue) without C: D [M, N] = A [M, K] ·
// B [K, N] in its layouts (packed), `edit` for its epilogue, on `sm_count` SMs.
template <class Gemm, class Edit>
Args<Gemm> editing_gemm_args(int m, int n, int k, const void* a, const void* b, void* d, Edit edit, int sm_count) {
  using K = typename Gemm::GemmKernel;
  Args<Gemm> args{};
  args.mode = cutlass::gemm::GemmUniversalMode::kGemm;
  args.problem_shape = {m, n, k, 1};
  args.mainloop = {static_cast<const E*>(a), cutlass::make_cute_packed_stride(typename K::StrideA{}, make_shape(m, k, 1)),
                   static_cast<const E*>(b), cutlass::make_cute_packed_stride(typename K::StrideB{}, make_shape(n, k, 1))};
  const auto sd = cutlass::make_cute_packed_stride(typename K::StrideD{}, make_shape(m, n, 1));
  auto& epi = args.epilogue;
  using BaseArguments = typename K::CollectiveEpilogue::BaseArguments;
  static_cast<BaseArguments&>(epi) = {{}, nullptr, sd, static_cast<typename K::CollectiveEpilogue::ElementD*>(d), sd};
  epi.thread.alpha = 1.0f;
  epi.thread.beta = 0.0f;
  epi.edit = edit;
  args.hw_info.sm_count = sm_count;
  return args;
}

// Prepares each of `Gemms` in turn: "" or the first one's error.
template <class... Gemms>
const char* prepare_all() {
  for (cudaError_t (*one)() : {prepare_one<Gemms>...}) {
    const cudaError_t e = one();
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      return cudaGetErrorString(e);
    }
  }
  return "";
}

}  // namespace tcg::cutlass_gemm
