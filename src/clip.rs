//! Gradient clipping by global norm that stays on the device (usable inside a captured step).

use crate::error::{Error, Result};
use crate::kernels::Kernels;
use crate::sys::optim as sys;
use tch::Tensor;

/// Scales the gradients of `params` so that their global `norm_type`-norm is at most
/// `max_norm` (PyTorch's `clip_grad_norm_`, `foreach` path), and returns the norm before
/// clipping as a 0-d device tensor. No host sync: the scale factor
/// `min(1, max_norm / (norm + 1e-6))` is computed and applied on the device, so this can be
/// captured. Parameters without a gradient are skipped. On a CUDA device the crate's own
/// kernels compute the per-tensor norms of float32 gradients (two launches for the whole list)
/// and the factor, each equal bit for bit to what ATen's operators give.
///
/// ```no_run
/// # fn main() -> tch_cuda_graphs::Result<()> {
/// # let params: Vec<tch::Tensor> = vec![];
/// let total_norm = tch_cuda_graphs::clip_grad_norm(&params, 1.0, 2.0)?;
/// # let _ = total_norm; Ok(()) }
/// ```
pub fn clip_grad_norm(params: &[Tensor], max_norm: f64, norm_type: f64) -> Result<Tensor> {
    check_norm_args(max_norm, norm_type)?;
    let grads = defined_grads(params)?;
    sys::clip_norm(&grads, max_norm, norm_type, Kernels::Auto.raw())
}

/// [`clip_grad_norm`]'s norm and factor `min(1, max_norm / (norm + 1e-6))`, both 0-d on the
/// device, with the gradients left as they are: for an update that multiplies by the factor as
/// it reads them ([`crate::optim::Optimizer::step_clipped`]). `kernels`: [`Kernels::PyTorch`]
/// computes them with ATen's operators, as PyTorch's `clip_grad_norm_` does; otherwise the own
/// kernels compute the per-tensor norms of float32 gradients and the factor (the same values,
/// bit for bit).
pub(crate) fn clip_factor(
    params: &[Tensor],
    max_norm: f64,
    norm_type: f64,
    kernels: Kernels,
) -> Result<(Tensor, Tensor)> {
    clip_factor_of(&defined_grads(params)?, max_norm, norm_type, kernels)
}

/// [`clip_factor`] of gradients given as they are (not read from parameters).
pub(crate) fn clip_factor_of(
    grads: &[Tensor],
    max_norm: f64,
    norm_type: f64,
    kernels: Kernels,
) -> Result<(Tensor, Tensor)> {
    check_norm_args(max_norm, norm_type)?;
    sys::clip_coef(grads, max_norm, norm_type, kernels.raw())
}

/// [`Error::Misuse`] for a `max_norm` or `norm_type` that clipping cannot take.
pub(crate) fn check_norm_args(max_norm: f64, norm_type: f64) -> Result<()> {
    if !(max_norm.is_finite() && max_norm >= 0.0 && norm_type.is_finite() && norm_type > 0.0) {
        return Err(Error::Misuse(format!("clip_grad_norm: invalid max_norm {max_norm} or norm_type {norm_type}")));
    }
    Ok(())
}

/// Clamps every gradient of `params` to `[-clip_value, clip_value]` in place (PyTorch's
/// `clip_grad_value_`, and what tch's `Optimizer::backward_step_clip` does), on the device and
/// without a host sync, so it can be captured. Parameters without a gradient are skipped.
///
/// ```
/// # fn main() -> tch_cuda_graphs::Result<()> {
/// use tch::{Device, Kind, Tensor};
/// let w = Tensor::ones([3], (Kind::Float, Device::Cpu)).set_requires_grad(true);
/// (&w * Tensor::from_slice(&[-4f32, 0.5, 9.0])).sum(Kind::Float).backward();
/// tch_cuda_graphs::clip_grad_value(&[w.shallow_clone()], 1.0)?;
/// assert_eq!(Vec::<f32>::try_from(&w.grad()).unwrap(), [-1.0, 0.5, 1.0]);
/// # Ok(()) }
/// ```
pub fn clip_grad_value(params: &[Tensor], clip_value: f64) -> Result<()> {
    if !(clip_value.is_finite() && clip_value >= 0.0) {
        return Err(Error::Misuse(format!("clip_grad_value: invalid clip_value {clip_value}")));
    }
    let grads = defined_grads(params)?;
    sys::clip_value(&grads, clip_value)
}

/// The gradients of the parameters that have one.
fn defined_grads(params: &[Tensor]) -> Result<Vec<Tensor>> {
    let mut grads = Vec::with_capacity(params.len());
    for p in params {
        let g = p.f_grad()?;
        if g.defined() {
            grads.push(g);
        }
    }
    Ok(grads)
}
