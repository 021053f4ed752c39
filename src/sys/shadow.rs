//! `csrc/shadow.cpp`: sets of weight shadows, each owned by its handle, and the set this thread
//! reads.

use super::{amp::dtype_of, check, ffi, non_null, tensor_ptrs};
use crate::error::Result;
use std::ptr::NonNull;
use tch::{Kind, Tensor};

/// A set of shadows in the shim, freed on drop.
#[derive(Debug)]
pub(crate) struct ShadowsHandle(NonNull<ffi::tcg_shadows>);

impl ShadowsHandle {
    /// Shadows of `dtype` for the float32 CUDA tensors among `params`; how many got one.
    pub(crate) fn new(params: &[Tensor], dtype: Kind) -> Result<(Self, usize)> {
        let dtype = dtype_of(dtype)?;
        let ptrs = tensor_ptrs(params);
        let (mut raw, mut count) = (std::ptr::null_mut(), 0usize);
        // SAFETY: the list points into `ptrs`, live tensor handles for the call (the shim keeps
        // its own references); `raw` and `count` are valid out pointers, and on success `raw`
        // holds a set we own.
        check(unsafe { ffi::tcg_shadows_new(ffi::tcg_tensors::of(&ptrs), dtype, &mut raw, &mut count) })?;
        Ok((ShadowsHandle(non_null(raw, "weight shadows")?), count))
    }

    /// Copies each parameter of the set whose shadow is stale into it, on the current stream.
    pub(crate) fn refresh(&self) -> Result<()> {
        // SAFETY: the handle is live; the shim only reads the set's tensors and writes the
        // shadows' data.
        check(unsafe { ffi::tcg_shadows_refresh(self.0.as_ptr()) })
    }

    /// How many shadows are stale now.
    pub(crate) fn stale(&self) -> Result<usize> {
        let mut count = 0usize;
        // SAFETY: the handle is live and `count` a valid out pointer; the shim only reads.
        check(unsafe { ffi::tcg_shadows_stale(self.0.as_ptr(), &mut count) })?;
        Ok(count)
    }

    /// Keeps only the shadows a layer asked for since the set was made; how many are left.
    pub(crate) fn keep_asked(&self) -> Result<usize> {
        let mut count = 0usize;
        // SAFETY: the handle is live and `count` a valid out pointer; the shim rebuilds the set's
        // lists and keeps the dropped shadows' tensors alive with the set.
        check(unsafe { ffi::tcg_shadows_keep_asked(self.0.as_ptr(), &mut count) })?;
        Ok(count)
    }

    /// Makes this set the one this thread reads; the set it replaces.
    pub(crate) fn activate(&self) -> Result<Option<ShadowsHandle>> {
        activate(Some(self))
    }
}

/// Makes `set` (None: none) the set this thread reads; the set it replaces, as a handle of its
/// own.
pub(crate) fn activate(set: Option<&ShadowsHandle>) -> Result<Option<ShadowsHandle>> {
    let mut previous = std::ptr::null_mut();
    let raw = set.map_or(std::ptr::null_mut(), |s| s.0.as_ptr());
    // SAFETY: `raw` is a live handle or null; `previous` is a valid out pointer, and a non-null
    // value written there is a new handle we own. The shim shares the set, so it outlives `set`.
    check(unsafe { ffi::tcg_shadows_activate(raw, &mut previous) })?;
    Ok(NonNull::new(previous).map(ShadowsHandle))
}

impl Drop for ShadowsHandle {
    fn drop(&mut self) {
        // SAFETY: the pointer came from the shim as a handle we own, freed exactly once, here.
        unsafe { ffi::tcg_shadows_free(self.0.as_ptr()) }
    }
}
