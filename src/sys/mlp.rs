//! `csrc/mlp.cpp` (and `csrc/cuda/mlp_own.cpp` behind it): the MLPs with their activation in
//! their GEMMs' epilogues.

use super::gelu::RawGeluForm;
use super::kernels::RawKernels;
use super::linear::RawWeightGrad;
use super::{adopt_some, check, ffi, opt_tensor_ptr, tensor_ptr};
use crate::error::Result;
use tch::Tensor;

/// One linear layer's parameters: the weight \[out, in\] and the bias \[out\], if any.
pub(crate) type Layer<'a> = (&'a Tensor, Option<&'a Tensor>);

/// Runs `entry` (one of the shim's MLP entry points) on `x` and the layers: the new tensor it
/// makes and whether the crate's path ran.
fn call(
    x: &Tensor,
    fc: Layer<'_>,
    proj: Layer<'_>,
    entry: impl FnOnce(&ffi::tcg_mlp_inputs, &mut ffi::tcg_tensor, &mut bool) -> ffi::tcg_status,
) -> Result<(Tensor, bool)> {
    let raw = ffi::tcg_mlp_inputs {
        x: tensor_ptr(x),
        fc_weight: tensor_ptr(fc.0),
        fc_bias: opt_tensor_ptr(fc.1),
        proj_weight: tensor_ptr(proj.0),
        proj_bias: opt_tensor_ptr(proj.1),
    };
    let (mut y, mut ran_own) = (std::ptr::null_mut(), false);
    check(entry(&raw, &mut y, &mut ran_own))?;
    // SAFETY: the slot holds a new handle made for this call (or null), owned by nobody else.
    let y = unsafe { adopt_some(y, "mlp")? };
    Ok((y, ran_own))
}

/// `proj(gelu(fc(x)))` (differentiable), GELU's `form`, and whether the crate's path ran.
pub(crate) fn gelu(
    x: &Tensor,
    fc: Layer<'_>,
    proj: Layer<'_>,
    form: RawGeluForm,
    wgrad: RawWeightGrad,
    kernels: RawKernels,
) -> Result<(Tensor, bool)> {
    call(x, fc, proj, |raw, y, ran_own| {
        // SAFETY: `raw` holds live tensor handles (the biases may be null) for the call; the out
        // slots are valid; the shim writes a new handle or null into `y`.
        unsafe { ffi::tcg_mlp_gelu(raw, form, wgrad, kernels, y, ran_own) }
    })
}

/// `proj(silu(gate) · up)` with `[gate | up] = fc(x)` (differentiable), and whether the crate's
/// path ran.
pub(crate) fn swiglu(
    x: &Tensor,
    fc: Layer<'_>,
    proj: Layer<'_>,
    wgrad: RawWeightGrad,
    kernels: RawKernels,
) -> Result<(Tensor, bool)> {
    call(x, fc, proj, |raw, y, ran_own| {
        // SAFETY: as in `gelu`: live handles in `raw`, valid out slots.
        unsafe { ffi::tcg_mlp_swiglu(raw, wgrad, kernels, y, ran_own) }
    })
}
