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

/// The GEMM shapes with an algorithm chosen, how many of them by timing, how many from a file.
pub(crate) fn shapes() -> Result<(i64, i64, i64)> {
    let (mut chosen, mut timed, mut from_file) = (0, 0, 0);
    // SAFETY: valid out slots for the call.
    check(unsafe { ffi::tcg_gemm_shapes(&mut chosen, &mut timed, &mut from_file) })?;
    Ok((chosen, timed, from_file))
}

/// One shape's choice as a file holds it.
pub(crate) use ffi::tcg_gemm_entry as GemmEntry;

/// What a file of choices is valid for: the current device's name, cuBLASLt's version,
/// libtorch's (major * 10000 + minor * 100 + patch).
pub(crate) fn identity() -> Result<(String, i64, i64)> {
    let mut out = ffi::tcg_gemm_identity { device: [0; 256], cublaslt_version: 0, torch_version: 0 };
    // SAFETY: a valid out slot; the shim writes a NUL-terminated name within the array.
    check(unsafe { ffi::tcg_gemm_get_identity(&mut out) })?;
    let bytes: Vec<u8> = out.device.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
    Ok((String::from_utf8_lossy(&bytes).into_owned(), out.cublaslt_version, out.torch_version))
}

/// The current device's choices (those read from a file and not yet met included).
pub(crate) fn export() -> Result<Vec<GemmEntry>> {
    loop {
        let mut n = 0i64;
        // SAFETY: cap 0 with a null buffer only counts.
        check(unsafe { ffi::tcg_gemm_export(std::ptr::null_mut(), 0, &mut n) })?;
        let mut out = vec![GemmEntry::default(); n.max(0) as usize];
        let mut written = 0i64;
        // SAFETY: `out` holds `out.len()` entries, the cap passed.
        check(unsafe { ffi::tcg_gemm_export(out.as_mut_ptr(), out.len() as i64, &mut written) })?;
        // Another thread may have chosen a shape between the two calls: count again.
        if written as usize == out.len() {
            return Ok(out);
        }
    }
}

/// Takes entries as the current device's choices.
pub(crate) fn import(entries: &[GemmEntry]) -> Result<()> {
    // SAFETY: `entries` is a valid slice of `entries.len()` entries for the call.
    check(unsafe { ffi::tcg_gemm_import(entries.as_ptr(), entries.len() as i64) })
}
