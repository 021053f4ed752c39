//! `csrc/shadow.cpp`: weight shadows (a registry in the shim, keyed by parameter).

use super::{amp::dtype_of, check, ffi, tensor_ptrs};
use crate::error::Result;
use tch::{Kind, Tensor};

/// Registers `params` (float32 CUDA ones; others are skipped) with a shadow of `dtype`; how many
/// were new.
pub(crate) fn register(params: &[Tensor], dtype: Kind) -> Result<usize> {
    let dtype = dtype_of(dtype)?;
    let ptrs = tensor_ptrs(params);
    let mut made = 0usize;
    // SAFETY: the list points into `ptrs`, live tensor handles for the call; `made` is valid.
    check(unsafe { ffi::tcg_shadow_register(ffi::tcg_tensors::of(&ptrs), dtype, &mut made) })?;
    Ok(made)
}

/// Drops the shadows of `params`.
pub(crate) fn unregister(params: &[Tensor]) -> Result<()> {
    let ptrs = tensor_ptrs(params);
    // SAFETY: the list points into `ptrs`, live tensor handles for the call.
    check(unsafe { ffi::tcg_shadow_unregister(ffi::tcg_tensors::of(&ptrs)) })
}

/// Copies every registered parameter into its shadow; how many.
pub(crate) fn refresh() -> Result<usize> {
    let mut n = 0usize;
    // SAFETY: a valid out pointer.
    check(unsafe { ffi::tcg_shadow_refresh(&mut n) })?;
    Ok(n)
}

/// Turns reading shadows on or off for this thread; the previous setting.
pub(crate) fn set_active(on: bool) -> Result<bool> {
    let mut was = false;
    // SAFETY: a valid out pointer.
    check(unsafe { ffi::tcg_shadow_set_active(on, &mut was) })?;
    Ok(was)
}
