// Programmatic dependent launch: own_kernels.cpp launches the crate's kernels on Hopper and later
// with it, so that a kernel's blocks are scheduled while the kernel before it on the stream
// drains (its launch latency hidden behind that tail, inside captured graphs too). Every kernel
// launched that way calls wait_prior() first, before it reads or writes memory: it returns once
// the previous kernel has completed and its writes are visible, so the kernels still run one
// after the other. Where the kernel was launched without the attribute, or before sm_90, it is
// nothing.
#pragma once

namespace tcg::cuda {

__device__ __forceinline__ void wait_prior() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

}  // namespace tcg::cuda
