//! `csrc/autograd.cpp`: `torch::autograd::grad`.

use super::{adopt, check, ffi, tensor_ptrs};
use crate::error::{Error, Result};
use tch::Tensor;

/// `torch::autograd::grad(outputs, inputs, grad_outputs, retain_graph, create_graph = false,
/// allow_unused)`: one gradient per input (`None` where unused and `allow_unused`).
/// `grad_outputs`, when given, must have one tensor per output ([`Error::Misuse`] otherwise).
pub(crate) fn grad(
    outputs: &[&Tensor],
    inputs: &[&Tensor],
    grad_outputs: Option<&[Tensor]>,
    retain_graph: bool,
    allow_unused: bool,
) -> Result<Vec<Option<Tensor>>> {
    if let Some(g) = grad_outputs {
        if g.len() != outputs.len() {
            let msg = format!("autograd::grad: {} grad_outputs for {} outputs", g.len(), outputs.len());
            return Err(Error::Misuse(msg));
        }
    }
    let outs = tensor_ptrs(outputs.iter().copied());
    let ins = tensor_ptrs(inputs.iter().copied());
    let gouts = grad_outputs.map(tensor_ptrs);
    let mut out: Vec<ffi::tcg_tensor> = vec![std::ptr::null_mut(); ins.len()];
    // SAFETY: every pointer array holds live tensor handles borrowed for the call (or is null
    // for grad_outputs, whose length is checked above); `out` has one slot per input.
    check(unsafe {
        ffi::tcg_autograd_grad(
            outs.as_ptr(),
            outs.len(),
            ins.as_ptr(),
            ins.len(),
            gouts.as_ref().map_or(std::ptr::null(), |g| g.as_ptr()),
            retain_graph,
            false,
            allow_unused,
            out.as_mut_ptr(),
        )
    })?;
    // SAFETY: on success each non-null slot is a new heap at::Tensor that nobody else owns.
    Ok(out.into_iter().map(|p| unsafe { adopt(p) }).collect())
}
