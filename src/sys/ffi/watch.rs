//! `csrc/watch.cpp`: tensor watches.
use super::{tcg_status, tcg_tensor};

#[repr(C)]
pub struct tcg_watch {
    _private: [u8; 0],
}

extern "C" {
    pub fn tcg_watch_new(out: *mut *mut tcg_watch) -> tcg_status;
    pub fn tcg_watch_storage_nbytes(t: tcg_tensor, out: *mut usize) -> tcg_status;
    pub fn tcg_watch_free(w: *mut tcg_watch);
    pub fn tcg_watch_add(w: *mut tcg_watch, ts: *const tcg_tensor, n: usize) -> tcg_status;
    pub fn tcg_watch_refresh(w: *mut tcg_watch) -> tcg_status;
    pub fn tcg_watch_check(w: *mut tcg_watch, index: *mut usize) -> tcg_status;
}
