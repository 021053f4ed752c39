//! `csrc/shadow.cpp`: weight shadows.
use super::{tcg_dtype, tcg_status, tcg_tensors};

#[repr(C)]
pub struct tcg_shadows {
    _private: [u8; 0],
}

extern "C" {
    pub fn tcg_shadows_new(
        params: tcg_tensors,
        dtype: tcg_dtype,
        out: *mut *mut tcg_shadows,
        count: *mut usize,
    ) -> tcg_status;
    pub fn tcg_shadows_free(s: *mut tcg_shadows);
    pub fn tcg_shadows_refresh(s: *mut tcg_shadows) -> tcg_status;
    pub fn tcg_shadows_stale(s: *mut tcg_shadows, count: *mut usize) -> tcg_status;
    pub fn tcg_shadows_keep_asked(s: *mut tcg_shadows, count: *mut usize) -> tcg_status;
    pub fn tcg_shadows_activate(s: *mut tcg_shadows, previous: *mut *mut tcg_shadows) -> tcg_status;
}
