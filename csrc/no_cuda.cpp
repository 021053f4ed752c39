// The CUDA families of tcg.h for builds without CUDA (a CPU-only libtorch, or
// TCH_CUDA_GRAPHS_NO_CUDA=1 at build time): every entry point reports TCG_NO_CUDA, except the
// queries that have an honest answer (no device). error.cpp, optim.cpp and watch.cpp are
// built as usual, so the optimizers and the eager fallback keep working.
#include "embedding_own.h"
#include "gelu_own.h"
#include "gemm.h"
#include "kernels.h"
#include "linear_own.h"
#include "loss_own.h"
#include "mlp_own.h"
#include "norm_own.h"
#include "rotary_own.h"
#include "swiglu_own.h"
#include "optim_own.h"
#include "shim.h"

namespace {
tcg_status no_cuda() noexcept {
  return tcg::fail(TCG_NO_CUDA,
                   "tch-cuda-graphs was built without CUDA (a libtorch without CUDA, or "
                   "TCH_CUDA_GRAPHS_NO_CUDA set at build time): CUDA graphs are unavailable");
}
}  // namespace

namespace tcg::gemm {
// No cuBLASLt GEMM runs without CUDA: no shape has a choice made.
Shapes shapes() { return Shapes{0, 0, 0}; }
void forget() {}
std::vector<tcg_gemm_entry> export_choices() { return {}; }
tcg_gemm_identity identity() { throw tcg::exception(TCG_NO_CUDA, "gemm: no CUDA device, so no GEMM choices"); }
void import_choices(const tcg_gemm_entry*, int64_t) {
  throw tcg::exception(TCG_NO_CUDA, "gemm: no CUDA device to take GEMM choices");
}
}  // namespace tcg::gemm

extern "C" {

bool tcg_device_built_with_cuda(void) { return false; }
tcg_status tcg_device_count(int* out) {
  *out = 0;
  return TCG_OK;
}
tcg_status tcg_device_current(int*) { return no_cuda(); }
tcg_status tcg_device_synchronize(int) { return no_cuda(); }
tcg_status tcg_stream_from_pool(int, bool, tcg_stream*) { return no_cuda(); }
tcg_status tcg_stream_current(int, tcg_stream*) { return no_cuda(); }
tcg_status tcg_stream_default(int, tcg_stream*) { return no_cuda(); }
tcg_status tcg_stream_synchronize(tcg_stream) { return no_cuda(); }
tcg_status tcg_stream_wait_stream(tcg_stream, tcg_stream) { return no_cuda(); }
tcg_status tcg_stream_capture_status(tcg_stream, tcg_capture_status*) { return no_cuda(); }
tcg_status tcg_stream_guard_new(tcg_stream, tcg_stream_guard**) { return no_cuda(); }
void tcg_stream_guard_free(tcg_stream_guard*) {}
tcg_status tcg_event_new(int, tcg_event**) { return no_cuda(); }
void tcg_event_free(tcg_event*) {}
tcg_status tcg_event_record(tcg_event*, tcg_stream) { return no_cuda(); }
tcg_status tcg_stream_wait_event(tcg_stream, tcg_event*) { return no_cuda(); }
tcg_status tcg_event_synchronize(tcg_event*) { return no_cuda(); }

tcg_status tcg_graph_new(bool, tcg_graph**) { return no_cuda(); }
tcg_status tcg_graph_update_from(tcg_graph*, tcg_graph*, bool*, int*) { return no_cuda(); }
tcg_status tcg_cond_begin(tcg_cond_kind, tcg_tensor, tcg_pool_id, int64_t, tcg_tensor, tcg_tensor, tcg_cond**) {
  return no_cuda();
}
tcg_status tcg_cond_end(tcg_cond*) { return no_cuda(); }
void tcg_cond_free(tcg_cond*) {}
tcg_status tcg_graphed_new(tcg_graph*, tcg_graph*, tcg_tensor*, size_t, size_t, tcg_tensor*, size_t,
                           tcg_tensor*, tcg_tensor*, tcg_graphed**) {
  return no_cuda();
}
void tcg_graphed_free(tcg_graphed*) {}
tcg_status tcg_graphed_apply(tcg_graphed*, tcg_tensor*, size_t, tcg_tensor*, size_t) { return no_cuda(); }
void tcg_graph_free(tcg_graph*) {}
tcg_status tcg_graph_capture_begin(tcg_graph*, tcg_pool_id, tcg_capture_mode) { return no_cuda(); }
tcg_status tcg_graph_capture_end(tcg_graph*) { return no_cuda(); }
tcg_status tcg_graph_capture_abort(tcg_graph*, bool*) { return no_cuda(); }
tcg_status tcg_graph_instantiate(tcg_graph*) { return no_cuda(); }
tcg_status tcg_graph_replay(tcg_graph*) { return no_cuda(); }
tcg_status tcg_graph_upload(tcg_graph*) { return no_cuda(); }
tcg_status tcg_graph_reset(tcg_graph*) { return no_cuda(); }
tcg_status tcg_graph_pool(tcg_graph*, tcg_pool_id*) { return no_cuda(); }
tcg_status tcg_graph_debug_dump(tcg_graph*, const char*) { return no_cuda(); }
tcg_status tcg_graph_node_count(tcg_graph*, size_t*) { return no_cuda(); }
tcg_status tcg_graph_node_kinds(tcg_graph*, tcg_node_kinds*) { return no_cuda(); }

tcg_status tcg_pool_id_new(tcg_pool_id*) { return no_cuda(); }
tcg_status tcg_pool_hold_new(int, tcg_pool_id, tcg_pool_hold**) { return no_cuda(); }
void tcg_pool_hold_free(tcg_pool_hold*) {}
tcg_status tcg_pool_hold_id(tcg_pool_hold*, tcg_pool_id*, int*) { return no_cuda(); }
tcg_status tcg_pool_hold_use_count(tcg_pool_hold*, int*) { return no_cuda(); }
tcg_status tcg_memory_stats(int, tcg_mem_stats*) { return no_cuda(); }
tcg_status tcg_memory_reset_peak(int) { return no_cuda(); }
tcg_status tcg_pool_memory(int, tcg_pool_id, int64_t*, int64_t*) { return no_cuda(); }
tcg_status tcg_pool_blocks(int, tcg_pool_id, tcg_pool_block*, size_t, size_t*) { return no_cuda(); }
tcg_status tcg_memory_empty_cache(void) { return no_cuda(); }
tcg_status tcg_memory_host_empty_cache(void) { return no_cuda(); }

}  // extern "C"

