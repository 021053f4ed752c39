//! `csrc/kernels.cpp`: which kernels run (the choice every fused family takes), the own kernels'
//! availability.

use super::{check, ffi};
use crate::error::Result;

/// Which kernels a call runs, as the shim takes it.
pub(crate) use ffi::tcg_kernels as RawKernels;

/// Whether the own kernels were built into this binary.
pub(crate) fn built() -> bool {
    // SAFETY: a query without arguments.
    unsafe { ffi::tcg_kernels_built() }
}

/// Ok if the own kernels run on CUDA device `index` (loading them there on first call).
pub(crate) fn check_device(index: i32) -> Result<()> {
    // SAFETY: a plain device index; the shim checks it.
    check(unsafe { ffi::tcg_kernels_check(index) })
}
