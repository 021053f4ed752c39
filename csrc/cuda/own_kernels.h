// The crate's own CUDA kernels as one library: the fat binaries build.rs compiles from
// csrc/cuda/*_kernels.cu and embeds (optimizers, conditional-node setter, normalization, loss),
// loaded once per process with the CUDA runtime's library API and checked per device, so that no
// lazy loading ever happens inside a capture. The launchers (optim_own.cpp, conditional.cpp,
// norm_own.cpp, loss_own.cpp) take their kernels from here by name.
#pragma once
#include <cuda_runtime_api.h>

#include <string>

namespace tcg::own {

// Whether the own kernels were built into this binary.
bool built();

// Why the own kernels cannot run on CUDA device `device` (not built, or the fat binaries have no
// code this device and driver can load); empty when they can. Loads them on first use, which is
// refused inside a capture.
std::string unavailable(int device);

// The kernel `name` on `device`; throws TCG_UNSUPPORTED (with unavailable()'s reason) where the
// own kernels cannot run.
cudaKernel_t kernel(const char* name, int device);

}  // namespace tcg::own
