//! `csrc/loss.cpp`: the cross-entropy loss on the crate's fused kernels.
use super::{c_enum, tcg_kernels, tcg_status, tcg_tensor, tcg_weight_grad};

c_enum!(tcg_linear_ce_method { TCG_LINEAR_CE_CHUNKED = 0, TCG_LINEAR_CE_EXP_IN_HEAD = 1 });

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct tcg_linear_ce_options {
    pub ignore_index: i64,
    pub chunk_rows: i64,
    pub wgrad: tcg_weight_grad,
    pub method: tcg_linear_ce_method,
}

extern "C" {
    pub fn tcg_loss_cross_entropy(
        logits: tcg_tensor,
        targets: tcg_tensor,
        ignore_index: i64,
        kernels: tcg_kernels,
        out: *mut tcg_tensor,
        ran_own: *mut bool,
    ) -> tcg_status;
    pub fn tcg_loss_linear_cross_entropy(
        h: tcg_tensor,
        weight: tcg_tensor,
        targets: tcg_tensor,
        options: *const tcg_linear_ce_options,
        kernels: tcg_kernels,
        out: *mut tcg_tensor,
        ran_own: *mut bool,
    ) -> tcg_status;
}
