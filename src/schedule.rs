//! Learning-rate schedules, applied per step without a host sync.
//!
//! A [`Schedule`] gives a factor of each group's base learning rate for the t-th optimizer step
//! (t from 1). Two ways to apply it:
//! - [`LrScheduler`] computes the rate on the host and fills each group's learning-rate tensor
//!   (an eager op queued on the stream: no sync). Call [`LrScheduler::step`] before each
//!   training step.
//! - [`DeviceLrScheduler`] goes further than PyTorch: it keeps the step count on the device and
//!   computes the rate there, inside the step closure, so a captured step writes its own
//!   learning rate on every replay and needs no host write at all.
//!
//! Both compute in float64 with the same operations in the same order, so they agree to the
//! last bit of the float32 learning rate except where the device's `cos` or `pow` rounds
//! differently. On a CUDA device the built-in schedules ([`WarmupCosine`], [`LinearWarmup`],
//! [`StepDecay`]) take one launch of the crate's own kernel per step
//! ([`Schedule::kernel_form`]); a schedule of your own runs its
//! [`factor_tensor`](Schedule::factor_tensor), about twenty small launches.

use crate::error::{Error, Result};
use crate::optim::LrHandle;
use crate::scalar::cpu_f64;
use crate::sys::optim::{lr_schedule_step, ScheduleForm, ScheduleKind};
use std::f64::consts::PI;
use tch::{Kind, Tensor};

/// A learning-rate schedule: the factor of the base rate for step `t` (1-based), on the host
/// and as tensor operations (for [`DeviceLrScheduler`]).
pub trait Schedule: Send {
    /// The factor for the t-th optimizer step (t ≥ 1).
    fn factor(&self, t: u64) -> f64;
    /// The same, from a 0-d float64 tensor holding t; returns a 0-d float64 tensor. No sync.
    fn factor_tensor(&self, t: &Tensor) -> Result<Tensor>;
    /// The schedule as the crate's own kernel computes it, where it can: [`DeviceLrScheduler`]
    /// then advances its counter and writes every group's rate in one launch. `None` (the
    /// default, and what a schedule of your own returns): [`factor_tensor`](Self::factor_tensor)
    /// computes it.
    fn kernel_form(&self) -> Option<KernelForm> {
        None
    }
}

/// A built-in schedule as the own kernel takes it ([`Schedule::kernel_form`]); only this crate's
/// schedules make one.
#[derive(Clone, Copy, Debug)]
pub struct KernelForm(ScheduleForm);

impl KernelForm {
    fn of(kind: ScheduleKind, warmup: u64, total: u64, min_factor: f64, step_size: u64, gamma: f64) -> Self {
        KernelForm(ScheduleForm {
            kind,
            warmup: warmup as f64,
            total: total as f64,
            min_factor,
            step_size: step_size as f64,
            gamma,
        })
    }
}

/// Linear warmup from `1/warmup` to 1 over the first `warmup` steps, then cosine decay to
/// `min_factor` at step `total` (and `min_factor` after).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WarmupCosine {
    /// Warmup steps (0: none).
    pub warmup: u64,
    /// The step at which the decay reaches `min_factor`.
    pub total: u64,
    /// The final factor.
    pub min_factor: f64,
}

impl Schedule for WarmupCosine {
    fn factor(&self, t: u64) -> f64 {
        let (t, w) = (t as f64, self.warmup as f64);
        if self.warmup > 0 && t <= w {
            return t / w;
        }
        let span = (self.total as f64 - w).max(1.0);
        let p = ((t - w) / span).clamp(0.0, 1.0);
        ((p * PI).cos() + 1.0) * 0.5 * (1.0 - self.min_factor) + self.min_factor
    }

    fn factor_tensor(&self, t: &Tensor) -> Result<Tensor> {
        let w = self.warmup as f64;
        let span = (self.total as f64 - w).max(1.0);
        let p = t.f_sub(&cpu_f64(w)?)?.f_div(&cpu_f64(span)?)?;
        let p = p.f_clamp_min_tensor(&p.f_zeros_like()?)?.f_clamp_max_tensor(&p.f_ones_like()?)?;
        let cosine = p
            .f_mul(&cpu_f64(PI)?)?
            .f_cos()?
            .f_add(&cpu_f64(1.0)?)?
            .f_mul(&cpu_f64(0.5)?)?
            .f_mul(&cpu_f64(1.0 - self.min_factor)?)?
            .f_add(&cpu_f64(self.min_factor)?)?;
        if self.warmup == 0 {
            return Ok(cosine);
        }
        let warm = t.f_div(&cpu_f64(w)?)?;
        Ok(warm.f_where_self(&t.f_le_tensor(&cpu_f64(w)?)?, &cosine)?)
    }

    fn kernel_form(&self) -> Option<KernelForm> {
        Some(KernelForm::of(ScheduleKind::TCG_SCHEDULE_WARMUP_COSINE, self.warmup, self.total, self.min_factor, 1, 1.0))
    }
}

/// Linear warmup over `warmup` steps, then constant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LinearWarmup {
    /// Warmup steps.
    pub warmup: u64,
}

impl Schedule for LinearWarmup {
    fn factor(&self, t: u64) -> f64 {
        if self.warmup == 0 {
            1.0
        } else {
            (t as f64 / self.warmup as f64).min(1.0)
        }
    }

