//! `csrc/rotary.cpp` (and `csrc/cuda/rotary_own.cpp` behind it): rotary position embeddings.

use super::kernels::RawKernels;
use super::linear::RawWeightGrad;
use super::{adopt, adopt_some, check, ffi, opt_tensor_ptr, tensor_ptr};
use crate::error::{Error, Result};
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

/// The projection `x · weightᵀ (+ bias)` read as q | k | v with q and k rotated, in one autograd
/// node on the crate's path: `Some((q, k, v))` where that path ran, `None` where it does not take
/// these inputs under [`RawKernels`]' automatic choice (or the choice is PyTorch's).
#[allow(clippy::too_many_arguments)]
pub(crate) fn project_qkv(
    x: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    (heads, kv_heads): (i64, i64),
    tables: (&Tensor, &Tensor),
    gemm_tables: Option<(&Tensor, &Tensor)>,
    offset: i64,
    layout: RawRotaryLayout,
    (wgrad, kernels): (RawWeightGrad, RawKernels),
) -> Result<Option<(Tensor, Tensor, Tensor)>> {
    let inputs = ffi::tcg_rotary_project_inputs {
        x: tensor_ptr(x),
        weight: tensor_ptr(weight),
        bias: opt_tensor_ptr(bias),
        cos: tensor_ptr(tables.0),
        sin: tensor_ptr(tables.1),
        cos_gemm: opt_tensor_ptr(gemm_tables.map(|t| t.0)),
        sin_gemm: opt_tensor_ptr(gemm_tables.map(|t| t.1)),
        heads,
        kv_heads,
    };
    let (mut q_out, mut k_out, mut v_out, mut ran_own) = (null_mut(), null_mut(), null_mut(), false);
    // SAFETY: live tensor handles for the call (borrowed from the arguments; the bias may be
    // null); the out slots are valid; the shim writes new handles or null into them.
    check(unsafe {
        ffi::tcg_rotary_project_qkv(
            &inputs,
            offset,
            layout,
            wgrad,
            kernels,
            &mut q_out,
            &mut k_out,
            &mut v_out,
            &mut ran_own,
        )
    })?;
    // SAFETY: each slot holds a new handle made for this call (or null), owned by nobody else;
    // all three are adopted before any is checked, so none is left behind.
    let (q, k, v) = unsafe { (adopt(q_out), adopt(k_out), adopt(v_out)) };
    match (ran_own, q, k, v) {
        (true, Some(q), Some(k), Some(v)) => Ok(Some((q, k, v))),
        (false, None, None, None) => Ok(None),
        _ => Err(Error::Libtorch("rotary projection: the shim returned an incomplete result".into())),
    }
}

/// `table` [positions, D/2] with each row's angles in the order the projection's GEMM holds the
/// pairs (`tcg_rotary_permuted_table`).
pub(crate) fn permuted_table(table: &Tensor) -> Result<Tensor> {
    let mut out = null_mut();
    // SAFETY: a live tensor handle for the call; the out slot is valid; the shim writes a new
    // handle or null into it.
    check(unsafe { ffi::tcg_rotary_permuted_table(tensor_ptr(table), &mut out) })?;
    // SAFETY: the slot holds a new handle made for this call (or null), owned by nobody else.
    unsafe { adopt_some(out, "rotary permuted table") }
}
