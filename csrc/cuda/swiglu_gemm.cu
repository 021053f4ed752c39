// The GEMM with SwiGLU's backward in its epilogue (swiglu_gemm.h), a CUTLASS 3 kernel for sm_90
// (cutlass_gemm.cuh's): w2's input-gradient GEMM, whose epilogue loads gate and up where they lie
// in the [gate | up] projection, applies SwiGLU's backward to the float32 product, and writes
// both gradients into [dgate | dup], D the first half and an aux store the second. The separate
// path writes dh (bf16) and reads it back with gate and up in the SwiGLU backward kernel.
#include "swiglu_gemm.h"

#include "cutlass_gemm.cuh"
#include "swiglu_math.cuh"

namespace tcg::swiglu_gemm {
namespace {

using namespace tcg::cutlass_gemm;

// As the transposed problem dhᵀ [F, M] = wᵀ [F, C] · dyᵀ [C, M], as gelu_gemm.cu's backward:
// column-major output with a leading dimension of 2F is [dgate | dup]'s first half row-major.
// Ping-pong on 128 × 128 tiles: each warp group's epilogue (two loads and two stores of its tile,
// as many bytes as the mainloop's) runs beside the other's mainloop. On an H200 at [12288, 768] →
// 2 × 2048 (the 124 M Llama's MLP) it took 83.6 µs, where cooperative kernels on 128 × 256,
// 256 × 128 and 128 × 128 tiles took 124.2, 139.2 and 99.4 µs, and cuBLAS's GEMM writing dh
// 57.8 µs before the SwiGLU backward kernel's 60 µs; at [16384, 384] → 2 × 1024, 48.4 µs against
// 26.3 µs + the kernel's. gate's and up's loads are staged through shared memory in as many
// stages as the builder gives C's (4): with fewer, CUTLASS's aux loads read the wrong stage.
using Tile = Shape<_128, _128, _64>;

// The operation's traits, for the epilogue builder (one bf16 column-major aux tensor read: the
// builder lays gate's and up's staging out by them); its tree is SwigluGradEvt below.
struct SwigluGrad
    : cutlass::epilogue::fusion::LinCombDeEltAct<ColumnMajor, cutlass::epilogue::thread::Identity, E, float, E, void> {
};

// The epilogue at one element: dup (stored) and dgate (passed on to D) from the product dh and
// gate and up.
struct SwigluGradSplit {
  CUTLASS_DEVICE void operator()(float& dup, float& dgate, float dh, float gate, float up) const {
    tcg::swiglu::grads(gate, up, dh, &dgate, &dup);
  }
};

}  // namespace
}  // namespace tcg::swiglu_gemm

namespace cutlass::epilogue::fusion {

// The tree's store node: CUTLASS's aux store, fed the float32 product dh and the bf16 gate and up,
// storing dup and passing dgate on to D.
template <int Stages, class EpilogueTile, class StrideMNL, class SmemLayoutAtom, class CopyOpR2S>
using Sm90SwigluGradStore =
    tcg::cutlass_gemm::SplitStore<Sm90AuxStore<Stages, EpilogueTile, bfloat16_t, FloatRoundStyle::round_to_nearest,
                                               StrideMNL, SmemLayoutAtom, CopyOpR2S, 8, /*EnableNullptr=*/false>,
                                  tcg::swiglu_gemm::SwigluGradSplit>;

using SwigluStride = gemm::TagToStrideC_t<layout::ColumnMajor>;

// SwigluGrad's tree: D = dgate (bf16) = store_dup(acc, gate, up).
template <int StagesC, int StagesD, class EpilogueTile, class SmemLayoutAtom, class CopyOpS2R>
using SwigluGradEvt = Sm90EVT<
    Sm90Compute<epilogue::thread::Identity, bfloat16_t, float, FloatRoundStyle::round_to_nearest>,
    Sm90EVT<Sm90SwigluGradStore<StagesD, EpilogueTile, SwigluStride, SmemLayoutAtom,
                                decltype(collective::detail::sm90_get_smem_store_op_for_accumulator<
                                         SwigluStride, bfloat16_t, EpilogueTile>())>,
            Sm90AccFetch, Sm90AuxLoad<StagesC, EpilogueTile, bfloat16_t, SwigluStride, SmemLayoutAtom, CopyOpS2R, 8>,
            Sm90AuxLoad<StagesC, EpilogueTile, bfloat16_t, SwigluStride, SmemLayoutAtom, CopyOpS2R, 8>>>;

template <int StagesC, int StagesD, int FragmentSize, bool ReuseSmemC, bool DelayTmaStore, class CtaTileShapeMNK,
          class EpilogueTile, class SmemLayoutAtom, class CopyOpS2R>
struct FusionCallbacks<epilogue::Sm90TmaWarpSpecialized<StagesC, StagesD, FragmentSize, ReuseSmemC, DelayTmaStore>,
                       tcg::swiglu_gemm::SwigluGrad, CtaTileShapeMNK, EpilogueTile, SmemLayoutAtom, CopyOpS2R>
    : SwigluGradEvt<StagesC, StagesD, EpilogueTile, SmemLayoutAtom, CopyOpS2R> {
  using Impl = SwigluGradEvt<StagesC, StagesD, EpilogueTile, SmemLayoutAtom, CopyOpS2R>;
  using Operation = tcg::swiglu_gemm::SwigluGrad;

  struct Arguments {
    bfloat16_t const* gate = nullptr;  // [gate | up]'s halves, in dh's layout (a leading dimension of 2F)
    bfloat16_t const* up = nullptr;
    bfloat16_t* dup = nullptr;  // [dgate | dup]'s second half, the same
    SwigluStride stride = {};

    operator typename Impl::Arguments() const {
      return {{    // store_dup(acc, gate, up)
               {}, // acc
               {gate, bfloat16_t(0), stride},
               {up, bfloat16_t(0), stride},
               {dup, stride}},
              {}};
    }
  };

  using Impl::Impl;
};

}  // namespace cutlass::epilogue::fusion

namespace tcg::swiglu_gemm {
namespace {

using Gemm = Kernel<Tile, ColumnMajor, ColumnMajor, ColumnMajor, SwigluGrad, Pingpong>::Gemm;

// A = wᵀ (F × C), B = dyᵀ, D = dgate's transpose (F × M, leading dimension 2F); gate, up and dup
// in D's layout.
Args<Gemm> backward_args(const Backward& a, int sm_count) {
  Args<Gemm> args = gemm_args<Gemm>(a.f, a.m, a.c, a.w, a.dy, a.dab, sm_count);
  get<1>(args.epilogue.dD) = 2 * static_cast<int64_t>(a.f);
  args.epilogue.thread.gate = static_cast<const E*>(a.ab);
  args.epilogue.thread.up = static_cast<const E*>(a.ab) + a.f;
  args.epilogue.thread.dup = static_cast<E*>(a.dab) + a.f;
  args.epilogue.thread.stride = args.epilogue.dD;
  return args;
}

}  // namespace

const char* prepare() { return prepare_all<Gemm>(); }

const char* unsupported(const Backward& a) {
  if (a.m <= 0 || a.f <= 0 || a.c <= 0 || a.f % 8 != 0 || a.c % 8 != 0) return "sizes that are not multiples of 8";
  if (!aligned(a.dy) || !aligned(a.w) || !aligned(a.ab) || !aligned(a.dab)) return "operands not 16-byte aligned";
  return "";
}

cudaError_t backward(const Backward& a, int sm_count, cudaStream_t stream) {
  return run<Gemm>(backward_args(a, sm_count), stream);
}

}  // namespace tcg::swiglu_gemm
