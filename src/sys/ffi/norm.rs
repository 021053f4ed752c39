//! `csrc/norm.cpp`: normalization with the residual add and dropout folded in.
use super::{c_enum, tcg_kernels, tcg_status, tcg_tensor};
use std::os::raw::c_double;

c_enum!(tcg_norm_kind { TCG_NORM_LAYER = 0, TCG_NORM_RMS = 1 });
c_enum!(tcg_norm_out { TCG_NORM_OUT_AUTOCAST = 0, TCG_NORM_OUT_INPUT = 1 });

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct tcg_norm_inputs {
    pub res: tcg_tensor,
    pub branch: tcg_tensor,
    pub weight: tcg_tensor,
    pub bias: tcg_tensor,
    pub branch_bias: tcg_tensor,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct tcg_norm_options {
    pub eps: c_double,
    pub dropout: c_double,
    pub kind: tcg_norm_kind,
    pub out: tcg_norm_out,
    pub train: bool,
}

extern "C" {
    pub fn tcg_norm_forward(
        inputs: *const tcg_norm_inputs,
        options: *const tcg_norm_options,
        kernels: tcg_kernels,
        out_res: *mut tcg_tensor,
        out_y: *mut tcg_tensor,
        ran_own: *mut bool,
    ) -> tcg_status;
}
