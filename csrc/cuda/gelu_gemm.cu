// The GEMMs with GELU's exact form in their epilogues (gelu_gemm.h), as CUTLASS 3 kernels for
// sm_90: TMA loads, warp-specialized cooperative mainloops, and epilogue visitor trees that add
// the bias and apply the GELU forward, keeping GELU's derivative (not its input) for the backward,
// and multiply by that derivative and sum the bias gradient backward. Compiled by nvcc into an
// object of the shim (build.rs), not a fat binary of own kernels: CUTLASS's host code builds the
// kernels' parameters (TMA descriptors) and launches them through the CUDA runtime.
//
// Against cuBLASLt's GEMM and gelu_kernels.cu's separate bias + GELU kernels, on an H200 (bf16,
// a micro-benchmark of the kernels alone): at [12288, 768] → 3072 the forward takes 119.7 µs
// against 79.1 + 49.2, and the backward 109.5 µs (its bias gradient's row sums within each tile
// included) against 82.2 + 79.2 (GEMM, GELU backward and its bias sums). Keeping GELU's input
// instead, the backward evaluating the derivative there, they took 113.3 and 129.0 µs: the
// derivative costs the forward a few operations on the tail it has evaluated anyway, and spares
// the backward a whole evaluation. The tiles (256 × 128 forward, 128 × 256 backward, one CTA per
// cluster) were the fastest of the cooperative and ping-pong variants measured.
#include "gelu_gemm.h"

#include "cutlass_gemm.cuh"
#include "gelu_math.cuh"

namespace tcg::gelu_gemm {
namespace {

using namespace tcg::cutlass_gemm;

// The backward's activation: the float32 product times GELU's derivative as the forward kept it
// (float16, converted to float32 by the tree), applied to a fragment.
template <class T>
struct TimesKeptGrad {
  CUTLASS_DEVICE T operator()(T const& dh, T const& grad) const { return dh * grad; }
};
template <class T, int N>
struct TimesKeptGrad<cutlass::Array<T, N>> {
  template <class U>
  CUTLASS_DEVICE cutlass::Array<T, N> operator()(cutlass::Array<T, N> const& dh, cutlass::Array<U, N> const& grad) const {
    cutlass::Array<T, N> y;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < N; ++i) y[i] = dh[i] * T(grad[i]);
    return y;
  }
};

using F16 = cutlass::half_t;  // GELU's derivative as the forward keeps it

// The forward's epilogue at one element: GELU's derivative at z (stored) and GELU(z) (passed on)
// from one evaluation of the normal tail.
struct GeluKeepGradSplit {
  CUTLASS_DEVICE void operator()(float& grad, float& value, float z) const {
    const tcg::gelu::ValueAndGrad g = tcg::gelu::gelu_and_grad<true>(z);
    value = g.value;
    grad = g.grad;
  }
};

// Forward, D = h: z = x · wᵀ + bias in float32, h = gelu(z), and GELU's derivative at z kept
// (float16) for the backward, from one evaluation of the normal tail (gelu_math.cuh's
// gelu_and_grad): LinCombPerColBiasEltActAux's traits (the epilogue builder lays the kept
// tensor out by them), its tree's store node replaced (GeluKeepGrad's callbacks below).
struct GeluKeepGrad
    : cutlass::epilogue::fusion::LinCombPerColBiasEltActAux<RowMajor, cutlass::epilogue::thread::Identity, E, float, F16,
                                                            float, void> {};

// Backward, as the transposed problem dpreᵀ [H, M] = wᵀ [H, C] · dyᵀ [C, M]: column-major output
// is dpre row-major, and a per-row sum of it is dpre's per-column one (fc's bias gradient).
using BackwardTile = Shape<_128, _256, _64>;

// With the bias gradient: CUTLASS's LinCombDeEltActDePerRowBias (the kept derivative, staged
// through shared memory, times the float32 product; each tile's row sums in a fixed order), but
// with the tiles' sums written as partials, [ceil(M / 256), H] float32, for col_sum.cuh's kernel
// to add: CUTLASS's own final reduction (the last tile of each row adding every tile's sums, one
// dependent load after another) took about 30 µs at [12288, 3072]. A tag of its own (the
// operation's traits, for the epilogue builder), and its callbacks below.
struct GradBiasPartials
    : cutlass::epilogue::fusion::LinCombDeEltActDePerRowBias<ColumnMajor, TimesKeptGrad, E, float, F16, float, void> {};

}  // namespace
}  // namespace tcg::gelu_gemm

