//! A two-layer MLP with GELU's tanh approximation between, `proj(gelu_tanh(fc(x)))`, whose
//! activation runs inside its GEMMs: [`f_gelu_tanh_mlp`].
//!
//! GPT-2's original activation (and llm.c's) is GELU's tanh approximation, which cuBLASLt can
//! compute in a GEMM's epilogue. On the crate's path `fc`'s forward GEMM adds its bias and
//! applies the GELU to the float32 accumulators (`GELU_AUX_BIAS`, keeping GELU's input for the
//! backward), and in the backward the GEMM through `proj` (the one that makes GELU's output
//! gradient) applies GELU's derivative and sums `fc`'s bias gradient (`DGELU_BGRAD`): no GELU
//! kernel runs, and neither does a bias-gradient pass for `fc`. The weight gradients are those of
//! [`crate::linear::Linear`]'s backward (`proj`'s bias gradient in its weight-gradient GEMM, float
//! 32 under [`WeightGrad::Float32`](crate::linear::WeightGrad::Float32)). Numerics against ATen's
//! `gelu(approximate="tanh")` on the same GEMM: `tests/gpu_mlp.rs` states the figures.
//!
//! The crate's path runs where both layers' do ([`crate::linear`]: CUDA tensors with a 16-bit
//! compute dtype), with a hidden width that is a multiple of 8; elsewhere, and under
//! [`Kernels::PyTorch`](crate::kernels::Kernels::PyTorch), ATen's `linear`,
//! `gelu(approximate="tanh")` and `linear` compute the same. The weight-gradient mode and the
//! kernel choice are `fc`'s ([`LinearConfig`](crate::linear::LinearConfig)). GELU's exact erf
//! form has no cuBLASLt epilogue: [`crate::gelu`] runs it (with `fc`'s bias) in one kernel each
//! way.
//!
//! ```no_run
//! # fn main() -> tch_cuda_graphs::Result<()> {
//! use tch::{nn, Device, Kind, Tensor};
//! use tch_cuda_graphs::linear::{linear, LinearConfig};
//! use tch_cuda_graphs::mlp::f_gelu_tanh_mlp;
//! let vs = nn::VarStore::new(Device::Cuda(0));
//! let fc = linear(vs.root() / "c_fc", 768, 3072, LinearConfig::default());
//! let proj = linear(vs.root() / "c_proj", 3072, 768, LinearConfig::default());
//! let x = Tensor::randn([12, 1024, 768], (Kind::BFloat16, Device::Cuda(0)));
//! let y = f_gelu_tanh_mlp(&x, &fc, &proj)?; // two GEMMs forward, no GELU kernel
//! # let _ = y; Ok(()) }
//! ```

use crate::error::Result;
use crate::linear::Linear;
use crate::sys::mlp as raw;
use tch::Tensor;

/// `proj(gelu_tanh(fc(x)))` of `x` [.., C], with `fc` C → H and `proj` H → C'; in the compute
/// dtype on the crate's path (as [`Linear::f_forward`]'s). [`crate::Error::Misuse`] where the
/// layers' shapes do not chain; [`crate::Error::Unsupported`] where `fc`'s config says
/// [`Kernels::Own`](crate::kernels::Kernels::Own) and the crate's path does not apply.
pub fn f_gelu_tanh_mlp(x: &Tensor, fc: &Linear, proj: &Linear) -> Result<Tensor> {
    run(x, fc, proj, proj.bs.as_ref())
}

/// [`f_gelu_tanh_mlp`], panicking on an error as tch's layers do.
pub fn gelu_tanh_mlp(x: &Tensor, fc: &Linear, proj: &Linear) -> Tensor {
    f_gelu_tanh_mlp(x, fc, proj).unwrap_or_else(|e| panic!("{e}"))
}

/// [`f_gelu_tanh_mlp`] without `proj`'s bias, for a following kernel that adds it and sums its
/// gradient itself ([`crate::norm::LayerNorm::f_forward_residual_biased`], through
/// [`crate::transformer::ResidualStream`]), as [`Linear::f_forward_unbiased`] is for one layer.
pub fn f_gelu_tanh_mlp_unbiased(x: &Tensor, fc: &Linear, proj: &Linear) -> Result<Tensor> {
    run(x, fc, proj, None)
}

fn run(x: &Tensor, fc: &Linear, proj: &Linear, proj_bias: Option<&Tensor>) -> Result<Tensor> {
    let config = fc.config();
    let (y, _own) = raw::gelu_tanh(
        x,
        (&fc.ws, fc.bs.as_ref()),
        (&proj.ws, proj_bias),
        config.weight_grad.raw(),
        config.kernels.raw(),
    )?;
    Ok(y)
}
