// The kernel that sets a conditional node's handle from a device value (conditional.cpp), built
// into the own kernels' fat binary (included at the end of optim_kernels.cu).
#pragma once
#include <cuda_runtime.h>

// cond: a 0-d tensor's data, dtype 0 bool/uint8, 1 int32, 2 int64, 3 float32, 4 float64; true
// when non-zero. Without a counter (IF): the handle is set to cond (`mode` 2: to !cond). With
// one (WHILE), `mode` 0 (before the node): the counter and *hit are reset, the handle set to cond (false if
// max_iters <= 0); `mode` 1 (end of the body): the counter counts the iteration just done, and
// the handle is set to cond, or to false with *hit = 1 when max_iters iterations are done.
extern "C" __global__ void tcg_cond_set(cudaGraphConditionalHandle handle, const void* cond,
                                        int dtype, int mode, int* counter, long long max_iters,
                                        int* hit) {
  bool v = false;
  switch (dtype) {
    case 0: v = *static_cast<const unsigned char*>(cond) != 0; break;
    case 1: v = *static_cast<const int*>(cond) != 0; break;
    case 2: v = *static_cast<const long long*>(cond) != 0; break;
    case 3: v = *static_cast<const float*>(cond) != 0.0f; break;
    default: v = *static_cast<const double*>(cond) != 0.0; break;
  }
  if (counter == nullptr && mode == 2) v = !v;
  if (counter != nullptr) {
    if (mode == 0) {
      *counter = 0;
      *hit = 0;
      if (max_iters <= 0) v = false;
    } else {
      const int done = *counter + 1;
      *counter = done;
      if (v && done >= max_iters) {
        v = false;
        *hit = 1;
      }
    }
  }
  cudaGraphSetConditional(handle, v ? 1u : 0u);
}
