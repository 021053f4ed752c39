// The launcher of the crate's fused cross-entropy kernels (loss_kernels.cu, loaded by
// own_kernels.cpp) and the autograd function around them. Where the loss will be differentiated
// (grad mode on, logits that require grad), the forward counts the rows first and writes the
// gradient for a loss gradient of 1 as it reads each row, and saves only that gradient; the
// backward scales it in place where the loss's gradient is not 1 (a device check: a captured
// graph reads each replay's own) and hands it on, so a second backward through it is refused.
// Where no backward can come, the forward writes no gradient.
#include "../loss_own.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>

#include "../linear_own.h"
#include "ce_head_gemm.h"
#include "cuda_shim.h"
#include "loss_params.h"
#include "lt_matmul.h"
#include "../kernels.h"
#include "own_kernels.h"

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

namespace tcg::loss {
namespace {

// How the forward kernel runs over logits [rows, cols]: its name, whether it loads 4 values at a
// time (every row 16-byte aligned for them), and how the rows are spread: a warp per row for
// narrow rows (kWarpRowsPerBlock to a block), else a block per row of enough threads for one
// load each, a multiple of 32, at most kRowThreads, or kMaxThreads for rows so wide that the rows
// kRowThreads-thread blocks hold at once would not fit in three quarters of the L2 cache: the
// forward reads each row a second time, from the L2 cache, which must still hold it (GPT-2's
// [12288, 50304] bf16 logits: 4 blocks of 512 threads on each SM held 53 MB of rows on an H200,
// and 1.81 GB were read from memory for 1.24 GB of logits; at 1024 threads, half the rows in
// flight, 1.24 GB, and 827 µs against 910 in one run, where 1024 threads at the Llama's 32,000
// classes, whose rows fit, took 602 µs against 506).
struct Grid {
  std::string kernel;
  bool vec;
  unsigned blocks, threads;
  bool warp_rows;
};

Grid grid_for(const at::Tensor& logits) {
  const int64_t rows = logits.size(0), cols = logits.size(1);
  const int device = logits.get_device();
  Grid g{own::loss_kernel(own::Pass::Forward, logits.scalar_type()), cols % 4 == 0 && own::aligned16(logits), 0, 0,
         false};
  const int64_t items = g.vec ? (cols + 3) / 4 : cols;
  if (items <= kWarpRowItems) {
    g.blocks = static_cast<unsigned>((rows + kWarpRowsPerBlock - 1) / kWarpRowsPerBlock);
    g.threads = 32 * kWarpRowsPerBlock;
    g.warp_rows = true;
    return g;
  }
  const auto threads_for = [&](int64_t most) {
    return static_cast<unsigned>(std::clamp<int64_t>((items + 31) / 32 * 32, 32, most));
  };
  g.blocks = static_cast<unsigned>(rows);
  g.threads = threads_for(kRowThreads);
  const int64_t held =
      own::sm_count(device) * own::resident_blocks(g.kernel, device, g.threads) * cols * logits.element_size();
  const int64_t l2 = at::cuda::getDeviceProperties(static_cast<c10::DeviceIndex>(device))->l2CacheSize;
  if (4 * held > 3 * l2) g.threads = threads_for(kMaxThreads);
  return g;
}

// Scales a gradient the forward wrote for a loss gradient of 1 by the loss's gradient g (0-d
// float32, on the device), in place.
void scale_by(const at::Tensor& grad, const at::Tensor& g) {
  const int64_t n = grad.numel();
  const int64_t blocks = std::min<int64_t>((n + 4 * kScaleThreads - 1) / (4 * kScaleThreads), kScaleBlocks);
  Scale p{grad.data_ptr(), g.data_ptr<float>(), n};
  own::launch(own::loss_kernel(own::Pass::Backward, grad.scalar_type()), grad.get_device(), static_cast<unsigned>(blocks),
              kScaleThreads, &p);
}

// The targets, passed as a plain value: not an autograd input; and whether the forward writes
// the gradient.
struct Targets {
  at::Tensor t;
  int64_t ignore_index;
  bool write_grad;
};

struct FusedCrossEntropy : torch::autograd::Function<FusedCrossEntropy> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& logits, Targets targets) {
    const int device = logits.get_device();
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
    const int64_t rows = logits.size(0), cols = logits.size(1);
    const auto f32 = logits.options().dtype(at::kFloat);
    at::Tensor row_loss = at::empty({rows}, f32), loss = at::empty({}, f32);
    const Grid g = grid_for(logits);
    at::Tensor dlogits, inv_count;
    if (targets.write_grad) {
      dlogits = at::empty_like(logits);
      inv_count = at::empty({}, f32);
      Count c{targets.t.data_ptr<int64_t>(), inv_count.data_ptr<float>(), rows, targets.ignore_index};
      own::launch("tcg_ce_count", device, 1, kFinishThreads, &c);
    }
    Forward p{logits.data_ptr(), targets.t.data_ptr<int64_t>(), row_loss.data_ptr<float>(), rows, cols,
              targets.ignore_index, g.vec ? 1 : 0, g.warp_rows ? 1 : 0,
              dlogits.defined() ? inv_count.data_ptr<float>() : nullptr, dlogits.defined() ? dlogits.data_ptr() : nullptr};
    own::launch(g.kernel, device, g.blocks, g.threads, &p);
    Finish f{row_loss.data_ptr<float>(), targets.t.data_ptr<int64_t>(), loss.data_ptr<float>(), rows,
             targets.ignore_index};
    own::launch("tcg_ce_finish", device, 1, kFinishThreads, &f);
    ctx->saved_data["dlogits"] = dlogits;  // undefined where no backward can come
    return {loss};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    if (at::GradMode::is_enabled()) misuse("cross_entropy: double backward (create_graph) is not supported");
    at::Tensor g = grads.at(0);
    if (!g.defined()) return {at::Tensor(), at::Tensor()};
    c10::IValue& written = ctx->saved_data["dlogits"];
    at::Tensor dlogits = written.isTensor() ? written.toTensor() : at::Tensor();
    if (!dlogits.defined()) misuse("cross_entropy: a second backward through the fused loss is not supported");
    written = at::Tensor();  // handed on: a second backward would scale it twice
    c10::cuda::CUDAGuard guard(dlogits.device());
    scale_by(dlogits, g.to(at::kFloat).contiguous());
    return {dlogits, at::Tensor()};
  }
};

