//! `csrc/rotary.cpp`: rotary position embeddings on the crate's kernel.
use super::{c_enum, tcg_kernels, tcg_status, tcg_tensor, tcg_weight_grad};

c_enum!(tcg_rotary_layout { TCG_ROTARY_INTERLEAVED = 0, TCG_ROTARY_HALF_SPLIT = 1 });

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct tcg_rotary_inputs {
    pub q: tcg_tensor,
    pub k: tcg_tensor,
    pub cos: tcg_tensor,
    pub sin: tcg_tensor,
    pub offset: tcg_tensor,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct tcg_rotary_qkv_inputs {
    pub qkv: tcg_tensor,
    pub cos: tcg_tensor,
    pub sin: tcg_tensor,
    pub offset: tcg_tensor,
    pub heads: i64,
    pub kv_heads: i64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct tcg_rotary_project_inputs {
    pub x: tcg_tensor,
    pub weight: tcg_tensor,
    pub bias: tcg_tensor,
    pub cos: tcg_tensor,
    pub sin: tcg_tensor,
    pub cos_gemm: tcg_tensor,
    pub sin_gemm: tcg_tensor,
    pub heads: i64,
    pub kv_heads: i64,
}

extern "C" {
    pub fn tcg_rotary_apply(
        inputs: *const tcg_rotary_inputs,
        offset: i64,
        layout: tcg_rotary_layout,
        kernels: tcg_kernels,
        q_out: *mut tcg_tensor,
        k_out: *mut tcg_tensor,
        ran_own: *mut bool,
    ) -> tcg_status;
    pub fn tcg_rotary_apply_qkv(
        inputs: *const tcg_rotary_qkv_inputs,
        offset: i64,
        layout: tcg_rotary_layout,
        kernels: tcg_kernels,
        q_out: *mut tcg_tensor,
        k_out: *mut tcg_tensor,
        v_out: *mut tcg_tensor,
        ran_own: *mut bool,
    ) -> tcg_status;
    pub fn tcg_rotary_project_qkv(
        inputs: *const tcg_rotary_project_inputs,
        offset: i64,
        layout: tcg_rotary_layout,
        wgrad: tcg_weight_grad,
        kernels: tcg_kernels,
        q_out: *mut tcg_tensor,
        k_out: *mut tcg_tensor,
        v_out: *mut tcg_tensor,
        ran_own: *mut bool,
    ) -> tcg_status;
    pub fn tcg_rotary_permuted_table(table: tcg_tensor, out: *mut tcg_tensor) -> tcg_status;
}
