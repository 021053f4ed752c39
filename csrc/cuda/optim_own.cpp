// The launcher of the crate's own optimizer kernels (optim_kernels.cu, loaded by own_kernels.cpp):
// builds the launch tables (optim_table.h) and launches on the current stream.
#include "../optim_own.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include <algorithm>

#include "cuda_shim.h"
#include "optim_table.h"
#include "scalar_params.h"
#include "../kernels.h"
#include "own_kernels.h"

namespace tcg::optim {
namespace {

// Why the own kernels cannot take these lists (list 0: the parameters), or "".
std::string check_lists(const std::vector<std::pair<const char*, const std::vector<at::Tensor>*>>& lists) {
  const auto& params = *lists[0].second;
  if (params.empty()) return "no parameters";
  const auto& p0 = params[0];
  if (!p0.is_cuda()) return "the parameters are not on a CUDA device";
  if (!own::optim_builds(p0.scalar_type())) {
    return std::string("dtype ") + c10::toString(p0.scalar_type()) + " (own kernels: float32, float64, float16, bfloat16)";
  }
  for (const auto& [what, list] : lists) {
    if (list->size() != params.size()) return std::string(what) + ": list length differs";
    for (size_t k = 0; k < params.size(); ++k) {
      const auto& t = (*list)[k];
      const auto where = std::string(what) + " #" + std::to_string(k);
      if (!t.defined()) return where + " is undefined";
      if (t.device() != p0.device()) return where + " is on another device";
      if (t.scalar_type() != p0.scalar_type()) return where + " has another dtype than the first parameter";
      if (!t.is_contiguous()) return where + " is not contiguous";
      if (t.numel() != params[k].numel()) return where + " has another size than its parameter";
    }
  }
  return "";
}

std::string check_scalar(const char* what, const at::Tensor& t, const at::Device& device) {
  if (!t.defined() || t.device() != device || t.scalar_type() != at::kFloat || t.numel() != 1) {
    return std::string(what) + " must be one float32 value on the parameters' device";
  }
  return "";
}

// Why the own Adam cannot store these shadows (none, or one per parameter: undefined, or a
// contiguous float16/bfloat16 tensor of its float32 parameter's size on its device, all of one
// dtype), or "".
std::string check_shadows(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& shadows) {
  if (shadows.empty()) return "";
  if (shadows.size() != params.size()) return "one shadow (or none) per parameter needed";
  std::optional<at::ScalarType> dtype;
  for (size_t k = 0; k < params.size(); ++k) {
    const auto& s = shadows[k];
    if (!s.defined()) continue;
    const auto where = "the shadow of param #" + std::to_string(k);
    if (params[k].scalar_type() != at::kFloat) return where + ": the parameter is not float32";
    if (s.scalar_type() != at::kHalf && s.scalar_type() != at::kBFloat16) return where + " is not 16-bit";
    if (dtype && *dtype != s.scalar_type()) return where + " has another dtype than the others";
    dtype = s.scalar_type();
    if (s.device() != params[k].device() || !s.is_contiguous() || s.numel() != params[k].numel()) {
      return where + " is not a contiguous tensor of its size on its device";
    }
  }
  return "";
}

const float* opt_ptr(const std::optional<at::Tensor>& t) {
  return t.has_value() ? t->data_ptr<float>() : nullptr;
}

// The checks both algorithms make: the lists, the device, the scalars. Returns why not, or "".
std::string check_common(
    const std::vector<std::pair<const char*, const std::vector<at::Tensor>*>>& lists,
    const at::Tensor& lr, const std::optional<at::Tensor>& grad_scale,
    const std::optional<at::Tensor>& found_inf) {
  auto why = check_lists(lists);
  if (!why.empty()) return why;
  const auto device = (*lists[0].second)[0].device();
  why = kernels::unavailable(device.index());
  if (why.empty()) why = check_scalar("lr", lr, device);
  if (why.empty() && grad_scale) why = check_scalar("grad_scale", *grad_scale, device);
  if (why.empty() && found_inf) why = check_scalar("found_inf", *found_inf, device);
  return why;
}

// A table with the scalars both algorithms read set, and the lists' rows for `launch` (padded to
// `depth` with the parameters: the kernels read only the rows their algorithm has).
template <int depth>
Table<depth> table(const at::Tensor& lr, const std::optional<at::Tensor>& grad_scale,
                   const std::optional<at::Tensor>& found_inf, bool maximize) {
  Table<depth> t{};
  t.lr = lr.data_ptr<float>();
  t.grad_scale = opt_ptr(grad_scale);
  t.found_inf = opt_ptr(found_inf);
  t.maximize = maximize ? 1 : 0;
  return t;
}

std::vector<const std::vector<at::Tensor>*> rows(
    const std::vector<std::pair<const char*, const std::vector<at::Tensor>*>>& lists, size_t depth) {
  std::vector<const std::vector<at::Tensor>*> out;
  for (const auto& [what, list] : lists) out.push_back(list);
  while (out.size() < depth) out.push_back(lists[0].second);
  return out;
}

// Launches `name` over the tensors of `lists` (depth of them), kMaxTensors per launch, with the
// scalars of `proto`; Adam also passes its step counts and arrival counters.
template <int depth>
void launch(const std::string& name, const std::vector<const std::vector<at::Tensor>*>& lists,
            const Table<depth>& proto, const std::vector<at::Tensor>* steps,
            const at::Tensor* arrivals, const size_t* slots,
            const std::vector<at::Tensor>* shadows = nullptr) {
  const auto& params = *lists[0];
  const auto device = params[0].device().index();
  cudaKernel_t k = own::kernel(name.c_str(), static_cast<int>(device));
  int64_t total = 0;
  for (const auto& p : params) total += p.numel();
  // Chunks small enough that the launch has about 8 blocks per SM, in whole block iterations,
  // and at most 16 of them: with more blocks in more waves the last wave's idle SMs cost less
  // (AdamW over the 124 M Llama's 75 tensors on an H200, alone: 956 µs in chunks of 16 iterations,
  // 980 in 64, 1128 in 128).
  const int64_t per_iter = static_cast<int64_t>(kBlockThreads) * kIlp;
  const int64_t sms = own::sm_count(static_cast<int>(device));
  const int64_t target = (total + sms * 8 - 1) / (sms * 8);
  const int64_t chunk = std::clamp((target + per_iter - 1) / per_iter, int64_t{1}, int64_t{16}) * per_iter;
  auto* counters = arrivals == nullptr ? nullptr : reinterpret_cast<unsigned int*>(arrivals->data_ptr<int32_t>());
  size_t i = 0;
  while (i < params.size()) {
    Table<depth> t = proto;
    t.chunk = chunk;
    int64_t blocks = 0;
    int nt = 0;
    for (; i < params.size() && nt < kMaxTensors; ++i, ++nt) {
      const int64_t numel = params[i].numel();
      for (int d = 0; d < depth; ++d) t.ptr[d][nt] = (*lists[d])[i].data_ptr();
      t.numel[nt] = numel;
      // An empty tensor still gets a block: Adam's block writes its step count.
      blocks += std::max<int64_t>(1, (numel + chunk - 1) / chunk);
      t.chunk_end[nt] = static_cast<int32_t>(blocks);
      if (steps != nullptr) {
        t.step[nt] = (*steps)[i].data_ptr<float>();
        t.arrivals[nt] = counters + slots[i];
      }
      if (shadows != nullptr && !shadows->empty() && (*shadows)[i].defined()) {
        t.shadow[nt] = (*shadows)[i].data_ptr();
        t.shadow_is_half = (*shadows)[i].scalar_type() == at::kHalf ? 1 : 0;
      }
    }
    t.n_tensors = nt;
    void* args[] = {&t};
    own::launch_kernel(k, device, dim3(static_cast<unsigned>(blocks)), dim3(kBlockThreads), args, name.c_str());
  }
}

}  // namespace

bool adam(bool adamw, const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads,
          const std::vector<at::Tensor>& exp_avgs, const std::vector<at::Tensor>& exp_avg_sqs,
          const std::vector<at::Tensor>& max_exp_avg_sqs, const std::vector<at::Tensor>& steps,
          const at::Tensor& lr, double beta1, double beta2, double weight_decay, double eps,
          bool amsgrad, bool maximize, const std::optional<at::Tensor>& grad_scale,
          const std::optional<at::Tensor>& found_inf, const at::Tensor& arrivals,
          const size_t* slots, const AdamExtras& extras, std::string* why) {
  std::vector<std::pair<const char*, const std::vector<at::Tensor>*>> lists = {
      {"param", &params}, {"grad", &grads}, {"exp_avg", &exp_avgs}, {"exp_avg_sq", &exp_avg_sqs}};
  if (amsgrad) lists.push_back({"max_exp_avg_sq", &max_exp_avg_sqs});
  *why = check_common(lists, lr, grad_scale, found_inf);
  if (!why->empty()) return false;
  const auto device = params[0].device();
  for (size_t k = 0; k < steps.size() && why->empty(); ++k) *why = check_scalar("a step count", steps[k], device);
  if (steps.size() != params.size()) *why = "one step count per parameter needed";
  if (why->empty() && (!arrivals.defined() || arrivals.device() != device ||
                       arrivals.scalar_type() != at::kInt)) {
    *why = "arrival counters must be int32 on the parameters' device";
  }
  for (size_t k = 0; k < params.size() && why->empty(); ++k) {
    if (slots[k] >= static_cast<size_t>(arrivals.numel())) *why = "arrival slot out of range";
  }
  if (why->empty() && extras.clip_coef) *why = check_scalar("the clipping factor", *extras.clip_coef, device);
  if (why->empty()) *why = check_shadows(params, extras.shadows);
  if (!why->empty()) return false;

  c10::cuda::CUDAGuard guard(device);
  auto t = table<5>(lr, grad_scale, found_inf, maximize);
  t.beta1 = beta1;
  t.beta2 = beta2;
  t.weight_decay = weight_decay;
  t.eps = eps;
  t.clip_coef = opt_ptr(extras.clip_coef);
  const std::string name = own::adam_kernel(params[0].scalar_type(), adamw, amsgrad);
  launch<5>(name, rows(lists, 5), t, &steps, &arrivals, slots, &extras.shadows);
  return true;
}

bool sgd(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads,
         const std::vector<at::Tensor>& bufs, double weight_decay, double momentum,
         const at::Tensor& lr, double dampening, bool nesterov, bool maximize, bool is_first_step,
         const std::optional<at::Tensor>& grad_scale, const std::optional<at::Tensor>& found_inf,
         std::string* why) {
  std::vector<std::pair<const char*, const std::vector<at::Tensor>*>> lists = {
      {"param", &params}, {"grad", &grads}};
  if (!bufs.empty()) lists.push_back({"momentum_buffer", &bufs});
  *why = check_common(lists, lr, grad_scale, found_inf);
  if (!why->empty()) return false;

  c10::cuda::CUDAGuard guard(params[0].device());
  auto t = table<3>(lr, grad_scale, found_inf, maximize);
  t.weight_decay = weight_decay;
  t.momentum = momentum;
  t.dampening = dampening;
  t.nesterov = nesterov ? 1 : 0;
  t.is_first_step = is_first_step ? 1 : 0;
  const bool with_momentum = !bufs.empty();
  const std::string name = own::sgd_kernel(params[0].scalar_type(), with_momentum);
  launch<3>(name, rows(lists, 3), t, nullptr, nullptr, nullptr);
  return true;
}

at::Tensor clip_coef(const at::Tensor& total, double max_norm) {
  if (!total.is_cuda() || total.scalar_type() != at::kFloat || total.numel() != 1) return at::Tensor();
  const int device = total.get_device();
  if (!tcg::kernels::unavailable(device).empty()) return at::Tensor();
  at::Tensor coef = at::empty({}, total.options());
  ClipCoef p{total.data_ptr<float>(), coef.data_ptr<float>(), static_cast<float>(max_norm)};
  own::launch("tcg_clip_coef", device, 1, 32, &p);
  return coef;
}

at::Tensor grad_norms(const std::vector<at::Tensor>& grads, double norm_type) {
  if (norm_type != 2.0 || grads.empty() || !grads[0].defined() || !grads[0].is_cuda()) return at::Tensor();
  const auto device = grads[0].device();
  for (const auto& g : grads) {
    if (!g.defined() || g.device() != device || g.scalar_type() != at::kFloat || !g.is_contiguous()) {
      return at::Tensor();
    }
  }
  if (!tcg::kernels::unavailable(device.index()).empty()) return at::Tensor();
  c10::cuda::CUDAGuard guard(device);
  int64_t chunks = 0;
  for (const auto& g : grads) chunks += (g.numel() + kNormChunk - 1) / kNormChunk;
  at::Tensor partial = at::empty({std::max<int64_t>(chunks, 1)}, grads[0].options());
  at::Tensor norms = at::empty({static_cast<int64_t>(grads.size())}, grads[0].options());
  // kMaxTensors tensors a table; each table's chunks and norms follow the previous table's
  int64_t chunks_before = 0;
  size_t i = 0;
  while (i < grads.size()) {
    NormTable t{};
    t.partial = partial.data_ptr<float>() + chunks_before;
    t.norms = norms.data_ptr<float>() + i;
    int32_t blocks = 0;
    int nt = 0;
    for (; i < grads.size() && nt < kMaxTensors; ++i, ++nt) {
      t.ptr[nt] = grads[i].data_ptr<float>();
      t.numel[nt] = grads[i].numel();
      blocks += static_cast<int32_t>((t.numel[nt] + kNormChunk - 1) / kNormChunk);
      t.chunk_end[nt] = blocks;
    }
    t.n_tensors = nt;
    if (blocks > 0) own::launch("tcg_grad_norm_chunks", device.index(), dim3(blocks), kNormThreads, &t);
    own::launch("tcg_grad_norm_finish", device.index(), dim3(nt), kNormThreads, &t);
    chunks_before += blocks;
  }
  return norms;
}

bool lr_schedule(const at::Tensor& step, const tcg_schedule& schedule, const std::vector<at::Tensor>& lrs,
                 const double* bases) {
  if (!step.is_cuda() || step.scalar_type() != at::kDouble || step.numel() != 1) return false;
  if (lrs.empty() || lrs.size() > static_cast<size_t>(kMaxScheduleGroups)) return false;
  LrSchedule p{};
  for (size_t g = 0; g < lrs.size(); ++g) {
    if (!check_scalar("a learning rate", lrs[g], step.device()).empty()) return false;
    p.lr[g] = lrs[g].data_ptr<float>();
    p.base[g] = bases[g];
  }
  const int device = step.get_device();
  if (!tcg::kernels::unavailable(device).empty()) return false;
  p.step = step.data_ptr<double>();
  p.groups = static_cast<int32_t>(lrs.size());
  p.kind = static_cast<int32_t>(schedule.kind);
  p.warmup = schedule.warmup;
  p.total = schedule.total;
  p.min_factor = schedule.min_factor;
  p.step_size = schedule.step_size;
  p.gamma = schedule.gamma;
  own::launch("tcg_lr_schedule", device, 1, 32, &p);
  return true;
}

}  // namespace tcg::optim
