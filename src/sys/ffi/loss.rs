//! `csrc/loss.cpp`: the cross-entropy loss on the crate's fused kernels.
use super::{tcg_kernels, tcg_status, tcg_tensor};

extern "C" {
    pub fn tcg_loss_cross_entropy(
        logits: tcg_tensor,
        targets: tcg_tensor,
        ignore_index: i64,
        kernels: tcg_kernels,
        out: *mut tcg_tensor,
        ran_own: *mut bool,
    ) -> tcg_status;
}
