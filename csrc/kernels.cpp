// The kernels family (CPU and CUDA builds): whether the crate's own kernels were built, and
// whether they run on a device. The decision between them and ATen's is kernels.h's.
#include "kernels.h"

extern "C" {

bool tcg_kernels_built(void) { return tcg::kernels::built(); }

tcg_status tcg_kernels_check(int device) {
  return tcg::guard([&] {
    auto why = tcg::kernels::unavailable(device);
    if (!why.empty()) throw tcg::exception(TCG_UNSUPPORTED, why);
  });
}

}  // extern "C"
