//! `csrc/embedding.cpp` (and `csrc/cuda/embedding_own.cpp` behind it): the embedding.

use super::kernels::RawKernels;
use super::{adopt, check, ffi, tensor_ptr};
use crate::error::{Error, Result};
use tch::Tensor;

/// `weight[indices]`, the tie when asked for and made (`tie`: see `tcg_embedding`), and whether
/// the crate's backward runs for it.
pub(crate) fn embedding(
    weight: &Tensor,
    indices: &Tensor,
    padding_idx: i64,
    tie: bool,
    kernels: RawKernels,
) -> Result<(Tensor, Option<Tensor>, bool)> {
    let (mut out, mut tied, mut ran_own) = (std::ptr::null_mut(), std::ptr::null_mut(), false);
    let tie_slot: *mut ffi::tcg_tensor = if tie { &mut tied } else { std::ptr::null_mut() };
    // SAFETY: live tensor handles for the call; the out slots are valid (`tie_slot` null or
    // `tied`); the shim writes a new handle or null into `out` and `tied`.
    check(unsafe {
        ffi::tcg_embedding(
            tensor_ptr(weight),
            tensor_ptr(indices),
            padding_idx,
            kernels,
            &mut out,
            tie_slot,
            &mut ran_own,
        )
    })?;
    // SAFETY: each slot holds a new handle made for this call (or null), owned by nobody else;
    // both are adopted before either is checked.
    let (y, tied) = unsafe { (adopt(out), adopt(tied)) };
    let y = y.ok_or_else(|| Error::Libtorch("embedding: the shim returned no tensor".into()))?;
    Ok((y, tied, ran_own))
}
