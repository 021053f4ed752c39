// The crate's SwiGLU kernels: silu(gate) · up read from the fused [gate | up] projection in one
// pass, and both gradients written into one [dgate | dup] tensor in one more (see
// swiglu_params.h), fp32 math, bf16 / fp16 / fp32 in and out. One thread per 4 columns of a
// row at a time, a block's threads over whole rows (several rows where they are narrow), the
// rows strided over the grid. The exponential and the division are the hardware's
// approximations (fast_math.cuh's exp_ftz, __fdividef): IEEE division and expf had made the
// kernels bound by their instructions; fp32 results stay within 1e-6 of ATen's composition
// (relative to the largest), bf16 ones within a rounding of its fp32 result.
//
// Compiled by nvcc into a fat binary that build.rs embeds in the shim; the launcher
// (swiglu_own.cpp) launches the extern "C" kernels by name.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "dependent_launch.cuh"
#include "own_kernel_list.h"
#include "swiglu_math.cuh"
#include "swiglu_params.h"
#include "vec_io.cuh"

namespace tcg::swiglu {
namespace {

using tcg::cuda::load4;
using tcg::cuda::store4;

// Where a thread works: a row's columns are covered by lanes_for(F) threads, the block holds
// blockDim.x / lanes rows at a time, the rows strided over the grid.
// Worked out once per thread: no division per value (a division per 4 values had made the
// kernels bound by their instructions).
struct RowSpan {
  int64_t row, row_step;
  int64_t col;  // this thread's first column; then every 4 · lanes
  int64_t col_step;
  __device__ RowSpan(int64_t f) {
    const int lanes = static_cast<int>(lanes_for(f));  // the launcher's blocks are kThreads wide
    const int rows_per_block = static_cast<int>(blockDim.x) / lanes;
    const int r = static_cast<int>(threadIdx.x) / lanes;
    // threads past the block's last whole row get no row
    row = r < rows_per_block ? static_cast<int64_t>(blockIdx.x) * rows_per_block + r : INT64_MAX;
    row_step = static_cast<int64_t>(gridDim.x) * rows_per_block;
    col = 4 * static_cast<int64_t>(threadIdx.x - r * lanes);
    col_step = 4 * static_cast<int64_t>(lanes);
  }
};

template <typename T>
__device__ void forward(const Forward& a) {
  const RowSpan rs(a.f);
  for (int64_t row = rs.row; row < a.rows; row += rs.row_step) {
    const T* g_row = static_cast<const T*>(a.h) + row * 2 * a.f;
    const T* u_row = g_row + a.f;
    T* out = static_cast<T*>(a.out) + row * a.f;
    for (int64_t c = rs.col; c < a.f; c += rs.col_step) {
      const float4 g = load4<T>(g_row + c), u = load4<T>(u_row + c);
      const float4 o = make_float4(silu(g.x) * u.x, silu(g.y) * u.y, silu(g.z) * u.z, silu(g.w) * u.w);
      store4<T>(out + c, o);
    }
  }
}

template <typename T>
__device__ void backward(const Backward& a) {
  const RowSpan rs(a.f);
  for (int64_t row = rs.row; row < a.rows; row += rs.row_step) {
    const T* g_row = static_cast<const T*>(a.h) + row * 2 * a.f;
    const T* u_row = g_row + a.f;
    const T* d_row = static_cast<const T*>(a.dout) + row * a.f;
    T* dg_row = static_cast<T*>(a.dh) + row * 2 * a.f;
    T* du_row = dg_row + a.f;
    for (int64_t c = rs.col; c < a.f; c += rs.col_step) {
      const float4 g = load4<T>(g_row + c), u = load4<T>(u_row + c), d = load4<T>(d_row + c);
      float4 dg, du;
      grads(g.x, u.x, d.x, &dg.x, &du.x);
      grads(g.y, u.y, d.y, &dg.y, &du.y);
      grads(g.z, u.z, d.z, &dg.z, &du.z);
      grads(g.w, u.w, d.w, &dg.w, &du.w);
      store4<T>(dg_row + c, dg);
      store4<T>(du_row + c, du);
    }
  }
}

}  // namespace
}  // namespace tcg::swiglu

// The kernels of own_kernel_list.h's TCG_SWIGLU_TYPES.
#define TCG_SWIGLU_KERNELS(N)                                                                        \
  extern "C" __global__ void __launch_bounds__(tcg::swiglu::kThreads) tcg_swiglu_fwd_##N(const tcg::swiglu::Forward a) { tcg::cuda::wait_prior(); \
    tcg::swiglu::forward<TCG_CUDA_TYPE(N)>(a);                                                      \
  }                                                                                                 \
  extern "C" __global__ void __launch_bounds__(tcg::swiglu::kThreads) tcg_swiglu_bwd_##N(const tcg::swiglu::Backward a) { tcg::cuda::wait_prior(); \
    tcg::swiglu::backward<TCG_CUDA_TYPE(N)>(a);                                                     \
  }
TCG_SWIGLU_TYPES(TCG_SWIGLU_KERNELS)
