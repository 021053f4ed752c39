//! `csrc/rotary.cpp` (and `csrc/cuda/rotary_own.cpp` behind it): rotary position embeddings.

use super::kernels::RawKernels;
use super::{adopt_some, check, ffi, opt_tensor_ptr, tensor_ptr};
use crate::error::Result;
use std::ptr::null_mut;
use tch::Tensor;

/// Which elements pair up, as the shim takes it.
pub(crate) use ffi::tcg_rotary_layout as RawRotaryLayout;

/// q and k rotated at positions `offset` (+ the device value `offset_dev`) onwards, and whether
/// the crate's kernel ran.
pub(crate) fn apply(
    q: &Tensor,
    k: &Tensor,
    tables: (&Tensor, &Tensor),
    offset: i64,
    offset_dev: Option<&Tensor>,
    layout: RawRotaryLayout,
    kernels: RawKernels,
) -> Result<(Tensor, Tensor, bool)> {
    let inputs = ffi::tcg_rotary_inputs {
        q: tensor_ptr(q),
        k: tensor_ptr(k),
        cos: tensor_ptr(tables.0),
        sin: tensor_ptr(tables.1),
        offset: opt_tensor_ptr(offset_dev),
    };
    let (mut q_out, mut k_out, mut ran_own) = (null_mut(), null_mut(), false);
    // SAFETY: live tensor handles for the call (borrowed from the arguments); the out slots are
    // valid; the shim writes new handles or null into them.
    check(unsafe { ffi::tcg_rotary_apply(&inputs, offset, layout, kernels, &mut q_out, &mut k_out, &mut ran_own) })?;
    // SAFETY: each slot holds a new handle made for this call (or null), owned by nobody else.
    let q = unsafe { adopt_some(q_out, "rotary q")? };
    // SAFETY: as above.
    let k = unsafe { adopt_some(k_out, "rotary k")? };
    Ok((q, k, ran_own))
}

/// q and k of the fused projection's `qkv` [B, T, heads + 2 kv_heads, D] rotated, and its v,
/// and whether the crate's kernel ran.
pub(crate) fn apply_qkv(
    qkv: &Tensor,
    (heads, kv_heads): (i64, i64),
    tables: (&Tensor, &Tensor),
    (offset, offset_dev): (i64, Option<&Tensor>),
    layout: RawRotaryLayout,
    kernels: RawKernels,
) -> Result<(Tensor, Tensor, Tensor, bool)> {
    let inputs = ffi::tcg_rotary_qkv_inputs {
        qkv: tensor_ptr(qkv),
        cos: tensor_ptr(tables.0),
        sin: tensor_ptr(tables.1),
        offset: opt_tensor_ptr(offset_dev),
        heads,
        kv_heads,
    };
    let (mut q_out, mut k_out, mut v_out, mut ran_own) = (null_mut(), null_mut(), null_mut(), false);
    // SAFETY: live tensor handles for the call (borrowed from the arguments); the out slots are
    // valid; the shim writes new handles or null into them.
    check(unsafe {
        ffi::tcg_rotary_apply_qkv(&inputs, offset, layout, kernels, &mut q_out, &mut k_out, &mut v_out, &mut ran_own)
    })?;
    // SAFETY: each slot holds a new handle made for this call (or null), owned by nobody else.
    let q = unsafe { adopt_some(q_out, "rotary q")? };
    // SAFETY: as above.
    let k = unsafe { adopt_some(k_out, "rotary k")? };
    // SAFETY: as above.
    let v = unsafe { adopt_some(v_out, "rotary v")? };
    Ok((q, k, v, ran_own))
}