namespace cutlass::epilogue::fusion {

// The forward's store node: CUTLASS's aux store, fed z, storing GELU's derivative at z and passing
// GELU(z) on (one tail for both).
template <int Stages, class EpilogueTile, class StrideMNL, class SmemLayoutAtom, class CopyOpR2S>
using Sm90GeluKeepGradStore = tcg::cutlass_gemm::SplitAuxStore<half_t, tcg::gelu_gemm::GeluKeepGradSplit, Stages,
                                                                EpilogueTile, StrideMNL, SmemLayoutAtom, CopyOpR2S>;

// GeluKeepGrad's tree: h = identity(store(0 · C + (1 · acc + bias))), h rounded to bf16 by the
// identity.
template <int StagesC, int StagesD, class CtaTileShapeMNK, class EpilogueTile, class SmemLayoutAtom, class CopyOpR2S>
using GeluKeepGradEvt =
    Sm90EVT<Sm90Compute<epilogue::thread::Identity, bfloat16_t, float, FloatRoundStyle::round_to_nearest>,
            Sm90EVT<Sm90GeluKeepGradStore<StagesD, EpilogueTile, gemm::TagToStrideC_t<layout::RowMajor>, SmemLayoutAtom,
                                          CopyOpR2S>,
                    Sm90LinCombPerColBias<StagesC, CtaTileShapeMNK, EpilogueTile, float, float, float, void, float, 4,
                                          FloatRoundStyle::round_to_nearest>>>;

template <int StagesC, int StagesD, int FragmentSize, bool ReuseSmemC, bool DelayTmaStore, class CtaTileShapeMNK,
          class EpilogueTile, class SmemLayoutAtom, class CopyOpR2S>
struct FusionCallbacks<epilogue::Sm90TmaWarpSpecialized<StagesC, StagesD, FragmentSize, ReuseSmemC, DelayTmaStore>,
                       tcg::gelu_gemm::GeluKeepGrad, CtaTileShapeMNK, EpilogueTile, SmemLayoutAtom, CopyOpR2S>
    : GeluKeepGradEvt<StagesC, StagesD, CtaTileShapeMNK, EpilogueTile, SmemLayoutAtom, CopyOpR2S> {
  using Impl = GeluKeepGradEvt<StagesC, StagesD, CtaTileShapeMNK, EpilogueTile, SmemLayoutAtom, CopyOpR2S>;
  using Operation = tcg::gelu_gemm::GeluKeepGrad;

  struct Arguments {
    float const* bias_ptr = nullptr;  // [N] or null (no bias)
    half_t* grad_ptr = nullptr;       // GELU's derivative, in h's layout
    gemm::TagToStrideC_t<layout::RowMajor> dGrad = {};

    operator typename Impl::Arguments() const {
      using StrideScalar = cute::Stride<cute::_0, cute::_0, int64_t>;
      return {
          {    // store(0 · C + (1 · acc + bias))
           {   // 0 · C + (1 · acc + bias)
            {{0.0f}, {nullptr}, {StrideScalar{}}},
            {},
            {{{1.0f}, {nullptr}, {StrideScalar{}}}, {}, {bias_ptr, 0.0f, {}}, {}},
            {}},
           {grad_ptr, dGrad}},
          {}};
    }
  };

  using Impl::Impl;
};

// GradBiasPartials' tree: LinCombDeEltActDePerRowBias's, its row reduction not final.
template <int StagesC, class CtaTileShapeMNK, class EpilogueTile, class SmemLayoutAtom, class CopyOpS2R>
using GradBiasPartialsEvt =
    Sm90EVT<Sm90Compute<epilogue::thread::Identity, bfloat16_t, float, FloatRoundStyle::round_to_nearest>,
            Sm90EVT<Sm90ColReduction<plus, plus, plus, 0, CtaTileShapeMNK, float, float, FloatRoundStyle::round_to_nearest,
                                     cute::Stride<cute::_1, cute::_0, int64_t>, 4, true, /*FinalReduction=*/false>,
                    Sm90LinCombDeEltAct<CtaTileShapeMNK, EpilogueTile, StagesC, gemm::TagToStrideC_t<layout::ColumnMajor>,
                                        SmemLayoutAtom, CopyOpS2R, tcg::gelu_gemm::TimesKeptGrad, float, float, half_t,
                                        void, float, 8, FloatRoundStyle::round_to_nearest>>>;

template <int StagesC, int StagesD, int FragmentSize, bool ReuseSmemC, bool DelayTmaStore, class CtaTileShapeMNK,
          class EpilogueTile, class SmemLayoutAtom, class CopyOpS2R>
struct FusionCallbacks<epilogue::Sm90TmaWarpSpecialized<StagesC, StagesD, FragmentSize, ReuseSmemC, DelayTmaStore>,
                       tcg::gelu_gemm::GradBiasPartials, CtaTileShapeMNK, EpilogueTile, SmemLayoutAtom, CopyOpS2R>
    : GradBiasPartialsEvt<StagesC, CtaTileShapeMNK, EpilogueTile, SmemLayoutAtom, CopyOpS2R> {
  using Impl = GradBiasPartialsEvt<StagesC, CtaTileShapeMNK, EpilogueTile, SmemLayoutAtom, CopyOpS2R>;
  using Operation = tcg::gelu_gemm::GradBiasPartials;

  struct Arguments {
    half_t const* aux_ptr = nullptr;  // GELU's derivative, as dpre's layout
    gemm::TagToStrideC_t<layout::ColumnMajor> dAux = {};
    float* partials = nullptr;  // [ceil(N / tile N), M] of the transposed problem

    operator typename Impl::Arguments() const {
      using StrideScalar = cute::Stride<cute::_0, cute::_0, int64_t>;
      return {
          {    // reduce(activation(acc, aux))
           {   // activation(1 · acc + 0 · C, aux)
            {  // 0 · C + (1 · acc)
             {{0.0f}, {nullptr}, {StrideScalar{}}},
             {},
             {{{1.0f}, {nullptr}, {StrideScalar{}}}, {}, {}},
             {}},
            {aux_ptr, half_t(0), dAux},
            {}},
           {partials, 0.0f, {}}},
          {}};
    }
  };

  using Impl::Impl;
};

}  // namespace cutlass::epilogue::fusion