// The backward of the head and loss paths that make both gradients in the forward (for a loss
// gradient of 1, saved as "dh" and "dw" with h's sizes and both dtypes): scales them by the loss's
// gradient on the device and hands them on, once.
variable_list linear_backward(AutogradContext* ctx, variable_list grads) {
  if (at::GradMode::is_enabled()) misuse("linear_cross_entropy: double backward (create_graph) is not supported");
  at::Tensor g = grads.at(0);
  if (!g.defined()) return {at::Tensor(), at::Tensor(), at::Tensor()};
  c10::IValue &dh_slot = ctx->saved_data["dh"], &dw_slot = ctx->saved_data["dw"];
  if (!dh_slot.isTensor() || !dh_slot.toTensor().defined()) {
    misuse("linear_cross_entropy: a second backward through the fused loss is not supported");
  }
  at::Tensor dh = dh_slot.toTensor(), dw = dw_slot.toTensor();
  dh_slot = at::Tensor();  // handed on: a second backward would scale them twice
  dw_slot = at::Tensor();
  c10::cuda::CUDAGuard guard(dh.device());
  g = g.to(at::kFloat).contiguous();
  scale_by(dh, g);
  scale_by(dw, g);
  const auto dtype_of = [&](const char* key) { return static_cast<at::ScalarType>(ctx->saved_data.at(key).toInt()); };
  return {dh.view(ctx->saved_data.at("h_sizes").toIntVector()).to(dtype_of("h_dtype")), dw.to(dtype_of("w_dtype")),
          at::Tensor()};
}

