//! `csrc/gemm.cpp` (and the cache in `csrc/cuda/lt_matmul.cpp`): how the crate's cuBLASLt GEMMs
//! choose their algorithm.

use super::{check, ffi};
use crate::error::Result;

/// The choice, as the shim takes it.
pub(crate) use ffi::tcg_gemm_choice as RawGemmChoice;

/// Sets the process-wide choice and forgets the choices made per shape.
pub(crate) fn set_choice(choice: RawGemmChoice) -> Result<()> {
    // SAFETY: a plain enum value; the shim refuses one it does not name.
    check(unsafe { ffi::tcg_gemm_set_choice(choice) })
}

/// The process-wide choice.
pub(crate) fn choice() -> Result<RawGemmChoice> {
    let mut out = RawGemmChoice::default();
    // SAFETY: a valid out slot for the call.
    check(unsafe { ffi::tcg_gemm_get_choice(&mut out) })?;
    Ok(out)
}

/// The GEMM shapes with an algorithm chosen, and how many of them by timing.
pub(crate) fn shapes() -> Result<(i64, i64)> {
    let (mut chosen, mut timed) = (0, 0);
    // SAFETY: valid out slots for the call.
    check(unsafe { ffi::tcg_gemm_shapes(&mut chosen, &mut timed) })?;
    Ok((chosen, timed))
}
