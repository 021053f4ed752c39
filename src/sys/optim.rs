//! `csrc/optim.cpp` (and `csrc/cuda/optim_own.cpp` behind it): fused optimizer steps, gradient
//! helpers.

use super::{adopt_some, check, ffi, opt_tensor_ptr, tensor_ptr, tensor_ptrs};
use crate::error::{Error, Result};
use tch::Tensor;

use super::kernels::RawKernels;
/// SGD's hyper-parameters as the shim takes them (the learning rate is a tensor, apart).
pub(crate) type SgdHyper = ffi::tcg_sgd_hyper;
/// Adam's and AdamW's, likewise.
pub(crate) type AdamHyper = ffi::tcg_adam_hyper;

/// How a step scales the gradients it reads: AMP's scale to divide them by and flag to skip the
/// step on, or global-norm clipping's factor to multiply them by (Adam only; not with a scale).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Scaling<'a> {
    pub(crate) grad_scale: Option<&'a Tensor>,
    pub(crate) found_inf: Option<&'a Tensor>,
    pub(crate) clip_coef: Option<&'a Tensor>,
}

impl Scaling<'_> {
    fn raw(self) -> ffi::tcg_amp_scaling {
        ffi::tcg_amp_scaling {
            grad_scale: opt_tensor_ptr(self.grad_scale),
            found_inf: opt_tensor_ptr(self.found_inf),
            clip_coef: opt_tensor_ptr(self.clip_coef),
        }
    }
}

/// The tensors of one fused SGD launch: one gradient per parameter, and no momentum buffer
/// (momentum 0) or one per parameter.
pub(crate) struct SgdTensors<'a> {
    pub(crate) params: &'a [&'a Tensor],
    pub(crate) grads: &'a [&'a Tensor],
    pub(crate) momentum_buffers: &'a [&'a Tensor],
}

/// The tensors of one fused Adam launch: one of each per parameter (`max_exp_avg_sqs` only with
/// amsgrad).
pub(crate) struct AdamTensors<'a> {
    pub(crate) params: &'a [&'a Tensor],
    pub(crate) grads: &'a [&'a Tensor],
    pub(crate) exp_avgs: &'a [&'a Tensor],
    pub(crate) exp_avg_sqs: &'a [&'a Tensor],
    pub(crate) max_exp_avg_sqs: &'a [&'a Tensor],
    pub(crate) steps: &'a [&'a Tensor],
}

fn ptrs(ts: &[&Tensor]) -> Vec<ffi::tcg_tensor> {
    tensor_ptrs(ts.iter().copied())
}

/// One fused SGD step; whether the own kernels ran (else ATen's did).
pub(crate) fn sgd(
    t: &SgdTensors<'_>,
    lr: &Tensor,
    h: &SgdHyper,
    is_first_step: bool,
    amp: Scaling<'_>,
    kernels: RawKernels,
) -> Result<bool> {
    let (p, g, b) = (ptrs(t.params), ptrs(t.grads), ptrs(t.momentum_buffers));
    let lists = ffi::tcg_sgd_tensors {
        params: ffi::tcg_tensors::of(&p),
        grads: ffi::tcg_tensors::of(&g),
        momentum_buffers: ffi::tcg_tensors::of(&b),
    };
    let mut ran_own = false;
    // SAFETY: the lists point into `p`, `g`, `b` (live for the call), each of live tensor handles
    // with its own length (the shim checks the lengths agree); `h` and `ran_own` are valid.
    check(unsafe { ffi::tcg_optim_sgd(&lists, tensor_ptr(lr), h, is_first_step, amp.raw(), kernels, &mut ran_own) })?;
    Ok(ran_own)
}

/// One fused Adam/AdamW step; whether the own kernels ran. `arrivals`: the own kernel's
/// per-tensor counters (an int32 tensor of zeros on the device) and each parameter's slot in it.
pub(crate) fn adam(
    t: &AdamTensors<'_>,
    lr: &Tensor,
    h: &AdamHyper,
    amp: Scaling<'_>,
    kernels: RawKernels,
    arrivals: Option<(&Tensor, &[usize])>,
) -> Result<bool> {
    if let Some((counters, slots)) = arrivals {
        let n = counters.numel();
        if slots.len() != t.params.len() || slots.iter().any(|&s| s >= n) {
            return Err(Error::Misuse(format!(
                "adam: {} arrival slots for {} parameters, each below {n}",
                slots.len(),
                t.params.len()
            )));
        }
    }
    let (p, g, m) = (ptrs(t.params), ptrs(t.grads), ptrs(t.exp_avgs));
    let (v, vmax, s) = (ptrs(t.exp_avg_sqs), ptrs(t.max_exp_avg_sqs), ptrs(t.steps));
    let lists = ffi::tcg_adam_tensors {
        params: ffi::tcg_tensors::of(&p),
        grads: ffi::tcg_tensors::of(&g),
        exp_avgs: ffi::tcg_tensors::of(&m),
        exp_avg_sqs: ffi::tcg_tensors::of(&v),
        max_exp_avg_sqs: ffi::tcg_tensors::of(&vmax),
        steps: ffi::tcg_tensors::of(&s),
    };
    let (counters, slots) = match arrivals {
        Some((c, slots)) => (tensor_ptr(c), slots.as_ptr()),
        None => (std::ptr::null_mut(), std::ptr::null()),
    };
    let mut ran_own = false;
    // SAFETY: the lists point into the vectors above (live for the call), each of live tensor
    // handles with its own length (the shim checks the lengths agree); `slots`, when given, has
    // one entry per parameter, each inside `counters` (checked above); `h` and `ran_own` are
    // valid.
    check(unsafe {
        ffi::tcg_optim_adam(&lists, tensor_ptr(lr), h, amp.raw(), kernels, counters, slots, &mut ran_own)
    })?;
    Ok(ran_own)
}

