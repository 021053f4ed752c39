// One cuBLASLt GEMM with an epilogue (lt_matmul.h): the descriptors of a call, created and
// destroyed with it; the algorithm chosen once per GEMM shape (gemm.h: the heuristic's first, or
// the fastest of its candidates); the forward, input- and weight-gradient GEMMs the linear layers
// share.
#include "lt_matmul.h"

#include <ATen/cuda/CUDAContext.h>

#include <torch/headeronly/version.h>

#include <algorithm>
#include <cstdio>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <vector>

#include "../gemm.h"
#include "../kernels.h"
#include "cuda_shim.h"
#include "linear_params.h"
#include "own_kernels.h"
#include "wgrad_gemm.h"

namespace tcg::lt {
namespace {

cudaDataType_t cuda_type(at::ScalarType t) {
  switch (t) {
    case at::kBFloat16: return CUDA_R_16BF;
    case at::kHalf: return CUDA_R_16F;
    default: return CUDA_R_32F;
  }
}

void check_lt(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) {
    throw tcg::exception(TCG_ERROR, std::string("cuBLASLt ") + what + " failed with status " + std::to_string(static_cast<int>(s)));
  }
}

struct MatmulDesc {
  cublasLtMatmulDesc_t d = nullptr;
  MatmulDesc() { check_lt(cublasLtMatmulDescCreate(&d, CUBLAS_COMPUTE_32F, CUDA_R_32F), "matmul descriptor"); }
  ~MatmulDesc() { (void)cublasLtMatmulDescDestroy(d); }
  MatmulDesc(const MatmulDesc&) = delete;
  MatmulDesc& operator=(const MatmulDesc&) = delete;
  template <class T>
  void set(cublasLtMatmulDescAttributes_t a, const T& v) {
    check_lt(cublasLtMatmulDescSetAttribute(d, a, &v, sizeof(v)), "matmul attribute");
  }
};

struct Layout {
  cublasLtMatrixLayout_t l = nullptr;
  explicit Layout(const Matrix& m) {
    check_lt(cublasLtMatrixLayoutCreate(&l, cuda_type(m.type), static_cast<uint64_t>(m.rows),
                                        static_cast<uint64_t>(m.cols), m.ld),
             "matrix layout");
    if (m.batch > 1) {
      check_lt(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &m.batch, sizeof(m.batch)),
               "batch count");
      check_lt(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &m.batch_stride,
                                                sizeof(m.batch_stride)),
               "batch stride");
    }
  }
  ~Layout() { (void)cublasLtMatrixLayoutDestroy(l); }
  Layout(const Layout&) = delete;
  Layout& operator=(const Layout&) = delete;
};

struct Preference {
  cublasLtMatmulPreference_t p = nullptr;
  Preference() { check_lt(cublasLtMatmulPreferenceCreate(&p), "preference"); }
  ~Preference() { (void)cublasLtMatmulPreferenceDestroy(p); }
  Preference(const Preference&) = delete;
  Preference& operator=(const Preference&) = delete;
  template <class T>
  void set(cublasLtMatmulPreferenceAttributes_t a, const T& v) {
    check_lt(cublasLtMatmulPreferenceSetAttribute(p, a, &v, sizeof(v)), "preference attribute");
  }
};

// The largest power of two up to 256 that divides the address (what cuBLASLt may assume).
uint32_t alignment(const void* p) {
  uint32_t a = 256;
  while (a > 1 && reinterpret_cast<uintptr_t>(p) % a != 0) a /= 2;
  return a;
}

// The descriptor of a call: the operations, the epilogue and its pointers.
void describe(MatmulDesc& desc, const Matrix& a, const Matrix& b, const Epilogue& e) {
  desc.set(CUBLASLT_MATMUL_DESC_TRANSA, static_cast<int32_t>(a.transpose ? CUBLAS_OP_T : CUBLAS_OP_N));
  desc.set(CUBLASLT_MATMUL_DESC_TRANSB, static_cast<int32_t>(b.transpose ? CUBLAS_OP_T : CUBLAS_OP_N));
  if (e.kind == CUBLASLT_EPILOGUE_DEFAULT) return;
  desc.set(CUBLASLT_MATMUL_DESC_EPILOGUE, static_cast<uint32_t>(e.kind));
  if (e.bias != nullptr) {
    desc.set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, e.bias);
    desc.set(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, static_cast<int32_t>(cuda_type(e.bias_type)));
  }
  if (e.aux != nullptr) {
    desc.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, e.aux);
    desc.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, e.aux_ld);
  }
}

