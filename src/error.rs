//! The crate's one error type (the safe layer, `sys`, turns every shim status into it).
//!
//! Errors are classified by what the shim and CUDA report (the C++ exception's type, the CUDA
//! error code, the capture stream's status, the allocator's OOM counter), never by searching
//! message texts. The underlying error stays reachable as the [`std::error::Error::source`].

/// Everything that can go wrong in this crate. Match on the variant; the message is for people.
///
/// Variants that wrap another error ([`Error::CaptureInvalidated`], [`Error::OutOfMemory`],
/// [`Error::Torch`], [`Error::User`]) keep it as their `source` and do not repeat it in their
/// own message: print the chain (e.g. anyhow's `{:#}`) to see both.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// No CUDA device is usable: the crate was built without CUDA (a CPU-only libtorch, or
    /// `TCH_CUDA_GRAPHS_NO_CUDA=1` at build time), or the driver reports no device. The eager
    /// paths ([`crate::TrainStep`] on CPU, the optimizers) still work.
    #[error("no CUDA device: {0}")]
    NoCuda(String),
    /// CUDA invalidated the stream capture, typically because the captured work synchronized
    /// with the host (`.item()`, `f64::try_from`) or made a call that is illegal during capture.
    /// The capture was torn down; the process can run eager CUDA work and capture again.
    /// `source` is the error that surfaced first (from the closure, or from ending the capture).
    #[error("CUDA graph capture was invalidated (a host sync or an illegal call during capture?)")]
    CaptureInvalidated {
        /// What surfaced: the closure's error, or the shim's report of the failed capture end.
        #[source]
        source: Box<Error>,
    },
    /// The CUDA caching allocator ran out of device memory (libtorch's `c10::OutOfMemoryError`,
    /// seen as such by the shim or through the allocator's OOM counter during a capture or its
    /// warmup). Anything under way was torn down.
    #[error("CUDA out of memory")]
    OutOfMemory {
        /// The error that reported it.
        #[source]
        source: Box<Error>,
    },
    /// An API used out of order or with invalid arguments: replay before capture, capture twice,
    /// `capture_end` without `capture_begin`, node queries on a graph that was not kept, a
    /// capture started from inside another capture, ...
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
    /// A tensor a captured graph uses no longer has the storage it had at capture (`set_data`,
    /// `VarStore::set_kind`, a resize): replaying would read or write freed memory, so nothing
    /// ran. Build the step again (capture again) after changing parameters this way.
    #[error("stale graph: {what} changed since capture: {detail}; capture the step again")]
    StaleGraph {
        /// Which tensor: "static input `x`", or "watched tensor #i".
        what: String,
        /// What changed (storage, dtype or shape, with the values).
        detail: String,
    },
    /// A checkpoint that does not fit what it is loaded into (another model, another optimizer
    /// or group layout, other shapes or dtypes). Nothing was changed.
    #[error("checkpoint does not fit: {0}")]
    Checkpoint(String),
    /// A checkpoint file that cannot be read or written (missing, corrupt, not safetensors).
    /// Nothing was changed.
    #[error("checkpoint file {path}")]
    CheckpointFile {
        /// The file.
        path: String,
        /// What tch (safetensors) reported.
        #[source]
        source: tch::TchError,
    },
    /// A file of GEMM algorithm choices ([`crate::gemm::f_read_file`], [`crate::gemm::f_write_file`])
    /// that cannot be read or written (`source`: the I/O error; a missing file's kind is
    /// `NotFound`), is not such a file, or was written for another GPU, cuBLASLt or libtorch
    /// (`source` is `None`; the reason names both sides). No choice was changed.
    #[error("GEMM choices file {path}: {reason}")]
    GemmFile {
        /// The file.
        path: String,
        /// What is wrong with it.
        reason: String,
        /// The I/O error, where there was one.
        #[source]
        source: Option<std::io::Error>,
    },
    /// c10d reported an error: the store (a rank that never joined), the network, NCCL.
    #[error("distributed: {0}")]
    Distributed(String),
    /// [`dist::ProcessGroup::wait_device`](crate::dist::ProcessGroup::wait_device) gave up: the
    /// device made no progress within the timeout (a rank died, or stopped calling
    /// collectives). The group was aborted: its collectives are refused from now on.
    #[error("distributed timeout: {0}")]
    DistributedTimeout(String),
    /// What was asked for is not available in this build or on this device: the crate's own
    /// kernels forced ([`crate::kernels::Kernels::Own`]) where they were not built,
    /// have no code for the GPU, or do not take the tensors (the message says which).
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// An error from a tch call (libtorch through tch's C API).
    #[error("libtorch error (through tch)")]
    Torch(#[source] tch::TchError),
    /// An error that libtorch or the CUDA runtime reported to this crate's shim.
    #[error("libtorch/CUDA error: {0}")]
    Libtorch(String),
    /// An error of the caller's own, carried through a step closure unchanged (see
    /// [`Error::user`]); get it back with `source()` and `downcast_ref`.
    #[error("error in the user's step")]
    User(#[source] Box<dyn std::error::Error + Send + Sync>),
}

impl Error {
    /// Wraps an error of the caller's own so it can travel through a step closure (whose
    /// return type is this crate's [`Result`]) and come back out unchanged.
    ///
    /// ```
    /// use tch_cuda_graphs::Error;
    /// #[derive(Debug)]
    /// struct DataEnded;
    /// impl std::fmt::Display for DataEnded {
    ///     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result { f.write_str("data ended") }
    /// }
    /// impl std::error::Error for DataEnded {}
    ///
    /// let e = Error::user(DataEnded);
    /// match &e {
    ///     Error::User(inner) => assert!(inner.downcast_ref::<DataEnded>().is_some()),
    ///     other => panic!("{other:?}"),
    /// }
    /// ```
    pub fn user(e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        Error::User(e.into())
    }

    /// Whether this error means a capture was invalidated (directly, not through a source).
    pub fn is_capture_invalidated(&self) -> bool {
        matches!(self, Error::CaptureInvalidated { .. })
    }

    /// Whether this error is an out-of-memory error.
    pub fn is_out_of_memory(&self) -> bool {
        matches!(self, Error::OutOfMemory { .. })
    }
}

/// An [`Error`] as tch's error, so that `?` carries it out of code that returns
/// `Result<_, tch::TchError>` (a model's `forward`, tch-style `f_` functions). A
/// [`Error::Torch`] becomes the tch error it wraps; any other error travels as
/// `TchError::Io` of kind `Other`, whose inner error is this one, source chain included:
/// `io.get_ref().and_then(|e| e.downcast_ref::<tch_cuda_graphs::Error>())` gets it back.
///
/// ```
/// use tch_cuda_graphs::Error;
/// fn forward() -> Result<(), tch::TchError> {
///     Err(Error::Misuse("no input".into()))?
/// }
/// match forward() {
///     Err(tch::TchError::Io(io)) => {
///         let inner = io.get_ref().and_then(|e| e.downcast_ref::<Error>());
///         assert!(matches!(inner, Some(Error::Misuse(_))));
///     }
///     other => panic!("{other:?}"),
/// }
/// // and back into this crate's error, as it was
/// let back: Error = forward().unwrap_err().into();
/// assert!(matches!(back, Error::Misuse(_)));
/// ```
impl From<Error> for tch::TchError {
    fn from(e: Error) -> Self {
        match e {
            Error::Torch(t) => t,
            other => tch::TchError::Io(std::io::Error::other(other)),
        }
    }
}

/// A tch error as this crate's: [`Error::Torch`], except that one of this crate's errors that
/// travelled through tch's type (the `From` above) comes back as it was.
impl From<tch::TchError> for Error {
    fn from(e: tch::TchError) -> Self {
        let tch::TchError::Io(io) = e else { return Error::Torch(e) };
        let kind = io.kind();
        match io.into_inner().map(|inner| inner.downcast::<Error>()) {
            Some(Ok(ours)) => *ours,
            // any other I/O error, rebuilt as it was (its kind and inner error)
            Some(Err(inner)) => Error::Torch(tch::TchError::Io(std::io::Error::new(kind, inner))),
            None => Error::Torch(tch::TchError::Io(kind.into())),
        }
    }
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
