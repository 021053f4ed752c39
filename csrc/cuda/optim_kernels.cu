// The crate's own fused optimizer kernels: Adam / AdamW (AMSGrad too) and SGD, over a table of
// tensors cut into small chunks (optim_table.h), one block per chunk, so any list of parameters
// spreads over every SM; and global-norm clipping's norms, its factor and a schedule's step.
// Compiled by nvcc into a fat binary that build.rs embeds in the shim; the launcher
// (optim_own.cpp) loads it with the CUDA runtime's library API and launches the extern "C"
// kernels by name.
//
// Numerics: Adam calls PyTorch's own `adam_math` from the 2.11 header
// `ATen/native/cuda/fused_adam_utils.cuh`, with the scalars computed as its
// `FusedAdamMathFunctor` computes them (a clipping factor, when given, multiplies each gradient
// first, as clipping's own `_foreach_mul_` would; a float32 parameter's 16-bit shadow, when
// given, gets the new value rounded as a cast rounds it); SGD's `sgd_math` below does the arithmetic of PyTorch
// 2.11's binary (float opmath, every multiply-add fused; see its comment). Each element's
// result depends only on its own values and those scalars, so the launch geometry does not
// change a bit. tests/gpu_optim.rs compares against `at::_fused_adam_` / `_fused_adamw_` /
// `_fused_sgd_` and states where the two differ (a compiler's rounding choices, not semantics).
#include <ATen/native/cuda/block_reduce.cuh>
#include <ATen/native/cuda/fused_adam_utils.cuh>

#include <type_traits>

#include "dependent_launch.cuh"
#include "optim_table.h"
#include "own_kernel_list.h"
#include "scalar_params.h"