// One GEMM as cuBLASLt runs it: descriptors, operands, scale factors.
struct Call {
  cublasLtHandle_t handle;
  const MatmulDesc& desc;
  const Layout &la, &lb, &ld;
  const void *a, *b;
  void* d;
  float beta;
  cublasStatus_t run(const cublasLtMatmulAlgo_t& algo) const {
    const float alpha = 1.0f;
    return cublasLtMatmul(handle, desc.d, &alpha, a, la.l, b, lb.l, &beta, d, ld.l, d, ld.l, &algo,
                          at::cuda::getCUDABlasLtWorkspace(), at::cuda::getCUDABlasLtWorkspaceSize(),
                          at::cuda::getCurrentCUDAStream());
  }
};

// What makes two calls the same GEMM to cuBLASLt: device, operands' shapes, layouts, dtypes and
// alignments, the epilogue, beta.
using Key = std::vector<int64_t>;
Key key_of(const Matrix& a, const Matrix& b, const Matrix& d, const Epilogue& e, bool accumulate) {
  Key k{c10::cuda::current_device(), static_cast<int64_t>(e.kind), static_cast<int64_t>(e.bias_type),
        e.bias != nullptr, e.aux != nullptr, e.aux_ld, accumulate};
  for (const Matrix* m : {&a, &b, &d}) {
    k.insert(k.end(), {static_cast<int64_t>(m->type), m->rows, m->cols, m->ld, m->transpose, alignment(m->data),
                       m->batch, m->batch_stride});
  }
  return k;
}

// A shape's algorithm and how it was chosen.
struct Choice {
  cublasLtMatmulAlgo_t algo;
  bool timed;      // by timing (in this process, or in the one that wrote the file)
  bool from_file;  // read from a file of choices (gemm::import_choices)
};

// The choices made, and those read from a file and not yet met (checked on first use).
struct Cache {
  std::mutex mutex;
  std::map<Key, Choice> chosen, read;
};
Cache& cache() {
  static Cache* c = new Cache();  // leaked: no destruction order to get wrong at exit
  return *c;
}

