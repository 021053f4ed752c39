//! Two-layer MLPs whose activation runs inside their GEMMs: GELU between, `proj(gelu(fc(x)))`
//! ([`f_gelu_mlp`], and [`f_gelu_tanh_mlp`] for GELU's tanh approximation), and the gated SwiGLU
//! of Llama-style models, `w2(silu(gate) · up)` with `[gate | up] = w13(x)` ([`f_swiglu_mlp`]).
//!
//! On the crate's path `fc`'s forward GEMM adds its bias and applies the GELU to the float32
//! accumulators (keeping GELU's input, or its derivative, for the backward), and in the backward
//! the GEMM through `proj` (the one that makes GELU's output gradient) applies GELU's derivative:
//! no GELU kernel runs. The two forms run in different GEMMs:
//! - **the tanh approximation** (GPT-2's original activation, llm.c's) in cuBLASLt's epilogues
//!   (`GELU_AUX_BIAS` forward, `DGELU` backward; `fc`'s bias gradient in its weight-gradient
//!   GEMM's `BGRADB`);
//! - **the exact form** (`approximate="none"`, PyTorch's default) in CUTLASS's, on bf16 and
//!   sm_90 (H100, H200) where the build found CUTLASS's headers (`scripts/setup.sh` installs
//!   them; `docs/building.md`): GELU computed as
//!   [`crate::gelu`]'s kernels compute it, its derivative computed with it in the forward and
//!   kept in float16 (the backward GEMM only multiplies by it), and `fc`'s bias gradient summed
//!   by the backward GEMM in a fixed order. cuBLASLt offers no epilogue for it.
//!
//! The weight gradients are those of [`crate::linear::Linear`]'s backward (`proj`'s bias gradient
//! in its weight-gradient GEMM, float 32 under
//! [`WeightGrad::Float32`](crate::linear::WeightGrad::Float32)). Numerics against ATen's
//! composition on the same GEMM: `tests/gpu_mlp.rs` states the figures. GELU applied to the
//! float32 accumulators, not to their bf16 rounding, is closer to the exact value than the
//! composition's.
//!
//! The crate's path runs where both layers' do ([`crate::linear`]: CUDA tensors with a 16-bit
//! compute dtype), with a hidden width that is a multiple of 8 (and, for the exact form, the
//! conditions above); elsewhere, and under [`Kernels::PyTorch`](crate::kernels::Kernels::PyTorch),
//! ATen's `linear`, `gelu` and `linear` compute the same. The weight-gradient mode and the kernel
//! choice are `fc`'s ([`LinearConfig`](crate::linear::LinearConfig)).
//!
//! **SwiGLU** ([`f_swiglu_mlp`]): forward, `w13`'s GEMM in two halves, the gate half's (cuBLASLt's)
//! and the up half's, whose epilogue loads gate and writes up and SwiGLU's output from the up
//! values rounded to bf16 (CUTLASS's, bf16 on sm_90 where the build found CUTLASS: the
//! [`crate::swiglu`] forward kernel's arithmetic on the same values, so the same bits, with no
//! pass of its own reading `[gate | up]` back), then `w2`'s GEMM; backward, `w2`'s input-gradient
//! GEMM applies SwiGLU's backward in its epilogue (CUTLASS's too), loading gate and up where they
//! lie in the `[gate | up]` projection and writing `[dgate | dup]` whole: the gradient of SwiGLU's
//! output is neither written nor read back, and SwiGLU's backward is computed on the float32
//! product, not on its bf16 rounding. Elsewhere on the crate's path (and with a bias on `w13`, for
//! the forward) the GEMMs write their outputs and [`crate::swiglu`]'s kernels run.
//!
//! ```no_run
//! # fn main() -> tch_cuda_graphs::Result<()> {
//! use tch::{nn, Device, Kind, Tensor};
//! use tch_cuda_graphs::gelu::GeluApproximate;
//! use tch_cuda_graphs::linear::{linear, LinearConfig};
//! use tch_cuda_graphs::mlp::f_gelu_mlp;
//! let vs = nn::VarStore::new(Device::Cuda(0));
//! let fc = linear(vs.root() / "c_fc", 768, 3072, LinearConfig::default());
//! let proj = linear(vs.root() / "c_proj", 3072, 768, LinearConfig::default());
//! let x = Tensor::randn([12, 1024, 768], (Kind::BFloat16, Device::Cuda(0)));
//! let y = f_gelu_mlp(&x, &fc, &proj, GeluApproximate::None)?; // two GEMMs forward, no GELU kernel
//! # let _ = y; Ok(()) }
//! ```

use crate::error::Result;
use crate::gelu::GeluApproximate;
use crate::kernels::Kernels;
use crate::linear::Linear;
use crate::sys::mlp as raw;
use tch::Tensor;

/// `proj(gelu(fc(x)))` of `x` [.., C], with `fc` C → H and `proj` H → C', GELU's exact form or its
/// tanh approximation (`approximate`); in the compute dtype on the crate's path (as
/// [`Linear::f_forward`]'s). [`crate::Error::Misuse`] where the layers' shapes do not chain;
/// [`crate::Error::Unsupported`] where `fc`'s config says
/// [`Kernels::Own`](crate::kernels::Kernels::Own) and the crate's path does not apply.
pub fn f_gelu_mlp(x: &Tensor, fc: &Linear, proj: &Linear, approximate: GeluApproximate) -> Result<Tensor> {
    run(x, fc, proj, proj.bs.as_ref(), approximate, fc.config().kernels)
}

