//! Weight shadows: the bf16 (or fp16) copy of each fp32 parameter made once per step and read by
//! the matmuls of the step, instead of autocast casting every weight again at each use.
//!
//! Inside a captured step autocast's weight-cast cache must be off (PyTorch refuses it on, and so
//! does this crate), so every forward casts every fp32 weight and bias to bf16 again: one small
//! kernel per use, mostly launch latency inside the graph. [`WeightShadows`] keeps a bf16 copy of
//! the parameters it is given; a step run with [`crate::StepOptions::weight_shadows`] holds one
//! ([`crate::TrainStep::shadow_parameters`]: its optimizer's parameters); the crate's Adam
//! writes each shadow as it updates its parameter, in the same kernel (no second pass over the
//! weights), the step copies any parameter changed otherwise ([`WeightShadows::f_refresh`]:
//! before each run and at the end of its body), and the crate's linear layers ([`crate::linear`],
//! [`linear`]) read it while autocast is on. A set is read only while its owner says so (the
//! step, or [`WeightShadows::f_read`]): there is no process-wide registry, and two models'
//! steps each refresh their own. The shadow is the same rounding the cast makes, and its gradient reaches the fp32
//! parameter through the same cast back, so the step equals the casting step bit for bit
//! (`tests/gpu_gpt.rs`). Outside such a step, or without a shadow, [`linear`] is `Tensor::linear`.
//!
//! ```no_run
//! # fn main() -> tch_cuda_graphs::Result<()> {
//! use tch::{nn, Device, Kind, Tensor};
//! use tch_cuda_graphs::optim::{Adam, AdamConfig, Optimizer};
//! use tch_cuda_graphs::{amp, shadow, StepOptions, TrainStep};
//! let vs = nn::VarStore::new(Device::Cuda(0));
//! let lin = nn::linear(vs.root() / "fc", 384, 384, Default::default());
//! let x = Tensor::zeros([64, 384], (Kind::Float, Device::Cuda(0)));
//! let opt = Adam::new(&vs, AdamConfig::adamw())?;
//! let options = StepOptions::default().autocast(Kind::BFloat16).weight_shadows(true);
//! let mut step = TrainStep::with_state(opt, &[("x", &x)], options, |opt, inp| {
//!     opt.zero_grad()?;
//!     let y = shadow::linear(&inp[0], &lin.ws, lin.bs.as_ref())?; // reads the bf16 shadows
//!     let loss = y.f_square()?.f_mean(None)?;
//!     amp::backward(&loss)?;
//!     opt.step()?;
//!     Ok(vec![loss.detach()])
//! })?;
//! step.shadow_parameters()?; // the optimizer's parameters, held and refreshed by the step
//! # let _ = step.run(&[&x])?; Ok(()) }
//! ```

use crate::error::Result;
use crate::kernels::Kernels;
use crate::linear::{f_apply, LinearConfig};
use crate::sys::shadow::{self as raw, ShadowsHandle};
use tch::{Kind, Tensor};

/// A set of shadows: a copy in one 16-bit dtype of each float32 CUDA parameter it was given.
/// Read while a step that holds it runs ([`crate::TrainStep::shadow_parameters`],
/// [`crate::TrainStep::set_weight_shadows`]) or while [`f_read`](Self::f_read)'s guard lives.
#[derive(Debug)]
pub struct WeightShadows {
    handle: ShadowsHandle,
    dtype: Kind,
    len: usize,
}

impl WeightShadows {
    /// Shadows of `dtype` (`Kind::BFloat16` or `Kind::Half`: the autocast dtype they will be
    /// read under) for the float32 CUDA tensors among `params` (others are left out: see
    /// [`len`](Self::len)). Made outside a capture.
    ///
    /// # Errors
    /// [`crate::Error::Misuse`] for another dtype, or inside a capture.
    pub fn new(params: &[Tensor], dtype: Kind) -> Result<Self> {
        let (handle, len) = ShadowsHandle::new(params, dtype)?;
        Ok(WeightShadows { handle, dtype, len })
    }

    /// How many parameters have a shadow.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether none does (CPU parameters, or not float32).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The shadows' dtype.
    pub fn dtype(&self) -> Kind {
        self.dtype
    }

    /// Copies each parameter whose shadow is stale into it (one multi-tensor copy per device,
    /// on the current stream; nothing where none is). A shadow is stale when its parameter
    /// changed since it was last copied or written: a new version (every in-place op, the
    /// crate's optimizers included, counts one) or new data (`set_data`). The crate's Adam
    /// writes the shadows of the set being read as it updates the parameters, so after its step
    /// nothing is stale. A graph replay counts no version: call this between replays of a graph
    /// that does not hold the set and something else changed the parameters. Inside a capture
    /// it records the copy of what is stale at capture, which every replay then makes.
    pub fn f_refresh(&self) -> Result<()> {
        self.handle.refresh()
    }

    /// How many shadows are stale now: what [`f_refresh`](Self::f_refresh) would copy.
    pub fn f_stale(&self) -> Result<usize> {
        self.handle.stale()
    }

    /// Keeps only the shadows that a layer asked for since the set was made (a linear layer, the
    /// head of a loss, a projection, while the set was read under autocast): the others are no
    /// longer written, refreshed or read, and [`len`](Self::len) counts what is left. A step
    /// does this after its first run before any capture, so an embedding table or a norm's
    /// weight, which no matmul reads, costs no write per step.
    pub(crate) fn f_keep_asked(&mut self) -> Result<()> {
        self.len = self.handle.keep_asked()?;
        Ok(())
    }

    /// Refreshes the stale shadows ([`f_refresh`](Self::f_refresh)) and has this thread's
    /// linear layers read them while the guard lives, for code that runs outside a
    /// [`crate::TrainStep`]. Under CUDA autocast of another dtype than the shadows', a linear
    /// layer fails with [`crate::Error::Misuse`].
    pub fn f_read(&self) -> Result<ReadShadows<'_>> {
        self.handle.refresh()?;
        let previous = self.handle.activate()?;
        Ok(ReadShadows { previous, _set: self })
    }
}

/// While it lives, this thread's linear layers read a [`WeightShadows`] ([`WeightShadows::f_read`]);
/// on drop, the set read before it (if any) is read again.
#[must_use = "the shadows are read only while the guard lives"]
#[derive(Debug)]
pub struct ReadShadows<'a> {
    previous: Option<ShadowsHandle>,
    _set: &'a WeightShadows,
}

impl Drop for ReadShadows<'_> {
    fn drop(&mut self) {
        let _ = raw::activate(self.previous.as_ref());
    }
}

/// `x · weightᵀ + bias` (as `Tensor::linear`), reading the shadows of `weight` and `bias` where
/// a set is read: [`crate::linear::f_apply`] on ATen's kernels.
pub fn linear(x: &Tensor, weight: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
    f_apply(x, weight, bias, &LinearConfig { kernels: Kernels::PyTorch, ..Default::default() })
}
