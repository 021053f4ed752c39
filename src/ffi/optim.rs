//! `csrc/optim.cpp`: fused optimizers and gradient helpers.
use super::{tcg_status, tcg_tensor};
use std::os::raw::{c_double, c_int};

pub const TCG_KERNELS_PYTORCH: c_int = 0;
pub const TCG_KERNELS_AUTO: c_int = 1;
pub const TCG_KERNELS_OWN: c_int = 2;

extern "C" {
    pub fn tcg_fused_sgd(
        params: *const tcg_tensor,
        grads: *const tcg_tensor,
        bufs: *const tcg_tensor,
        n: usize,
        n_bufs: usize,
        weight_decay: c_double,
        momentum: c_double,
        lr: tcg_tensor,
        dampening: c_double,
        nesterov: c_int,
        maximize: c_int,
        is_first_step: c_int,
        grad_scale: tcg_tensor,
        found_inf: tcg_tensor,
        kernels: c_int,
        ran_own: *mut c_int,
    ) -> tcg_status;
    pub fn tcg_fused_adam(
        adamw: c_int,
        params: *const tcg_tensor,
        grads: *const tcg_tensor,
        exp_avgs: *const tcg_tensor,
        exp_avg_sqs: *const tcg_tensor,
        max_exp_avg_sqs: *const tcg_tensor,
        n_max: usize,
        steps: *const tcg_tensor,
        n: usize,
        lr: tcg_tensor,
        beta1: c_double,
        beta2: c_double,
        weight_decay: c_double,
        eps: c_double,
        amsgrad: c_int,
        maximize: c_int,
        grad_scale: tcg_tensor,
        found_inf: tcg_tensor,
        kernels: c_int,
        arrivals: tcg_tensor,
        slots: *const usize,
        ran_own: *mut c_int,
    ) -> tcg_status;
    pub fn tcg_own_kernels_built() -> c_int;
    pub fn tcg_own_kernels_check(device: c_int) -> tcg_status;
    pub fn tcg_grads_set_to_none(params: *const tcg_tensor, n: usize) -> tcg_status;
    pub fn tcg_grads_zero(params: *const tcg_tensor, n: usize) -> tcg_status;
    pub fn tcg_clip_grad_norm(
        grads: *const tcg_tensor,
        n: usize,
        max_norm: c_double,
        norm_type: c_double,
        total_out: *mut tcg_tensor,
    ) -> tcg_status;
}
