//! Capturable SGD on `at::_fused_sgd_` (tensor learning rate).

use super::groups::{copy_state, param_key};
use super::{by_dtype, check_hparam, optional_ptr, with_grads, Groups, HyperParams, LrHandle, Optimizer, ParamGroup};
use crate::error::{check, Error, Result};
use crate::ffi::{self, tensor_ptr as ptr, tensor_ptrs as ptrs};
use std::collections::HashMap;
use tch::{nn::VarStore, Tensor};

/// Hyper-parameters of [`Sgd`]. Builder style; each setter says its default (PyTorch's).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SgdConfig {
    lr: f64,
    momentum: f64,
    dampening: f64,
    weight_decay: f64,
    nesterov: bool,
    maximize: bool,
}

impl Default for SgdConfig {
    fn default() -> Self {
        SgdConfig { lr: 1e-3, momentum: 0.0, dampening: 0.0, weight_decay: 0.0, nesterov: false, maximize: false }
    }
}

impl SgdConfig {
    /// Learning rate. Default: 1e-3.
    pub fn lr(mut self, lr: f64) -> Self {
        self.lr = lr;
        self
    }
    /// Momentum factor. Default: 0 (no momentum buffers).
    pub fn momentum(mut self, m: f64) -> Self {
        self.momentum = m;
        self
    }
    /// Dampening of the momentum. Default: 0.
    pub fn dampening(mut self, d: f64) -> Self {
        self.dampening = d;
        self
    }
    /// L2 weight decay. Default: 0.
    pub fn weight_decay(mut self, wd: f64) -> Self {
        self.weight_decay = wd;
        self
    }
    /// Nesterov momentum (needs momentum > 0 and dampening 0). Default: false.
    pub fn nesterov(mut self, yes: bool) -> Self {
        self.nesterov = yes;
        self
    }
    /// Maximize the objective instead of minimizing. Default: false.
    pub fn maximize(mut self, yes: bool) -> Self {
        self.maximize = yes;
        self
    }
}

impl HyperParams for SgdConfig {
    fn lr(&self) -> f64 {
        self.lr
    }
    fn validate(&self) -> Result<()> {
        check_hparam("lr", self.lr, self.lr >= 0.0)?;
        check_hparam("momentum", self.momentum, self.momentum >= 0.0)?;
        check_hparam("dampening", self.dampening, true)?;
        check_hparam("weight_decay", self.weight_decay, self.weight_decay >= 0.0)?;
        if self.nesterov && (self.momentum <= 0.0 || self.dampening != 0.0) {
            return Err(Error::Misuse("Nesterov momentum needs momentum > 0 and zero dampening".into()));
        }
        Ok(())
    }
    fn named(&self) -> Vec<(&'static str, f64)> {
        vec![("momentum", self.momentum), ("dampening", self.dampening), ("weight_decay", self.weight_decay)]
    }
    fn set_named(&mut self, name: &str, value: f64) {
        match name {
            "momentum" => self.momentum = value,
            "dampening" => self.dampening = value,
            "weight_decay" => self.weight_decay = value,
            _ => {}
        }
    }
}

/// Stochastic gradient descent with momentum, capturable (PyTorch's `SGD(fused=True)` with a
/// tensor learning rate), with parameter groups.
///
/// The momentum buffers are created by the first step of each parameter, which must run
/// eagerly: warm up at least one step before capturing ([`crate::TrainStep`] does). A first step
/// inside a capture is refused with [`Error::Misuse`].
///
/// ```no_run
/// # fn main() -> tch_cuda_graphs::Result<()> {
/// use tch::{nn, Device};
/// use tch_cuda_graphs::optim::{Optimizer, Sgd, SgdConfig};
/// let vs = nn::VarStore::new(Device::Cuda(0));
/// let _layer = nn::linear(vs.root(), 4, 4, Default::default());
/// let mut opt = Sgd::new(&vs, SgdConfig::default().lr(0.1).momentum(0.9))?;
/// // ... loss.backward() ...
/// opt.step()?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Sgd {
    groups: Groups<SgdConfig>,
    bufs: Vec<Option<Tensor>>,
    /// The grad scale and found-inf tensors of the step under way (mixed precision).
    scaled: (Option<Tensor>, Option<Tensor>),
}

impl Sgd {
    /// An optimizer over the trainable variables of `vs`, one group per tch group, each with
    /// `config`.
    pub fn new(vs: &VarStore, config: SgdConfig) -> Result<Self> {
        Ok(Sgd::build(Groups::from_var_store(vs, config)?))
    }

    /// An optimizer over `params` (all on one device), one group; state names `param{i}`.
    pub fn from_params(params: Vec<Tensor>, config: SgdConfig) -> Result<Self> {
        Ok(Sgd::build(Groups::from_params(params, config)?))
    }

    /// An optimizer over explicit groups, each with its own hyper-parameters.
    pub fn with_groups(groups: Vec<ParamGroup<SgdConfig>>) -> Result<Self> {
        Ok(Sgd::build(Groups::build(groups)?))
    }

    fn build(groups: Groups<SgdConfig>) -> Self {
        let bufs = groups.params.iter().map(|_| None).collect();
        Sgd { groups, bufs, scaled: (None, None) }
    }

    /// The hyper-parameters of group `g`.
    pub fn config(&self, g: usize) -> Option<&SgdConfig> {
        self.groups.groups.get(g).map(|g| &g.config)
    }

    /// The learning-rate tensor of group 0 (what a captured step reads).
    pub fn lr_tensor(&self) -> &Tensor {
        self.groups.groups[0].lr.tensor()
    }

