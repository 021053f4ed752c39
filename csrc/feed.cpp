// Copies for feeding batches into static inputs (CPU and CUDA).
#include "shim.h"

#include <c10/core/GradMode.h>

extern "C" {

tcg_status tcg_copy_(tcg_tensor dst, tcg_tensor src, int non_blocking) {
  return tcg::guard([&] {
    c10::AutoGradMode no_grad(false);
    tcg::tensor_ref(dst).copy_(tcg::tensor_ref(src), non_blocking != 0);
  });
}

}  // extern "C"
