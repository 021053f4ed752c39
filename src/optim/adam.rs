//! Capturable Adam / AdamW on `at::_fused_adam_` / `at::_fused_adamw_` (tensor learning rate).

use super::groups::{copy_state, param_key};
use super::{by_dtype, check_hparam, optional_ptr, with_grads, Groups, HyperParams, LrHandle, Optimizer, ParamGroup};
use crate::error::{check, Result};
use crate::ffi::{self, tensor_ptr as ptr, tensor_ptrs as ptrs};
use std::collections::HashMap;
use tch::{nn::VarStore, Kind, Tensor};

/// Hyper-parameters of [`Adam`]. Builder style; each setter says its default (PyTorch's).
/// [`AdamConfig::default`] is Adam (L2 weight decay); [`AdamConfig::adamw`] is AdamW.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamConfig {
    lr: f64,
    beta1: f64,
    beta2: f64,
    eps: f64,
    weight_decay: f64,
    amsgrad: bool,
    maximize: bool,
    decoupled: bool,
}

impl Default for AdamConfig {
    fn default() -> Self {
        AdamConfig {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.0,
            amsgrad: false,
            maximize: false,
            decoupled: false,
        }
    }
}

impl AdamConfig {
    /// AdamW: decoupled weight decay, default weight decay 1e-2 (PyTorch's `AdamW`).
    pub fn adamw() -> Self {
        AdamConfig { weight_decay: 1e-2, decoupled: true, ..Self::default() }
    }
    /// Learning rate. Default: 1e-3.
    pub fn lr(mut self, lr: f64) -> Self {
        self.lr = lr;
        self
    }
    /// Coefficients of the running averages of the gradient and its square. Default: (0.9, 0.999).
    pub fn betas(mut self, beta1: f64, beta2: f64) -> Self {
        self.beta1 = beta1;
        self.beta2 = beta2;
        self
    }
    /// Added to the denominator. Default: 1e-8.
    pub fn eps(mut self, eps: f64) -> Self {
        self.eps = eps;
        self
    }
    /// Weight decay: L2 for Adam, decoupled for AdamW. Default: 0 (Adam), 1e-2 (AdamW).
    pub fn weight_decay(mut self, wd: f64) -> Self {
        self.weight_decay = wd;
        self
    }
    /// The AMSGrad variant. Default: false.
    pub fn amsgrad(mut self, yes: bool) -> Self {
        self.amsgrad = yes;
        self
    }
    /// Maximize the objective instead of minimizing. Default: false.
    pub fn maximize(mut self, yes: bool) -> Self {
        self.maximize = yes;
        self
    }
    /// Whether this is AdamW (decoupled weight decay).
    pub fn is_adamw(&self) -> bool {
        self.decoupled
    }
}

impl HyperParams for AdamConfig {
    fn lr(&self) -> f64 {
        self.lr
    }
    fn validate(&self) -> Result<()> {
        check_hparam("lr", self.lr, self.lr >= 0.0)?;
        check_hparam("beta1", self.beta1, (0.0..1.0).contains(&self.beta1))?;
        check_hparam("beta2", self.beta2, (0.0..1.0).contains(&self.beta2))?;
        check_hparam("eps", self.eps, self.eps >= 0.0)?;
        check_hparam("weight_decay", self.weight_decay, self.weight_decay >= 0.0)
    }
    fn named(&self) -> Vec<(&'static str, f64)> {
        vec![("beta1", self.beta1), ("beta2", self.beta2), ("eps", self.eps), ("weight_decay", self.weight_decay)]
    }
    fn set_named(&mut self, name: &str, value: f64) {
        match name {
            "beta1" => self.beta1 = value,
            "beta2" => self.beta2 = value,
            "eps" => self.eps = value,
            "weight_decay" => self.weight_decay = value,
            _ => {}
        }
    }
}

