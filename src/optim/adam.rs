//! Adam / AdamW: the crate's own fused kernel on CUDA, `at::_fused_adam_` / `at::_fused_adamw_`
//! elsewhere (tensor learning rate either way).

use super::core::Core;
use super::{check_hparam, Groups, HyperField, HyperParams, KernelPath, Kernels, LrHandle, Optimizer, ParamGroup};
use crate::error::Result;
use crate::sys::optim::{self as sys, AdamHyper, AdamTensors, Scaling};
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

/// tch's `nn::AdamW` settings (betas, weight decay, epsilon, AMSGrad) as AdamW; tch gives the
/// learning rate to `build`, so set it with [`AdamConfig::lr`].
///
/// ```
/// use tch::nn;
/// use tch_cuda_graphs::optim::AdamConfig;
/// // was: nn::AdamW { wd: 0.1, ..Default::default() }.build(&vs, 3e-4)
/// let cfg = AdamConfig::from(nn::AdamW { wd: 0.1, ..Default::default() }).lr(3e-4);
/// assert_eq!(cfg, AdamConfig::adamw().weight_decay(0.1).lr(3e-4));
/// ```
impl From<tch::nn::AdamW> for AdamConfig {
    fn from(c: tch::nn::AdamW) -> Self {
        let base = AdamConfig::adamw().betas(c.beta1, c.beta2).eps(c.eps);
        base.weight_decay(c.wd).amsgrad(c.amsgrad)
    }
}

/// tch's `nn::Adam` settings as Adam (L2 weight decay, as tch's); the learning rate as above.
impl From<tch::nn::Adam> for AdamConfig {
    fn from(c: tch::nn::Adam) -> Self {
        let base = AdamConfig::default().betas(c.beta1, c.beta2).eps(c.eps);
        base.weight_decay(c.wd).amsgrad(c.amsgrad)
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
    /// Whether AMSGrad is on (it keeps a third moment, `max_exp_avg_sq`).
    pub(crate) fn uses_amsgrad(&self) -> bool {
        self.amsgrad
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
    const FIELDS: &'static [HyperField<Self>] = &[
        HyperField { name: "beta1", get: |c| c.beta1, set: |c, v| c.beta1 = v },
        HyperField { name: "beta2", get: |c| c.beta2, set: |c, v| c.beta2 = v },
        HyperField { name: "eps", get: |c| c.eps, set: |c, v| c.eps = v },
        HyperField { name: "weight_decay", get: |c| c.weight_decay, set: |c, v| c.weight_decay = v },
    ];
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
}

/// Adam and AdamW, capturable (PyTorch's `Adam(capturable=True, fused=True)` and `AdamW(...)`).
///
/// State lives on the parameters' device: first and second moments (and the AMSGrad maximum),
/// one step counter per parameter (0-d float32, as PyTorch's capturable/fused Adam keeps), and
/// one learning-rate tensor per group. A step runs one fused launch per group and dtype over
/// the parameters that have a gradient; it increments their step counts first (the own kernel
/// in place, PyTorch's path with one `_foreach_add_`), so a parameter that first gets a gradient
/// at step t (progressive unfreezing, a conditional branch) starts its own count at 1 and gets
/// PyTorch's bias correction, exactly as `torch.optim.Adam` does.
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
    core: Core<AdamConfig>,
}