// An event pair timing one call on the current stream, µs.
struct Timer {
  cudaEvent_t start = nullptr, stop = nullptr;
  Timer() {
    check_cuda(cudaEventCreateWithFlags(&start, cudaEventDefault), "cudaEventCreate");
    check_cuda(cudaEventCreateWithFlags(&stop, cudaEventDefault), "cudaEventCreate");
  }
  ~Timer() {
    (void)cudaEventDestroy(start);
    (void)cudaEventDestroy(stop);
  }
  Timer(const Timer&) = delete;
  Timer& operator=(const Timer&) = delete;
  float us(const Call& call, const cublasLtMatmulAlgo_t& algo) {
    cudaStream_t s = at::cuda::getCurrentCUDAStream();
    check_cuda(cudaEventRecord(start, s), "cudaEventRecord");
    const cublasStatus_t status = call.run(algo);
    check_cuda(cudaEventRecord(stop, s), "cudaEventRecord");
    check_cuda(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float ms = 0;
    check_cuda(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    return status == CUBLAS_STATUS_SUCCESS ? ms * 1000.0f : std::numeric_limits<float>::infinity();
  }
};

// `floats` float32 values of scratch on the current device (zeroed with `zero`).
at::Tensor scratch(int64_t floats, bool zero = false) {
  const auto opts = at::TensorOptions().device(at::kCUDA, c10::cuda::current_device()).dtype(at::kFloat);
  return zero ? at::zeros({floats}, opts) : at::empty({floats}, opts);
}

// The epilogue's outputs pointed at scratch (what timing may overwrite): the bias gradient of a
// *BGRAD* epilogue, GELU's input of a GELU_AUX* one. `keep` holds the scratch tensors.
Epilogue scratch_epilogue(const Epilogue& e, const Matrix& d, std::vector<at::Tensor>& keep) {
  Epilogue s = e;
  const bool writes_bias = e.kind == CUBLASLT_EPILOGUE_BGRADA || e.kind == CUBLASLT_EPILOGUE_BGRADB ||
                           e.kind == CUBLASLT_EPILOGUE_DGELU_BGRAD;
  const bool writes_aux = e.kind == CUBLASLT_EPILOGUE_GELU_AUX || e.kind == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
  if (writes_bias && e.bias != nullptr) s.bias = keep.emplace_back(scratch(std::max(d.rows, d.cols))).data_ptr();
  if (writes_aux && e.aux != nullptr) s.aux = keep.emplace_back(scratch(e.aux_ld * d.cols)).data_ptr();
  return s;
}

// Whether the current stream is capturing (no timing there: a capture records, runs nothing).
bool capturing() {
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  check_cuda(cudaStreamIsCapturing(at::cuda::getCurrentCUDAStream(), &st), "cudaStreamIsCapturing");
  return st != cudaStreamCaptureStatusNone;
}

// The fastest of `found` for this GEMM, each run into scratch outputs (one warm-up, then the
// median of five); the first unless another is 3% faster.
cublasLtMatmulAlgo_t fastest(const Matrix& a, const Matrix& b, const Matrix& d, const Epilogue& e, bool accumulate,
                             const std::vector<cublasLtMatmulHeuristicResult_t>& found) {
  std::vector<at::Tensor> keep;
  const Epilogue se = scratch_epilogue(e, d, keep);
  const int64_t d_elements = d.batch > 1 ? d.batch_stride * d.batch : d.ld * d.cols;
  const int64_t d_bytes = d_elements * static_cast<int64_t>(c10::elementSize(d.type));
  const at::Tensor scratch_d = scratch((d_bytes + 3) / 4, accumulate);
  MatmulDesc desc;
  describe(desc, a, b, se);
  const Layout la(a), lb(b), ld(d);
  const Call call{at::cuda::getCurrentCUDABlasLtHandle(), desc, la, lb, ld, a.data, b.data, scratch_d.data_ptr(),
                  accumulate ? 1.0f : 0.0f};
  Timer timer;
  size_t best = 0;
  float best_us = std::numeric_limits<float>::infinity(), first_us = best_us;
  for (size_t i = 0; i < found.size(); ++i) {
    (void)timer.us(call, found[i].algo);  // warm-up
    float t[5];
    for (float& x : t) x = timer.us(call, found[i].algo);
    std::sort(t, t + 5);
    if (i == 0) first_us = t[2];
    if (t[2] < best_us) {
      best_us = t[2];
      best = i;
    }
  }
  return best_us < 0.97f * first_us ? found[best].algo : found[0].algo;
}

// Whether cuBLASLt takes `algo` for this call's descriptors within the workspace (a choice read
// from a file: written by another process, perhaps for another library).
bool accepts(const MatmulDesc& desc, const Layout& la, const Layout& lb, const Layout& ld,
             const cublasLtMatmulAlgo_t& algo) {
  cublasLtMatmulHeuristicResult_t result{};
  return cublasLtMatmulAlgoCheck(at::cuda::getCurrentCUDABlasLtHandle(), desc.d, la.l, lb.l, ld.l, ld.l, &algo,
                                 &result) == CUBLAS_STATUS_SUCCESS &&
         result.workspaceSize <= at::cuda::getCUDABlasLtWorkspaceSize();
}

// How many of the heuristic's candidates GemmChoice::Timed times (32 found faster algorithms for
// GPT-2's and the 124 M Llama's shapes that the first 8 did not hold).
constexpr int kTimedCandidates = 32;

// The algorithm for this GEMM: the cache's, else chosen now (and kept), or false where the
// heuristic offers none.
bool algorithm(const Matrix& a, const Matrix& b, const Matrix& d, const Epilogue& e, bool accumulate,
               const MatmulDesc& desc, const Layout& la, const Layout& lb, const Layout& ld,
               cublasLtMatmulAlgo_t& out) {
  Cache& c = cache();
  const Key key = key_of(a, b, d, e, accumulate);
  std::optional<Choice> read;
  {
    std::lock_guard<std::mutex> lock(c.mutex);
    const auto it = c.chosen.find(key);
    if (it != c.chosen.end()) {
      out = it->second.algo;
      return true;
    }
    const auto r = c.read.find(key);
    if (r != c.read.end()) {
      read = r->second;
      c.read.erase(r);
    }
  }
  if (read && accepts(desc, la, lb, ld, read->algo)) {
    out = read->algo;
    std::lock_guard<std::mutex> lock(c.mutex);
    c.chosen.emplace(key, *read);
    return true;
  }
  const bool timed = tcg::gemm::choice() == TCG_GEMM_TIMED && !capturing();
  Preference pref;
  pref.set(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, static_cast<uint64_t>(at::cuda::getCUDABlasLtWorkspaceSize()));
  pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, alignment(a.data));
  pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, alignment(b.data));
  pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, alignment(d.data));
  pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, alignment(d.data));
  std::vector<cublasLtMatmulHeuristicResult_t> found(timed ? kTimedCandidates : 1);
  int n = 0;
  if (cublasLtMatmulAlgoGetHeuristic(at::cuda::getCurrentCUDABlasLtHandle(), desc.d, la.l, lb.l, ld.l, ld.l, pref.p,
                                     static_cast<int>(found.size()), found.data(), &n) != CUBLAS_STATUS_SUCCESS ||
      n == 0) {
    return false;
  }
  found.resize(static_cast<size_t>(n));
  out = timed && n > 1 ? fastest(a, b, d, e, accumulate, found) : found[0].algo;
  std::lock_guard<std::mutex> lock(c.mutex);
  c.chosen.emplace(key, Choice{out, timed, false});
  return true;
}

}  // namespace