namespace tcg::optim {
namespace {

using at::native::ADAM_MODE;

// The tensor that block `block` works on: the first i with block < chunk_end[i].
__device__ __forceinline__ int tensor_of(const int32_t* chunk_end, int n, int block) {
  int lo = 0, hi = n - 1;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (block < chunk_end[mid]) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  return lo;
}

// Where block `blockIdx.x`'s chunk of tensor `i` starts, in elements.
template <int table_depth>
__device__ __forceinline__ int64_t chunk_start(const Table<table_depth>& t, int i) {
  const int64_t first_block = i == 0 ? 0 : t.chunk_end[i - 1];
  return (blockIdx.x - first_block) * t.chunk;
}

// This block's chunk of tensor `i`: the first `depth` lists' pointers at its start, its length,
// and whether every one of them allows 4-element vector loads.
template <typename T, int depth, int table_depth>
__device__ __forceinline__ bool chunk_args(const Table<table_depth>& t, int i, T* args[depth],
                                           int64_t* len) {
  const int64_t start = chunk_start(t, i);
  *len = t.numel[i] - start < t.chunk ? t.numel[i] - start : t.chunk;
  bool aligned = true;
#pragma unroll
  for (int d = 0; d < depth; ++d) {
    args[d] = static_cast<T*>(t.ptr[d][i]) + start;
    aligned = aligned && reinterpret_cast<uint64_t>(args[d]) % (kIlp * sizeof(T)) == 0;
  }
  return aligned;
}

// Where an update also stores each new parameter value: nowhere (NoShadow), or a 16-bit shadow
// (ShadowOut: bfloat16 or float16, rounded to nearest even as ATen's cast rounds).
struct NoShadow {
  __device__ bool aligned() const { return true; }
  template <typename T>
  __device__ void vec(const T (&)[kIlp], int64_t) const {}
  template <typename T>
  __device__ void one(T, int64_t) const {}
};

template <typename S>
struct ShadowOut {
  S* out;  // at the chunk's start
  __device__ bool aligned() const { return reinterpret_cast<uint64_t>(out) % (kIlp * sizeof(S)) == 0; }
  __device__ void vec(const float (&p)[kIlp], int64_t v) const {
    S s[kIlp];
#pragma unroll
    for (int ii = 0; ii < kIlp; ++ii) s[ii] = static_cast<S>(p[ii]);
    at::native::load_store(out, s, v, 0);
  }
  __device__ void one(float p, int64_t e) const { out[e] = static_cast<S>(p); }
};

// Runs `math` over elements [begin, len) of the chunk, kIlp per thread and iteration, with
// bounds checks (the path for misaligned views and tails). Stores every list but the gradient,
// which is stored only when `store_grad` (it was unscaled).
template <typename T, int depth, class Math, class Out>
__device__ __forceinline__ void scalar_loop(T* args[depth], int64_t begin, int64_t len,
                                            bool store_grad, Math& math, const Out& out) {
  T r[depth][kIlp];
  for (int64_t base = begin; base < len; base += static_cast<int64_t>(blockDim.x) * kIlp) {
#pragma unroll
    for (int ii = 0; ii < kIlp; ++ii) {
      const int64_t e = base + threadIdx.x + static_cast<int64_t>(ii) * blockDim.x;
#pragma unroll
      for (int d = 0; d < depth; ++d) r[d][ii] = e < len ? args[d][e] : T(0);
    }
    math(r);
#pragma unroll
    for (int ii = 0; ii < kIlp; ++ii) {
      const int64_t e = base + threadIdx.x + static_cast<int64_t>(ii) * blockDim.x;
      if (e < len) {
#pragma unroll
        for (int d = 0; d < depth; ++d) {
          if (d != kGrad || store_grad) args[d][e] = r[d][ii];
        }
        out.one(r[kParam][ii], e);
      }
    }
  }
}

// Runs `math` over the whole chunk: one vector load and store per list and kIlp elements where
// all lists are aligned, then the tail (len % kIlp elements) element by element. `out` stores
// each new parameter value once more (a shadow), or nowhere.
template <typename T, int depth, class Math, class Out = NoShadow>
__device__ __forceinline__ void chunk_loop(T* args[depth], int64_t len, bool aligned,
                                           bool store_grad, Math& math, const Out& out = Out{}) {
  int64_t begin = 0;
  if (aligned && out.aligned()) {
    const int64_t nvec = len / kIlp;
    T r[depth][kIlp];
    for (int64_t v = threadIdx.x; v < nvec; v += blockDim.x) {
#pragma unroll
      for (int d = 0; d < depth; ++d) at::native::load_store(r[d], args[d], 0, v);
      math(r);
#pragma unroll
      for (int d = 0; d < depth; ++d) {
        if (d != kGrad || store_grad) at::native::load_store(args[d], r[d], v, 0);
      }
      out.vec(r[kParam], v);
    }
    begin = nvec * kIlp;
  }
  if (begin < len) scalar_loop<T, depth>(args, begin, len, store_grad, math, out);
}

template <typename T, ADAM_MODE mode, bool amsgrad>
__device__ __forceinline__ void adam(const Table<5>& t) {
  constexpr int depth = amsgrad ? 5 : 4;
  using opmath_t = at::opmath_type<T>;
  // A skipped step (the GradScaler found inf/NaN): nothing is written, the step counts included.
  if (t.found_inf != nullptr && *t.found_inf == 1) return;
  const int i = tensor_of(t.chunk_end, t.n_tensors, blockIdx.x);
  // PyTorch increments the step counts first (`_foreach_add_(steps, 1)`, in float32), then its
  // functor reads them: the same value here, written back once every block has read it.
  const float step = *t.step[i] + 1.0f;
  const auto lr = static_cast<opmath_t>(*t.lr);
  const auto beta1 = static_cast<opmath_t>(t.beta1);
  const auto beta2 = static_cast<opmath_t>(t.beta2);
  const auto weight_decay = static_cast<opmath_t>(t.weight_decay);
  const auto eps = static_cast<opmath_t>(t.eps);
  const bool maximize = t.maximize != 0;
  const auto step_count = static_cast<opmath_t>(step);
  const opmath_t bias_correction1 = 1 - at::native::pow_(beta1, step_count);
  const opmath_t bias_correction2 = 1 - at::native::pow_(beta2, step_count);
  const opmath_t bias_correction2_sqrt = std::sqrt(bias_correction2);

  // Clipping folded in: each gradient times the factor, rounded to its dtype, as the separate
  // `_foreach_mul_` computes it; the gradients in memory stay as they are.
  const bool clip = t.clip_coef != nullptr;
  const opmath_t coef = clip ? static_cast<opmath_t>(*t.clip_coef) : opmath_t(1);

  T* args[depth];
  int64_t len;
  const bool aligned = chunk_args<T, depth>(t, i, args, &len);
  auto math = [&](T (&r)[depth][kIlp]) {
    if (clip) {
#pragma unroll
      for (int ii = 0; ii < kIlp; ++ii) r[kGrad][ii] = static_cast<T>(static_cast<opmath_t>(r[kGrad][ii]) * coef);
    }
    at::native::adam_math<T, opmath_t, depth, mode, amsgrad>(
        r, lr, beta1, beta2, weight_decay, eps, maximize, t.grad_scale, t.found_inf,
        bias_correction1, bias_correction2_sqrt);
  };
  const bool store_grad = t.grad_scale != nullptr;
  bool done = false;
  if constexpr (std::is_same_v<T, float>) {
    if (t.shadow[i] != nullptr) {
      const int64_t start = chunk_start(t, i);
      if (t.shadow_is_half) {
        chunk_loop<T, depth>(args, len, aligned, store_grad, math, ShadowOut<at::Half>{static_cast<at::Half*>(t.shadow[i]) + start});
      } else {
        chunk_loop<T, depth>(args, len, aligned, store_grad, math,
                             ShadowOut<at::BFloat16>{static_cast<at::BFloat16*>(t.shadow[i]) + start});
      }
      done = true;
    }
  }
  if (!done) chunk_loop<T, depth>(args, len, aligned, store_grad, math);

  // The last block of this tensor to finish writes its step count and re-arms the counter. No
  // fence is needed before the count: every thread of every block has consumed the step count
  // it loaded (its updates depend on it) before the barrier, so that load has returned before
  // thread 0 counts, and the write of the last block to count cannot reach it.
  __syncthreads();
  if (threadIdx.x == 0) {
    const unsigned int chunks = t.chunk_end[i] - (i == 0 ? 0 : t.chunk_end[i - 1]);
    if (atomicAdd(t.arrivals[i], 1u) == chunks - 1) {
      *t.step[i] = step;
      *t.arrivals[i] = 0;
    }
  }
}

// PyTorch's SGD update of one thread's kIlp elements, in opmath (float for float32, float16 and
// bfloat16; double for float64) with the hyper-parameters converted to it, as PyTorch 2.11's
// binary computes (its SASS: F2F.F32.F64 of the hyper-parameters, FFMA/FMUL in float). Each
// multiply-add is fused explicitly, as in PyTorch's element-wise path; its vectorized path
// rounds some products first (the compiler's choice differs by element position), so there
// the two can differ by one rounding per step.
template <typename T, int depth>
__device__ __forceinline__ void sgd_math(T (&r)[depth][kIlp], double weight_decay,
                                         double momentum, float lr_f, double dampening,
                                         bool nesterov, bool maximize, bool is_first_step,
                                         const float* grad_scale) {
  using opmath_t = at::opmath_type<T>;
  const auto lr = static_cast<opmath_t>(lr_f);
  const auto wd = static_cast<opmath_t>(weight_decay);
  const auto mom = static_cast<opmath_t>(momentum);
  const auto damp1 = static_cast<opmath_t>(1 - dampening);
#pragma unroll
  for (int ii = 0; ii < kIlp; ++ii) {
    auto p = static_cast<opmath_t>(r[kParam][ii]);
    auto g = static_cast<opmath_t>(r[kGrad][ii]);
    if (grad_scale != nullptr) {
      g = g / static_cast<opmath_t>(*grad_scale);
      r[kGrad][ii] = g;
    }
    if (maximize) g = -g;
    if (weight_decay != 0) g = std::fma(p, wd, g);
    if constexpr (depth > 2) {
      const opmath_t buf = is_first_step
                               ? g
                               : std::fma(g, damp1, mom * static_cast<opmath_t>(r[kMomentumBuffer][ii]));
      r[kMomentumBuffer][ii] = buf;
      g = nesterov ? std::fma(buf, mom, g) : buf;
    }
    r[kParam][ii] = std::fma(g, -lr, p);
  }
}

template <typename T, int depth>
__device__ __forceinline__ void sgd(const Table<3>& t) {
  if (t.found_inf != nullptr && *t.found_inf == 1) return;
  const int i = tensor_of(t.chunk_end, t.n_tensors, blockIdx.x);
  const float lr = *t.lr;
  T* args[depth];
  int64_t len;
  const bool aligned = chunk_args<T, depth>(t, i, args, &len);
  auto math = [&](T (&r)[depth][kIlp]) {
    sgd_math<T, depth>(r, t.weight_decay, t.momentum, lr, t.dampening, t.nesterov != 0,
                       t.maximize != 0, t.is_first_step != 0, t.grad_scale);
  };
  chunk_loop<T, depth>(args, len, aligned, t.grad_scale != nullptr, math);
}

// Vectors of kIlp values a thread loads before it adds any of them, in the norms' chunks.
constexpr int kNormAhead = 4;

// One chunk's sum of squares, as ATen's `LpNormFunctor` (L2, float32) sums it: each thread's kIlp
// slots summed in the order of its steps, the slots added in turn, then the block's sum
// (block_reduce.cuh). The loads run kNormAhead vectors ahead of the adds; the order of the adds
// is ATen's, so the sum is its sum bit for bit.
__device__ __forceinline__ void norm_chunk(const NormTable& t) {
  const int i = tensor_of(t.chunk_end, t.n_tensors, blockIdx.x);
  const int64_t first_block = i == 0 ? 0 : t.chunk_end[i - 1];
  const int64_t start = (blockIdx.x - first_block) * kNormChunk;
  const float* x = t.ptr[i] + start;
  const int64_t n = t.numel[i] - start;
  __shared__ float s_vals[kNormThreads];
  float vals[kIlp] = {0.f, 0.f, 0.f, 0.f};
  if (n % kIlp == 0 && reinterpret_cast<uint64_t>(x) % (kIlp * sizeof(float)) == 0) {
    // ATen's vector path: thread t adds vectors t, t + blockDim.x, ... of the chunk
    const int64_t nvec = (n < kNormChunk ? n : kNormChunk) / kIlp;
    for (int64_t v0 = threadIdx.x; v0 < nvec; v0 += static_cast<int64_t>(blockDim.x) * kNormAhead) {
      float r[kNormAhead][kIlp];
#pragma unroll
      for (int a = 0; a < kNormAhead; ++a) {
        const int64_t v = v0 + static_cast<int64_t>(a) * blockDim.x;
        if (v < nvec) at::native::load_store(r[a], const_cast<float*>(x), 0, v);
      }
#pragma unroll
      for (int a = 0; a < kNormAhead; ++a) {
        if (v0 + static_cast<int64_t>(a) * blockDim.x < nvec) {
#pragma unroll
          for (int ii = 0; ii < kIlp; ++ii) {
            const float next = r[a][ii];
            vals[ii] += next * next;
          }
        }
      }
    }
  } else {
    // ATen's element path (a size not a multiple of kIlp, or a misaligned start)
    for (int64_t i_start = 0; i_start < n && i_start < kNormChunk; i_start += blockDim.x * kIlp) {
#pragma unroll
      for (int ii = 0; ii < kIlp; ++ii) {
        const int64_t e = i_start + threadIdx.x + ii * blockDim.x;
        if (e < n && e < kNormChunk) {
          const float next = x[e];
          vals[ii] += next * next;
        }
      }
    }
  }
  float val = 0.f;
#pragma unroll
  for (int ii = 0; ii < kIlp; ++ii) val += vals[ii];
  val = at::native::cuda_utils::BlockReduceSum(val, s_vals);
  if (threadIdx.x == 0) t.partial[blockIdx.x] = val;
}

// Tensor blockIdx.x's norm from its chunks' sums, as ATen's `lpnorm_cleanup` computes it: thread
// j adds sums j, j + blockDim.x, ... (ATen's zeros past a tensor's own chunks add nothing), the
// block's sum, its square root.
__device__ __forceinline__ void norm_finish(const NormTable& t) {
  __shared__ float s_vals[kNormThreads];
  const int i = blockIdx.x;
  const int32_t first = i == 0 ? 0 : t.chunk_end[i - 1];
  const int32_t chunks = t.chunk_end[i] - first;
  float val = 0.f;
  for (int32_t j = threadIdx.x; j < chunks; j += blockDim.x) val += t.partial[first + j];
  val = at::native::cuda_utils::BlockReduceSum(val, s_vals);
  if (threadIdx.x == 0) t.norms[i] = ::sqrt(val);
}

}  // namespace
}  // namespace tcg::optim

