//! `csrc/linear.cpp` (and `csrc/cuda/linear_own.cpp` behind it): the linear layer whose backward
//! computes the bias gradient in the weight-gradient GEMM.

use super::{adopt_some, check, ffi, opt_tensor_ptr, tensor_ptr};
use crate::error::Result;
use tch::Tensor;

use super::kernels::RawKernels;
pub(crate) use ffi::tcg_weight_grad as RawWeightGrad;

/// `x · weightᵀ + bias` (differentiable), and whether the crate's path ran.
pub(crate) fn forward(
    x: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    wgrad: RawWeightGrad,
    kernels: RawKernels,
) -> Result<(Tensor, bool)> {
    let raw = ffi::tcg_linear_inputs { x: tensor_ptr(x), weight: tensor_ptr(weight), bias: opt_tensor_ptr(bias) };
    let (mut y, mut ran_own) = (std::ptr::null_mut(), false);
    // SAFETY: `raw` holds live tensor handles (bias may be null) for the call; the out slots are
    // valid; the shim writes a new handle or null into `y`.
    check(unsafe { ffi::tcg_linear_forward(&raw, wgrad, kernels, &mut y, &mut ran_own) })?;
    // SAFETY: the slot holds a new handle made for this call (or null), owned by nobody else.
    let y = unsafe { adopt_some(y, "linear")? };
    Ok((y, ran_own))
}
