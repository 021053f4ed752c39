//! Capturable optimizers on ATen's fused kernels: state (step counts, moments, the learning
//! rates) lives in device tensors, so a captured step reads it from memory on every replay, as
//! PyTorch's `capturable=True, fused=True` optimizers do.
//!
//! - [`Sgd`]: momentum, dampening, Nesterov, weight decay (`at::_fused_sgd_`).
//! - [`Adam`]: Adam and AdamW (decoupled weight decay), AMSGrad (`at::_fused_adam_`,
//!   `at::_fused_adamw_`).
//! - Parameter groups ([`ParamGroup`]): each with its own hyper-parameters and learning-rate
//!   tensor, one fused launch per group; from tch's VarStore groups ([`var_store_groups`]),
//!   a name/shape rule ([`split_params`], e.g. no weight decay on biases and norms), or lists.
//! - [`LrHandle`]: a cloneable `Send` handle on a group's learning rate that stays reachable
//!   after the optimizer is moved into a step closure (schedules use it: [`crate::schedule`]).
//! - [`Optimizer::state`] / [`Optimizer::load_state`]: named state for checkpoints
//!   ([`crate::checkpoint`]); loading validates everything first, then writes in place.
//!
//! Both run on CPU too (ATen has CPU kernels), which is how their numerics are tested in CI.

mod adam;
mod groups;
mod sgd;

pub use adam::{Adam, AdamConfig};
pub use groups::{split_params, var_store_groups, LrHandle, NamedParams, ParamGroup};
pub use sgd::{Sgd, SgdConfig};

pub(crate) use groups::{check_hparam, Groups, HyperParams};

use crate::error::{check, Error, Result};
use crate::ffi;
use std::collections::HashMap;
use tch::Tensor;

/// What a training step needs of an optimizer. Implemented by [`Sgd`] and [`Adam`].
pub trait Optimizer {
    /// Applies one update to every parameter that has a gradient. Capturable: no host sync.
    fn step(&mut self) -> Result<()> {
        self.step_scaled(None, None)
    }
    /// [`step`](Self::step) for mixed precision ([`crate::amp::GradScaler`] calls it): the fused
    /// kernels divide the gradients by `grad_scale` first, and skip the update (Adam's step
    /// counts included) where `found_inf` is 1. Both are 0-d float32 tensors on the device.
    fn step_scaled(&mut self, grad_scale: Option<&Tensor>, found_inf: Option<&Tensor>) -> Result<()>;
    /// Sets every parameter's gradient to none (PyTorch's `zero_grad(set_to_none=True)`, which
    /// is what capture wants: backward then allocates the grads inside the graph's pool).
    fn zero_grad(&mut self) -> Result<()> {
        grads_to_none(self.params())
    }
    /// Zeroes the parameters' gradients in place instead (PyTorch's
    /// `zero_grad(set_to_none=False)`; one `_foreach_zero_` launch): gradients keep their
    /// storage from step to step. In a [`crate::TrainStep`] with several batch shapes this keeps
    /// them out of the graphs' pool (made once, by the first eager step), where gradients set
    /// to none are made inside every capture and outlive it, and the pool grows past the
    /// largest shape (see the README's "Several shapes, one pool"). The same numbers either way.
    fn zero_grad_in_place(&mut self) -> Result<()> {
        grads_zero(self.params())
    }
    /// Sets the learning rate of every group. It is a device tensor per group that a captured
    /// step reads on each replay, so this changes the rate of a captured step without
    /// re-capture.
    fn set_lr(&mut self, lr: f64) -> Result<()> {
        (0..self.group_count()).try_for_each(|g| self.set_group_lr(g, lr))
    }
    /// The learning rate of group 0 (a host-side mirror; reading it never syncs).
    fn lr(&self) -> f64 {
        self.lr_handles().first().map(LrHandle::get).unwrap_or(0.0)
    }
    /// Sets the learning rate of one group.
    fn set_group_lr(&mut self, group: usize, lr: f64) -> Result<()> {
        let handles = self.lr_handles();
        let h = handles.get(group).ok_or_else(|| Error::Misuse(format!("no parameter group {group}")))?;
        h.set(lr)
    }
    /// The parameters this optimizer updates, all groups in order (shallow clones).
    fn params(&self) -> &[Tensor];
    /// How many parameter groups there are.
    fn group_count(&self) -> usize {
        self.lr_handles().len()
    }
    /// One learning-rate handle per group (clones share the device tensor).
    fn lr_handles(&self) -> Vec<LrHandle>;
    /// The optimizer's state by name: per parameter (`"{name}.exp_avg"`, ...) and per group
    /// (`"group.{g}.lr"`, hyper-parameters), as detached tensors (device state is not copied).
    fn state(&self) -> Result<Vec<(String, Tensor)>>;
    /// Loads what [`state`](Self::state) gave, into this optimizer's existing tensors, in
    /// place (so a step already captured continues from it). Everything is validated first
    /// (names, group layout, shapes, dtypes): on error nothing changed.
    fn load_state(&mut self, state: &HashMap<String, Tensor>) -> Result<()>;
}

