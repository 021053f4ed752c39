//! `csrc/embedding.cpp`: the embedding on the crate's deterministic backward.
use super::{tcg_kernels, tcg_status, tcg_tensor};

extern "C" {
    pub fn tcg_embedding(
        weight: tcg_tensor,
        indices: tcg_tensor,
        padding_idx: i64,
        kernels: tcg_kernels,
        out: *mut tcg_tensor,
        tie: *mut tcg_tensor,
        ran_own: *mut bool,
    ) -> tcg_status;
}
