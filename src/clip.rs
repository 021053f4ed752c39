//! Gradient clipping by global norm that stays on the device (usable inside a captured step).

use crate::error::{Error, Result};
use crate::optim::with_grads;
use crate::sys::optim as sys;
use tch::Tensor;

/// Scales the gradients of `params` so that their global `norm_type`-norm is at most
/// `max_norm` (PyTorch's `clip_grad_norm_`, `foreach` path), and returns the norm before
/// clipping as a 0-d device tensor. No host sync: the scale factor
/// `min(1, max_norm / (norm + 1e-6))` is computed and applied on the device, so this can be
/// captured. Parameters without a gradient are skipped.
///
/// ```no_run
/// # fn main() -> tch_cuda_graphs::Result<()> {
/// # let params: Vec<tch::Tensor> = vec![];
/// let total_norm = tch_cuda_graphs::clip_grad_norm(&params, 1.0, 2.0)?;
/// # let _ = total_norm; Ok(()) }
/// ```
pub fn clip_grad_norm(params: &[Tensor], max_norm: f64, norm_type: f64) -> Result<Tensor> {
    if !(max_norm.is_finite() && max_norm >= 0.0 && norm_type.is_finite() && norm_type > 0.0) {
        return Err(Error::Misuse(format!("clip_grad_norm: invalid max_norm {max_norm} or norm_type {norm_type}")));
    }
    let (_, grads) = with_grads(params)?;
    sys::clip_norm(&grads, max_norm, norm_type)
}