    fn factor_tensor(&self, t: &Tensor) -> Result<Tensor> {
        if self.warmup == 0 {
            return Ok(t.f_ones_like()?);
        }
        let f = t.f_div(&cpu_f64(self.warmup as f64)?)?;
        Ok(f.f_clamp_max_tensor(&f.f_ones_like()?)?)
    }

    fn kernel_form(&self) -> Option<KernelForm> {
        Some(KernelForm::of(ScheduleKind::TCG_SCHEDULE_LINEAR_WARMUP, self.warmup, 0, 0.0, 1, 1.0))
    }
}

/// Multiply by `gamma` every `step_size` steps (PyTorch's `StepLR`): `gamma^floor((t-1)/step_size)`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepDecay {
    /// Steps between decays (at least 1).
    pub step_size: u64,
    /// The decay factor.
    pub gamma: f64,
}

impl Schedule for StepDecay {
    fn factor(&self, t: u64) -> f64 {
        let k = (t.saturating_sub(1) / self.step_size.max(1)) as f64;
        self.gamma.powf(k)
    }

    fn factor_tensor(&self, t: &Tensor) -> Result<Tensor> {
        let k = t.f_sub(&cpu_f64(1.0)?)?;
        let k = k.f_clamp_min_tensor(&k.f_zeros_like()?)?.f_div(&cpu_f64(self.step_size.max(1) as f64)?)?.f_floor()?;
        // gamma^k as pow(Scalar, Tensor) computes it: gamma as a tensor on k's device
        Ok(k.f_ones_like()?.f_mul(&cpu_f64(self.gamma)?)?.f_pow(&k)?)
    }

    fn kernel_form(&self) -> Option<KernelForm> {
        Some(KernelForm::of(ScheduleKind::TCG_SCHEDULE_STEP_DECAY, 0, 0, 0.0, self.step_size, self.gamma))
    }
}

/// Applies a [`Schedule`] from the host: each [`step`](Self::step) sets every group's rate to
/// its base rate (the rate the group had when the scheduler was made) times the factor.
#[derive(Debug)]
pub struct LrScheduler<S> {
    schedule: S,
    targets: Vec<(LrHandle, f64)>,
    steps: u64,
}

impl<S: Schedule> LrScheduler<S> {
    /// A scheduler of the groups behind `handles` (e.g. `opt.lr_handles()`).
    pub fn new(schedule: S, handles: Vec<LrHandle>) -> Self {
        let targets = handles.into_iter().map(|h| (h.get(), h)).map(|(base, h)| (h, base)).collect();
        LrScheduler { schedule, targets, steps: 0 }
    }

    /// Advances to the next step and sets its rates; returns group 0's. Call it before the
    /// training step it is for.
    pub fn step(&mut self) -> Result<f64> {
        self.steps += 1;
        let f = self.schedule.factor(self.steps);
        for (h, base) in &self.targets {
            h.set(base * f)?;
        }
        Ok(self.targets.first().map(|(_, b)| b * f).unwrap_or(0.0))
    }

    /// How many steps were scheduled.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// Sets the step count (when resuming); the next [`step`](Self::step) schedules `n + 1`.
    pub fn set_steps(&mut self, n: u64) {
        self.steps = n;
    }
}

/// Applies a [`Schedule`] on the device, from a device step counter: call
/// [`step`](Self::step) inside the training step's closure, before the optimizer. Captured,
/// each replay advances the counter and writes the rates: no host write per step.
#[derive(Debug)]
pub struct DeviceLrScheduler<S> {
    schedule: S,
    step: Tensor,
    targets: Vec<(LrHandle, f64)>,
}

impl<S: Schedule> DeviceLrScheduler<S> {
    /// A scheduler of the groups behind `handles`, with its counter on their device.
    pub fn new(schedule: S, handles: Vec<LrHandle>) -> Result<Self> {
        let device = handles
            .first()
            .map(|h| h.tensor().device())
            .ok_or_else(|| Error::Misuse("a scheduler needs at least one learning rate".into()))?;
        let targets = handles.into_iter().map(|h| (h.get(), h)).map(|(base, h)| (h, base)).collect();
        Ok(DeviceLrScheduler { schedule, step: Tensor::f_zeros([], (Kind::Double, device))?, targets })
    }

    /// Advances the device counter and writes every group's rate, all on the device: one launch
    /// of the own kernel where the schedule has a [`KernelForm`] and the kernel runs on the
    /// counter's device, the schedule's [`factor_tensor`](Schedule::factor_tensor) otherwise.
    pub fn step(&mut self) -> Result<()> {
        let _no_grad = tch::no_grad_guard();
        if let Some(KernelForm(form)) = self.schedule.kernel_form() {
            let lrs: Vec<&Tensor> = self.targets.iter().map(|(h, _)| h.tensor()).collect();
            let bases: Vec<f64> = self.targets.iter().map(|(_, base)| *base).collect();
            if lr_schedule_step(&self.step, &form, &lrs, &bases)? {
                return Ok(());
            }
        }
        let _ = self.step.f_add_(&cpu_f64(1.0)?)?;
        let f = self.schedule.factor_tensor(&self.step)?;
        for (h, base) in &self.targets {
            h.tensor().shallow_clone().f_copy_(&f.f_mul(&cpu_f64(*base)?)?)?;
        }
        Ok(())
    }

    /// The device step counter (0-d float64): save it in checkpoints to resume the schedule.
    pub fn step_tensor(&self) -> &Tensor {
        &self.step
    }
}
