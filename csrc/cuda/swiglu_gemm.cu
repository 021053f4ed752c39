// The GEMMs with SwiGLU in their epilogues (swiglu_gemm.h), CUTLASS 3 kernels for sm_90
// (cutlass_gemm.cuh's). The forward: the up half of w13's GEMM, whose epilogue loads gate (the
// gate half's GEMM wrote it) and writes up and h = silu(gate) · up; the separate path writes
// [gate | up] and reads it back in the SwiGLU forward kernel. The backward: w2's input-gradient
// GEMM, whose epilogue loads gate and up where they lie in the [gate | up] projection, applies
// SwiGLU's backward to the float32 product, and writes both gradients into [dgate | dup], D the
// first half and an aux store the second; the separate path writes dh (bf16) and reads it back
// with gate and up in the SwiGLU backward kernel.
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

// The forward's up half, as the row-major problem up [M, F] = x [M, C] · w_upᵀ (cuBLAS's NT
// layout: A row-major, B column-major), D row-major with a leading dimension of 2F. Its traits:
// one bf16 row-major aux tensor read (gate); its tree is SwigluFwdEvt below.
struct SwigluFwd
    : cutlass::epilogue::fusion::LinCombDeEltAct<RowMajor, cutlass::epilogue::thread::Identity, E, float, E, void> {};

// The forward's epilogue at one element: h (stored) from gate and the product rounded to bf16, as
// D stores it (the product passed on); the SwiGLU forward kernel's arithmetic on those values.
struct SwigluFwdSplit {
  CUTLASS_DEVICE void operator()(float& h, float& up, float acc, float gate) const {
    up = acc;
    h = tcg::swiglu::silu(gate) * float(cutlass::bfloat16_t(acc));
  }
};

// T, once per value of a pack expanded over it (the trees' aux loads).
template <int, class T>
struct Each {
  using type = T;
};

}  // namespace
}  // namespace tcg::swiglu_gemm

