//! Capturable SGD on `at::_fused_sgd_` (tensor learning rate).

use super::{check_hparam, grads_to_none, params_on_one_device, trainable, with_grads, Lr, Optimizer};
use crate::error::{check, Error, Result};
use crate::ffi::{self, tensor_ptr as ptr, tensor_ptrs as ptrs};
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
/// tensor learning rate).
///
/// The momentum buffers are created by the first step of each parameter, which must run
/// eagerly: warm up at least one step before capturing (the capture helpers do). A first step
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
    params: Vec<Tensor>,
    bufs: Vec<Option<Tensor>>,
    lr: Lr,
    config: SgdConfig,
}

impl Sgd {
    /// An optimizer over the trainable variables of `vs`.
    pub fn new(vs: &VarStore, config: SgdConfig) -> Result<Self> {
        let (params, device) = trainable(vs)?;
        Self::build(params, device, config)
    }

    /// An optimizer over `params` (all on one device).
    pub fn from_params(params: Vec<Tensor>, config: SgdConfig) -> Result<Self> {
        let (params, device) = params_on_one_device(params)?;
        Self::build(params, device, config)
    }

    fn build(params: Vec<Tensor>, device: tch::Device, config: SgdConfig) -> Result<Self> {
        config.validate()?;
        let lr = Lr::new(config.lr, device)?;
        let bufs = params.iter().map(|_| None).collect();
        Ok(Sgd { params, bufs, lr, config })
    }

    /// The hyper-parameters.
    pub fn config(&self) -> &SgdConfig {
        &self.config
    }

    /// The learning-rate tensor a captured step reads.
    pub fn lr_tensor(&self) -> &Tensor {
        self.lr.tensor()
    }

    /// The momentum buffer of parameter `i`, once its first step has run.
    pub fn momentum_buffer(&self, i: usize) -> Option<&Tensor> {
        self.bufs.get(i).and_then(Option::as_ref)
    }

    fn fused(&self, params: &[&Tensor], grads: &[&Tensor], bufs: &[&Tensor], first: bool) -> Result<()> {
        let (p, g, b) = (ptrs(params.iter().copied()), ptrs(grads.iter().copied()), ptrs(bufs.iter().copied()));
        let c = &self.config;
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
                ptr(self.lr.tensor()),
                c.dampening,
                i32::from(c.nesterov),
                i32::from(c.maximize),
                i32::from(first),
            )
        })
    }
}

impl Optimizer for Sgd {
    fn step(&mut self) -> Result<()> {
        let (idx, grads) = with_grads(&self.params)?;
        if idx.is_empty() {
            return Ok(());
        }
        if self.config.momentum == 0.0 {
            let params: Vec<&Tensor> = idx.iter().map(|&i| &self.params[i]).collect();
            let grads: Vec<&Tensor> = grads.iter().collect();
            return self.fused(&params, &grads, &[], false);
        }
        // Parameters whose buffer exists take one launch; first steps (buffers created now,
        // initialised by the kernel) another.
        let mut first = Vec::new();
        let mut later = Vec::new();
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
                let i = idx[k];
                self.bufs[i] = Some(grads[k].f_empty_like()?);
            }
        }
        for (group, is_first) in [(&later, false), (&first, true)] {
            if group.is_empty() {
                continue;
            }
            let params: Vec<&Tensor> = group.iter().map(|&k| &self.params[idx[k]]).collect();
            let gs: Vec<&Tensor> = group.iter().map(|&k| &grads[k]).collect();
            let bufs: Vec<&Tensor> = group
                .iter()
                .map(|&k| self.bufs[idx[k]].as_ref().ok_or_else(|| Error::Libtorch("momentum buffer missing".into())))
                .collect::<Result<_>>()?;
            self.fused(&params, &gs, &bufs, is_first)?;
        }
        Ok(())
    }

    fn zero_grad(&mut self) -> Result<()> {
        grads_to_none(&self.params)
    }

    fn set_lr(&mut self, lr: f64) -> Result<()> {
        self.lr.set(lr)
    }

    fn lr(&self) -> f64 {
        self.lr.value()
    }

    fn params(&self) -> &[Tensor] {
        &self.params
    }
}