bool matmul(const Matrix& a, const Matrix& b, const Matrix& d, const Epilogue& e, bool accumulate) {
  MatmulDesc desc;
  describe(desc, a, b, e);
  const Layout la(a), lb(b), ld(d);
  cublasLtMatmulAlgo_t algo;
  if (!algorithm(a, b, d, e, accumulate, desc, la, lb, ld, algo)) return false;
  const Call call{at::cuda::getCurrentCUDABlasLtHandle(), desc, la, lb, ld, a.data, b.data, d.data, accumulate ? 1.0f : 0.0f};
  check_lt(call.run(algo), "matmul");
  return true;
}

// y2 [N, out] = x2 [N, in] · wᵀ: in cuBLASLt's terms y2ᵀ [out, N] = (w stored [in, out])ᵀ ·
// x2ᵀ [in, N]; a bias is one value per row of D.
bool forward(const at::Tensor& x2, const at::Tensor& w, at::Tensor& y2, const Epilogue& e) {
  const int64_t n = x2.size(0), in = x2.size(1), out = w.size(0);
  const at::ScalarType dt = x2.scalar_type();
  return matmul(Matrix{w.data_ptr(), dt, in, out, in, true}, Matrix{x2.data_ptr(), dt, in, n, in, false},
                Matrix{y2.data_ptr(), dt, out, n, out, false}, e);
}

// dx2 [N, in] = dy2 [N, out] · w [out, in]: dx2ᵀ [in, N] = (w stored [in, out]) · dy2ᵀ [out, N].
bool input_gradient(const at::Tensor& dy2, const at::Tensor& w, at::Tensor& dx2, const Epilogue& e) {
  const int64_t n = dy2.size(0), out = w.size(0), in = w.size(1);
  const at::ScalarType dt = dy2.scalar_type();
  return matmul(Matrix{w.data_ptr(), dt, in, out, in, false}, Matrix{dy2.data_ptr(), dt, out, n, out, false},
                Matrix{dx2.data_ptr(), dt, in, n, in, false}, e);
}

void linear_into(const at::Tensor& x2, const at::Tensor& w, const at::Tensor& bias, at::Tensor& y2) {
  Epilogue e;
  if (bias.defined()) {
    e.kind = CUBLASLT_EPILOGUE_BIAS;
    e.bias = bias.data_ptr();
    e.bias_type = bias.scalar_type();
  }
  if (forward(x2, w, y2, e)) return;
  if (bias.defined()) {
    at::addmm_out(y2, bias, x2, w.t());
  } else {
    at::mm_out(y2, x2, w.t());
  }
}