namespace tcg::gelu_gemm {
namespace {

using ForwardGemm = Kernel<Shape<_256, _128, _64>, RowMajor, ColumnMajor, RowMajor, GeluKeepGrad>::Gemm;
using BackwardBiasGemm = Kernel<BackwardTile, ColumnMajor, ColumnMajor, ColumnMajor, GradBiasPartials>::Gemm;
using BackwardGemm = Kernel<BackwardTile, ColumnMajor, ColumnMajor, ColumnMajor,
                            cutlass::epilogue::fusion::LinCombDeEltAct<ColumnMajor, TimesKeptGrad, E, float, F16, void>>::Gemm;

// Forward: A = x, B = w (w [N, K] row-major is B as K × N column-major), D = h; GELU's derivative
// written in D's layout.
Args<ForwardGemm> forward_args(const Forward& a, int sm_count) {
  Args<ForwardGemm> args = gemm_args<ForwardGemm>(a.m, a.n, a.k, a.x, a.w, a.h, sm_count);
  args.epilogue.thread.bias_ptr = a.bias;
  args.epilogue.thread.grad_ptr = static_cast<F16*>(a.grad);
  args.epilogue.thread.dGrad = args.epilogue.dD;
  return args;
}

// Backward, transposed: A = wᵀ (H × C), B = dyᵀ, D = dpreᵀ (H × M); GELU's derivative read in
// D's layout.
template <class Gemm>
Args<Gemm> backward_args(const Backward& a, int sm_count) {
  Args<Gemm> args = gemm_args<Gemm>(a.h, a.m, a.c, a.w, a.dy, a.dpre, sm_count);
  args.epilogue.thread.aux_ptr = static_cast<const F16*>(a.grad);
  args.epilogue.thread.dAux = args.epilogue.dD;
  if constexpr (std::is_same_v<Gemm, BackwardBiasGemm>) args.epilogue.thread.partials = a.partials;
  return args;
}

}  // namespace

const char* prepare() { return prepare_all<ForwardGemm, BackwardBiasGemm, BackwardGemm>(); }

const char* unsupported(const Forward& a) {
  if (a.m <= 0 || a.n <= 0 || a.k <= 0 || a.n % 8 != 0 || a.k % 8 != 0) return "sizes that are not multiples of 8";
  if (!aligned(a.x) || !aligned(a.w) || !aligned(a.grad) || !aligned(a.h) || (a.bias != nullptr && !aligned(a.bias))) {
    return "operands not 16-byte aligned";
  }
  return "";
}

const char* unsupported(const Backward& a) {
  if (a.m <= 0 || a.h <= 0 || a.c <= 0 || a.h % 8 != 0 || a.c % 8 != 0) return "sizes that are not multiples of 8";
  if (!aligned(a.dy) || !aligned(a.w) || !aligned(a.grad) || !aligned(a.dpre) ||
      (a.partials != nullptr && !aligned(a.partials))) {
    return "operands not 16-byte aligned";
  }
  return "";
}

int32_t backward_partial_rows(const Backward& a) { return (a.m + size<1>(BackwardTile{}) - 1) / size<1>(BackwardTile{}); }

cudaError_t forward(const Forward& a, int sm_count, cudaStream_t stream) {
  return run<ForwardGemm>(forward_args(a, sm_count), stream);
}

cudaError_t backward(const Backward& a, int sm_count, cudaStream_t stream) {
  if (a.partials != nullptr) return run<BackwardBiasGemm>(backward_args<BackwardBiasGemm>(a, sm_count), stream);
  return run<BackwardGemm>(backward_args<BackwardGemm>(a, sm_count), stream);
}

}  // namespace tcg::gelu_gemm
