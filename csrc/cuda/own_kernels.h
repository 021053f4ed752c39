// The crate's own CUDA kernels as one library: the fat binaries build.rs compiles from
// csrc/cuda/*_kernels.cu and embeds (optimizers, conditional-node setter, normalization, loss),
// loaded once per process with the CUDA runtime's library API and checked per device, so that no
// lazy loading ever happens inside a capture. The launchers (optim_own.cpp, conditional.cpp,
// norm_own.cpp, loss_own.cpp) take their kernels from here by name.
#pragma once
#include <c10/core/ScalarType.h>
#include <cuda_runtime_api.h>

#include <string>

namespace tcg::own {

// Whether they were built and whether they run on a device: tcg::kernels::built and
// tcg::kernels::unavailable (../kernels.h), which this library answers.

// The kernel `name` on `device`; throws TCG_UNSUPPORTED (with kernels::unavailable()'s reason)
// where the own kernels cannot run.
cudaKernel_t kernel(const char* name, int device);

// Launches the kernel `name` on `device`'s current stream, `params` pointing at its one by-value
// argument (the launch-parameter structs of *_params.h). Throws on a launch error.
void launch(const std::string& name, int device, unsigned blocks, unsigned threads, void* params);

// The names the norm and loss kernels give float32, bfloat16 and float16 ("f32", "bf16", "f16");
// null for any other dtype (those kernels do not take it).
const char* float_name(at::ScalarType t);

}  // namespace tcg::own