at::Tensor linear(const at::Tensor& x2, const at::Tensor& w, const at::Tensor& bias) {
  at::Tensor y2 = at::empty({x2.size(0), w.size(0)}, x2.options());
  linear_into(x2, w, bias, y2);
  return y2;
}

void input_grad_into(const at::Tensor& dy2, const at::Tensor& w, at::Tensor& dx2) {
  if (!input_gradient(dy2, w, dx2, Epilogue{})) at::mm_out(dx2, dy2, w);
}

at::Tensor input_grad(const at::Tensor& dy2, const at::Tensor& w) {
  at::Tensor dx2 = at::empty({dy2.size(0), w.size(1)}, dy2.options());
  input_grad_into(dy2, w, dx2);
  return dx2;
}

// dw [out, in] (row-major) = dy2ᵀ · x2: in cuBLASLt's terms dwᵀ [in, out] = x2ᵀ [in, N] · (dy2ᵀ
// [out, N])ᵀ, so A = x2 (no transpose), B = dy2 (transposed), k = N, and BGRADB reduces op(B)
// over k: one value per column of D, per output feature.
namespace {
struct WgradOperands {
  Matrix a, b, d;
};
WgradOperands wgrad_operands(const at::Tensor& x2, const at::Tensor& dy2, const at::Tensor& dw) {
  const int64_t rows = x2.size(0), in = x2.size(1), out = dy2.size(1);
  const at::ScalarType dt = x2.scalar_type();
  return {Matrix{x2.data_ptr(), dt, in, rows, in, false}, Matrix{dy2.data_ptr(), dt, out, rows, out, true},
          Matrix{dw.data_ptr(), dw.scalar_type(), in, out, in, false}};
}
at::Tensor aten_wgrad(const at::Tensor& x2, const at::Tensor& dy2, at::ScalarType type) {
  return type == x2.scalar_type() ? at::mm(dy2.t(), x2) : at::mm(dy2.t(), x2, type);
}

// Whether a float32 weight gradient is summed in slices of the rows (k): cuBLASLt's heuristic offers
// no split-k for a float32 D, and a D of few tiles then runs its whole k on a few SMs (the small
// Llama's [384, 384] over 16,384 rows: 26 µs, where cuBLAS's split-k GEMM into bf16 takes 16).
// Split where D is at most 2^19 values and each slice keeps at least twice D's longer side in
// rows (on an H200 the small Llama's step gains 0.1 ms; at 2^21, the 124 M one's [1280, 768]
// and [768, 768] lost what the slices' sum costs), and where every slice starts as aligned as
// the first (both widths multiples of 8: the alignment cuBLASLt is told holds for each).
constexpr int kWgradSlices = 4;
bool sliced(const at::Tensor& x2, const at::Tensor& dy2, const at::Tensor& dw) {
  const int64_t rows = x2.size(0), in = x2.size(1), out = dy2.size(1);
  return dw.scalar_type() == at::kFloat && in % 8 == 0 && out % 8 == 0 && out * in <= (int64_t{1} << 19) &&
         rows % kWgradSlices == 0 && rows / kWgradSlices >= 2 * std::max(out, in);
}

// dw (+)= the sum of part [slices, out, in] over its slices, in slice order: the own kernel
// (linear_kernels.cu) where the own kernels run on dw's device, ATen's sum otherwise.
void sum_slices(const at::Tensor& part, at::Tensor& dw, bool accumulate) {
  static_assert(kWgradSlices <= tcg::linear::kMaxSlices, "linear_kernels.cu sums at most kMaxSlices");
  const int device = dw.get_device();
  if (dw.is_contiguous() && tcg::own::aligned16(dw) && tcg::kernels::unavailable(device).empty()) {
    tcg::linear::SlicesSum p{part.data_ptr<float>(), dw.data_ptr<float>(), dw.numel(),
                             static_cast<int32_t>(part.size(0)), accumulate ? 1 : 0};
    const int64_t groups = (p.n / 4 + tcg::linear::kSlicesSumThreads - 1) / tcg::linear::kSlicesSumThreads;
    const int64_t blocks = std::min<int64_t>(groups, 8 * tcg::own::sm_count(device));
    tcg::own::launch("tcg_wgrad_slices_sum", device, static_cast<unsigned>(blocks), tcg::linear::kSlicesSumThreads,
                     &p);
  } else if (accumulate) {
    dw.add_(part.sum(0));
  } else {
    at::sum_out(dw, part, {0});
  }
}

// dw (+)= dy2ᵀ · x2 summed in slices of the rows where sliced() says so: one strided batched
// GEMM into float32 partials [slices, out, in], then their sum in slice order (deterministic);
// false, having launched nothing, where it does not apply or cuBLASLt offers no algorithm.
bool sliced_wgrad(const at::Tensor& x2, const at::Tensor& dy2, at::Tensor& dw, bool accumulate) {
  if (!sliced(x2, dy2, dw)) return false;
  const int slices = kWgradSlices;
  const int64_t rows = x2.size(0) / slices, in = x2.size(1), out = dy2.size(1);
  const at::ScalarType dt = x2.scalar_type();
  at::Tensor part = at::empty({slices, out, in}, dw.options());
  const Matrix a{x2.data_ptr(), dt, in, rows, in, false, slices, rows * in};
  const Matrix b{dy2.data_ptr(), dt, out, rows, out, true, slices, rows * out};
  const Matrix d{part.data_ptr(), part.scalar_type(), in, out, in, false, slices, in * out};
  if (!matmul(a, b, d, Epilogue{})) return false;
  sum_slices(part, dw, accumulate);
  return true;
}

// dw = dy2ᵀ · x2 in CUTLASS's kernel (wgrad_gemm.h) where it beats cuBLASLt's heuristic's (the
// figures in wgrad_gemm.cu): a float32 gradient of at least 2^23 values (a vocabulary's head)
// from bf16 operands, on a device where the CUTLASS GEMMs run. Whatever gemm::choice() says: it is not a cuBLASLt
// algorithm, and it is the same kernel in every process. False, having launched nothing, otherwise.
constexpr int64_t kCutlassWgradValues = int64_t{1} << 23;
bool cutlass_wgrad(const at::Tensor& x2, const at::Tensor& dy2, at::Tensor& dw) {
#ifdef TCG_CUTLASS_GEMMS
  const int64_t rows = x2.size(0), in = x2.size(1), out = dy2.size(1);
  const int device = dw.get_device();
  if (dw.scalar_type() != at::kFloat || x2.scalar_type() != at::kBFloat16 || out * in < kCutlassWgradValues ||
      rows > std::numeric_limits<int32_t>::max() || std::max(out, in) > std::numeric_limits<int32_t>::max() ||
      !tcg::own::cutlass_gemms_unavailable(device).empty()) {
    return false;
  }
  const tcg::wgrad_gemm::WeightGrad a{x2.data_ptr(), dy2.data_ptr(), dw.data_ptr<float>(), static_cast<int32_t>(rows),
                                      static_cast<int32_t>(in), static_cast<int32_t>(out)};
  if (*tcg::wgrad_gemm::unsupported(a) != '\0') return false;
  check_cuda(tcg::wgrad_gemm::weight_grad(a, static_cast<int>(tcg::own::sm_count(device)),
                                          at::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device)).stream()),
             "linear: the weight gradient's GEMM");
  return true;
