//! `csrc/gelu.cpp` (and `csrc/cuda/gelu_own.cpp` behind it): bias + GELU.

use super::kernels::RawKernels;
use super::{adopt_some, check, ffi, opt_tensor_ptr, tensor_ptr};
use crate::error::Result;
use tch::Tensor;

pub(crate) use ffi::tcg_gelu_form as RawGeluForm;

/// gelu(x + bias) in `x`'s dtype, and whether the crate's kernels ran.
pub(crate) fn gelu(
    x: &Tensor,
    bias: Option<&Tensor>,
    form: RawGeluForm,
    kernels: RawKernels,
) -> Result<(Tensor, bool)> {
    let (mut out, mut ran_own) = (std::ptr::null_mut(), false);
    // SAFETY: live tensor handles (or null for no bias) for the call; the out slots are valid;
    // the shim writes a new handle or null into `out`.
    check(unsafe { ffi::tcg_gelu(tensor_ptr(x), opt_tensor_ptr(bias), form, kernels, &mut out, &mut ran_own) })?;
    // SAFETY: the slot holds a new handle made for this call (or null), owned by nobody else.
    let y = unsafe { adopt_some(out, "gelu")? };
    Ok((y, ran_own))
}
