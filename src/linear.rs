//! A linear layer whose backward computes the bias gradient inside the weight-gradient GEMM, and
//! can write float32 weight gradients without a cast: [`Linear`].
//!
//! Under bf16 autocast, `tch::nn::Linear`'s backward launches, per layer, the weight-gradient
//! GEMM (bf16 out), a reduction of the output gradient for the bias gradient (bf16 out), and two
//! casts of those gradients back to the float32 parameters' dtype. [`Linear`] runs one cuBLASLt
//! GEMM whose `BGRADB` epilogue sums the bias gradient while the GEMM reads the output gradient,
//! and with [`WeightGrad::Float32`] that GEMM writes both gradients in float32 (Megatron's
//! `main_grad`: no cast kernels, one rounding fewer). Its forward is `at::linear` on the same
//! operands as autocast's (the weights' bf16 shadows inside a step run with
//! [`crate::StepOptions::weight_shadows`], [`crate::shadow`]), so forward values equal
//! `nn::Linear`'s bit for bit; the gradients differ by summation order (the bias) and, with
//! [`WeightGrad::Float32`], by the bf16 rounding they no longer get (`tests/gpu_linear.rs` states
//! the figures).
//!
//! The crate's path runs where it applies — CUDA tensors with a 16-bit compute dtype (CUDA
//! autocast's, or bf16 / f16 input and weight) — and `at::linear` (with the shadows) elsewhere,
//! with the same forward ([`LinearConfig::kernels`]). cuBLASLt's GELU epilogues compute the tanh
//! approximation, not `nn::GELU`'s exact erf form: [`crate::mlp`] offers them for an MLP with
//! that activation.
//!
//! ```no_run
//! # fn main() -> tch_cuda_graphs::Result<()> {
//! use tch::{nn, Device, Kind, Tensor};
//! use tch_cuda_graphs::linear::{linear, LinearConfig, WeightGrad};
//! let vs = nn::VarStore::new(Device::Cuda(0));
//! let fc = linear(vs.root() / "c_fc", 384, 1536, LinearConfig { weight_grad: WeightGrad::Float32, ..Default::default() });
//! let x = Tensor::randn([8, 256, 384], (Kind::BFloat16, Device::Cuda(0)));
//! let y = fc.f_forward(&x)?; // bf16 out; its backward: one GEMM for the weight and bias gradients
//! let same = x.apply(&fc); // tch's `nn::Module`: panics where `f_forward` returns an error
//! # let _ = y; Ok(()) }
//! ```

use crate::error::Result;
use crate::kernels::{KernelPath, Kernels};
use crate::sys::linear::{self as raw, RawWeightGrad};
use std::borrow::Borrow;
use std::cell::Cell;
use tch::{nn, Tensor};

/// How the weight gradient of a 16-bit step reaches a float32 parameter.
///
/// The default is [`WeightGrad::Float32`] (Megatron-LM's choice for its `main_grad`): faster (no
/// cast kernel per parameter) and more precise than the rounded gradient autocast's
/// `nn::Linear` gives; [`WeightGrad::Rounded`] gives that one's values (up to summation order).
/// A float32 step, or one on ATen's path, is the same either way.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WeightGrad {
    /// Computed in the compute dtype (bf16 or f16), then cast to float32: the values autocast's
    /// `nn::Linear` gives (up to summation order).
    Rounded,
    /// The GEMM writes float32 from its float32 accumulators (Megatron's `main_grad`): no cast
    /// kernel, and more precise, so no longer equal to the rounded gradient.
    #[default]
    Float32,
}

impl WeightGrad {
    pub(crate) fn raw(self) -> RawWeightGrad {
        match self {
            WeightGrad::Rounded => RawWeightGrad::TCG_WEIGHT_GRAD_ROUNDED,
            WeightGrad::Float32 => RawWeightGrad::TCG_WEIGHT_GRAD_FP32,
        }
    }
}

