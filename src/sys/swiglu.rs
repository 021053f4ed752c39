//! `csrc/swiglu.cpp` (and `csrc/cuda/swiglu_own.cpp` behind it): SwiGLU.

use super::kernels::RawKernels;
use super::{adopt_some, check, ffi, tensor_ptr};
use crate::error::Result;
use tch::Tensor;

/// silu(gate) · up of `h` = [gate | up], and whether the crate's kernels ran.
pub(crate) fn swiglu(h: &Tensor, kernels: RawKernels) -> Result<(Tensor, bool)> {
    let (mut out, mut ran_own) = (std::ptr::null_mut(), false);
    // SAFETY: a live tensor handle for the call; the out slots are valid; the shim writes a new
    // handle or null into `out`.
    check(unsafe { ffi::tcg_swiglu(tensor_ptr(h), kernels, &mut out, &mut ran_own) })?;
    // SAFETY: the slot holds a new handle made for this call (or null), owned by nobody else.
    let y = unsafe { adopt_some(out, "swiglu")? };
    Ok((y, ran_own))
}
