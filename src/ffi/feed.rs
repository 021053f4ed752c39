//! `csrc/feed.cpp`: copies for feeding batches.
use super::{tcg_status, tcg_tensor};
use std::os::raw::c_int;

extern "C" {
    pub fn tcg_copy_(dst: tcg_tensor, src: tcg_tensor, non_blocking: c_int) -> tcg_status;
    pub fn tcg_is_pinned(t: tcg_tensor, out: *mut c_int) -> tcg_status;
    pub fn tcg_pin_memory(t: tcg_tensor, out: *mut tcg_tensor) -> tcg_status;
}
