//! `csrc/shadow.cpp`: weight shadows.
use super::{tcg_dtype, tcg_status, tcg_tensors};

extern "C" {
    pub fn tcg_shadow_register(params: tcg_tensors, dtype: tcg_dtype, made: *mut usize) -> tcg_status;
    pub fn tcg_shadow_unregister(params: tcg_tensors) -> tcg_status;
    pub fn tcg_shadow_refresh(refreshed: *mut usize) -> tcg_status;
    pub fn tcg_shadow_set_active(on: bool, was: *mut bool) -> tcg_status;
}
