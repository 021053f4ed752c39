//! `csrc/mlp.cpp`: the MLPs with their activation in their GEMMs' epilogues.
use super::{tcg_gelu_form, tcg_kernels, tcg_status, tcg_tensor, tcg_weight_grad};

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct tcg_mlp_inputs {
    pub x: tcg_tensor,
    pub fc_weight: tcg_tensor,
    pub fc_bias: tcg_tensor,
    pub proj_weight: tcg_tensor,
    pub proj_bias: tcg_tensor,
}

extern "C" {
    pub fn tcg_mlp_gelu(
        inputs: *const tcg_mlp_inputs,
        form: tcg_gelu_form,
        wgrad: tcg_weight_grad,
        kernels: tcg_kernels,
        out: *mut tcg_tensor,
        ran_own: *mut bool,
    ) -> tcg_status;
    pub fn tcg_mlp_swiglu(
        inputs: *const tcg_mlp_inputs,
        wgrad: tcg_weight_grad,
        kernels: tcg_kernels,
        out: *mut tcg_tensor,
        ran_own: *mut bool,
    ) -> tcg_status;
}