/// What [`grads_reset`] does to each gradient.
#[derive(Clone, Copy, Debug)]
pub(crate) enum GradReset {
    /// `.grad` set to undefined (bucket views zeroed instead).
    ToNone,
    /// Zeroed in place.
    Zero,
}

/// Resets the gradients of `params`.
pub(crate) fn grads_reset(params: &[Tensor], how: GradReset) -> Result<()> {
    let p = tensor_ptrs(params);
    let list = ffi::tcg_tensors::of(&p);
    // SAFETY: `list` points into `p`, live tensor handles borrowed from `params` for the call.
    check(unsafe {
        match how {
            GradReset::ToNone => ffi::tcg_grads_set_to_none(list),
            GradReset::Zero => ffi::tcg_grads_zero(list),
        }
    })
}

/// Global-norm clipping's norm and factor for `grads`, on the device; the gradients unchanged.
/// `kernels`: ATen's operators (PyTorch), or the own kernels where they apply (the same values).
pub(crate) fn clip_coef(
    grads: &[Tensor],
    max_norm: f64,
    norm_type: f64,
    kernels: RawKernels,
) -> Result<(Tensor, Tensor)> {
    let g = tensor_ptrs(grads);
    let (mut total, mut coef): (ffi::tcg_tensor, ffi::tcg_tensor) = (std::ptr::null_mut(), std::ptr::null_mut());
    // SAFETY: the list points into `g`, live tensor handles for the call; both out slots are
    // valid.
    check(unsafe {
        ffi::tcg_grads_clip_coef(ffi::tcg_tensors::of(&g), max_norm, norm_type, kernels, &mut total, &mut coef)
    })?;
    // SAFETY: on success each is a new heap at::Tensor that nobody else owns.
    let total = unsafe { adopt_some(total, "clip_grad_norm") }?;
    // SAFETY: as above.
    let coef = unsafe { adopt_some(coef, "clip_grad_norm") }?;
    Ok((total, coef))
}

/// A learning-rate schedule in the form the own kernel computes.
pub(crate) type ScheduleForm = ffi::tcg_schedule;
/// Its kinds.
pub(crate) type ScheduleKind = ffi::tcg_schedule_kind;

/// One schedule step by the own kernel: `step` += 1, then `lrs[i]` = `bases[i]` · the factor, on
/// the current stream. `Ok(false)`, nothing done, where the kernel does not apply there.
pub(crate) fn lr_schedule_step(step: &Tensor, form: &ScheduleForm, lrs: &[&Tensor], bases: &[f64]) -> Result<bool> {
    if lrs.len() != bases.len() {
        return Err(Error::Misuse("lr schedule: one base rate per learning rate".into()));
    }
    let l = ptrs(lrs);
    let mut ran = false;
    // SAFETY: `step` and the list (pointing into `l`) are live tensor handles for the call;
    // `form` and `bases` (holding `l.len()` values) are valid for reads; `ran` is a valid slot.
    check(unsafe {
        ffi::tcg_lr_schedule_step(tensor_ptr(step), form, ffi::tcg_tensors::of(&l), bases.as_ptr(), &mut ran)
    })?;
    Ok(ran)
}

/// Value clipping of `grads` in place, on their device.
pub(crate) fn clip_value(grads: &[Tensor], clip: f64) -> Result<()> {
    let g = tensor_ptrs(grads);
    // SAFETY: the list points into `g`, live tensor handles for the call.
    check(unsafe { ffi::tcg_grads_clip_value(ffi::tcg_tensors::of(&g), clip) })
}

/// Global-norm clipping of `grads` on the device; the norm before clipping. `kernels` as in
/// [`clip_coef`].
pub(crate) fn clip_norm(grads: &[Tensor], max_norm: f64, norm_type: f64, kernels: RawKernels) -> Result<Tensor> {
    let g = tensor_ptrs(grads);
    let mut total: ffi::tcg_tensor = std::ptr::null_mut();
    // SAFETY: the list points into `g`, live tensor handles for the call; `total` is a valid slot.
    check(unsafe { ffi::tcg_grads_clip_norm(ffi::tcg_tensors::of(&g), max_norm, norm_type, kernels, &mut total) })?;
    // SAFETY: on success `total` is a new heap at::Tensor that nobody else owns.
    unsafe { adopt_some(total, "clip_grad_norm") }
}
