//! Capturable Adam / AdamW on `at::_fused_adam_` / `at::_fused_adamw_` (tensor learning rate).

use super::{check_hparam, grads_to_none, params_on_one_device, trainable, with_grads, Lr, Optimizer};
use crate::error::{check, Result};
use crate::ffi::{self, tensor_ptr as ptr, tensor_ptrs as ptrs};
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
/// the learning rate. A step increments the counters of the parameters that have a gradient in
/// one multi-tensor kernel (`_foreach_add_`), then runs one fused kernel: a parameter that first
/// gets a gradient at step t (progressive unfreezing, a conditional branch) starts its own count
/// at 1 and gets PyTorch's bias correction, exactly as `torch.optim.Adam` does.
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
    params: Vec<Tensor>,
    exp_avg: Vec<Tensor>,
    exp_avg_sq: Vec<Tensor>,
    max_exp_avg_sq: Vec<Tensor>,
    steps: Vec<Tensor>,
    lr: Lr,
    config: AdamConfig,
}

impl Adam {
    /// An optimizer over the trainable variables of `vs`.
    pub fn new(vs: &VarStore, config: AdamConfig) -> Result<Self> {
        let (params, device) = trainable(vs)?;
        Self::build(params, device, config)
    }

    /// An optimizer over `params` (all on one device).
    pub fn from_params(params: Vec<Tensor>, config: AdamConfig) -> Result<Self> {
        let (params, device) = params_on_one_device(params)?;
        Self::build(params, device, config)
    }

    fn build(params: Vec<Tensor>, device: tch::Device, config: AdamConfig) -> Result<Self> {
        config.validate()?;
        let zeros = |p: &Tensor| -> Result<Tensor> { Ok(p.f_zeros_like()?.f_detach()?) };
        let exp_avg = params.iter().map(zeros).collect::<Result<Vec<_>>>()?;
        let exp_avg_sq = params.iter().map(zeros).collect::<Result<Vec<_>>>()?;
        let max_exp_avg_sq =
            if config.amsgrad { params.iter().map(zeros).collect::<Result<Vec<_>>>()? } else { Vec::new() };
        let steps = params.iter().map(|_| Tensor::f_zeros([], (Kind::Float, device))).collect::<Result<Vec<_>, _>>()?;
        let lr = Lr::new(config.lr, device)?;
        Ok(Adam { params, exp_avg, exp_avg_sq, max_exp_avg_sq, steps, lr, config })
    }

    /// The hyper-parameters.
    pub fn config(&self) -> &AdamConfig {
        &self.config
    }

    /// The learning-rate tensor a captured step reads.
    pub fn lr_tensor(&self) -> &Tensor {
        self.lr.tensor()
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
    fn step(&mut self) -> Result<()> {
        let (idx, grads) = with_grads(&self.params)?;
        if idx.is_empty() {
            return Ok(());
        }
        let p = ptrs(idx.iter().map(|&i| &self.params[i]));
        let g = ptrs(&grads);
        let m = ptrs(idx.iter().map(|&i| &self.exp_avg[i]));
        let v = ptrs(idx.iter().map(|&i| &self.exp_avg_sq[i]));
        let vmax = if self.config.amsgrad { ptrs(idx.iter().map(|&i| &self.max_exp_avg_sq[i])) } else { Vec::new() };
        let steps = ptrs(idx.iter().map(|&i| &self.steps[i]));
        let c = &self.config;
        // SAFETY: every pointer is a live tensor handle borrowed for the call; `p`, `g`, `m`,
        // `v` and `steps` have p.len() entries, `vmax` has vmax.len() (0 or p.len()). The shim
        // increments `steps` (one _foreach_add_) before the fused update.
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
                ptr(self.lr.tensor()),
                c.beta1,
                c.beta2,
                c.weight_decay,
                c.eps,
                i32::from(c.amsgrad),
                i32::from(c.maximize),
            )
        })
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