// What linear_backward reads, saved by a forward (dh and dw undefined where no backward can come).
void save_for_linear_backward(AutogradContext* ctx, const at::Tensor& dh, const at::Tensor& dw, const at::Tensor& h,
                              const at::Tensor& weight) {
  ctx->saved_data["dh"] = dh;
  ctx->saved_data["dw"] = dw;
  ctx->saved_data["h_sizes"] = h.sizes().vec();
  ctx->saved_data["h_dtype"] = static_cast<int64_t>(h.scalar_type());
  ctx->saved_data["w_dtype"] = static_cast<int64_t>(weight.scalar_type());
}

// The chunked path's settings: not autograd inputs.
struct ChunkArgs {
  at::Tensor shadow_w, targets;
  int64_t ignore_index, chunk_rows;
  at::ScalarType dt;
  bool fp32_wgrad, write_grad;
};

// Rows of logits per chunk when the caller leaves it to the path: 256 MiB of them.
constexpr int64_t kAutoChunkBytes = int64_t{256} << 20;

struct LinearCrossEntropy : torch::autograd::Function<LinearCrossEntropy> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& h, const at::Tensor& weight, ChunkArgs a) {
    const int device = h.get_device();
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
    const int64_t c = weight.size(1), v = weight.size(0);
    const at::Tensor h2 = lt::in_dtype(h, at::Tensor(), a.dt).contiguous().view({-1, c});
    const at::Tensor w = lt::in_dtype(weight, a.shadow_w, a.dt).contiguous();
    const at::Tensor targets = a.targets.reshape({-1}).contiguous();
    const int64_t rows = h2.size(0);
    const int64_t per_chunk = a.chunk_rows > 0 ? a.chunk_rows : std::max<int64_t>(kAutoChunkBytes / (v * h2.element_size()), 1);
    const int64_t chunk = std::min(per_chunk, rows);
    const auto f32 = h2.options().dtype(at::kFloat);
    at::Tensor row_loss = at::empty({rows}, f32), loss = at::empty({}, f32), buf = at::empty({chunk, v}, h2.options());
    at::Tensor dh, dw, inv_count;
    if (a.write_grad) {
      dh = at::empty_like(h2);
      dw = at::empty({v, c}, h2.options().dtype(lt::weight_grad_type(a.fp32_wgrad, weight.scalar_type(), a.dt)));
      inv_count = at::empty({}, f32);
      Count n{targets.data_ptr<int64_t>(), inv_count.data_ptr<float>(), rows, a.ignore_index};
      own::launch("tcg_ce_count", device, 1, kFinishThreads, &n);
    }
    for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
      const int64_t rc = std::min(chunk, rows - r0);
      at::Tensor logits = buf.narrow(0, 0, rc);
      const at::Tensor hc = h2.narrow(0, r0, rc);
      lt::linear_into(hc, w, at::Tensor(), logits);
      const Grid g = grid_for(logits);
      // the gradient over the chunk's logits, in place (the kernel reads the target's logit first)
      Forward p{logits.data_ptr(), targets.data_ptr<int64_t>() + r0, row_loss.data_ptr<float>() + r0, rc, v,
                a.ignore_index, g.vec ? 1 : 0, g.warp_rows ? 1 : 0,
                a.write_grad ? inv_count.data_ptr<float>() : nullptr, a.write_grad ? logits.data_ptr() : nullptr};
      own::launch(g.kernel, device, g.blocks, g.threads, &p);
      if (a.write_grad) {
        at::Tensor dhc = dh.narrow(0, r0, rc);
        lt::input_grad_into(logits, w, dhc);
        lt::weight_grad_into(hc, logits, dw, r0 > 0);
      }
    }
    Finish f{row_loss.data_ptr<float>(), targets.data_ptr<int64_t>(), loss.data_ptr<float>(), rows, a.ignore_index};
    own::launch("tcg_ce_finish", device, 1, kFinishThreads, &f);
    save_for_linear_backward(ctx, dh, dw, h, weight);
    return {loss};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) { return linear_backward(ctx, grads); }
};

