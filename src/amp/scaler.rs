//! [`GradScaler`]: PyTorch's `torch.amp.GradScaler`, with every piece of state on the device.

use crate::capture::recording;
use crate::control::capture_unless;
use crate::error::{Error, Result};
use crate::optim::Optimizer;
use crate::stream::is_current_stream_capturing;
use crate::sys::amp as sys;
use std::collections::HashMap;
use tch::{Device, Kind, Tensor};

/// The scaler's settings (PyTorch's defaults).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ScalerConfig {
    /// The first scale. Default 2^16.
    pub init_scale: f64,
    /// The factor the scale grows by after `growth_interval` steps without inf/NaN. Default 2.
    pub growth_factor: f64,
    /// The factor the scale shrinks by on a step with inf/NaN. Default 0.5.
    pub backoff_factor: f64,
    /// Steps without inf/NaN before the scale grows. Default 2000.
    pub growth_interval: i64,
}

impl Default for ScalerConfig {
    fn default() -> Self {
        ScalerConfig { init_scale: 65536.0, growth_factor: 2.0, backoff_factor: 0.5, growth_interval: 2000 }
    }
}

/// Loss scaling for fp16 training with no host sync anywhere, so the whole step is captured.
///
/// Per step: `scale(&loss)` → backward → optionally `unscale(&opt)` and clip → `step(&mut opt)`
/// (checks the grads for inf/NaN on the device; the fused kernel divides by the scale and skips
/// the update where inf/NaN was found) → `update()` (halves the scale on inf/NaN, doubles it
/// after `growth_interval` clean steps). State: the scale (f32), the growth tracker (i32) and
/// the found-inf flag (f32), 0-d device tensors; [`state`](Self::state) gives them for
/// checkpoints.
///
/// ```no_run
/// # fn main() -> tch_cuda_graphs::Result<()> {
/// # use tch::{nn, nn::Module, Device, Kind, Tensor};
/// use tch_cuda_graphs::amp::{Autocast, GradScaler};
/// use tch_cuda_graphs::optim::{Adam, AdamConfig, Optimizer};
/// # let vs = nn::VarStore::new(Device::Cuda(0));
/// # let model = nn::linear(vs.root(), 8, 1, Default::default());
/// # let (x, y) = (Tensor::randn([4, 8], (Kind::Float, Device::Cuda(0))), Tensor::randn([4, 1], (Kind::Float, Device::Cuda(0))));
/// let mut opt = Adam::new(&vs, AdamConfig::default())?;
/// let mut scaler = GradScaler::new(Device::Cuda(0))?;
/// opt.zero_grad()?;
/// let loss = {
///     let _fp16 = Autocast::new(Kind::Half, false)?;
///     model.forward(&x).f_mse_loss(&y, tch::Reduction::Mean)?
/// };
/// scaler.scale(&loss)?.f_backward()?;
/// scaler.step(&mut opt)?;
/// scaler.update()?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct GradScaler {
    scale: Tensor,
    growth_tracker: Tensor,
    found_inf: Tensor,
    ones: Tensor,
    config: ScalerConfig,
    /// `unscale` ran in this step: the grads are unscaled already.
    unscaled: bool,
    /// Inside a capture, skip the optimizer with an IF node instead of the kernels' flag.
    if_node: bool,
}

impl GradScaler {
    /// A scaler on `device` with PyTorch's defaults.
    pub fn new(device: Device) -> Result<Self> {
        Self::with_config(device, ScalerConfig::default())
    }

    /// A scaler on `device` with `config`.
    pub fn with_config(device: Device, config: ScalerConfig) -> Result<Self> {
        let ok = config.init_scale > 0.0
            && config.growth_factor > 1.0
            && config.backoff_factor > 0.0
            && config.backoff_factor < 1.0
            && config.growth_interval > 0;
        if !ok {
            return Err(Error::Misuse(format!("invalid GradScaler config {config:?}")));
        }
        Ok(GradScaler {
            scale: Tensor::f_full([], config.init_scale, (Kind::Float, device))?,
            growth_tracker: Tensor::f_zeros([], (Kind::Int, device))?,
            found_inf: Tensor::f_zeros([], (Kind::Float, device))?,
            ones: Tensor::f_ones([], (Kind::Float, device))?,
            config,
            unscaled: false,
            if_node: false,
        })
    }

    /// Inside a capture, puts the optimizer step behind an IF node ([`crate::control`], CUDA
    /// 12.3+ drivers) that runs it only when no inf/NaN was found, instead of running the
    /// optimizer's kernels with the found-inf flag (which then leave every value as it was).
    /// The same results bit for bit either way (the same kernels, with or without the flag);
    /// a step with inf skips the optimizer's kernels. The node costs about as much as it saves
    /// unless inf steps are frequent (see `docs/mixed-precision.md`). Outside a capture
    /// (eager steps, warmup) the flag is used. Without a CUDA 12.3 driver the capture fails
    /// with [`Error::Unsupported`]. Default off.
    pub fn skip_with_if_node(mut self, yes: bool) -> Self {
        self.if_node = yes;
        self
    }

