//! `csrc/cuda/conditional.cpp`: conditional IF / WHILE nodes inside a capture.

use super::{check, ffi, graph::RawPoolId, non_null, opt_tensor_ptr, tensor_ptr};
use crate::error::Result;
use std::ptr::NonNull;
use tch::Tensor;

/// A conditional node's body being captured: ended by [`CondHandle::end`]; dropped before
/// that, the body's capture is ended and discarded (an error or a panic in the body).
#[derive(Debug)]
pub(crate) struct CondHandle(NonNull<ffi::tcg_cond>);

impl CondHandle {
    /// Adds an IF / IF_NOT node (`counters` `None`) or a WHILE node (`counters` the iteration
    /// counter and the limit flag, int32 on the device; at most `max_iters` iterations) on
    /// `cond` to the capture under way, and starts capturing its body, allocating from `pool`.
    pub(crate) fn begin(
        cond: &Tensor,
        negate: bool,
        pool: RawPoolId,
        max_iters: i64,
        counters: Option<(&Tensor, &Tensor)>,
    ) -> Result<Self> {
        let kind = match (counters.is_some(), negate) {
            (true, _) => ffi::tcg_cond_kind::TCG_COND_WHILE,
            (false, false) => ffi::tcg_cond_kind::TCG_COND_IF,
            (false, true) => ffi::tcg_cond_kind::TCG_COND_IF_NOT,
        };
        let counter = opt_tensor_ptr(counters.map(|c| c.0));
        let hit = opt_tensor_ptr(counters.map(|c| c.1));
        let mut raw = std::ptr::null_mut();
        // SAFETY: `cond`, and the counters when given, are live tensor handles borrowed for the
        // call; `raw` is a valid out pointer and on success holds a handle we own.
        check(unsafe { ffi::tcg_cond_begin(kind, tensor_ptr(cond), pool, max_iters, counter, hit, &mut raw) })?;
        non_null(raw, "conditional node").map(CondHandle)
    }

    /// Ends the body's capture (the shim undoes everything on failure).
    pub(crate) fn end(self) -> Result<()> {
        // SAFETY: the handle is live; it is freed when `self` drops right after.
        check(unsafe { ffi::tcg_cond_end(self.0.as_ptr()) })
    }
}

impl Drop for CondHandle {
    fn drop(&mut self) {
        // SAFETY: the handle came from tcg_cond_begin and is freed once, here; never throws.
        unsafe { ffi::tcg_cond_free(self.0.as_ptr()) }
    }
}