namespace cutlass::epilogue::fusion {

// Both trees: D (bf16) = store(acc, loads...), the store node SplitAuxStore with `Split` (the
// result it stores, the other passed on to D), every tensor bf16 in the layout `Stride`, one aux
// load per value of `Loads`, staged as C is.
template <class Split, class Stride, int StagesC, int StagesD, class EpilogueTile, class SmemLayoutAtom,
          class CopyOpS2R, int... Loads>
using SwigluEvt = Sm90EVT<
    Sm90Compute<epilogue::thread::Identity, bfloat16_t, float, FloatRoundStyle::round_to_nearest>,
    Sm90EVT<tcg::cutlass_gemm::SplitAuxStore<bfloat16_t, Split, StagesD, EpilogueTile, Stride, SmemLayoutAtom,
                                             decltype(collective::detail::sm90_get_smem_store_op_for_accumulator<
                                                      Stride, bfloat16_t, EpilogueTile>())>,
            Sm90AccFetch,
            typename tcg::swiglu_gemm::Each<Loads, Sm90AuxLoad<StagesC, EpilogueTile, bfloat16_t, Stride, SmemLayoutAtom, CopyOpS2R,
                                               8>>::type...>>;

using SwigluStride = gemm::TagToStrideC_t<layout::ColumnMajor>;

// SwigluGrad's tree: D = dgate = store_dup(acc, gate, up).
template <int StagesC, int StagesD, class EpilogueTile, class SmemLayoutAtom, class CopyOpS2R>
using SwigluGradEvt = SwigluEvt<tcg::swiglu_gemm::SwigluGradSplit, SwigluStride, StagesC, StagesD, EpilogueTile,
                                SmemLayoutAtom, CopyOpS2R, 0, 1>;

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

using SwigluRowStride = gemm::TagToStrideC_t<layout::RowMajor>;

// SwigluFwd's tree: D = up = store_h(acc, gate).
template <int StagesC, int StagesD, class EpilogueTile, class SmemLayoutAtom, class CopyOpS2R>
using SwigluFwdEvt = SwigluEvt<tcg::swiglu_gemm::SwigluFwdSplit, SwigluRowStride, StagesC, StagesD, EpilogueTile,
                               SmemLayoutAtom, CopyOpS2R, 0>;

template <int StagesC, int StagesD, int FragmentSize, bool ReuseSmemC, bool DelayTmaStore, class CtaTileShapeMNK,
          class EpilogueTile, class SmemLayoutAtom, class CopyOpS2R>
struct FusionCallbacks<epilogue::Sm90TmaWarpSpecialized<StagesC, StagesD, FragmentSize, ReuseSmemC, DelayTmaStore>,
                       tcg::swiglu_gemm::SwigluFwd, CtaTileShapeMNK, EpilogueTile, SmemLayoutAtom, CopyOpS2R>
    : SwigluFwdEvt<StagesC, StagesD, EpilogueTile, SmemLayoutAtom, CopyOpS2R> {
  using Impl = SwigluFwdEvt<StagesC, StagesD, EpilogueTile, SmemLayoutAtom, CopyOpS2R>;
  using Operation = tcg::swiglu_gemm::SwigluFwd;

  struct Arguments {
    bfloat16_t const* gate = nullptr;  // [gate | up]'s first half (a leading dimension of 2F)
    SwigluRowStride gate_stride = {};
    bfloat16_t* h = nullptr;  // [M, F]
    SwigluRowStride h_stride = {};

    operator typename Impl::Arguments() const {
      return {{    // store_h(acc, gate)
               {}, // acc
               {gate, bfloat16_t(0), gate_stride},
               {h, h_stride}},
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

// The forward's up half: ping-pong on 128 × 128 tiles, as the backward's (its epilogue loads gate
// and stores up and h: as many bytes as the backward's).
using FwdGemm = Kernel<Tile, RowMajor, ColumnMajor, RowMajor, SwigluFwd, Pingpong>::Gemm;

// A = x (M × C, row-major), B = w_up (F × C, row-major: C × F column-major), D = ab's second half
// (M × F, leading dimension 2F); gate ab's first half, h packed [M, F].
Args<FwdGemm> forward_args(const Forward& a, int sm_count) {
  const int64_t f = a.f;
  Args<FwdGemm> args = gemm_args<FwdGemm>(a.m, a.f, a.c, a.x, a.w_up, static_cast<E*>(a.ab) + f, sm_count);
  get<0>(args.epilogue.dD) = 2 * f;
  args.epilogue.thread.gate = static_cast<const E*>(a.ab);
  args.epilogue.thread.gate_stride = args.epilogue.dD;
  args.epilogue.thread.h = static_cast<E*>(a.h);
  args.epilogue.thread.h_stride =
      cutlass::make_cute_packed_stride(cutlass::epilogue::fusion::SwigluRowStride{}, make_shape(a.m, a.f, 1));
  return args;
}

}  // namespace

const char* prepare() { return prepare_all<Gemm, FwdGemm>(); }

const char* unsupported(const Forward& a) {
  if (a.m <= 0 || a.f <= 0 || a.c <= 0 || a.f % 8 != 0 || a.c % 8 != 0) return "sizes that are not multiples of 8";
  if (!aligned(a.x) || !aligned(a.w_up) || !aligned(a.ab) || !aligned(a.h)) return "operands not 16-byte aligned";
  return "";
}

cudaError_t forward(const Forward& a, int sm_count, cudaStream_t stream) {
  return run<FwdGemm>(forward_args(a, sm_count), stream);
}

const char* unsupported(const Backward& a) {
  if (a.m <= 0 || a.f <= 0 || a.c <= 0 || a.f % 8 != 0 || a.c % 8 != 0) return "sizes that are not multiples of 8";
  if (!aligned(a.dy) || !aligned(a.w) || !aligned(a.ab) || !aligned(a.dab)) return "operands not 16-byte aligned";
  return "";
}

cudaError_t backward(const Backward& a, int sm_count, cudaStream_t stream) {
  return run<Gemm>(backward_args(a, sm_count), stream);
}

}  // namespace tcg::swiglu_gemm
