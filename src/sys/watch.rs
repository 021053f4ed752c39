//! `csrc/watch.cpp`: tensor watches (storage identity checks).

use super::{check, ffi, non_null, take_message, tensor_ptr, tensor_ptrs};
use crate::error::Result;
use std::ptr::NonNull;
use tch::Tensor;

/// What [`WatchHandle::check`] found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Checked {
    /// Every watched tensor has the storage, dtype and shape it had.
    Unchanged,
    /// The tensor at `index` (in the order added) changed; `detail` says how.
    Stale { index: usize, detail: String },
}

/// The shim's watch, freed on drop.
#[derive(Debug)]
pub(crate) struct WatchHandle(NonNull<ffi::tcg_watch>);

// SAFETY: the shim's watch holds only at::Tensor references (whose refcounts are atomic and
// usable from any thread) and plain data; it has no thread affinity. Mutation goes through
// `&mut self`, and `check` only reads.
unsafe impl Send for WatchHandle {}

impl WatchHandle {
    pub(crate) fn new() -> Result<Self> {
        let mut raw = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out pointer; on success it holds a watch we own.
        check(unsafe { ffi::tcg_watch_new(&mut raw) })?;
        non_null(raw, "tensor watch").map(WatchHandle)
    }

    /// Adds `tensors`, recording their storage now (the watch keeps references to them).
    pub(crate) fn add(&mut self, tensors: &[&Tensor]) -> Result<()> {
        let ptrs = tensor_ptrs(tensors.iter().copied());
        // SAFETY: the handle is live; `ptrs` holds live tensor handles borrowed for the call
        // (the shim copies the at::Tensor references it keeps).
        check(unsafe { ffi::tcg_watch_add(self.0.as_ptr(), ptrs.as_ptr(), ptrs.len()) })
    }

    pub(crate) fn refresh(&mut self) -> Result<()> {
        // SAFETY: the handle is live and exclusively borrowed; the shim re-reads its tensors.
        check(unsafe { ffi::tcg_watch_refresh(self.0.as_ptr()) })
    }

    pub(crate) fn check(&self) -> Result<Checked> {
        let mut index = usize::MAX;
        // SAFETY: the handle is live; `index` is a valid out pointer. The shim only reads.
        let status = unsafe { ffi::tcg_watch_check(self.0.as_ptr(), &mut index) };
        if status == ffi::tcg_status::TCG_STALE {
            return Ok(Checked::Stale { index, detail: take_message() });
        }
        check(status).map(|()| Checked::Unchanged)
    }
}

impl Drop for WatchHandle {
    fn drop(&mut self) {
        // SAFETY: the pointer came from tcg_watch_new and is freed exactly once, here; the shim's
        // free never throws.
        unsafe { ffi::tcg_watch_free(self.0.as_ptr()) }
    }
}

/// Bytes of the storage `t` views (0 for an undefined tensor).
pub(crate) fn storage_nbytes(t: &Tensor) -> Result<usize> {
    let mut n = 0usize;
    // SAFETY: `t` is live for the call; `n` is a valid out pointer. The shim only reads.
    check(unsafe { ffi::tcg_watch_storage_nbytes(tensor_ptr(t), &mut n) })?;
    Ok(n)
}
