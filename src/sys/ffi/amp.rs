//! `csrc/amp.cpp`: the autocast guard and the GradScaler ops.
use super::{c_enum, tcg_status, tcg_tensor, tcg_tensors};
use std::os::raw::c_double;

c_enum!(
    /// c10::ScalarType codes.
    tcg_dtype { TCG_DTYPE_HALF = 5, TCG_DTYPE_FLOAT = 6, TCG_DTYPE_BFLOAT16 = 15 }
);

#[repr(C)]
pub struct tcg_autocast_guard {
    _private: [u8; 0],
}

extern "C" {
    pub fn tcg_autocast_guard_new(dtype: tcg_dtype, cache: bool, out: *mut *mut tcg_autocast_guard) -> tcg_status;
    pub fn tcg_autocast_suspend_new(out: *mut *mut tcg_autocast_guard) -> tcg_status;
    pub fn tcg_autocast_guard_free(g: *mut tcg_autocast_guard);
    pub fn tcg_autocast_state(enabled: *mut bool, dtype: *mut tcg_dtype, cache: *mut bool) -> tcg_status;
    pub fn tcg_scaler_check_unscale(grads: tcg_tensors, found_inf: tcg_tensor, inv_scale: tcg_tensor) -> tcg_status;
    pub fn tcg_scaler_update(
        scale: tcg_tensor,
        growth_tracker: tcg_tensor,
        found_inf: tcg_tensor,
        growth: c_double,
        backoff: c_double,
        interval: i64,
    ) -> tcg_status;
}
