// The crate's MLPs with their activation in the GEMMs' epilogues (GELU; SwiGLU's backward), as
// mlp.cpp sees them (no CUDA types here).
// Defined in csrc/cuda/mlp_own.cpp in CUDA builds, in csrc/no_cuda.cpp otherwise.
#pragma once
#include <ATen/ATen.h>

#include <string>

namespace tcg::mlp {

// The operands, already read: x [.., C]; the first layer fc [H, C] (bias [H] or undefined) and
// the second proj [C', H] (bias [C'] or undefined), the parameters themselves (autograd inputs),
// and their shadows in the compute dtype, or undefined where there is none.
struct Operands {
  at::Tensor x, fc_w, fc_b, proj_w, proj_b;
  at::Tensor shadow_fc_w, shadow_fc_b, shadow_proj_w, shadow_proj_b;
};

// Why the crate's path cannot take these operands with GELU's tanh (`tanh`) or exact form, or ""
// when it can.
std::string unsupported(const Operands& in, bool tanh);

// proj(gelu(fc(x))) through one autograd node: the forward GEMM of fc adds its bias and applies
// the GELU in its epilogue (keeping GELU's input, or its derivative, for the backward), and the
// backward's GEMM through proj applies GELU's derivative. The tanh form: cuBLASLt's GELU_AUX_BIAS and DGELU
// epilogues, fc's weight-gradient GEMM summing its bias gradient (BGRADB); the exact form:
// CUTLASS's (cuda/gelu_gemm.h), whose backward GEMM sums fc's bias gradient. `fp32_wgrad`: the
// weight-gradient GEMMs write float32. Call only where unsupported() is "".
at::Tensor gelu(const Operands& in, bool tanh, bool fp32_wgrad);

// The SwiGLU MLP, proj(silu(gate) · up) with [gate | up] = fc(x) (fc [2F, C], proj [C', F]):
// why the crate's path cannot take these operands, or "".
std::string unsupported_swiglu(const Operands& in);

// It, through one autograd node: fc's GEMM, SwiGLU's forward kernel and proj's GEMM forward; the
// backward's GEMM through proj applies SwiGLU's backward in its epilogue (CUTLASS's,
// cuda/swiglu_gemm.h; bf16 on sm_90 where the build found CUTLASS, else the GEMM and SwiGLU's
// backward kernel). `fp32_wgrad` as gelu()'s. Call only where unsupported_swiglu() is "".
at::Tensor swiglu(const Operands& in, bool fp32_wgrad);

}  // namespace tcg::mlp