#else
  (void)x2, (void)dy2, (void)dw;
  return false;
#endif
}
}  // namespace

WeightGrads weight_grads(const at::Tensor& x2, const at::Tensor& dy2, bool want_w, bool want_b, at::ScalarType type) {
  WeightGrads g;
  if (!want_w) {
    if (want_b) g.db = dy2.sum(0, false, type);
    return g;
  }
  g.dw = at::empty({dy2.size(1), x2.size(1)}, x2.options().dtype(type));
  if (!want_b) {  // the weight gradient's own routes: slices, CUTLASS, cuBLASLt, ATen
    weight_grad_into(x2, dy2, g.dw, false);
    return g;
  }
  const WgradOperands m = wgrad_operands(x2, dy2, g.dw);
  g.db = at::empty({dy2.size(1)}, x2.options().dtype(type));
  Epilogue e;
  e.kind = CUBLASLT_EPILOGUE_BGRADB;
  e.bias = g.db.data_ptr();
  e.bias_type = type;
  if (matmul(m.a, m.b, m.d, e)) return g;
  g.db = dy2.sum(0, false, type);
  if (!matmul(m.a, m.b, m.d, Epilogue{})) g.dw = aten_wgrad(x2, dy2, type);  // cuBLASLt offered no algorithm
  return g;
}

