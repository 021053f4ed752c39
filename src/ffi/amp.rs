//! `csrc/amp.cpp`: the autocast guard and the GradScaler ops.
use super::{tcg_status, tcg_tensor};
use std::os::raw::{c_double, c_int};

#[repr(C)]
pub struct tcg_autocast_guard {
    _private: [u8; 0],
}

extern "C" {
    pub fn tcg_autocast_guard_new(dtype: c_int, cache: c_int, out: *mut *mut tcg_autocast_guard) -> tcg_status;
    pub fn tcg_autocast_suspend_new(out: *mut *mut tcg_autocast_guard) -> tcg_status;
    pub fn tcg_autocast_guard_free(g: *mut tcg_autocast_guard);
    pub fn tcg_autocast_state(enabled: *mut c_int, dtype: *mut c_int, cache: *mut c_int) -> tcg_status;
    pub fn tcg_amp_check_unscale(
        grads: *const tcg_tensor,
        n: usize,
        found_inf: tcg_tensor,
        inv_scale: tcg_tensor,
    ) -> tcg_status;
    pub fn tcg_amp_update_scale(
        scale: tcg_tensor,
        growth_tracker: tcg_tensor,
        found_inf: tcg_tensor,
        growth: c_double,
        backoff: c_double,
        interval: i64,
    ) -> tcg_status;
}