    /// `loss` times the scale (on the device).
    pub fn scale(&self, loss: &Tensor) -> Result<Tensor> {
        Ok(loss.f_mul(&self.scale)?)
    }

    /// Backward of the scaled loss, with autocast suspended ([`super::backward`]).
    pub fn backward(&self, loss: &Tensor) -> Result<()> {
        super::backward(&self.scale(loss)?)
    }

    fn check_unscale(&mut self, opt: &dyn Optimizer, inv_scale: &Tensor) -> Result<()> {
        let _ = self.found_inf.f_zero_()?;
        let grads: Vec<Tensor> = opt
            .params()
            .iter()
            .map(|p| p.f_grad())
            .collect::<Result<Vec<_>, _>>()?
            .into_iter()
            .filter(Tensor::defined)
            .collect();
        sys::check_unscale(&grads, &self.found_inf, inv_scale)
    }

    /// Divides the gradients of `opt` by the scale in place and records inf/NaN, so they can be
    /// clipped before [`step`](Self::step) (which then does not divide again).
    pub fn unscale(&mut self, opt: &dyn Optimizer) -> Result<()> {
        let inv = self.scale.f_reciprocal()?;
        self.check_unscale(opt, &inv)?;
        self.unscaled = true;
        Ok(())
    }

    /// The optimizer step: checks the grads for inf/NaN (unless [`unscale`](Self::unscale)
    /// did), then runs the fused update with the scale and the found-inf flag: skipped on the
    /// device where inf/NaN was found.
    pub fn step(&mut self, opt: &mut dyn Optimizer) -> Result<()> {
        let scale = if self.unscaled {
            self.unscaled = false;
            None
        } else {
            let ones = self.ones.shallow_clone();
            self.check_unscale(opt, &ones)?; // inv_scale 1: a check only
            Some(&self.scale)
        };
        if self.if_node && recording(self.found_inf.device()) && is_current_stream_capturing()? {
            return capture_unless(&self.found_inf, || opt.step_scaled(scale, None));
        }
        opt.step_scaled(scale, Some(&self.found_inf))
    }

    /// Updates the scale from this step's found-inf flag (PyTorch's `update()`, on the device).
    pub fn update(&mut self) -> Result<()> {
        let c = &self.config;
        sys::update_scale(
            &self.scale,
            &self.growth_tracker,
            &self.found_inf,
            c.growth_factor,
            c.backoff_factor,
            c.growth_interval,
        )
    }

    /// The scale (0-d float32 on the device).
    pub fn scale_tensor(&self) -> &Tensor {
        &self.scale
    }

    /// Clean steps since the last growth or backoff (0-d int32 on the device).
    pub fn growth_tracker(&self) -> &Tensor {
        &self.growth_tracker
    }

    /// 1 if the last checked step had inf/NaN gradients (0-d float32 on the device).
    pub fn found_inf(&self) -> &Tensor {
        &self.found_inf
    }

    /// The scaler's state for checkpoints (`scaler.scale`, `scaler.growth_tracker`): pass it
    /// as extra tensors to [`crate::checkpoint::save`].
    pub fn state(&self) -> Vec<(String, Tensor)> {
        vec![
            ("scaler.scale".to_owned(), self.scale.shallow_clone()),
            ("scaler.growth_tracker".to_owned(), self.growth_tracker.shallow_clone()),
        ]
    }

    /// Restores what [`state`](Self::state) saved (from [`crate::checkpoint::load`]'s extras),
    /// in place; checked first.
    pub fn load_state(&mut self, extra: &HashMap<String, Tensor>) -> Result<()> {
        let get = |k: &str, kind: Kind| -> Result<&Tensor> {
            let t = extra.get(k).ok_or_else(|| Error::Checkpoint(format!("`{k}` is missing")))?;
            if t.numel() != 1 || t.kind() != kind {
                return Err(Error::Checkpoint(format!(
                    "`{k}` is {:?} {:?}, expected a {kind:?} scalar",
                    t.size(),
                    t.kind()
                )));
            }
            Ok(t)
        };
        let (s, g) = (get("scaler.scale", Kind::Float)?, get("scaler.growth_tracker", Kind::Int)?);
        let _no_grad = tch::no_grad_guard();
        self.scale.f_copy_(&s.f_reshape([])?)?;
        self.growth_tracker.f_copy_(&g.f_reshape([])?)?;
        Ok(())
    }
}