    /// The momentum buffer of parameter `i`, once its first step has run.
    pub fn momentum_buffer(&self, i: usize) -> Option<&Tensor> {
        self.bufs.get(i).and_then(Option::as_ref)
    }

    /// One fused launch per dtype of `params`.
    fn fused(&self, group: usize, params: &[&Tensor], grads: &[&Tensor], bufs: &[&Tensor], first: bool) -> Result<()> {
        for ks in by_dtype(params.iter().copied()) {
            let pick = |v: &[&Tensor]| -> Vec<Tensor> {
                ks.iter().filter_map(|&k| v.get(k)).map(|t| t.shallow_clone()).collect()
            };
            let (p, g, b) = (pick(params), pick(grads), pick(bufs));
            self.fused_one(group, &p, &g, &b, first)?;
        }
        Ok(())
    }

    fn fused_one(&self, group: usize, params: &[Tensor], grads: &[Tensor], bufs: &[Tensor], first: bool) -> Result<()> {
        let (p, g, b) = (ptrs(params), ptrs(grads), ptrs(bufs));
        let (scale, found) = (optional_ptr(self.scaled.0.as_ref()), optional_ptr(self.scaled.1.as_ref()));
        let group = &self.groups.groups[group];
        let c = &group.config;
        // SAFETY: every pointer is a live tensor handle borrowed for the call; lengths match
        // the vectors passed.
        check(unsafe {
            ffi::tcg_fused_sgd(
                p.as_ptr(),
                g.as_ptr(),
                b.as_ptr(),
                p.len(),
                b.len(),
                c.weight_decay,
                c.momentum,
                ptr(group.lr.tensor()),
                c.dampening,
                i32::from(c.nesterov),
                i32::from(c.maximize),
                i32::from(first),
                scale,
                found,
            )
        })
    }

    fn step_group(&mut self, g: usize) -> Result<()> {
        let range = self.groups.groups[g].range.clone();
        let (idx, grads) = with_grads(&self.groups.params[range.clone()])?;
        if idx.is_empty() {
            return Ok(());
        }
        let idx: Vec<usize> = idx.into_iter().map(|i| range.start + i).collect();
        if self.groups.groups[g].config.momentum == 0.0 {
            let params: Vec<&Tensor> = idx.iter().map(|&i| &self.groups.params[i]).collect();
            let grads: Vec<&Tensor> = grads.iter().collect();
            return self.fused(g, &params, &grads, &[], false);
        }
        // Parameters whose buffer exists take one launch; first steps (buffers created now,
        // initialised by the kernel) another.
        let (mut first, mut later) = (Vec::new(), Vec::new());
        for (k, &i) in idx.iter().enumerate() {
            if self.bufs[i].is_none() {
                first.push(k)
            } else {
                later.push(k)
            }
        }
        if !first.is_empty() {
            if crate::stream::is_current_stream_capturing()? {
                return Err(Error::Misuse(
                    "Sgd with momentum: the first step creates the momentum buffers and must run eagerly; \
                     warm up at least one step before capture"
                        .into(),
                ));
            }
            for &k in &first {
                self.bufs[idx[k]] = Some(grads[k].f_empty_like()?);
            }
        }
        for (set, is_first) in [(&later, false), (&first, true)] {
            if set.is_empty() {
                continue;
            }
            let params: Vec<&Tensor> = set.iter().map(|&k| &self.groups.params[idx[k]]).collect();
            let gs: Vec<&Tensor> = set.iter().map(|&k| &grads[k]).collect();
            let bufs: Vec<&Tensor> = set
                .iter()
                .map(|&k| self.bufs[idx[k]].as_ref().ok_or_else(|| Error::Libtorch("momentum buffer missing".into())))
                .collect::<Result<_>>()?;
            self.fused(g, &params, &gs, &bufs, is_first)?;
        }
        Ok(())
    }
}

impl Optimizer for Sgd {
    fn step_scaled(&mut self, grad_scale: Option<&Tensor>, found_inf: Option<&Tensor>) -> Result<()> {
        self.scaled = (grad_scale.map(Tensor::shallow_clone), found_inf.map(Tensor::shallow_clone));
        let r = (0..self.groups.groups.len()).try_for_each(|g| self.step_group(g));
        self.scaled = (None, None);
        r
    }

    fn params(&self) -> &[Tensor] {
        &self.groups.params
    }

    fn lr_handles(&self) -> Vec<LrHandle> {
        self.groups.lr_handles()
    }

    fn state(&self) -> Result<Vec<(String, Tensor)>> {
        let mut out = Vec::new();
        self.groups.state(&mut out)?;
        for (name, buf) in self.groups.names.iter().zip(&self.bufs) {
            if let Some(b) = buf {
                out.push((param_key(name, "momentum_buffer"), b.f_detach()?));
            }
        }
        Ok(out)
    }

    /// A parameter whose buffer exists here must have one in `state` (a captured step cannot go
    /// back to its first step); one without gets the saved buffer.
    fn load_state(&mut self, state: &HashMap<String, Tensor>) -> Result<()> {
        self.groups.check_state(state, |i| {
            let p = &self.groups.params[i];
            vec![("momentum_buffer", p.size(), p.kind(), self.bufs[i].is_some())]
        })?;
        for (i, name) in self.groups.names.iter().enumerate() {
            match (&self.bufs[i], state.get(&param_key(name, "momentum_buffer"))) {
                (Some(b), Some(saved)) => copy_state(b, saved)?,
                (None, Some(saved)) => {
                    // a fresh tensor of our own, on our device (the saved one may be shared)
                    self.bufs[i] = Some(saved.f_detach()?.f_to_device(self.groups.device())?.copy());
                }
                _ => {}
            }
        }
        self.groups.load_state(state)
    }
}