// The kernels of own_kernel_list.h's TCG_OPTIM_TYPES, on ATen's types (adam_math takes them).
#define TCG_ATEN_TYPE(NAME) TCG_ATEN_TYPE_##NAME
#define TCG_ATEN_TYPE_Float float
#define TCG_ATEN_TYPE_Double double
#define TCG_ATEN_TYPE_Half at::Half
#define TCG_ATEN_TYPE_BFloat16 at::BFloat16
#define TCG_ADAM_KERNEL(dtype, mode, mode_name, ams)                                              \
  extern "C" __global__ void __launch_bounds__(tcg::optim::kBlockThreads)                         \
      tcg_adam_##dtype##_##mode_name##_##ams(const __grid_constant__ tcg::optim::Table<5> t) { tcg::cuda::wait_prior();      \
    tcg::optim::adam<TCG_ATEN_TYPE(dtype), at::native::ADAM_MODE::mode, ams != 0>(t);             \
  }
#define TCG_SGD_KERNEL(dtype, depth)                                                              \
  extern "C" __global__ void __launch_bounds__(tcg::optim::kBlockThreads)                         \
      tcg_sgd_##dtype##_##depth(const __grid_constant__ tcg::optim::Table<3> t) { tcg::cuda::wait_prior();                  \
    tcg::optim::sgd<TCG_ATEN_TYPE(dtype), depth>(t);                                              \
  }