/// Adam and AdamW, capturable (PyTorch's `Adam(capturable=True, fused=True)` and `AdamW(...)`).
///
/// State lives on the parameters' device: first and second moments (and the AMSGrad maximum),
/// one step counter per parameter (0-d float32, as PyTorch's capturable/fused Adam keeps), and
/// one learning-rate tensor per group. A step increments the counters of the parameters that
/// have a gradient in one multi-tensor kernel (`_foreach_add_`), then runs one fused kernel per
/// group: a parameter that first gets a gradient at step t (progressive unfreezing, a
/// conditional branch) starts its own count at 1 and gets PyTorch's bias correction, exactly as
/// `torch.optim.Adam` does.
///
/// ```no_run
/// # fn main() -> tch_cuda_graphs::Result<()> {
/// use tch::{nn, Device};
/// use tch_cuda_graphs::optim::{Adam, AdamConfig, Optimizer};
/// let vs = nn::VarStore::new(Device::Cuda(0));
/// let _layer = nn::linear(vs.root(), 4, 4, Default::default());
/// let mut opt = Adam::new(&vs, AdamConfig::adamw().lr(3e-4))?;
/// // ... loss.backward() ...
/// opt.step()?;
/// opt.set_lr(1e-4)?; // takes effect in captured steps too
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Adam {
    groups: Groups<AdamConfig>,
    exp_avg: Vec<Tensor>,
    exp_avg_sq: Vec<Tensor>,
    /// Empty tensors for parameters of groups without AMSGrad.
    max_exp_avg_sq: Vec<Tensor>,
    steps: Vec<Tensor>,
}

impl Adam {
    /// An optimizer over the trainable variables of `vs`, one group per tch group
    /// (`nn::Path::set_group`), each with `config`.
    pub fn new(vs: &VarStore, config: AdamConfig) -> Result<Self> {
        Self::build(Groups::from_var_store(vs, config)?)
    }

    /// An optimizer over `params` (all on one device), one group; state names `param{i}`.
    pub fn from_params(params: Vec<Tensor>, config: AdamConfig) -> Result<Self> {
        Self::build(Groups::from_params(params, config)?)
    }

    /// An optimizer over explicit groups, each with its own hyper-parameters (see
    /// [`super::split_params`]). Adam and AdamW groups may be mixed.
    pub fn with_groups(groups: Vec<ParamGroup<AdamConfig>>) -> Result<Self> {
        Self::build(Groups::build(groups)?)
    }

    fn build(groups: Groups<AdamConfig>) -> Result<Self> {
        let device = groups.device();
        let zeros = |p: &Tensor| -> Result<Tensor> { Ok(p.f_zeros_like()?.f_detach()?) };
        let exp_avg = groups.params.iter().map(zeros).collect::<Result<Vec<_>>>()?;
        let exp_avg_sq = groups.params.iter().map(zeros).collect::<Result<Vec<_>>>()?;
        let mut max_exp_avg_sq = Vec::with_capacity(groups.params.len());
        for g in &groups.groups {
            for i in g.range.clone() {
                max_exp_avg_sq.push(if g.config.amsgrad {
                    zeros(&groups.params[i])?
                } else {
                    Tensor::f_empty([0], (Kind::Float, device))?
                });
            }
        }
        let steps =
            groups.params.iter().map(|_| Tensor::f_zeros([], (Kind::Float, device))).collect::<Result<Vec<_>, _>>()?;
        Ok(Adam { groups, exp_avg, exp_avg_sq, max_exp_avg_sq, steps })
    }

    /// The hyper-parameters of group `g`.
    pub fn config(&self, g: usize) -> Option<&AdamConfig> {
        self.groups.groups.get(g).map(|g| &g.config)
    }

    /// The learning-rate tensor of group 0 (what a captured step reads).
    pub fn lr_tensor(&self) -> &Tensor {
        self.groups.groups[0].lr.tensor()
    }

    /// The step counter of parameter `i` (0-d float32 on the parameters' device): how many
    /// updates that parameter has had.
    pub fn step_tensor(&self, i: usize) -> Option<&Tensor> {
        self.steps.get(i)
    }

