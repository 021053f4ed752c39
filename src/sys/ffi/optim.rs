//! `csrc/optim.cpp`: fused optimizers and gradient helpers.
use super::{c_enum, tcg_kernels, tcg_status, tcg_tensor, tcg_tensors};
use std::os::raw::c_double;

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct tcg_amp_scaling {
    pub grad_scale: tcg_tensor,
    pub found_inf: tcg_tensor,
    pub clip_coef: tcg_tensor,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct tcg_sgd_hyper {
    pub weight_decay: c_double,
    pub momentum: c_double,
    pub dampening: c_double,
    pub nesterov: bool,
    pub maximize: bool,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct tcg_sgd_tensors {
    pub params: tcg_tensors,
    pub grads: tcg_tensors,
    pub momentum_buffers: tcg_tensors,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct tcg_adam_hyper {
    pub beta1: c_double,
    pub beta2: c_double,
    pub weight_decay: c_double,
    pub eps: c_double,
    pub adamw: bool,
    pub amsgrad: bool,
    pub maximize: bool,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct tcg_adam_tensors {
    pub params: tcg_tensors,
    pub grads: tcg_tensors,
    pub exp_avgs: tcg_tensors,
    pub exp_avg_sqs: tcg_tensors,
    pub max_exp_avg_sqs: tcg_tensors,
    pub steps: tcg_tensors,
}

c_enum!(tcg_schedule_kind {
    TCG_SCHEDULE_WARMUP_COSINE = 0,
    TCG_SCHEDULE_LINEAR_WARMUP = 1,
    TCG_SCHEDULE_STEP_DECAY = 2,
});

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct tcg_schedule {
    pub kind: tcg_schedule_kind,
    pub warmup: c_double,
    pub total: c_double,
    pub min_factor: c_double,
    pub step_size: c_double,
    pub gamma: c_double,
}

extern "C" {
    pub fn tcg_optim_sgd(
        t: *const tcg_sgd_tensors,
        lr: tcg_tensor,
        h: *const tcg_sgd_hyper,
        is_first_step: bool,
        amp: tcg_amp_scaling,
        kernels: tcg_kernels,
        ran_own: *mut bool,
    ) -> tcg_status;
    pub fn tcg_optim_adam(
        t: *const tcg_adam_tensors,
        lr: tcg_tensor,
        h: *const tcg_adam_hyper,
        amp: tcg_amp_scaling,
        kernels: tcg_kernels,
        arrivals: tcg_tensor,
        slots: *const usize,
        ran_own: *mut bool,
    ) -> tcg_status;
    pub fn tcg_grads_set_to_none(params: tcg_tensors) -> tcg_status;
    pub fn tcg_grads_zero(params: tcg_tensors) -> tcg_status;
    pub fn tcg_grads_clip_norm(
        grads: tcg_tensors,
        max_norm: c_double,
        norm_type: c_double,
        kernels: tcg_kernels,
        total_out: *mut tcg_tensor,
    ) -> tcg_status;
    pub fn tcg_grads_clip_coef(
        grads: tcg_tensors,
        max_norm: c_double,
        norm_type: c_double,
        kernels: tcg_kernels,
        total_out: *mut tcg_tensor,
        coef_out: *mut tcg_tensor,
    ) -> tcg_status;
    pub fn tcg_grads_clip_value(grads: tcg_tensors, clip: c_double) -> tcg_status;
    pub fn tcg_lr_schedule_step(
        step: tcg_tensor,
        schedule: *const tcg_schedule,
        lrs: tcg_tensors,
        bases: *const c_double,
        ran_own: *mut bool,
    ) -> tcg_status;
}