/// An optimizer chosen at run time (`Box<dyn Optimizer + Send>`) is an optimizer too.
impl<O: Optimizer + ?Sized> Optimizer for Box<O> {
    fn step(&mut self) -> Result<()> {
        (**self).step()
    }
    fn step_scaled(&mut self, grad_scale: Option<&Tensor>, found_inf: Option<&Tensor>) -> Result<()> {
        (**self).step_scaled(grad_scale, found_inf)
    }
    fn zero_grad(&mut self) -> Result<()> {
        (**self).zero_grad()
    }
    fn zero_grad_in_place(&mut self) -> Result<()> {
        (**self).zero_grad_in_place()
    }
    fn set_lr(&mut self, lr: f64) -> Result<()> {
        (**self).set_lr(lr)
    }
    fn lr(&self) -> f64 {
        (**self).lr()
    }
    fn set_group_lr(&mut self, group: usize, lr: f64) -> Result<()> {
        (**self).set_group_lr(group, lr)
    }
    fn params(&self) -> &[Tensor] {
        (**self).params()
    }
    fn group_count(&self) -> usize {
        (**self).group_count()
    }
    fn lr_handles(&self) -> Vec<LrHandle> {
        (**self).lr_handles()
    }
    fn state(&self) -> Result<Vec<(String, Tensor)>> {
        (**self).state()
    }
    fn load_state(&mut self, state: &HashMap<String, Tensor>) -> Result<()> {
        (**self).load_state(state)
    }
}

/// `t`'s handle, or null.
pub(crate) fn optional_ptr(t: Option<&Tensor>) -> ffi::tcg_tensor {
    t.map(ffi::tensor_ptr).unwrap_or(std::ptr::null_mut())
}

/// The positions of `tensors` grouped by dtype, in first-seen order: the fused kernels take one
/// dtype per launch.
pub(crate) fn by_dtype<'a>(tensors: impl IntoIterator<Item = &'a Tensor>) -> Vec<Vec<usize>> {
    let mut kinds: Vec<(tch::Kind, Vec<usize>)> = Vec::new();
    for (k, t) in tensors.into_iter().enumerate() {
        let kind = t.kind();
        match kinds.iter_mut().find(|(kd, _)| *kd == kind) {
            Some((_, v)) => v.push(k),
            None => kinds.push((kind, vec![k])),
        }
    }
    kinds.into_iter().map(|(_, v)| v).collect()
}

/// Indices and gradients of the parameters of `range` that have a gradient.
pub(crate) fn with_grads(params: &[Tensor]) -> Result<(Vec<usize>, Vec<Tensor>)> {
    let mut idx = Vec::with_capacity(params.len());
    let mut grads = Vec::with_capacity(params.len());
    for (i, p) in params.iter().enumerate() {
        let g = p.f_grad()?;
        if g.defined() {
            idx.push(i);
            grads.push(g);
        }
    }
    Ok((idx, grads))
}

/// Zeroes the defined grads of `params` in place.
pub(crate) fn grads_zero(params: &[Tensor]) -> Result<()> {
    let p = ffi::tensor_ptrs(params);
    // SAFETY: `p` holds live tensor handles (borrowed from `params` for the call's duration).
    check(unsafe { ffi::tcg_grads_zero(p.as_ptr(), p.len()) })
}

/// Sets the grads of `params` to none.
pub(crate) fn grads_to_none(params: &[Tensor]) -> Result<()> {
    let p = ffi::tensor_ptrs(params);
    // SAFETY: `p` holds live tensor handles (borrowed from `params` for the call's duration).
    check(unsafe { ffi::tcg_grads_set_to_none(p.as_ptr(), p.len()) })
}