// The fields of Adam's state, in `Core::fields` order.
const EXP_AVG: usize = 0;
const EXP_AVG_SQ: usize = 1;
const MAX_EXP_AVG_SQ: usize = 2;
const STEP: usize = 3;

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
    /// [`super::decay_groups`], [`super::split_params`]). Adam and AdamW groups may be mixed.
    pub fn with_groups(groups: Vec<ParamGroup<AdamConfig>>) -> Result<Self> {
        Self::build(Groups::build(groups)?)
    }

    fn build(groups: Groups<AdamConfig>) -> Result<Self> {
        let mut core = Core::new(groups)?;
        let zeros = |p: &Tensor| -> Result<Option<Tensor>> { Ok(Some(p.f_zeros_like()?.f_detach()?)) };
        core.add_field("exp_avg", false, |p, _| zeros(p))?;
        core.add_field("exp_avg_sq", false, |p, _| zeros(p))?;
        core.add_field("max_exp_avg_sq", false, |p, c| if c.amsgrad { zeros(p) } else { Ok(None) })?;
        core.add_field("step", false, |p, _| Ok(Some(Tensor::f_zeros([], (Kind::Float, p.device()))?)))?;
        Ok(Adam { core })
    }

    /// The hyper-parameters of group `g`.
    pub fn config(&self, g: usize) -> Option<&AdamConfig> {
        self.core.groups.groups.get(g).map(|g| &g.config)
    }

    /// The learning-rate tensor of group 0 (what a captured step reads).
    pub fn lr_tensor(&self) -> &Tensor {
        self.core.groups.groups[0].lr.tensor()
    }

    /// The step counter of parameter `i` (0-d float32 on the parameters' device): how many
    /// updates that parameter has had.
    pub fn step_tensor(&self, i: usize) -> Option<&Tensor> {
        self.core.fields[STEP].tensors.get(i)?.as_ref()
    }

    /// First and second moment of parameter `i`.
    pub fn moments(&self, i: usize) -> Option<(&Tensor, &Tensor)> {
        let at = |f: usize| self.core.fields[f].tensors.get(i)?.as_ref();
        Some((at(EXP_AVG)?, at(EXP_AVG_SQ)?))
    }
}

impl Adam {
    /// One update of every parameter from `grads` (one per parameter, in [`Optimizer::params`]'
    /// order) instead of their `.grad`, each multiplied by `clip_coef` first where given: what a
    /// sharded step gives the views of its shard.
    pub(crate) fn step_with_grads(&mut self, grads: &[Tensor], clip_coef: Option<&Tensor>) -> Result<()> {
        self.run_from(None, Some(grads), Scaling { clip_coef, ..Scaling::default() })
    }

    /// One update of the parameters that have a gradient (those in `only`, when given).
    fn run(&mut self, only: Option<&[usize]>, amp: Scaling<'_>) -> Result<()> {
        self.run_from(only, None, amp)
    }

    fn run_from(&mut self, only: Option<&[usize]>, grads: Option<&[Tensor]>, amp: Scaling<'_>) -> Result<()> {
        self.core.begin_step();
        for launch in self.core.launches(only, grads)? {
            let core = &self.core;
            let group = &core.groups.groups[launch.group];
            let c = &group.config;
            let at = |f| core.field_at(f, &launch.idx);
            let grads: Vec<&Tensor> = launch.grads.iter().collect();
            let vmax = if c.amsgrad { at(MAX_EXP_AVG_SQ)? } else { Vec::new() };
            let tensors = AdamTensors {
                params: &core.params_at(&launch.idx),
                grads: &grads,
                exp_avgs: &at(EXP_AVG)?,
                exp_avg_sqs: &at(EXP_AVG_SQ)?,
                max_exp_avg_sqs: &vmax,
                steps: &at(STEP)?,
            };
            let hyper = AdamHyper {
                beta1: c.beta1,
                beta2: c.beta2,
                weight_decay: c.weight_decay,
                eps: c.eps,
                adamw: c.decoupled,
                amsgrad: c.amsgrad,
                maximize: c.maximize,
            };
            let arrivals = core.arrivals().map(|counters| (counters, launch.idx.as_slice()));
            let ran_own = sys::adam(&tensors, group.lr.tensor(), &hyper, amp, core.kernels_arg(), arrivals)?;
            self.core.record(ran_own);
        }
        Ok(())
    }
}

impl Optimizer for Adam {
    fn step_scaled(&mut self, grad_scale: Option<&Tensor>, found_inf: Option<&Tensor>) -> Result<()> {
        self.run(None, Scaling { grad_scale, found_inf, clip_coef: None })
    }

    fn step_only(&mut self, params: &[usize]) -> Result<()> {
        self.run(Some(params), Scaling::default())
    }

    /// The clipping folded into the update: the factor multiplies each gradient as the kernel
    /// reads it (PyTorch's `clip_grad_norm_` then `step`, bit for bit), and the gradients in
    /// memory are left as backward wrote them (one pass over them fewer).
    fn step_clipped(&mut self, max_norm: f64) -> Result<Tensor> {
        let (norm, coef) = crate::clip::clip_factor(&self.core.groups.params, max_norm, 2.0, self.kernels())?;
        self.run(None, Scaling { clip_coef: Some(&coef), ..Scaling::default() })?;
        Ok(norm)
    }

    delegate_to_core!();
}
