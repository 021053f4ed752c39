// The gemm family (CPU and CUDA builds): how the crate's cuBLASLt GEMMs choose their algorithm.
// The choice is one process-wide value; the cache of choices made is cuda/lt_matmul.cpp's.
#include "gemm.h"

#include <algorithm>
#include <atomic>

namespace tcg::gemm {
namespace {
std::atomic<int> current{TCG_GEMM_HEURISTIC};
}  // namespace

tcg_gemm_choice choice() { return static_cast<tcg_gemm_choice>(current.load()); }
void set_choice(tcg_gemm_choice c) { current.store(c); }

}  // namespace tcg::gemm

extern "C" {

tcg_status tcg_gemm_set_choice(tcg_gemm_choice choice) {
  return tcg::guard([&] {
    if (choice != TCG_GEMM_HEURISTIC && choice != TCG_GEMM_TIMED) tcg::misuse("gemm: unknown algorithm choice");
    tcg::gemm::set_choice(choice);
    tcg::gemm::forget();
  });
}

tcg_status tcg_gemm_get_choice(tcg_gemm_choice* out) {
  return tcg::guard([&] {
    if (out == nullptr) tcg::misuse("gemm: null output");
    *out = tcg::gemm::choice();
  });
}

tcg_status tcg_gemm_shapes(int64_t* chosen, int64_t* timed, int64_t* from_file) {
  return tcg::guard([&] {
    if (chosen == nullptr || timed == nullptr || from_file == nullptr) tcg::misuse("gemm: null output");
    const tcg::gemm::Shapes s = tcg::gemm::shapes();
    *chosen = s.chosen;
    *timed = s.timed;
    *from_file = s.from_file;
  });
}

tcg_status tcg_gemm_get_identity(tcg_gemm_identity* out) {
  return tcg::guard([&] {
    if (out == nullptr) tcg::misuse("gemm: null output");
    *out = tcg::gemm::identity();
  });
}

tcg_status tcg_gemm_export(tcg_gemm_entry* out, int64_t cap, int64_t* n) {
  return tcg::guard([&] {
    if (n == nullptr || cap < 0 || (cap > 0 && out == nullptr)) tcg::misuse("gemm: bad output buffer");
    const std::vector<tcg_gemm_entry> all = tcg::gemm::export_choices();
    std::copy_n(all.begin(), std::min<int64_t>(cap, static_cast<int64_t>(all.size())), out);
    *n = static_cast<int64_t>(all.size());
  });
}

tcg_status tcg_gemm_import(const tcg_gemm_entry* in, int64_t n) {
  return tcg::guard([&] {
    if (n < 0 || (n > 0 && in == nullptr)) tcg::misuse("gemm: bad entries");
    tcg::gemm::import_choices(in, n);
  });
}

}  // extern "C"
