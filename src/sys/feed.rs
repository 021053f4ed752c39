//! `csrc/feed.cpp`: copies for feeding batches, pinned memory.

use super::{adopt_some, check, ffi, tensor_ptr};
use crate::error::Result;
use tch::Tensor;

/// `dst.copy_(src, non_blocking)`, in place under no_grad.
pub(crate) fn copy(dst: &mut Tensor, src: &Tensor, non_blocking: bool) -> Result<()> {
    // SAFETY: both handles are live for the call; the shim copies data in place.
    check(unsafe { ffi::tcg_feed_copy(tensor_ptr(dst), tensor_ptr(src), non_blocking) })
}

/// Whether the CPU tensor `t` is page-locked.
pub(crate) fn is_pinned(t: &Tensor) -> Result<bool> {
    let mut out = false;
    // SAFETY: `t` is live for the call; `out` is a valid out pointer. The shim only reads.
    check(unsafe { ffi::tcg_feed_is_pinned(tensor_ptr(t), &mut out) })?;
    Ok(out)
}

/// A page-locked copy of the CPU tensor `t`.
pub(crate) fn pin(t: &Tensor) -> Result<Tensor> {
    let mut out: ffi::tcg_tensor = std::ptr::null_mut();
    // SAFETY: `t` is live for the call; `out` is a valid out slot.
    check(unsafe { ffi::tcg_feed_pin(tensor_ptr(t), &mut out) })?;
    // SAFETY: on success `out` is a new heap at::Tensor that nobody else owns.
    unsafe { adopt_some(out, "pin_memory") }
}
