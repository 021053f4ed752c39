//! The crate's one error type, and the check every FFI status goes through.

use crate::ffi;
use std::ffi::CStr;

/// Everything that can go wrong in this crate. Match on the variant; the message is for people.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No CUDA device is usable: the crate was built against a CPU-only libtorch, or the driver
    /// reports no device. The eager paths ([`crate::TrainStep`] on CPU, the optimizers) still work.
    #[error("no CUDA device: {0}")]
    NoCuda(String),
    /// CUDA invalidated the stream capture, typically because the captured work synchronized
    /// with the host (`.item()`, `f64::try_from`, `.to(Device::Cpu)`, printing a tensor) or used
    /// an API that is illegal during capture. The capture was torn down; the process can run
    /// eager CUDA work and capture again.
    #[error("CUDA graph capture was invalidated (a host sync or an illegal call during capture?): {0}")]
    CaptureInvalidated(String),
    /// An API used out of order or with invalid arguments: replay before capture, capture twice,
    /// `capture_end` without `capture_begin`, node queries on a graph that was not kept, ...
    #[error("misuse of tch-cuda-graphs: {0}")]
    Misuse(String),
    /// A batch fed to a static input does not match it; nothing was copied.
    #[error("static input `{name}` (#{index}) mismatch: expected {expected}, got {got}")]
    InputMismatch {
        /// The input's name, as declared.
        name: String,
        /// Its position among the step's inputs.
        index: usize,
        /// Shape, dtype and device of the static input.
        expected: String,
        /// Shape, dtype and device of what was given.
        got: String,
    },
    /// An error reported by libtorch or the CUDA runtime, with its message.
    #[error("libtorch/CUDA error: {0}")]
    Torch(String),
}

impl From<tch::TchError> for Error {
    fn from(e: tch::TchError) -> Self {
        Error::Torch(e.to_string())
    }
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Reads and clears this thread's shim error message (git2-style: read once, cannot leak into
/// the next call).
fn take_last_error() -> String {
    // SAFETY: tcg_take_last_error has no preconditions; it returns NULL or a malloc'ed,
    // NUL-terminated string that we own and release with tcg_string_free exactly once.
    unsafe {
        let p = ffi::tcg_take_last_error();
        if p.is_null() {
            return "unknown error (the shim left no message)".to_owned();
        }
        let s = CStr::from_ptr(p).to_string_lossy().into_owned();
        ffi::tcg_string_free(p);
        s
    }
}

/// Turns a shim status into a `Result`, taking the thread-local message on failure.
pub(crate) fn check(status: ffi::tcg_status) -> Result<()> {
    match status {
        ffi::TCG_OK => Ok(()),
        ffi::TCG_NO_CUDA => Err(Error::NoCuda(take_last_error())),
        ffi::TCG_CAPTURE_INVALIDATED => Err(Error::CaptureInvalidated(take_last_error())),
        ffi::TCG_MISUSE => Err(Error::Misuse(take_last_error())),
        _ => Err(Error::Torch(take_last_error())),
    }
}
