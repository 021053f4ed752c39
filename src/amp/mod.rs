//! Mixed precision: [`Autocast`], a guard that turns CUDA autocast on (bf16 or fp16), and
//! [`GradScaler`], PyTorch's loss scaler kept entirely on the device, so a whole fp16 step
//! (scale, backward, unscale and inf check, skipped or applied update, scale update) is
//! captured.
//!
//! # Autocast and graphs
//! Autocast caches the casts of the fp32 weights ("weight-cast cache") for the life of the
//! autocast region. Captured, a cached cast would be recorded once and every replay would read
//! the stale cast while the weights change; PyTorch refuses graphed callables with the cache
//! on for that reason. So [`crate::TrainStep`] (with [`crate::StepOptions::autocast`]) runs
//! every step, eager warmup and capture alike, with the cache **off**: the cast kernels are part
//! of every step and of every replay, and eager and graphed steps are the same kernels.
//! [`crate::CudaGraph::capture`] refuses to start under an autocast region whose cache is on
//! ([`crate::Error::Misuse`]).

mod scaler;

pub use scaler::{GradScaler, ScalerConfig};

use crate::error::Result;
use crate::sys::amp::{autocast_state, AutocastHandle};
use tch::Kind;

/// CUDA autocast on with a dtype until dropped; the previous autocast state (enabled, dtype,
/// cache) comes back on drop, panics included (a guard, not a closure). Autocast state is
/// per thread, so the guard is neither `Send` nor `Sync`.
///
/// ```no_run
/// # fn main() -> tch_cuda_graphs::Result<()> {
/// use tch::{Device, Kind, Tensor};
/// use tch_cuda_graphs::amp::Autocast;
/// let a = Tensor::randn([64, 64], (Kind::Float, Device::Cuda(0)));
/// {
///     let _bf16 = Autocast::new(Kind::BFloat16, false)?;
///     assert_eq!(a.matmul(&a).kind(), Kind::BFloat16);
/// }
/// assert_eq!(a.matmul(&a).kind(), Kind::Float);
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Autocast {
    _handle: AutocastHandle,
}

/// The thread's CUDA autocast state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AutocastState {
    /// Whether CUDA autocast is on.
    pub enabled: bool,
    /// Its dtype.
    pub dtype: Kind,
    /// Whether the weight-cast cache is on.
    pub cache: bool,
}

impl Autocast {
    /// Turns CUDA autocast on with `dtype` (`Kind::BFloat16` or `Kind::Half`); `cache` turns
    /// the weight-cast cache on (keep it off for anything captured).
    pub fn new(dtype: Kind, cache: bool) -> Result<Self> {
        Ok(Autocast { _handle: AutocastHandle::enter(dtype, cache)? })
    }

    /// CUDA autocast off until dropped (the previous state comes back then). For backward:
    /// PyTorch runs backward outside the autocast region, and libtorch's autograd engine carries
    /// the caller's autocast state into backward, where it only adds casts. See [`backward`].
    pub fn suspend() -> Result<Self> {
        Ok(Autocast { _handle: AutocastHandle::suspend()? })
    }

    /// The current thread's CUDA autocast state.
    pub fn state() -> Result<AutocastState> {
        let (enabled, dtype, cache) = autocast_state()?;
        Ok(AutocastState { enabled, dtype, cache })
    }
}

/// `loss.backward()` with CUDA autocast suspended, as PyTorch runs it (outside the `autocast`
/// region). Use it inside a step run under [`crate::StepOptions::autocast`].
///
/// ```no_run
/// # fn main() -> tch_cuda_graphs::Result<()> {
/// # let loss = tch::Tensor::from(1.0f32);
/// tch_cuda_graphs::amp::backward(&loss)?;
/// # Ok(()) }
/// ```
pub fn backward(loss: &tch::Tensor) -> Result<()> {
    let _off = Autocast::suspend()?;
    Ok(loss.f_backward()?)
}