// The own kernels need CUDA.
namespace tcg::kernels {
bool built() { return false; }
std::string unavailable(int) {
  throw tcg::exception(TCG_NO_CUDA, "tch-cuda-graphs was built without CUDA: no own kernels");
}
}  // namespace tcg::kernels

// optim.cpp runs ATen's fused kernels.
namespace tcg::optim {
bool adam(bool, const std::vector<at::Tensor>&, const std::vector<at::Tensor>&,
          const std::vector<at::Tensor>&, const std::vector<at::Tensor>&,
          const std::vector<at::Tensor>&, const std::vector<at::Tensor>&, const at::Tensor&,
          double, double, double, double, bool, bool, const std::optional<at::Tensor>&,
          const std::optional<at::Tensor>&, const at::Tensor&, const size_t*, const AdamExtras&,
          std::string* why) {
  *why = "this binary was built without CUDA";
  return false;
}
bool sgd(const std::vector<at::Tensor>&, const std::vector<at::Tensor>&,
         const std::vector<at::Tensor>&, double, double, const at::Tensor&, double, bool, bool,
         bool, const std::optional<at::Tensor>&, const std::optional<at::Tensor>&,
         std::string* why) {
  *why = "this binary was built without CUDA";
  return false;
}
at::Tensor clip_coef(const at::Tensor&, double) { return at::Tensor(); }
at::Tensor grad_norms(const std::vector<at::Tensor>&, double) { return at::Tensor(); }
bool lr_schedule(const at::Tensor&, const tcg_schedule&, const std::vector<at::Tensor>&, const double*) {
  return false;
}
}  // namespace tcg::optim

// The fused normalization kernels need CUDA: norm.cpp runs ATen's operators.
namespace tcg::norm {
std::string unsupported(const Inputs&, const Options&) { return "this binary was built without CUDA"; }
std::pair<at::Tensor, at::Tensor> fused(const Inputs&, const Options&) {
  throw tcg::exception(TCG_NO_CUDA, "tch-cuda-graphs was built without CUDA: no fused kernels");
}
}  // namespace tcg::norm

