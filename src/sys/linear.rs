//! `csrc/linear.cpp` (and `csrc/cuda/linear_own.cpp` behind it): the linear layer whose backward
//! computes the bias gradient in the weight-gradient GEMM.

use super::{adopt, adopt_some, check, ffi, opt_tensor_ptr, tensor_ptr};
use crate::error::{Error, Result};
use tch::Tensor;

use super::kernels::RawKernels;
pub(crate) use ffi::tcg_weight_grad as RawWeightGrad;

/// `x · weightᵀ + bias` (differentiable), and whether the crate's path ran. `grad_to`: a tied
/// embedding's tie ([`super::embedding::embedding`]), which takes the weight's gradient on the
/// crate's path.
pub(crate) fn forward(
    x: &Tensor,
    weight: &Tensor,
    grad_to: Option<&Tensor>,
    bias: Option<&Tensor>,
    wgrad: RawWeightGrad,
    kernels: RawKernels,
) -> Result<(Tensor, bool)> {
    let raw = ffi::tcg_linear_inputs {
        x: tensor_ptr(x),
        weight: tensor_ptr(weight),
        bias: opt_tensor_ptr(bias),
        weight_grad_to: opt_tensor_ptr(grad_to),
    };
    let (mut y, mut ran_own) = (std::ptr::null_mut(), false);
    // SAFETY: `raw` holds live tensor handles (bias and weight_grad_to may be null) for the call;
    // the out slots are valid; the shim writes a new handle or null into `y`.
    check(unsafe { ffi::tcg_linear_forward(&raw, wgrad, kernels, &mut y, &mut ran_own) })?;
    // SAFETY: the slot holds a new handle made for this call (or null), owned by nobody else.
    let y = unsafe { adopt_some(y, "linear")? };
    Ok((y, ran_own))
}

/// The most pieces [`split`] makes.
pub(crate) const MAX_PARTS: i64 = ffi::TCG_LINEAR_MAX_PARTS;

/// `x · weightᵀ + bias` split into `parts` equal views along the last dimension, and whether the
/// crate's path ran. [`Error::Misuse`] for a count outside 1 to [`MAX_PARTS`].
pub(crate) fn split(
    x: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    parts: i64,
    (wgrad, kernels): (RawWeightGrad, RawKernels),
) -> Result<(Vec<Tensor>, bool)> {
    let count = match usize::try_from(parts) {
        Ok(n) if (1..=MAX_PARTS).contains(&parts) => n,
        _ => return Err(Error::Misuse(format!("linear split: {parts} pieces (1 to {MAX_PARTS})"))),
    };
    let raw = ffi::tcg_linear_inputs {
        x: tensor_ptr(x),
        weight: tensor_ptr(weight),
        bias: opt_tensor_ptr(bias),
        weight_grad_to: std::ptr::null_mut(),
    };
    let mut outs = vec![std::ptr::null_mut(); count];
    let mut ran_own = false;
    // SAFETY: `raw` holds live tensor handles (bias may be null) for the call; `outs` has a slot
    // for each of the `parts` pieces; the shim writes a new handle or null into each.
    check(unsafe { ffi::tcg_linear_split(&raw, parts, wgrad, kernels, outs.as_mut_ptr(), &mut ran_own) })?;
    // SAFETY: each slot holds a new handle made for this call (or null), owned by nobody else;
    // every slot is adopted before any is checked, so none is left behind.
    let adopted: Vec<Option<Tensor>> = outs.into_iter().map(|p| unsafe { adopt(p) }).collect();
    let pieces = adopted.into_iter().collect::<Option<Vec<Tensor>>>();
    let pieces = pieces.ok_or_else(|| Error::Libtorch("linear split: the shim returned no tensor".into()))?;
    Ok((pieces, ran_own))
}
