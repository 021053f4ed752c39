//! `csrc/norm.cpp` (and `csrc/cuda/norm_own.cpp` behind it): LayerNorm and RMSNorm with the
//! residual add and dropout folded in.

use super::{adopt, adopt_some, check, ffi, opt_tensor_ptr};
use crate::error::Result;
use tch::Tensor;

pub(crate) use ffi::tcg_norm_kind as RawNormKind;
pub(crate) use ffi::tcg_norm_out as RawNormOut;
/// The options as the shim takes them.
pub(crate) type NormOptions = ffi::tcg_norm_options;
use super::kernels::RawKernels;

/// The tensors of one normalization: the residual stream, and optionally the branch added to it
/// through dropout (with the bias of the layer that made it), the weight and the bias. Without
/// the residual stream the branch starts it.
pub(crate) struct NormInputs<'a> {
    pub(crate) res: Option<&'a Tensor>,
    pub(crate) branch: Option<&'a Tensor>,
    pub(crate) weight: Option<&'a Tensor>,
    pub(crate) bias: Option<&'a Tensor>,
    pub(crate) branch_bias: Option<&'a Tensor>,
}

/// What one normalization made: the new residual (with a branch), the normalized output, and
/// whether the crate's fused kernels ran.
pub(crate) struct NormOutputs {
    pub(crate) res: Option<Tensor>,
    pub(crate) y: Tensor,
    pub(crate) ran_own: bool,
}

/// Runs one normalization (differentiable).
pub(crate) fn forward(inputs: &NormInputs<'_>, options: &NormOptions, kernels: RawKernels) -> Result<NormOutputs> {
    let raw = ffi::tcg_norm_inputs {
        res: opt_tensor_ptr(inputs.res),
        branch: opt_tensor_ptr(inputs.branch),
        weight: opt_tensor_ptr(inputs.weight),
        bias: opt_tensor_ptr(inputs.bias),
        branch_bias: opt_tensor_ptr(inputs.branch_bias),
    };
    let (mut res, mut y, mut ran_own) = (std::ptr::null_mut(), std::ptr::null_mut(), false);
    // SAFETY: `raw` holds live tensor handles (or nulls) for the call; `options` and the out
    // slots are valid; the shim writes new handles or nulls into the slots.
    check(unsafe { ffi::tcg_norm_forward(&raw, options, kernels, &mut res, &mut y, &mut ran_own) })?;
    // SAFETY: the slots hold new handles made for this call (or null), owned by nobody else.
    let (res, y) = unsafe { (adopt(res), adopt_some(y, "norm")?) };
    Ok(NormOutputs { res, y, ran_own })
}