// The head and the loss with the exponentials in the head's GEMM (ce_head_gemm.h): the GEMM
// writes e and the tiles' stats, the rows' pass the loss, f and xs, and in grad mode the two
// backward GEMMs both gradients, for a loss gradient of 1 (linear_backward scales them). e
// (all [rows, classes] of it, bf16) lives through the forward only.
struct ExpInHeadCrossEntropy : torch::autograd::Function<ExpInHeadCrossEntropy> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& h, const at::Tensor& weight, ChunkArgs a) {
#ifdef TCG_CUTLASS_GEMMS
    namespace ce = tcg::ce_head_gemm;
    const int device = h.get_device();
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
    const int64_t c = weight.size(1), v = weight.size(0);
    at::Tensor h2 = lt::in_dtype(h, at::Tensor(), a.dt).contiguous().view({-1, c});
    at::Tensor w = lt::in_dtype(weight, a.shadow_w, a.dt).contiguous();
    // the GEMMs' operands 16-byte aligned (a view at an odd offset copied)
    const int32_t rows = static_cast<int32_t>(h2.size(0)), vocab = static_cast<int32_t>(v), cols = static_cast<int32_t>(c);
    if (*ce::unsupported(rows, vocab, cols, h2.data_ptr(), nullptr) != '\0') h2 = h2.clone();
    if (*ce::unsupported(rows, vocab, cols, nullptr, w.data_ptr()) != '\0') w = w.clone();
    const at::Tensor targets = a.targets.reshape({-1}).contiguous();
    const auto f32 = h2.options().dtype(at::kFloat);
    const int sm_count = static_cast<int>(own::sm_count(device));
    const cudaStream_t stream = at::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device)).stream();
    at::Tensor e = at::empty({rows, v}, h2.options()), stats = at::empty({ce::tiles(vocab), rows, 2}, f32);
    at::Tensor f = at::empty({rows}, f32);
    at::Tensor xs = at::empty_like(h2), row_loss = at::empty({rows}, f32), loss = at::empty({}, f32);
    at::Tensor inv_count = at::empty({}, f32);
    Count n{targets.data_ptr<int64_t>(), inv_count.data_ptr<float>(), rows, a.ignore_index};
    own::launch("tcg_ce_count", device, 1, kFinishThreads, &n);
    check_cuda(ce::forward(ce::Forward{h2.data_ptr(), w.data_ptr(), e.data_ptr(), stats.data_ptr(), rows, vocab, cols},
                           sm_count, stream),
               "linear_cross_entropy: the head's GEMM with the exponentials in its epilogue");
    check_cuda(ce::rows_pass(ce::Rows{stats.data_ptr(), targets.data_ptr<int64_t>(), a.ignore_index,
                                      inv_count.data_ptr<float>(), h2.data_ptr(), w.data_ptr(), e.data_ptr(),
                                      f.data_ptr<float>(), xs.data_ptr(), row_loss.data_ptr<float>(), rows, vocab,
                                      cols},
                             stream),
               "linear_cross_entropy: the rows' pass");
    at::Tensor dh, dw;
    if (a.write_grad) {
      dh = at::empty_like(h2);
      dw = at::empty({v, c}, h2.options().dtype(lt::weight_grad_type(a.fp32_wgrad, weight.scalar_type(), a.dt)));
      check_cuda(
          ce::input_grad(ce::InputGrad{e.data_ptr(), w.data_ptr(), f.data_ptr<float>(), dh.data_ptr(), rows, vocab, cols},
                         sm_count, stream),
          "linear_cross_entropy: the input gradient's GEMM");
      lt::weight_grad_into(xs, e, dw, false);  // eᵀ · xs
    }
    Finish fin{row_loss.data_ptr<float>(), targets.data_ptr<int64_t>(), loss.data_ptr<float>(), rows, a.ignore_index};
    own::launch("tcg_ce_finish", device, 1, kFinishThreads, &fin);
    save_for_linear_backward(ctx, dh, dw, h, weight);
    return {loss};
