//! SGD with momentum: the crate's own fused kernel on CUDA, `at::_fused_sgd_` elsewhere (tensor
//! learning rate either way).

use super::core::{Core, Launch};
use super::{check_hparam, Groups, HyperField, HyperParams, KernelPath, Kernels, LrHandle, Optimizer, ParamGroup};
use crate::error::{Error, Result};
use crate::sys::optim::{self as sys, Scaling, SgdHyper, SgdTensors};
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
    const FIELDS: &'static [HyperField<Self>] = &[
        HyperField { name: "momentum", get: |c| c.momentum, set: |c, v| c.momentum = v },
        HyperField { name: "dampening", get: |c| c.dampening, set: |c, v| c.dampening = v },
        HyperField { name: "weight_decay", get: |c| c.weight_decay, set: |c, v| c.weight_decay = v },
    ];
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
    core: Core<SgdConfig>,
}

// The one field of SGD's state (none until a parameter's first step with momentum).
const MOMENTUM_BUFFER: usize = 0;

impl Sgd {
    /// An optimizer over the trainable variables of `vs`, one group per tch group, each with
    /// `config`.
    pub fn new(vs: &VarStore, config: SgdConfig) -> Result<Self> {
        Sgd::build(Groups::from_var_store(vs, config)?)
    }

    /// An optimizer over `params` (all on one device), one group; state names `param{i}`.
    pub fn from_params(params: Vec<Tensor>, config: SgdConfig) -> Result<Self> {
        Sgd::build(Groups::from_params(params, config)?)
    }

    /// An optimizer over explicit groups, each with its own hyper-parameters.
    pub fn with_groups(groups: Vec<ParamGroup<SgdConfig>>) -> Result<Self> {
        Sgd::build(Groups::build(groups)?)
    }

    fn build(groups: Groups<SgdConfig>) -> Result<Self> {
        let mut core = Core::new(groups)?;
        core.add_field("momentum_buffer", true, |_, _| Ok(None))?;
        Ok(Sgd { core })
    }

    /// The hyper-parameters of group `g`.
    pub fn config(&self, g: usize) -> Option<&SgdConfig> {
        self.core.groups.groups.get(g).map(|g| &g.config)
    }

    /// The learning-rate tensor of group 0 (what a captured step reads).
    pub fn lr_tensor(&self) -> &Tensor {
        self.core.groups.groups[0].lr.tensor()
    }

    /// The momentum buffer of parameter `i`, once its first step has run.
    pub fn momentum_buffer(&self, i: usize) -> Option<&Tensor> {
        self.core.fields[MOMENTUM_BUFFER].tensors.get(i)?.as_ref()
    }

    /// One fused launch over the parameters `set` (positions in `launch`); `first`: their
    /// momentum buffers were made just now (the kernel initialises them).
    fn fused(&mut self, launch: &Launch, set: &[usize], first: bool, amp: Scaling<'_>) -> Result<()> {
        let core = &self.core;
        let group = &core.groups.groups[launch.group];
        let c = &group.config;
        let idx: Vec<usize> = set.iter().map(|&k| launch.idx[k]).collect();
        let grads: Vec<&Tensor> = set.iter().map(|&k| &launch.grads[k]).collect();
        let bufs = if c.momentum == 0.0 { Vec::new() } else { core.field_at(MOMENTUM_BUFFER, &idx)? };
        let tensors = SgdTensors { params: &core.params_at(&idx), grads: &grads, momentum_buffers: &bufs };
        let hyper = SgdHyper {
            weight_decay: c.weight_decay,
            momentum: c.momentum,
            dampening: c.dampening,
            nesterov: c.nesterov,
            maximize: c.maximize,
        };
        let ran_own = sys::sgd(&tensors, group.lr.tensor(), &hyper, first, amp, core.kernels_arg())?;
        self.core.record(ran_own);
        Ok(())
    }

    fn step_launch(&mut self, launch: &Launch, amp: Scaling<'_>) -> Result<()> {
        let all: Vec<usize> = (0..launch.idx.len()).collect();
        if self.core.groups.groups[launch.group].config.momentum == 0.0 {
            return self.fused(launch, &all, false, amp);
        }
        // Parameters whose buffer exists take one launch; first steps (buffers made now,
        // initialised by the kernel) another.
        let bufs = &self.core.fields[MOMENTUM_BUFFER].tensors;
        let (first, later): (Vec<usize>, Vec<usize>) = all.into_iter().partition(|&k| bufs[launch.idx[k]].is_none());
        if !first.is_empty() {
            if crate::stream::is_current_stream_capturing()? {
                return Err(Error::Misuse(
                    "Sgd with momentum: the first step creates the momentum buffers and must run eagerly; \
                     warm up at least one step before capture"
                        .into(),
                ));
            }
            for &k in &first {
                self.core.fields[MOMENTUM_BUFFER].tensors[launch.idx[k]] = Some(launch.grads[k].f_empty_like()?);
            }
        }
        for (set, is_first) in [(&later, false), (&first, true)] {
            if !set.is_empty() {
                self.fused(launch, set, is_first, amp)?;
            }
        }
        Ok(())
    }

    /// One update of the parameters that have a gradient (those in `only`, when given).
    fn run(&mut self, only: Option<&[usize]>, grad_scale: Option<&Tensor>, found_inf: Option<&Tensor>) -> Result<()> {
        let amp = Scaling { grad_scale, found_inf, clip_coef: None };
        self.core.begin_step();
        for launch in self.core.launches(only, None)? {
            self.step_launch(&launch, amp)?;
        }
        Ok(())
    }
}

impl Optimizer for Sgd {
    fn step_scaled(&mut self, grad_scale: Option<&Tensor>, found_inf: Option<&Tensor>) -> Result<()> {
        self.run(None, grad_scale, found_inf)
    }

    fn step_only(&mut self, params: &[usize]) -> Result<()> {
        self.run(Some(params), None, None)
    }

    delegate_to_core!();
}
