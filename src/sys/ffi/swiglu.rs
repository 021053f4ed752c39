//! `csrc/swiglu.cpp`: SwiGLU on the crate's kernels.
use super::{tcg_kernels, tcg_status, tcg_tensor};

extern "C" {
    pub fn tcg_swiglu(h: tcg_tensor, kernels: tcg_kernels, out: *mut tcg_tensor, ran_own: *mut bool) -> tcg_status;
}
