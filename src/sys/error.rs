//! `csrc/error.cpp`: statuses, the thread-local message, strings the shim hands over, fault
//! injection.

use super::ffi;
use crate::error::{Error, Result};
use std::ffi::{CStr, CString};
use std::os::raw::c_char;

/// Takes a string the shim allocated (NULL: `None`) and frees it.
///
/// # Safety
/// `p` is null or a string the shim malloc'ed for the caller, not yet freed.
pub(super) unsafe fn take_string(p: *mut c_char) -> Option<String> {
    if p.is_null() {
        return None;
    }
    // SAFETY: per the contract, `p` is a live NUL-terminated string that we own; it is freed
    // exactly once, here, after the copy.
    unsafe {
        let s = CStr::from_ptr(p).to_string_lossy().into_owned();
        ffi::tcg_string_free(p);
        Some(s)
    }
}

/// Reads and clears this thread's shim error message (git2-style: read once, cannot leak into
/// the next call).
pub(crate) fn take_message() -> String {
    // SAFETY: tcg_error_take_last has no preconditions; it returns NULL or a malloc'ed string
    // that is ours.
    unsafe { take_string(ffi::tcg_error_take_last()) }
        .unwrap_or_else(|| "unknown error (the shim left no message)".to_owned())
}

/// Turns a shim status into a `Result`, taking the thread-local message on failure.
pub(crate) fn check(status: ffi::tcg_status) -> Result<()> {
    use ffi::tcg_status as S;
    match status {
        S::TCG_OK => Ok(()),
        S::TCG_NO_CUDA => Err(Error::NoCuda(take_message())),
        S::TCG_CAPTURE_INVALIDATED => {
            Err(Error::CaptureInvalidated { source: Box::new(Error::Libtorch(take_message())) })
        }
        S::TCG_MISUSE => Err(Error::Misuse(take_message())),
        S::TCG_DIST => Err(Error::Distributed(take_message())),
        S::TCG_DIST_TIMEOUT => Err(Error::DistributedTimeout(take_message())),
        S::TCG_UNSUPPORTED => Err(Error::Unsupported(take_message())),
        S::TCG_OUT_OF_MEMORY => Err(Error::OutOfMemory { source: Box::new(Error::Libtorch(take_message())) }),
        // TCG_STALE is read by the watch, which knows the tensor's name; elsewhere it is plain,
        // as is TCG_ERROR (a libtorch or CUDA failure of no more specific kind).
        S::TCG_ERROR | S::TCG_STALE => Err(Error::Libtorch(take_message())),
        _ => Err(Error::Libtorch(take_message())),
    }
}

/// A string for the shim (NUL-terminated), or [`Error::Misuse`] if it holds a NUL.
pub(super) fn c_string(s: &str, what: &str) -> Result<CString> {
    CString::new(s).map_err(|_| Error::Misuse(format!("{what} contains a NUL byte")))
}

/// Arms (or, with `""`, disarms) the shim's fault point `name` for this thread.
pub(crate) fn testing_fail_next(name: &str) -> Result<()> {
    let name = c_string(name, "fault point name")?;
    // SAFETY: `name` is a NUL-terminated string that outlives the call; the shim copies it.
    check(unsafe { ffi::tcg_testing_fail_next(name.as_ptr()) })
}
