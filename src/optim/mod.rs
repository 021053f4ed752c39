//! Capturable fused optimizers: state (step counts, moments, the learning rates) lives in device
//! tensors, so a captured step reads it from memory on every replay, as PyTorch's
//! `capturable=True, fused=True` optimizers do.
//!
//! On a CUDA device they run the crate's own kernels by default ([`crate::kernels::Kernels`]): one launch per
//! group and dtype that spreads every parameter over every SM in small chunks (PyTorch's
//! `multi_tensor_apply` gives each 65,536-element chunk one block, so a small model runs on a
//! handful of SMs), with PyTorch's own per-element math, so the results are PyTorch's bit for
//! bit. Where they were not built, cannot load on the GPU, or do not take the tensors
//! (non-contiguous ones, say), the optimizers run PyTorch's fused kernels; ask with
//! [`Optimizer::last_path`] and [`crate::kernels::own_kernels_available`], force either with
//! [`Optimizer::set_kernels`] ([`crate::kernels`]).
//!
//! - [`Sgd`]: momentum, dampening, Nesterov, weight decay (`at::_fused_sgd_`).
//! - [`Adam`]: Adam and AdamW (decoupled weight decay), AMSGrad (`at::_fused_adam_`,
//!   `at::_fused_adamw_`).
//! - Parameter groups ([`ParamGroup`]): each with its own hyper-parameters and learning-rate
//!   tensor, one fused launch per group; from tch's VarStore groups ([`var_store_groups`]),
//!   a name/shape rule ([`split_params`]; [`decay_groups`] for weight decay on matrices and
//!   embeddings only), or lists.
//! - [`LrHandle`]: a cloneable `Send` handle on a group's learning rate that stays reachable
//!   after the optimizer is moved into a step closure (schedules use it: [`crate::schedule`]).
//! - [`Optimizer::state`] / [`Optimizer::load_state`]: named state for checkpoints
//!   ([`crate::checkpoint`]); loading validates everything first, then writes in place.
//!
//! Both run on CPU too (ATen has CPU kernels), which is how their numerics are tested in CI.

/// The [`Optimizer`] methods that an optimizer answers from its `core` field ([`core::Core`]):
/// everything but the step itself.
macro_rules! delegate_to_core {
    () => {
        fn params(&self) -> &[Tensor] {
            &self.core.groups.params
        }
        fn lr_handles(&self) -> Vec<LrHandle> {
            self.core.groups.lr_handles()
        }
        fn kernels(&self) -> Kernels {
            self.core.kernels()
        }
        fn set_kernels(&mut self, kernels: Kernels) -> Result<()> {
            self.core.set_kernels(kernels)
        }
        fn last_path(&self) -> Option<KernelPath> {
            self.core.last_path()
        }
        fn state(&self) -> Result<Vec<(String, Tensor)>> {
            self.core.state()
        }
        fn load_state(&mut self, state: &HashMap<String, Tensor>) -> Result<()> {
            self.core.load_state(state)
        }
    };
}

mod adam;
mod core;
mod groups;
mod sgd;

pub use adam::{Adam, AdamConfig};
pub use groups::{decay_groups, split_params, var_store_groups, LrHandle, NamedParams, ParamGroup, Split};
pub use sgd::{Sgd, SgdConfig};

pub(crate) use groups::{check_hparam, Groups, HyperField, HyperParams};

