// The crate's own CUDA kernels as one library: the fat binaries build.rs compiles from
// csrc/cuda/*_kernels.cu and embeds (optimizers, conditional-node setter, normalization, loss, rotary, SwiGLU, GELU, embedding,
// the linear layer's weight-gradient slices and split),
// loaded once per process with the CUDA runtime's library API and checked per device, so that no
// lazy loading ever happens inside a capture. The launchers (optim_own.cpp, conditional.cpp,
// norm_own.cpp, loss_own.cpp) take their kernels from here by name.
#pragma once
#include <ATen/core/Tensor.h>
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
// argument (the launch-parameter structs of *_params.h); `blocks` a count or a 2-D grid. Throws
// on a launch error.
void launch(const std::string& name, int device, dim3 blocks, unsigned threads, void* params);

// Launches kernel `k` on `device`'s current stream with `args`: as a programmatic dependent on
// sm_90 and later (its blocks scheduled while the previous kernel on the stream drains; every own
// kernel waits for that kernel first, dependent_launch.cuh), unless the environment sets
// TCH_CUDA_GRAPHS_DEPENDENT_LAUNCH=0. Throws on a launch error. `launch` goes through it.
void launch_kernel(cudaKernel_t k, int device, dim3 grid, dim3 block, void** args, const char* name);

// Why the CUTLASS GEMMs (gelu_gemm.h, swiglu_gemm.h, wgrad_gemm.h) cannot run on `device`, or "":
// loaded and checked with the own kernels, once per device and never first inside a capture (as
// kernels.h's unavailable()).
std::string cutlass_gemms_unavailable(int device);

// What every launcher asks: the device's SM count (its grids are sized from it), and whether a
// tensor's data is 16-byte aligned for the kernels' vector loads (an undefined tensor is).
int64_t sm_count(int device);
bool aligned16(const at::Tensor& t);

// How many blocks of `threads` threads of the kernel `name` one SM of `device` holds at once (its
// registers decide): a grid of sm_count() times this runs in one wave. At least 1; asked of the
// runtime once per kernel, device and block size.
int64_t resident_blocks(const std::string& name, int device, unsigned threads);

// The kernels of own_kernel_list.h, by their names' parts: whether the lists build a dtype (or
// pair), and each kernel's name as the *_kernels.cu files spell it.
enum class Pass { Forward, Backward };
bool optim_builds(at::ScalarType param);
bool norm_builds(at::ScalarType branch, at::ScalarType out);
bool loss_builds(at::ScalarType logits);
bool rotary_builds(at::ScalarType t);
bool swiglu_builds(at::ScalarType t);
bool gelu_builds(at::ScalarType t);
bool embedding_builds(at::ScalarType t);
bool split_builds(at::ScalarType t);
std::string adam_kernel(at::ScalarType param, bool adamw, bool amsgrad);
std::string sgd_kernel(at::ScalarType param, bool momentum);
// `vec`: 4 for rows up to 512 wide, 8 up to 1024 (norm_params.h's kMaxCols).
std::string norm_kernel(Pass pass, at::ScalarType branch, at::ScalarType out, int vec);
// The loss's backward is the scale of the gradient its forward wrote (tcg_ce_scale_<T>).
std::string loss_kernel(Pass pass, at::ScalarType logits);
std::string rotary_kernel(at::ScalarType t);
std::string swiglu_kernel(Pass pass, at::ScalarType t);
std::string gelu_kernel(Pass pass, at::ScalarType t, bool tanh);
// `scan`: the backward at a small vocabulary, without the sort (tcg_embedding_scan_<T>).
std::string embedding_kernel(at::ScalarType t, bool scan);
// The backward of a linear layer's split output (tcg_split_bwd_<T>).
std::string split_kernel(at::ScalarType t);

}  // namespace tcg::own
