//! Capturable optimizers on ATen's fused kernels: state (step counts, moments, the learning
//! rate) lives in device tensors, so a captured step reads it from memory on every replay, as
//! PyTorch's `capturable=True, fused=True` optimizers do.
//!
//! - [`Sgd`]: momentum, dampening, Nesterov, weight decay (`at::_fused_sgd_`).
//! - [`Adam`]: Adam and AdamW (decoupled weight decay), AMSGrad (`at::_fused_adam_`,
//!   `at::_fused_adamw_`).
//!
//! Both run on CPU too (ATen has CPU kernels), which is how their numerics are tested in CI.

mod adam;
mod sgd;

pub use adam::{Adam, AdamConfig};
pub use sgd::{Sgd, SgdConfig};

use crate::error::{check, Error, Result};
use crate::ffi;
use tch::{nn::VarStore, Device, Tensor};

/// What a training step needs of an optimizer. Implemented by [`Sgd`] and [`Adam`].
pub trait Optimizer {
    /// Applies one update to every parameter that has a gradient. Capturable: no host sync.
    fn step(&mut self) -> Result<()>;
    /// Sets every parameter's gradient to none (PyTorch's `zero_grad(set_to_none=True)`, which
    /// is what capture wants: backward then allocates the grads inside the graph's pool).
    fn zero_grad(&mut self) -> Result<()>;
    /// Sets the learning rate. It is a device tensor that a captured step reads on each replay,
    /// so calling this between replays changes the rate of a captured step without re-capture.
    fn set_lr(&mut self, lr: f64) -> Result<()>;
    /// The learning rate last set (a host-side mirror; reading it never syncs).
    fn lr(&self) -> f64;
    /// The parameters this optimizer updates (shallow clones, sharing storage).
    fn params(&self) -> &[Tensor];
}

/// The trainable variables of a VarStore, checked to share one device.
pub(crate) fn trainable(vs: &VarStore) -> Result<(Vec<Tensor>, Device)> {
    params_on_one_device(vs.trainable_variables())
}

pub(crate) fn params_on_one_device(params: Vec<Tensor>) -> Result<(Vec<Tensor>, Device)> {
    let first = params.first().ok_or_else(|| Error::Misuse("optimizer: no trainable parameters".into()))?;
    let device = first.device();
    if let Some(p) = params.iter().find(|p| p.device() != device) {
        return Err(Error::Misuse(format!(
            "optimizer: parameters live on several devices ({device:?} and {:?}); use one optimizer per device",
            p.device()
        )));
    }
    Ok((params.iter().map(Tensor::shallow_clone).collect(), device))
}

/// Indices and gradients of the parameters that have a gradient.
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

/// Sets the grads of `params` to none.
pub(crate) fn grads_to_none(params: &[Tensor]) -> Result<()> {
    let p = ffi::tensor_ptrs(params);
    // SAFETY: `p` holds live tensor handles (borrowed from `params` for the call's duration).
    check(unsafe { ffi::tcg_grads_set_to_none(p.as_ptr(), p.len()) })
}

/// The learning rate: a 0-d float32 tensor on the parameters' device (the fused kernels read a
/// float from device memory on every launch) and a host mirror of its value.
#[derive(Debug)]
pub(crate) struct Lr {
    tensor: Tensor,
    value: f64,
}

impl Lr {
    pub(crate) fn new(lr: f64, device: Device) -> Result<Self> {
        Ok(Lr { tensor: Tensor::f_full([], lr, (tch::Kind::Float, device))?, value: lr })
    }

    /// Fills the device tensor (an eager op on the current stream: ordered with replays).
    pub(crate) fn set(&mut self, lr: f64) -> Result<()> {
        check_hparam("lr", lr, lr >= 0.0)?;
        let _ = self.tensor.f_fill_(lr)?;
        self.value = lr;
        Ok(())
    }

    pub(crate) fn value(&self) -> f64 {
        self.value
    }

    pub(crate) fn tensor(&self) -> &Tensor {
        &self.tensor
    }
}

pub(crate) fn check_hparam(name: &str, value: f64, ok: bool) -> Result<()> {
    if ok && value.is_finite() {
        Ok(())
    } else {
        Err(Error::Misuse(format!("invalid {name}: {value}")))
    }
}