/// [`f_gelu_mlp`], panicking on an error as tch's layers do.
pub fn gelu_mlp(x: &Tensor, fc: &Linear, proj: &Linear, approximate: GeluApproximate) -> Tensor {
    f_gelu_mlp(x, fc, proj, approximate).unwrap_or_else(|e| panic!("{e}"))
}

/// [`f_gelu_mlp`] with GELU's tanh approximation.
pub fn f_gelu_tanh_mlp(x: &Tensor, fc: &Linear, proj: &Linear) -> Result<Tensor> {
    f_gelu_mlp(x, fc, proj, GeluApproximate::Tanh)
}

/// [`f_gelu_tanh_mlp`], panicking on an error as tch's layers do.
pub fn gelu_tanh_mlp(x: &Tensor, fc: &Linear, proj: &Linear) -> Tensor {
    f_gelu_tanh_mlp(x, fc, proj).unwrap_or_else(|e| panic!("{e}"))
}

/// [`f_gelu_tanh_mlp`] without `proj`'s bias, for a following kernel that adds it and sums its
/// gradient itself ([`crate::norm::LayerNorm::f_forward_residual_biased`], through
/// [`crate::transformer::ResidualStream`]), as [`Linear::f_forward_unbiased`] is for one layer.
pub fn f_gelu_tanh_mlp_unbiased(x: &Tensor, fc: &Linear, proj: &Linear) -> Result<Tensor> {
    run(x, fc, proj, None, GeluApproximate::Tanh, fc.config().kernels)
}

/// [`f_gelu_mlp`] without `proj`'s bias (as [`f_gelu_tanh_mlp_unbiased`]), on the crate's path
/// only: [`crate::Error::Unsupported`] where it does not apply, whatever `fc`'s config says (the
/// caller then runs the layers apart).
pub(crate) fn f_gelu_mlp_unbiased_own(
    x: &Tensor,
    fc: &Linear,
    proj: &Linear,
    approximate: GeluApproximate,
) -> Result<Tensor> {
    run(x, fc, proj, None, approximate, Kernels::Own)
}

/// `w2(silu(gate) · up)` of `x` [.., C], with `[gate | up] = w13(x)` (`w13` C → 2F, the gate
/// first, as [`crate::swiglu`] reads it) and `w2` F → C': a Llama-style MLP, its backward through
/// `w2` and SwiGLU in one GEMM on the crate's path (the module's docs). The crate's path runs
/// where both layers' do, with F a multiple of 4; elsewhere, and under
/// [`Kernels::PyTorch`](crate::kernels::Kernels::PyTorch), ATen's `linear`, `silu`, `mul` and
/// `linear` compute the same. [`crate::Error::Misuse`] where the layers' shapes do not chain
/// (`w13`'s out odd, or not twice `w2`'s in); [`crate::Error::Unsupported`] where `w13`'s config
/// says [`Kernels::Own`](crate::kernels::Kernels::Own) and the crate's path does not apply. The
/// weight-gradient mode and the kernel choice are `w13`'s.
///
/// ```no_run
/// # fn main() -> tch_cuda_graphs::Result<()> {
/// use tch::{nn, Device, Kind, Tensor};
/// use tch_cuda_graphs::linear::{linear, LinearConfig};
/// use tch_cuda_graphs::mlp::f_swiglu_mlp;
/// let vs = nn::VarStore::new(Device::Cuda(0));
/// let no_bias = LinearConfig { bias: false, ..Default::default() };
/// let w13 = linear(vs.root() / "w13", 768, 2 * 2048, no_bias);
/// let w2 = linear(vs.root() / "w2", 2048, 768, no_bias);
/// let x = Tensor::randn([12, 1024, 768], (Kind::BFloat16, Device::Cuda(0)));
/// let y = f_swiglu_mlp(&x, &w13, &w2)?;
/// # let _ = y; Ok(()) }
/// ```
pub fn f_swiglu_mlp(x: &Tensor, w13: &Linear, w2: &Linear) -> Result<Tensor> {
    let (y, _own) = raw::swiglu(
        x,
        (&w13.ws, w13.bs.as_ref()),
        (&w2.ws, w2.bs.as_ref()),
        w13.config().weight_grad.raw(),
        w13.config().kernels.raw(),
    )?;
    Ok(y)
}

/// [`f_swiglu_mlp`], panicking on an error as tch's layers do.
pub fn swiglu_mlp(x: &Tensor, w13: &Linear, w2: &Linear) -> Tensor {
    f_swiglu_mlp(x, w13, w2).unwrap_or_else(|e| panic!("{e}"))
}

fn run(
    x: &Tensor,
    fc: &Linear,
    proj: &Linear,
    proj_bias: Option<&Tensor>,
    approximate: GeluApproximate,
    kernels: Kernels,
) -> Result<Tensor> {
    let (y, _own) = raw::gelu(
        x,
        (&fc.ws, fc.bs.as_ref()),
        (&proj.ws, proj_bias),
        approximate.raw(),
        fc.config().weight_grad.raw(),
        kernels.raw(),
    )?;
    Ok(y)
}
