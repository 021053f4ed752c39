//! Weight shadows: the bf16 (or fp16) copy of each fp32 parameter made once per step and read by
//! the matmuls of the step, instead of autocast casting every weight again at each use.
//!
//! Inside a captured step autocast's weight-cast cache must be off (PyTorch refuses it on, and so
//! does this crate), so every forward casts every fp32 weight and bias to bf16 again: one small
//! kernel per use, mostly launch latency inside the graph. [`WeightShadows`] keeps a bf16 copy of
//! the parameters it is given; a step run with [`crate::StepOptions::weight_shadows`] refreshes
//! them all with one multi-tensor copy before its body, and [`linear`] reads them while autocast
//! is on. The shadow is the same rounding the cast makes, and its gradient reaches the fp32
//! parameter through the same cast back, so the step equals the casting step bit for bit
//! (`tests/gpu_gpt.rs`). Outside such a step, or without a shadow, [`linear`] is `Tensor::linear`.
//!
//! ```no_run
//! # fn main() -> tch_cuda_graphs::Result<()> {
//! use tch::{nn, Device, Kind, Tensor};
//! use tch_cuda_graphs::shadow::{self, WeightShadows};
//! use tch_cuda_graphs::{StepOptions, TrainStep};
//! let vs = nn::VarStore::new(Device::Cuda(0));
//! let lin = nn::linear(vs.root() / "fc", 384, 384, Default::default());
//! let _shadows = WeightShadows::new(&vs.trainable_variables(), Kind::BFloat16)?;
//! let x = Tensor::zeros([64, 384], (Kind::Float, Device::Cuda(0)));
//! let options = StepOptions::default().autocast(Kind::BFloat16).weight_shadows(true);
//! let mut step = TrainStep::new(&[("x", &x)], options, move |inp| {
//!     let y = shadow::linear(&inp[0], &lin.ws, lin.bs.as_ref())?; // reads the bf16 shadows
//!     Ok(vec![y.sum(Kind::Float)])
//! })?;
//! # let _ = step.run(&[&x])?; Ok(()) }
//! ```

use crate::error::{Error, Result};
use crate::sys::linear::{self as raw_linear, RawWeightGrad};
use crate::sys::optim::RawKernels;
use crate::sys::shadow as raw;
use tch::{Kind, Tensor};

/// The shadows of a set of parameters, registered while this value lives (their copies are
/// refreshed by every step run with [`crate::StepOptions::weight_shadows`]).
#[derive(Debug)]
pub struct WeightShadows {
    params: Vec<Tensor>,
    made: usize,
}

impl WeightShadows {
    /// Shadows of `dtype` (`Kind::BFloat16` or `Kind::Half`, the autocast dtype) for the float32
    /// CUDA tensors among `params` (others are left out). Made outside a capture.
    pub fn new(params: &[Tensor], dtype: Kind) -> Result<Self> {
        let made = raw::register(params, dtype)?;
        Ok(WeightShadows { params: params.iter().map(Tensor::shallow_clone).collect(), made })
    }

    /// How many parameters got a shadow.
    pub fn len(&self) -> usize {
        self.made
    }

    /// Whether none did (CPU parameters, or not float32).
    pub fn is_empty(&self) -> bool {
        self.made == 0
    }
}

impl Drop for WeightShadows {
    fn drop(&mut self) {
        let _ = raw::unregister(&self.params);
    }
}

/// `x · weightᵀ + bias` (as `Tensor::linear`), reading the shadows of `weight` and `bias` inside
/// a step run with weight shadows under autocast: [`crate::linear::apply`] on ATen's path.
pub fn linear(x: &Tensor, weight: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
    let rounded = RawWeightGrad::TCG_WEIGHT_GRAD_ROUNDED;
    Ok(raw_linear::forward(x, weight, bias, rounded, RawKernels::TCG_KERNELS_PYTORCH)?.0)
}

/// While it lives, this thread reads shadows, refreshed when it was made.
pub(crate) struct ActiveShadows {
    was: bool,
}

impl ActiveShadows {
    /// Refreshes every shadow (one multi-tensor copy per device and dtype) and turns reading on.
    /// A step on a CUDA device that finds no shadow to refresh is refused: its shadows were
    /// dropped (`let _ = WeightShadows::new(..)`) or never made, and it would run without them.
    pub(crate) fn begin(cuda: bool) -> Result<Self> {
        if raw::refresh()? == 0 && cuda {
            return Err(Error::Misuse(
                "weight_shadows(true), but no parameter has a shadow: call TrainStep::shadow_parameters, or keep \
                 the WeightShadows alive while the step runs"
                    .into(),
            ));
        }
        Ok(ActiveShadows { was: raw::set_active(true)? })
    }
}

impl Drop for ActiveShadows {
    fn drop(&mut self) {
        let _ = raw::set_active(self.was);
    }
}