    /// First and second moment of parameter `i`.
    pub fn moments(&self, i: usize) -> Option<(&Tensor, &Tensor)> {
        Some((self.exp_avg.get(i)?, self.exp_avg_sq.get(i)?))
    }
}

impl Optimizer for Adam {
    fn step_scaled(&mut self, grad_scale: Option<&Tensor>, found_inf: Option<&Tensor>) -> Result<()> {
        let (scale, found) = (optional_ptr(grad_scale), optional_ptr(found_inf));
        for group in &self.groups.groups {
            let base = group.range.start;
            let (idx, grads) = with_grads(&self.groups.params[group.range.clone()])?;
            let c = &group.config;
            // one fused launch per group and dtype
            for ks in by_dtype(idx.iter().map(|&i| &self.groups.params[base + i])) {
                let at = |v: &[Tensor]| ptrs(ks.iter().map(|&k| &v[base + idx[k]]));
                let (p, m, v, steps) =
                    (at(&self.groups.params), at(&self.exp_avg), at(&self.exp_avg_sq), at(&self.steps));
                let vmax = if c.amsgrad { at(&self.max_exp_avg_sq) } else { Vec::new() };
                let g = ptrs(ks.iter().map(|&k| &grads[k]));
                // SAFETY: every pointer is a live tensor handle borrowed for the call (or null for
                // an absent scale); `p`, `g`, `m`, `v` and `steps` have p.len() entries, `vmax`
                // has vmax.len() (0 or p.len()). The shim increments `steps` (one _foreach_add_)
                // before the fused update and takes a skipped step back after it.
                check(unsafe {
                    ffi::tcg_fused_adam(
                        i32::from(c.decoupled),
                        p.as_ptr(),
                        g.as_ptr(),
                        m.as_ptr(),
                        v.as_ptr(),
                        vmax.as_ptr(),
                        vmax.len(),
                        steps.as_ptr(),
                        p.len(),
                        ptr(group.lr.tensor()),
                        c.beta1,
                        c.beta2,
                        c.weight_decay,
                        c.eps,
                        i32::from(c.amsgrad),
                        i32::from(c.maximize),
                        scale,
                        found,
                    )
                })?;
            }
        }
        Ok(())
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
        for (i, name) in self.groups.names.iter().enumerate() {
            out.push((param_key(name, "exp_avg"), self.exp_avg[i].f_detach()?));
            out.push((param_key(name, "exp_avg_sq"), self.exp_avg_sq[i].f_detach()?));
            out.push((param_key(name, "step"), self.steps[i].f_detach()?));
            if self.max_exp_avg_sq[i].numel() > 0 {
                out.push((param_key(name, "max_exp_avg_sq"), self.max_exp_avg_sq[i].f_detach()?));
            }
        }
        Ok(out)
    }

    fn load_state(&mut self, state: &HashMap<String, Tensor>) -> Result<()> {
        let amsgrad: Vec<bool> = self.max_exp_avg_sq.iter().map(|t| t.numel() > 0).collect();
        self.groups.check_state(state, |i| {
            let (shape, kind) = (self.groups.params[i].size(), self.exp_avg[i].kind());
            let mut fields = vec![
                ("exp_avg", shape.clone(), kind, true),
                ("exp_avg_sq", shape.clone(), kind, true),
                ("step", vec![], Kind::Float, true),
            ];
            if amsgrad[i] {
                fields.push(("max_exp_avg_sq", shape, kind, true));
            }
            fields
        })?;
        for (i, name) in self.groups.names.iter().enumerate() {
            copy_state(&self.exp_avg[i], &state[&param_key(name, "exp_avg")])?;
            copy_state(&self.exp_avg_sq[i], &state[&param_key(name, "exp_avg_sq")])?;
            copy_state(&self.steps[i], &state[&param_key(name, "step")])?;
            if amsgrad[i] {
                copy_state(&self.max_exp_avg_sq[i], &state[&param_key(name, "max_exp_avg_sq")])?;
            }
        }
        self.groups.load_state(state)
    }
}