// The crate's linear path needs CUDA (cuBLASLt): linear.cpp runs ATen's at::linear.
namespace tcg::linear {
std::string unsupported(const Operands&) { return "this binary was built without CUDA"; }
at::Tensor fused(const Operands&, bool) {
  throw tcg::exception(TCG_NO_CUDA, "tch-cuda-graphs was built without CUDA: no cuBLASLt path");
}
std::string split_unsupported(const Operands&, int64_t) { return "this binary was built without CUDA"; }
std::vector<at::Tensor> fused_split(const Operands&, bool, int64_t) {
  throw tcg::exception(TCG_NO_CUDA, "tch-cuda-graphs was built without CUDA: no cuBLASLt path");
}
}  // namespace tcg::linear

// The MLPs' fused GEMMs need CUDA (cuBLASLt, CUTLASS): mlp.cpp runs ATen's linear, gelu (or silu
// and mul), linear.
namespace tcg::mlp {
std::string unsupported(const Operands&, bool) { return "this binary was built without CUDA"; }
at::Tensor gelu(const Operands&, bool, bool) {
  throw tcg::exception(TCG_NO_CUDA, "tch-cuda-graphs was built without CUDA: no cuBLASLt path");
}
std::string unsupported_swiglu(const Operands&) { return "this binary was built without CUDA"; }
at::Tensor swiglu(const Operands&, bool) {
  throw tcg::exception(TCG_NO_CUDA, "tch-cuda-graphs was built without CUDA: no cuBLASLt path");
}
}  // namespace tcg::mlp

// The fused cross-entropy needs CUDA: loss.cpp runs ATen's cross_entropy_loss.
namespace tcg::loss {
std::string unsupported(const at::Tensor&, const at::Tensor&) { return "this binary was built without CUDA"; }
at::Tensor cross_entropy(const at::Tensor&, const at::Tensor&, int64_t) {
  throw tcg::exception(TCG_NO_CUDA, "tch-cuda-graphs was built without CUDA: no fused kernels");
}
std::string linear_unsupported(const LinearOperands&) { return "this binary was built without CUDA"; }
std::string exp_in_head_unsupported(const LinearOperands&) { return "this binary was built without CUDA"; }
at::Tensor linear_cross_entropy(const LinearOperands&, int64_t, int64_t, bool, bool) {
  throw tcg::exception(TCG_NO_CUDA, "tch-cuda-graphs was built without CUDA: no fused kernels");
}
}  // namespace tcg::loss

// The rotary, embedding, SwiGLU and GELU kernels need CUDA: rotary.cpp, embedding.cpp, swiglu.cpp
// and gelu.cpp run ATen's compositions.
namespace tcg::rotary {
std::string unsupported(const Inputs&) { return "this binary was built without CUDA"; }
std::pair<at::Tensor, at::Tensor> fused(const Inputs&) {
  throw tcg::exception(TCG_NO_CUDA, "tch-cuda-graphs was built without CUDA: no fused kernels");
}
std::array<at::Tensor, 3> fused_qkv(const at::Tensor&, int64_t, int64_t, const Inputs&) {
  throw tcg::exception(TCG_NO_CUDA, "tch-cuda-graphs was built without CUDA: no fused kernels");
}
std::string project_unsupported(const Projection&, const Inputs&) { return "this binary was built without CUDA"; }
std::array<at::Tensor, 3> fused_project_qkv(const Projection&, bool, const Inputs&) {
  throw tcg::exception(TCG_NO_CUDA, "tch-cuda-graphs was built without CUDA: no fused kernels");
}
}  // namespace tcg::rotary
namespace tcg::embedding {
std::string unsupported(const at::Tensor&, const at::Tensor&) { return "this binary was built without CUDA"; }
std::pair<at::Tensor, at::Tensor> fused(const at::Tensor&, const at::Tensor&, int64_t, bool) {
  throw tcg::exception(TCG_NO_CUDA, "tch-cuda-graphs was built without CUDA: no fused kernels");
}
}  // namespace tcg::embedding
namespace tcg::swiglu {
std::string unsupported(const at::Tensor&) { return "this binary was built without CUDA"; }
at::Tensor fused(const at::Tensor&) {
  throw tcg::exception(TCG_NO_CUDA, "tch-cuda-graphs was built without CUDA: no fused kernels");
}
}  // namespace tcg::swiglu
namespace tcg::gelu {
std::string unsupported(const at::Tensor&, const at::Tensor&) { return "this binary was built without CUDA"; }
at::Tensor fused(const at::Tensor&, const at::Tensor&, bool) {
  throw tcg::exception(TCG_NO_CUDA, "tch-cuda-graphs was built without CUDA: no fused kernels");
}
}  // namespace tcg::gelu

bool tcg::capturing_on(const at::Tensor&) { return false; }
