// The gemm family (CPU and CUDA builds): how the crate's cuBLASLt GEMMs choose their algorithm.
// The choice is one process-wide value; the cache of choices made is cuda/lt_matmul.cpp's.
#include "gemm.h"

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

tcg_status tcg_gemm_shapes(int64_t* chosen, int64_t* timed) {
  return tcg::guard([&] {
    if (chosen == nullptr || timed == nullptr) tcg::misuse("gemm: null output");
    const tcg::gemm::Shapes s = tcg::gemm::shapes();
    *chosen = s.chosen;
    *timed = s.timed;
  });
}

}  // extern "C"