use crate::error::{Error, Result};
use crate::kernels::{KernelPath, Kernels};
use crate::sys::optim::{self as sys, GradReset};
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
    /// [`step`](Self::step) restricted to the parameters `params` (indices into
    /// [`params`](Self::params)): each gets exactly the update a whole step gives it (the
    /// update of every parameter depends only on its own gradient and state: per-parameter
    /// step counts, moments, momentum), so stepping the parameters in parts, each part once,
    /// equals one step, bit for bit. What lets [`crate::dist::GradAllReduce::backward_and_step`]
    /// update each bucket's parameters as soon as its all-reduce is done. Not for a
    /// [`crate::amp::GradScaler`] step (whose inf check needs every gradient first).
    /// [`Error::Misuse`] for an index out of range; [`Error::Unsupported`] from an optimizer
    /// that cannot (the default).
    fn step_only(&mut self, params: &[usize]) -> Result<()> {
        let _ = params;
        Err(Error::Unsupported("this optimizer cannot step a subset of its parameters".into()))
    }
    /// Sets every parameter's gradient to none (PyTorch's `zero_grad(set_to_none=True)`, which
    /// is what capture wants: backward then allocates the grads inside the graph's pool), except
    /// gradients that are views into a [`crate::dist::GradAllReduce`]'s buckets: those are
    /// zeroed in place (one multi-tensor kernel), so the views stay.
    fn zero_grad(&mut self) -> Result<()> {
        grads_to_none(self.params())
    }
    /// tch's `nn::Optimizer::backward_step`: [`zero_grad`](Self::zero_grad), `loss`'s
    /// backward, [`step`](Self::step). The backward runs outside CUDA autocast, as PyTorch runs
    /// it ([`crate::amp::backward`]; the same as `loss.backward()` without autocast). Capturable.
    fn backward_step(&mut self, loss: &Tensor) -> Result<()> {
        self.zero_grad()?;
        backward_outside_autocast(loss)?;
        self.step()
    }
    /// tch's `backward_step_clip`: [`backward_step`](Self::backward_step) with each gradient
    /// clamped to `[-max, max]` before the step ([`crate::clip_grad_value`]).
    fn backward_step_clip(&mut self, loss: &Tensor, max: f64) -> Result<()> {
        self.zero_grad()?;
        backward_outside_autocast(loss)?;
        crate::clip::clip_grad_value(self.params(), max)?;
        self.step()
    }
    /// tch's `backward_step_clip_norm`: [`backward_step`](Self::backward_step) with the
    /// gradients scaled to a global L2 norm of at most `max`
    /// ([`step_clipped`](Self::step_clipped)).
    fn backward_step_clip_norm(&mut self, loss: &Tensor, max: f64) -> Result<()> {
        self.zero_grad()?;
        backward_outside_autocast(loss)?;
        self.step_clipped(max).map(drop)
    }
    /// [`crate::clip_grad_norm`] to a global L2 norm of at most `max_norm`, then
    /// [`step`](Self::step); returns the norm before clipping (0-d, on the parameters' device;
    /// no host sync, capturable). The update is PyTorch's `clip_grad_norm_(params, max_norm)`
    /// then `step()`, bit for bit. [`Adam`] folds the clipping into its update kernel and leaves
    /// the gradients in memory as backward wrote them; the default (used by [`Sgd`]) clips
    /// them in place first. Not for a [`crate::amp::GradScaler`] step (unscale, clip, then
    /// step scaled).
    ///
    /// ```no_run
    /// # fn main() -> tch_cuda_graphs::Result<()> {
    /// # use tch::{nn, Device};
    /// # use tch_cuda_graphs::optim::{Adam, AdamConfig, Optimizer};
    /// # let vs = nn::VarStore::new(Device::Cuda(0));
    /// let mut opt = Adam::new(&vs, AdamConfig::adamw().lr(3e-4))?;
    /// // ... loss.backward() ...
    /// let grad_norm = opt.step_clipped(1.0)?; // was: clip_grad_norm(&params, 1.0, 2.0)?; opt.step()?;
    /// # let _ = grad_norm; Ok(()) }
    /// ```
    fn step_clipped(&mut self, max_norm: f64) -> Result<Tensor> {
        let norm = crate::clip::clip_grad_norm(self.params(), max_norm, 2.0)?;
        self.step()?;
        Ok(norm)
    }
    /// Zeroes the parameters' gradients in place instead (PyTorch's
    /// `zero_grad(set_to_none=False)`; one `_foreach_zero_` launch): gradients keep their
    /// storage from step to step. In a [`crate::TrainStep`] with several batch shapes this keeps
    /// them out of the graphs' pool (made once, by the first eager step), where gradients set
    /// to none are made inside every capture and outlive it, and the pool grows past the
    /// largest shape (see `docs/train-step.md`, "Several shapes, one pool"). The same numbers either way.
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
    /// The kernels chosen ([`Kernels::Auto`] unless set).
    fn kernels(&self) -> Kernels;
    /// Chooses the kernels of the following steps. [`Kernels::Own`] is refused with
    /// [`Error::Unsupported`] where the own kernels cannot run on the parameters' device.
    /// Re-capture a step already captured for the change to reach it.
    fn set_kernels(&mut self, kernels: Kernels) -> Result<()>;
    /// Which kernels the last step ran (None before any step, or if no parameter had a grad).
    fn last_path(&self) -> Option<KernelPath>;
    /// The optimizer's state by name: per parameter (`"{name}.exp_avg"`, ...) and per group
    /// (`"group.{g}.lr"`, hyper-parameters), as detached tensors (device state is not copied).
    fn state(&self) -> Result<Vec<(String, Tensor)>>;
    /// Loads what [`state`](Self::state) gave, into this optimizer's existing tensors, in
    /// place (so a step already captured continues from it). Everything is validated first
    /// (names, group layout, shapes, dtypes): on error nothing changed.
    /// State that exists here must be in it (a captured step cannot go back to a first step);
    /// SGD's momentum buffers that do not exist yet are made from it.
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
    fn step_only(&mut self, params: &[usize]) -> Result<()> {
        (**self).step_only(params)
    }
    fn step_clipped(&mut self, max_norm: f64) -> Result<Tensor> {
        (**self).step_clipped(max_norm)
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
    fn kernels(&self) -> Kernels {
        (**self).kernels()
    }
    fn set_kernels(&mut self, kernels: Kernels) -> Result<()> {
        (**self).set_kernels(kernels)
    }
    fn last_path(&self) -> Option<KernelPath> {
        (**self).last_path()
    }
    fn state(&self) -> Result<Vec<(String, Tensor)>> {
        (**self).state()
    }
    fn load_state(&mut self, state: &HashMap<String, Tensor>) -> Result<()> {
        (**self).load_state(state)
    }
}

/// `loss.backward()` with CUDA autocast suspended (what [`crate::amp::backward`] does, from below
/// it).
fn backward_outside_autocast(loss: &Tensor) -> Result<()> {
    let _off = crate::sys::amp::AutocastHandle::suspend()?;
    Ok(loss.f_backward()?)
}

/// Zeroes the defined grads of `params` in place.
pub(crate) fn grads_zero(params: &[Tensor]) -> Result<()> {
    sys::grads_reset(params, GradReset::Zero)
}

/// Sets the grads of `params` to none.
pub(crate) fn grads_to_none(params: &[Tensor]) -> Result<()> {
    sys::grads_reset(params, GradReset::ToNone)
}