/// How a [`Linear`] is made and run.
#[derive(Clone, Copy, Debug)]
pub struct LinearConfig {
    /// The weight's initialisation (default: `tch::nn::LinearConfig`'s, Kaiming uniform).
    pub ws_init: nn::Init,
    /// The bias's initialisation (`None`: `tch::nn::LinearConfig`'s, uniform in ±1/sqrt(in)).
    pub bs_init: Option<nn::Init>,
    /// A learnable bias (default true).
    pub bias: bool,
    /// How the weight (and bias) gradient reaches the parameters (default [`WeightGrad::Float32`]).
    pub weight_grad: WeightGrad,
    /// The crate's path where it applies ([`Kernels::Auto`], the default), `at::linear` always
    /// ([`Kernels::PyTorch`]; `weight_grad` is then not honoured: ATen rounds), or the crate's
    /// path only ([`Kernels::Own`]: an input it does not take fails with
    /// [`crate::Error::Unsupported`]).
    pub kernels: Kernels,
}

impl Default for LinearConfig {
    fn default() -> Self {
        let tch_default = nn::LinearConfig::default();
        LinearConfig {
            ws_init: tch_default.ws_init,
            bs_init: tch_default.bs_init,
            bias: true,
            weight_grad: WeightGrad::Float32,
            kernels: Kernels::Auto,
        }
    }
}

/// tch's linear settings (initialisations, bias) with the crate's defaults for the rest.
///
/// ```
/// use tch::nn;
/// use tch_cuda_graphs::linear::LinearConfig;
/// let cfg = LinearConfig::from(nn::LinearConfig { bias: false, ..Default::default() });
/// assert!(!cfg.bias);
/// ```
impl From<nn::LinearConfig> for LinearConfig {
    fn from(c: nn::LinearConfig) -> Self {
        LinearConfig { ws_init: c.ws_init, bs_init: c.bs_init, bias: c.bias, ..Default::default() }
    }
}

/// A linear layer, `x · weightᵀ + bias`. Its variables are named as `tch::nn::linear`'s
/// (`weight` \[out, in\], `bias` \[out\]), so checkpoints move between the two.
#[derive(Debug)]
pub struct Linear {
    /// The weight, [out, in].
    pub ws: Tensor,
    /// The bias, \[out\] (`None` without one).
    pub bs: Option<Tensor>,
    config: LinearConfig,
    last: Cell<Option<KernelPath>>,
}

/// A linear layer from `in_dim` to `out_dim` features under `path`.
///
/// ```no_run
/// # use tch::{nn, Device};
/// # use tch_cuda_graphs::linear::{linear, LinearConfig};
/// let vs = nn::VarStore::new(Device::Cuda(0));
/// let proj = linear(vs.root() / "c_proj", 384, 384, LinearConfig::default());
/// ```
pub fn linear<'a>(path: impl Borrow<nn::Path<'a>>, in_dim: i64, out_dim: i64, config: LinearConfig) -> Linear {
    let p = path.borrow();
    let ws = p.var("weight", &[out_dim, in_dim], config.ws_init);
    let bs = config.bias.then(|| {
        let init = config.bs_init.unwrap_or_else(|| {
            let bound = 1.0 / (in_dim.max(1) as f64).sqrt();
            nn::Init::Uniform { lo: -bound, up: bound }
        });
        p.var("bias", &[out_dim], init)
    });
    Linear { ws, bs, config, last: Cell::new(None) }
}

impl nn::Module for Linear {
    /// [`Linear::f_forward`], panicking on an error as tch's own layers do.
    fn forward(&self, xs: &Tensor) -> Tensor {
        self.f_forward(xs).unwrap_or_else(|e| panic!("{e}"))
    }
}

impl Linear {
    /// `x · weightᵀ + bias` over the last dimension of `x`.
    pub fn f_forward(&self, x: &Tensor) -> Result<Tensor> {
        let (y, own) = raw::forward(
            x,
            &self.ws,
            None,
            self.bs.as_ref(),
            self.config.weight_grad.raw(),
            self.config.kernels.raw(),
        )?;
        self.last.set(Some(KernelPath::of_one(own)));
        Ok(y)
    }

    /// `x · weightᵀ` without the bias, for a following fused kernel that adds the bias (`bs`)
    /// itself and sums its gradient from a gradient it reads anyway:
    /// [`crate::norm::LayerNorm::f_forward_residual_biased`] (a residual branch's projection),
    /// [`crate::gelu::f_bias_gelu`] (an MLP's first layer). The backward then computes the
    /// weight gradient only. [`Linear::f_forward`] without a bias.
    pub fn f_forward_unbiased(&self, x: &Tensor) -> Result<Tensor> {
        let (y, own) = raw::forward(x, &self.ws, None, None, self.config.weight_grad.raw(), self.config.kernels.raw())?;
        self.last.set(Some(KernelPath::of_one(own)));
        Ok(y)
    }