#define TCG_OPTIM_KERNELS(dtype)              \
  TCG_ADAM_KERNEL(dtype, ORIGINAL, adam, 0)   \
  TCG_ADAM_KERNEL(dtype, ORIGINAL, adam, 1)   \
  TCG_ADAM_KERNEL(dtype, ADAMW, adamw, 0)     \
  TCG_ADAM_KERNEL(dtype, ADAMW, adamw, 1)     \
  TCG_SGD_KERNEL(dtype, 2)                    \
  TCG_SGD_KERNEL(dtype, 3)
TCG_OPTIM_TYPES(TCG_OPTIM_KERNELS)

// The step's scalars (scalar_params.h): one thread each.
extern "C" __global__ void tcg_clip_coef(const tcg::optim::ClipCoef a) { tcg::cuda::wait_prior();
  if (threadIdx.x != 0) return;
  // ATen: total + 1e-6 (the scalar as float32), reciprocal (1 / x, correctly rounded), · max_norm,
  // clamp_max(1) keeping NaN
  const float c = __fmul_rn(__frcp_rn(__fadd_rn(*a.total, static_cast<float>(1e-6))), a.max_norm);
  *a.coef = isnan(c) ? c : fminf(c, 1.0f);
}

namespace {

// schedule.rs's `Schedule::factor` for step t (t >= 1), operation for operation.
__device__ double schedule_factor(const tcg::optim::LrSchedule& a, double t) {
  switch (a.kind) {
    case tcg::optim::kWarmupCosine: {
      const double w = a.warmup;
      if (w > 0 && t <= w) return __ddiv_rn(t, w);
      const double span = fmax(__dsub_rn(a.total, w), 1.0);
      const double p = fmin(fmax(__ddiv_rn(__dsub_rn(t, w), span), 0.0), 1.0);
      const double c = __dmul_rn(__dmul_rn(__dadd_rn(cos(__dmul_rn(p, 3.141592653589793)), 1.0), 0.5),
                                 __dsub_rn(1.0, a.min_factor));
      return __dadd_rn(c, a.min_factor);
    }
    case tcg::optim::kLinearWarmup:
      return a.warmup == 0 ? 1.0 : fmin(__ddiv_rn(t, a.warmup), 1.0);
    default: {  // kStepDecay: gamma^floor((t - 1) / step_size), the quotient in integers
      const uint64_t n = static_cast<uint64_t>(t), size = static_cast<uint64_t>(fmax(a.step_size, 1.0));
      const uint64_t k = n > 0 ? (n - 1) / size : 0;
      return pow(a.gamma, static_cast<double>(k));
    }
  }
}

}  // namespace

extern "C" __global__ void tcg_lr_schedule(const tcg::optim::LrSchedule a) { tcg::cuda::wait_prior();
  if (threadIdx.x != 0) return;
  const double t = __dadd_rn(*a.step, 1.0);
  *a.step = t;
  const double f = schedule_factor(a, t);
  for (int g = 0; g < a.groups; ++g) *a.lr[g] = __double2float_rn(__dmul_rn(a.base[g], f));
}

// The fat binary holds the conditional nodes' setter too.
#include "cond_kernels.cuh"

// Global-norm clipping's per-tensor norms (optim_table.h's NormTable): every chunk's sum of
// squares, one block each, then every tensor's norm, one block each.
extern "C" __global__ void __launch_bounds__(tcg::optim::kNormThreads)
    tcg_grad_norm_chunks(const __grid_constant__ tcg::optim::NormTable t) {
  tcg::cuda::wait_prior();
  tcg::optim::norm_chunk(t);
}
extern "C" __global__ void __launch_bounds__(tcg::optim::kNormThreads)
    tcg_grad_norm_finish(const __grid_constant__ tcg::optim::NormTable t) {
  tcg::cuda::wait_prior();
  tcg::optim::norm_finish(t);
}
