//! `csrc/amp.cpp`: the autocast guard and the GradScaler ops.

use super::{check, ffi, non_null, tensor_ptr, tensor_ptrs};
use crate::error::{Error, Result};
use std::marker::PhantomData;
use std::ptr::NonNull;
use tch::{Kind, Tensor};

/// The shim's autocast guard (a region, or a suspension), restoring the previous state on drop.
/// Autocast state is thread-local: the guard is `!Send`, dropped on the thread that made it.
#[derive(Debug)]
pub(crate) struct AutocastHandle {
    raw: NonNull<ffi::tcg_autocast_guard>,
    _not_send: PhantomData<*const ()>,
}

pub(crate) fn dtype_of(kind: Kind) -> Result<ffi::tcg_dtype> {
    match kind {
        Kind::Half => Ok(ffi::tcg_dtype::TCG_DTYPE_HALF),
        Kind::BFloat16 => Ok(ffi::tcg_dtype::TCG_DTYPE_BFLOAT16),
        other => Err(Error::Misuse(format!("autocast dtype must be Half or BFloat16, got {other:?}"))),
    }
}

impl AutocastHandle {
    /// CUDA autocast on with `dtype` (Half or BFloat16) and the weight-cast cache on or off.
    pub(crate) fn enter(dtype: Kind, cache: bool) -> Result<Self> {
        let dtype = dtype_of(dtype)?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out pointer; on success it holds a guard we own.
        check(unsafe { ffi::tcg_autocast_guard_new(dtype, cache, &mut raw) })?;
        Ok(AutocastHandle { raw: non_null(raw, "autocast guard")?, _not_send: PhantomData })
    }

    /// CUDA autocast off until dropped.
    pub(crate) fn suspend() -> Result<Self> {
        let mut raw = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out pointer; on success it holds a guard we own.
        check(unsafe { ffi::tcg_autocast_suspend_new(&mut raw) })?;
        Ok(AutocastHandle { raw: non_null(raw, "autocast guard")?, _not_send: PhantomData })
    }
}

impl Drop for AutocastHandle {
    fn drop(&mut self) {
        // SAFETY: the pointer came from tcg_autocast_guard_new / suspend_new on this thread (the
        // handle is !Send) and is freed exactly once, here; the shim's free never throws.
        unsafe { ffi::tcg_autocast_guard_free(self.raw.as_ptr()) }
    }
}

/// This thread's CUDA autocast state: enabled, dtype, cast cache on.
pub(crate) fn autocast_state() -> Result<(bool, Kind, bool)> {
    let (mut enabled, mut dtype, mut cache) = (false, ffi::tcg_dtype::default(), false);
    // SAFETY: three valid out pointers; the shim only reads thread-local autocast state.
    check(unsafe { ffi::tcg_autocast_state(&mut enabled, &mut dtype, &mut cache) })?;
    let dtype = match dtype {
        ffi::tcg_dtype::TCG_DTYPE_HALF => Kind::Half,
        ffi::tcg_dtype::TCG_DTYPE_BFLOAT16 => Kind::BFloat16,
        _ => Kind::Float,
    };
    Ok((enabled, dtype, cache))
}

/// `_amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv_scale)` (nothing for no grads).
pub(crate) fn check_unscale(grads: &[Tensor], found_inf: &Tensor, inv_scale: &Tensor) -> Result<()> {
    let g = tensor_ptrs(grads);
    // SAFETY: `g` holds live tensor handles for the call; found_inf and inv_scale are live.
    check(unsafe {
        ffi::tcg_scaler_check_unscale(ffi::tcg_tensors::of(&g), tensor_ptr(found_inf), tensor_ptr(inv_scale))
    })
}

/// `_amp_update_scale_`, in place on the device.
pub(crate) fn update_scale(
    scale: &Tensor,
    growth_tracker: &Tensor,
    found_inf: &Tensor,
    growth: f64,
    backoff: f64,
    interval: i64,
) -> Result<()> {
    // SAFETY: the three tensors are live for the call; the shim updates scale and tracker in place.
    check(unsafe {
        ffi::tcg_scaler_update(
            tensor_ptr(scale),
            tensor_ptr(growth_tracker),
            tensor_ptr(found_inf),
            growth,
            backoff,
            interval,
        )
    })
}