LinearGrads linear_grads(const at::Tensor& x2, const at::Tensor& w, const at::Tensor& dy2, bool want_x, bool want_w,
                         bool want_b, at::ScalarType type) {
  WeightGrads wg = weight_grads(x2, dy2, want_w, want_b, type);
  return {want_x ? input_grad(dy2, w) : at::Tensor(), wg.dw, wg.db};
}

void weight_grad_into(const at::Tensor& x2, const at::Tensor& dy2, at::Tensor& dw, bool accumulate) {
  if (sliced_wgrad(x2, dy2, dw, accumulate) || (!accumulate && cutlass_wgrad(x2, dy2, dw))) return;
  const WgradOperands m = wgrad_operands(x2, dy2, dw);
  if (matmul(m.a, m.b, m.d, Epilogue{}, accumulate)) return;
  const at::Tensor part = aten_wgrad(x2, dy2, dw.scalar_type());
  if (accumulate) {
    dw.add_(part);
  } else {
    dw.copy_(part);
  }
}

}  // namespace tcg::lt

namespace tcg::gemm {

Shapes shapes() {
  tcg::lt::Cache& c = tcg::lt::cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  Shapes s{static_cast<int64_t>(c.chosen.size()), 0, 0};
  for (const auto& [key, choice] : c.chosen) {
    s.from_file += choice.from_file;
    s.timed += choice.timed && !choice.from_file;
  }
  return s;
}

void forget() {
  tcg::lt::Cache& c = tcg::lt::cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  c.chosen.clear();
  c.read.clear();
}

tcg_gemm_identity identity() {
  tcg_gemm_identity id{};
  const cudaDeviceProp* p = at::cuda::getCurrentDeviceProperties();
  std::snprintf(id.device, sizeof(id.device), "%s", p->name);
  id.cublaslt_version = static_cast<int64_t>(cublasLtGetVersion());
  if (id.cublaslt_version == 0) throw tcg::exception(TCG_ERROR, "gemm: cuBLASLt is not loaded, so it has no version");
  id.torch_version = TORCH_VERSION_MAJOR * 10000 + TORCH_VERSION_MINOR * 100 + TORCH_VERSION_PATCH;
  return id;
}

// A key is the device, then TCG_GEMM_KEY_LEN values (key_of).
std::vector<tcg_gemm_entry> export_choices() {
  tcg::lt::Cache& c = tcg::lt::cache();
  const int64_t device = c10::cuda::current_device();
  std::lock_guard<std::mutex> lock(c.mutex);
  std::vector<tcg_gemm_entry> out;
  for (const auto* m : {&c.chosen, &c.read}) {
    for (const auto& [key, choice] : *m) {
      if (key.size() != TCG_GEMM_KEY_LEN + 1 || key[0] != device) continue;
      tcg_gemm_entry e{};
      std::copy(key.begin() + 1, key.end(), e.key);
      std::copy(std::begin(choice.algo.data), std::end(choice.algo.data), e.algo);
      e.timed = choice.timed;
      out.push_back(e);
    }
  }
  return out;
}

void import_choices(const tcg_gemm_entry* in, int64_t n) {
  tcg::lt::Cache& c = tcg::lt::cache();
  const int64_t device = c10::cuda::current_device();
  std::lock_guard<std::mutex> lock(c.mutex);
  for (int64_t i = 0; i < n; ++i) {
    tcg::lt::Key key{device};
    key.insert(key.end(), std::begin(in[i].key), std::end(in[i].key));
    tcg::lt::Choice choice{};
    std::copy(std::begin(in[i].algo), std::end(in[i].algo), choice.algo.data);
    choice.timed = in[i].timed;
    choice.from_file = true;
    c.chosen.erase(key);
    c.read[key] = choice;
  }
}

}  // namespace tcg::gemm
