//! `csrc/linear.cpp`: the linear layer (bias gradients in the weight-gradient GEMM).
use super::{c_enum, tcg_kernels, tcg_status, tcg_tensor};

c_enum!(tcg_weight_grad { TCG_WEIGHT_GRAD_ROUNDED = 0, TCG_WEIGHT_GRAD_FP32 = 1 });

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct tcg_linear_inputs {
    pub x: tcg_tensor,
    pub weight: tcg_tensor,
    pub bias: tcg_tensor,
    pub weight_grad_to: tcg_tensor,
}

/// `TCG_LINEAR_MAX_PARTS`: the most pieces `tcg_linear_split` makes.
pub const TCG_LINEAR_MAX_PARTS: i64 = 8;

extern "C" {
    pub fn tcg_linear_split(
        inputs: *const tcg_linear_inputs,
        parts: i64,
        wgrad: tcg_weight_grad,
        kernels: tcg_kernels,
        outs: *mut tcg_tensor,
        ran_own: *mut bool,
    ) -> tcg_status;
    pub fn tcg_linear_forward(
        inputs: *const tcg_linear_inputs,
        wgrad: tcg_weight_grad,
        kernels: tcg_kernels,
        out: *mut tcg_tensor,
        ran_own: *mut bool,
    ) -> tcg_status;
}