    /// [`Linear::f_forward`]'s output split into `parts` equal pieces along its last dimension,
    /// as views of it (`f_forward(x)?.f_split(out / parts, -1)`, the same values): a fused
    /// projection's parts, such as attention's q, k and v.
    ///
    /// Backward, a split's gradient is otherwise a concatenation of the pieces' gradients (a
    /// copy of all of them), and the bias gradient one more pass over the result (the GEMM's
    /// `BGRADB` epilogue). On the crate's path (the output bfloat16 or float16, at most 4 pieces
    /// of a width that is a multiple of 8) one kernel packs the pieces' gradients and sums the
    /// bias gradient as it goes, so the weight-gradient GEMM has no epilogue; elsewhere it is
    /// ATen's `split`. [`crate::Error::Misuse`] where `out` is not a multiple of `parts` or
    /// `parts` is outside 1 to 8. On the crate's path the pieces are views made inside an
    /// autograd function, which PyTorch does not let be modified in place while they require a
    /// gradient: copy a piece first to change it in place.
    ///
    /// ```no_run
    /// # fn main() -> tch_cuda_graphs::Result<()> {
    /// use tch::{nn, Device, Kind, Tensor};
    /// use tch_cuda_graphs::linear::{linear, LinearConfig};
    /// let vs = nn::VarStore::new(Device::Cuda(0));
    /// let c_attn = linear(vs.root() / "c_attn", 384, 3 * 384, LinearConfig::default());
    /// let h = Tensor::randn([8, 256, 384], (Kind::BFloat16, Device::Cuda(0)));
    /// let qkv = c_attn.f_forward_split(&h, 3)?; // q, k, v: [8, 256, 384] each
    /// # let _ = qkv; Ok(()) }
    /// ```
    pub fn f_forward_split(&self, x: &Tensor, parts: i64) -> Result<Vec<Tensor>> {
        let modes = (self.config.weight_grad.raw(), self.config.kernels.raw());
        let (pieces, own) = raw::split(x, &self.ws, self.bs.as_ref(), parts, modes)?;
        self.last.set(Some(KernelPath::of_one(own)));
        Ok(pieces)
    }

    /// Which kernels the last forward ran: [`KernelPath::Own`] for the crate's path,
    /// [`KernelPath::PyTorch`] for `at::linear` (None before the first).
    pub fn last_path(&self) -> Option<KernelPath> {
        self.last.get()
    }

    /// The configuration it was made with.
    pub fn config(&self) -> LinearConfig {
        self.config
    }
}

/// `x · weightᵀ + bias` as [`Linear::f_forward`] runs it, for weights a [`Linear`] does not own (a
/// language-model head tied to the token embedding). Only `config.weight_grad` and
/// `config.kernels` are read. [`apply`] is the same, panicking on an error as tch's
/// `Tensor::linear` does.
///
/// ```no_run
/// # fn main() -> tch_cuda_graphs::Result<()> {
/// use tch::{nn, Device, Kind, Tensor};
/// use tch_cuda_graphs::linear::{f_apply, LinearConfig};
/// let vs = nn::VarStore::new(Device::Cuda(0));
/// let wte = nn::embedding(vs.root() / "wte", 65, 384, Default::default());
/// let h = Tensor::randn([8, 256, 384], (Kind::BFloat16, Device::Cuda(0)));
/// let logits = f_apply(&h, &wte.ws, None, &LinearConfig::default())?;
/// # let _ = logits; Ok(()) }
/// ```
pub fn f_apply(x: &Tensor, weight: &Tensor, bias: Option<&Tensor>, config: &LinearConfig) -> Result<Tensor> {
    Ok(raw::forward(x, weight, None, bias, config.weight_grad.raw(), config.kernels.raw())?.0)
}

/// [`f_apply`], panicking on an error.
pub fn apply(x: &Tensor, weight: &Tensor, bias: Option<&Tensor>, config: &LinearConfig) -> Tensor {
    f_apply(x, weight, bias, config).unwrap_or_else(|e| panic!("{e}"))
}