#else
    (void)ctx, (void)h, (void)weight, (void)a;
    misuse("linear_cross_entropy: built without CUTLASS's GEMMs");
#endif
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) { return linear_backward(ctx, grads); }
};

}  // namespace

std::string unsupported(const at::Tensor& logits, const at::Tensor& targets) {
  if (!logits.is_cuda()) return "the logits are not on a CUDA device";
  if (targets.device() != logits.device()) return "the targets are on another device";
  if (!own::loss_builds(logits.scalar_type())) return std::string("logits dtype ") + c10::toString(logits.scalar_type());
  if (!logits.is_contiguous() || !targets.is_contiguous()) return "the logits or targets are not contiguous";
  if (logits.size(0) == 0 || logits.size(1) == 0) return "no rows or no classes";
  if (logits.size(0) > INT32_MAX) return "more rows than a grid holds";
  if (logits.size(1) > (int64_t{1} << 30)) return "rows of more than 2^30 classes (the kernels index a row in 32 bits)";
  return kernels::unavailable(logits.get_device());
}

std::string linear_unsupported(const LinearOperands& in) {
  std::string why = linear::unsupported(linear::Operands{in.h, in.weight, {}, {}, {}});
  if (!why.empty()) return why;
  const at::ScalarType dt = lt::compute_dtype(in.h, in.weight);
  if (!own::loss_builds(dt)) return std::string("logits dtype ") + c10::toString(dt);
  if (in.targets.device() != in.h.device()) return "the targets are on another device";
  if (in.weight.size(0) > (int64_t{1} << 30)) return "more than 2^30 classes (the kernels index a row in 32 bits)";
  if (in.h.numel() / in.h.size(-1) > INT32_MAX) return "more rows than a grid holds";
  return kernels::unavailable(in.h.get_device());
}

std::string exp_in_head_unsupported(const LinearOperands& in) {
  const at::ScalarType dt = lt::compute_dtype(in.h, in.weight);
  if (dt != at::kBFloat16) return std::string("compute dtype ") + c10::toString(dt) + " (the GEMMs take bf16)";
  const int64_t rows = in.h.numel() / in.h.size(-1), v = in.weight.size(0), c = in.weight.size(1);
  if (rows > INT32_MAX || v * rows > (int64_t{1} << 40)) return "more rows or classes than the GEMMs index";
  const std::string why = own::cutlass_gemms_unavailable(in.h.get_device());
  if (!why.empty()) return why;
#ifdef TCG_CUTLASS_GEMMS
  // the sizes (the forward copies operands that are not 16-byte aligned)
  return tcg::ce_head_gemm::unsupported(static_cast<int32_t>(rows), static_cast<int32_t>(v), static_cast<int32_t>(c),
                                        nullptr, nullptr);
#else
  return why;
#endif
}

at::Tensor linear_cross_entropy(const LinearOperands& in, int64_t ignore_index, int64_t chunk_rows, bool fp32_wgrad,
                                bool exp_in_head) {
  const bool write_grad = at::GradMode::is_enabled() && (in.h.requires_grad() || in.weight.requires_grad());
  ChunkArgs a{in.shadow_w, in.targets, ignore_index, chunk_rows, lt::compute_dtype(in.h, in.weight), fp32_wgrad, write_grad};
  if (exp_in_head && exp_in_head_unsupported(in).empty()) {
    return ExpInHeadCrossEntropy::apply(in.h, in.weight, a)[0];
  }
  return LinearCrossEntropy::apply(in.h, in.weight, a)[0];
}

at::Tensor cross_entropy(const at::Tensor& logits, const at::Tensor& targets, int64_t ignore_index) {
  const bool write_grad = at::GradMode::is_enabled() && logits.requires_grad();
  return FusedCrossEntropy::apply(logits, Targets{targets, ignore_index, write_grad})[0];
}

}  // namespace tcg::loss
