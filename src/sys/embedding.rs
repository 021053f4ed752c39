//! `csrc/embedding.cpp` (and `csrc/cuda/embedding_own.cpp` behind it): the embedding.

use super::kernels::RawKernels;
use super::{adopt_some, check, ffi, tensor_ptr};
use crate::error::Result;
use tch::Tensor;

/// `weight[indices]`, and whether the crate's backward runs for it.
pub(crate) fn embedding(
    weight: &Tensor,
    indices: &Tensor,
    padding_idx: i64,
    kernels: RawKernels,
) -> Result<(Tensor, bool)> {
    let (mut out, mut ran_own) = (std::ptr::null_mut(), false);
    // SAFETY: live tensor handles for the call; the out slots are valid; the shim writes a new
    // handle or null into `out`.
    check(unsafe {
        ffi::tcg_embedding(tensor_ptr(weight), tensor_ptr(indices), padding_idx, kernels, &mut out, &mut ran_own)
    })?;
    // SAFETY: the slot holds a new handle made for this call (or null), owned by nobody else.
    let y = unsafe { adopt_some(out, "embedding")? };
    Ok((y, ran_own))
}
