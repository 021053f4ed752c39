//! `csrc/feed.cpp`: copies for feeding batches.
use super::{tcg_status, tcg_tensor};

extern "C" {
    pub fn tcg_feed_copy(dst: tcg_tensor, src: tcg_tensor, non_blocking: bool) -> tcg_status;
    pub fn tcg_feed_is_pinned(t: tcg_tensor, out: *mut bool) -> tcg_status;
    pub fn tcg_feed_pin(t: tcg_tensor, out: *mut tcg_tensor) -> tcg_status;
}
