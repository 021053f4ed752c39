//! `csrc/loss.cpp` (and `csrc/cuda/loss_own.cpp` behind it): the fused cross-entropy.

use super::{adopt_some, check, ffi, tensor_ptr};
use crate::error::Result;
use tch::Tensor;

use super::kernels::RawKernels;
pub(crate) use ffi::tcg_linear_ce_method as RawLinearCeMethod;
pub(crate) use ffi::tcg_linear_ce_options as RawLinearCeOptions;

/// The mean cross-entropy of `logits` [rows, classes] against `targets` [rows] (differentiable),
/// and whether the crate's fused kernels ran.
pub(crate) fn cross_entropy(
    logits: &Tensor,
    targets: &Tensor,
    ignore_index: i64,
    kernels: RawKernels,
) -> Result<(Tensor, bool)> {
    let (mut out, mut ran_own) = (std::ptr::null_mut(), false);
    // SAFETY: live tensor handles for the call; the out slots are valid; the shim writes a new
    // handle or null into `out`.
    check(unsafe {
        ffi::tcg_loss_cross_entropy(
            tensor_ptr(logits),
            tensor_ptr(targets),
            ignore_index,
            kernels,
            &mut out,
            &mut ran_own,
        )
    })?;
    // SAFETY: the slot holds a new handle made for this call (or null), owned by nobody else.
    let loss = unsafe { adopt_some(out, "cross_entropy")? };
    Ok((loss, ran_own))
}

/// The mean cross-entropy of `h · weightᵀ` against `targets` as `options` say (the method, the
/// chunks' rows, the weight gradient's type) on the crate's path (differentiable in `h` and
/// `weight`), and whether that path ran.
pub(crate) fn linear_cross_entropy(
    h: &Tensor,
    weight: &Tensor,
    targets: &Tensor,
    options: RawLinearCeOptions,
    kernels: RawKernels,
) -> Result<(Tensor, bool)> {
    let (mut out, mut ran_own) = (std::ptr::null_mut(), false);
    // SAFETY: live tensor handles and options for the call; the out slots are valid; the shim
    // writes a new handle or null into `out`.
    check(unsafe {
        ffi::tcg_loss_linear_cross_entropy(
            tensor_ptr(h),
            tensor_ptr(weight),
            tensor_ptr(targets),
            &options,
            kernels,
            &mut out,
            &mut ran_own,
        )
    })?;
    // SAFETY: the slot holds a new handle made for this call (or null), owned by nobody else.
    let loss = unsafe { adopt_some(out, "linear_cross_entropy")? };
    Ok((loss, ran_own))
}
