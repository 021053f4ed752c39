//! Normalization layers with the residual add and dropout folded in: [`LayerNorm`] (LayerNorm or
//! RMSNorm) on the crate's own fused kernels, forward and backward.
//!
//! A pre-LayerNorm transformer block spends most of its non-GEMM time around its norms: the
//! residual add (in fp32), the dropout of the branch, the norm itself (fp32 under autocast), the
//! casts around it, and ATen's weight- and bias-gradient reduction. [`LayerNorm::forward_residual`]
//! does `x = res + dropout(branch)` and `y = norm(x)` in one kernel, and the backward of both in
//! one more (plus a small one summing the weight and bias gradients in a fixed order, so the
//! result is deterministic). Under CUDA autocast `y` comes out in the autocast dtype (what the
//! next matmul casts it to anyway; [`NormOutput`]).
//!
//! The fused kernels run where they apply — a CUDA float32 input whose last dimension is a
//! multiple of 4 up to 1024, contiguous float32 / bfloat16 / float16 tensors, float32 weight and
//! bias — and ATen's operators (`dropout`, `add`, `layer_norm` / `rms_norm`) everywhere else, with
//! the same semantics ([`NormConfig::kernels`]). Numerics: fp32 math throughout; against ATen's
//! float32 `layer_norm` the results differ by the rounding of a different summation order
//! (`tests/gpu_norm.rs` states the figures). The dropout masks are the crate's own (Philox, drawn
//! from PyTorch's CUDA generator, graph-safe), so they differ from ATen's `dropout` draws; a
//! captured step replays the masks its eager twin draws.
//!
//! ```no_run
//! # fn main() -> tch_cuda_graphs::Result<()> {
//! use tch::{nn, Device, Kind, Tensor};
//! use tch_cuda_graphs::norm::{layer_norm, NormConfig};
//! let vs = nn::VarStore::new(Device::Cuda(0));
//! let ln = layer_norm(vs.root() / "ln_2", vec![384], NormConfig::default());
//! let res = Tensor::randn([8, 256, 384], (Kind::Float, Device::Cuda(0)));
//! let branch = Tensor::randn([8, 256, 384], (Kind::BFloat16, Device::Cuda(0)));
//! // res + dropout(branch, 0.2), and its LayerNorm, in one kernel
//! let (res, y) = ln.f_forward_residual(&res, &branch, 0.2, true)?;
//! let plain = ln.f_forward(&res)?; // a LayerNorm alone
//! let same = res.apply(&ln); // tch's `nn::Module`: panics where `f_forward` returns an error
//! # let _ = (y, plain); Ok(()) }
//! ```

use crate::error::Result;
use crate::kernels::{KernelPath, Kernels};
use crate::sys::norm::{self as raw, NormInputs, NormOptions, RawNormKind, RawNormOut};
use std::borrow::Borrow;
use std::cell::Cell;
use tch::{nn, Tensor};

/// Which normalization.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum NormKind {
    /// `(x - mean) / sqrt(var + eps) * weight + bias`, as `torch.nn.LayerNorm`.
    #[default]
    Layer,
    /// `x / sqrt(mean(x²) + eps) * weight`, as `torch.nn.RMSNorm` (no bias).
    Rms,
}

/// The dtype of the normalized output.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum NormOutput {
    /// The CUDA autocast dtype while autocast is on (what a following matmul would cast to: the
    /// cast is folded into the kernel), the input's otherwise.
    #[default]
    Autocast,
    /// Always the input's dtype (ATen's `layer_norm` under autocast gives float32).
    Input,
}

/// How a [`LayerNorm`] is made and run: tch's `nn::LayerNormConfig` fields (but
/// `cudnn_enabled`, which no layer-norm kernel reads) and the crate's. A tch config converts
/// with `NormConfig::from`.
#[derive(Clone, Copy, Debug)]
pub struct NormConfig {
    /// Added to the variance (default 1e-5, PyTorch's).
    pub eps: f64,
    /// A learnable weight (`weight`, see `ws_init`; default true).
    pub elementwise_affine: bool,
    /// The weight's initialisation (default ones, as tch's).
    pub ws_init: nn::Init,
    /// The bias's initialisation (default zeros, as tch's).
    pub bs_init: nn::Init,
    /// A learnable bias (`bias`, see `bs_init`; default true; never for RMSNorm).
    pub bias: bool,
    /// LayerNorm or RMSNorm.
    pub kind: NormKind,
    /// The output's dtype.
    pub output: NormOutput,
    /// The crate's fused kernels where they apply ([`Kernels::Auto`], the default), ATen's
    /// operators always ([`Kernels::PyTorch`]), or the fused kernels only ([`Kernels::Own`]: an
    /// input they do not take fails with [`crate::Error::Unsupported`]).
    pub kernels: Kernels,
}

impl Default for NormConfig {
    fn default() -> Self {
        NormConfig {
            eps: 1e-5,
            elementwise_affine: true,
            ws_init: nn::Init::Const(1.0),
            bs_init: nn::Init::Const(0.0),
            bias: true,
            kind: NormKind::Layer,
            output: NormOutput::Autocast,
            kernels: Kernels::Auto,
        }
    }
}

/// tch's layer-norm settings (epsilon, affine, initialisations) with the crate's defaults for
/// the rest.
impl From<nn::LayerNormConfig> for NormConfig {
    fn from(c: nn::LayerNormConfig) -> Self {
        NormConfig {
            eps: c.eps,
            elementwise_affine: c.elementwise_affine,
            ws_init: c.ws_init,
            bs_init: c.bs_init,
            ..Default::default()
        }
    }
}

/// A LayerNorm (or RMSNorm) over the last dimension, with the residual add and dropout of
/// [`LayerNorm::forward_residual`]. Its variables are named as `tch::nn::layer_norm`'s
/// (`weight`, `bias`), so checkpoints move between the two.
#[derive(Debug)]
pub struct LayerNorm {
    /// The weight (`None` without elementwise affine).
    pub ws: Option<Tensor>,
    /// The bias (`None` without one, and for RMSNorm).
    pub bs: Option<Tensor>,
    config: NormConfig,
    last: Cell<Option<KernelPath>>,
}

/// A LayerNorm over the last dimension under `path`, shaped as tch's `nn::layer_norm`:
/// `normalized_shape` is `vec![width]`.
///
/// # Panics
/// If `normalized_shape` is not one positive width (the layer normalizes the last dimension
/// only), or the VarStore cannot make the variables (as tch's constructors panic).
///
/// ```no_run
/// # use tch::{nn, Device};
/// # use tch_cuda_graphs::norm::{layer_norm, NormConfig};
/// let vs = nn::VarStore::new(Device::Cuda(0));
/// // was: nn::layer_norm(vs.root() / "ln_f", vec![384], Default::default())
/// let ln = layer_norm(vs.root() / "ln_f", vec![384], NormConfig::default());
/// ```
pub fn layer_norm<'a>(path: impl Borrow<nn::Path<'a>>, normalized_shape: Vec<i64>, config: NormConfig) -> LayerNorm {
    let dim = match normalized_shape[..] {
        [d] if d > 0 => d,
        _ => panic!(
            "layer_norm: normalized_shape must be one positive width (the last dimension), got {normalized_shape:?}"
        ),
    };
    let p = path.borrow();
    let ws = config.elementwise_affine.then(|| p.var("weight", &[dim], config.ws_init));
    let bs = (config.bias && config.kind == NormKind::Layer).then(|| p.var("bias", &[dim], config.bs_init));
    LayerNorm { ws, bs, config, last: Cell::new(None) }
}

/// An RMSNorm over the last dimension under `path`: [`layer_norm`] with [`NormKind::Rms`] and no
/// bias (tch has no RMSNorm layer; `torch.nn.RMSNorm`'s semantics).
pub fn rms_norm<'a>(path: impl Borrow<nn::Path<'a>>, normalized_shape: Vec<i64>, config: NormConfig) -> LayerNorm {
    layer_norm(path, normalized_shape, NormConfig { kind: NormKind::Rms, bias: false, ..config })
}

impl nn::Module for LayerNorm {
    /// [`LayerNorm::f_forward`], panicking on an error as tch's own layers do.
    fn forward(&self, xs: &Tensor) -> Tensor {
        self.f_forward(xs).unwrap_or_else(|e| panic!("{e}"))
    }
}

impl LayerNorm {
    /// The normalized `x`.
    pub fn f_forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(self.run(Some(x), None, None, 0.0, false)?.1)
    }

    /// `(x, y)`: the residual stream's start `x = dropout(branch, p)` (dropout only when `train`;
    /// embeddings, say) and its normalization `y`, in one kernel. Where the stream then goes on
    /// to the next norm, the backward adds the gradient coming back along it to the norm's in the
    /// same kernel (no separate add of the two, no dropout kernels). A float32 `branch` taken as
    /// it is (no dropout) is not copied: `x` is a view of it. ATen's path computes the same with
    /// `dropout` and the norm.
    ///
    /// ```no_run
    /// # fn main() -> tch_cuda_graphs::Result<()> {
    /// use tch::{nn, Device, Kind, Tensor};
    /// use tch_cuda_graphs::norm::{layer_norm, NormConfig};
    /// let vs = nn::VarStore::new(Device::Cuda(0));
    /// let ln_1 = layer_norm(vs.root() / "ln_1", vec![384], NormConfig::default());
    /// let emb = Tensor::randn([8, 256, 384], (Kind::Float, Device::Cuda(0)));
    /// // was: let x = emb.dropout(0.2, true); let h = x.apply(&ln_1);
    /// let (x, h) = ln_1.f_forward_dropout(&emb, 0.2, true)?;
    /// # let _ = (x, h); Ok(()) }
    /// ```
    pub fn f_forward_dropout(&self, branch: &Tensor, p: f64, train: bool) -> Result<(Tensor, Tensor)> {
        self.f_forward_dropout_biased(branch, None, p, train)
    }

    /// [`f_forward_dropout`](Self::f_forward_dropout), panicking on an error as tch's layers do.
    pub fn forward_dropout(&self, branch: &Tensor, p: f64, train: bool) -> (Tensor, Tensor) {
        self.f_forward_dropout(branch, p, train).unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`f_forward_dropout`](Self::f_forward_dropout) for a start with a bias still to add:
    /// `x = dropout(branch + branch_bias, p)`. `branch_bias` is `[width]`, or the branch's
    /// trailing dimensions: the position embeddings `[T, width]` of a `[B, T, width]` branch of
    /// token embeddings (GPT-2's `wte(idx) + wpe(pos)`), broadcast over the batch as `add` does.
    /// The fused kernel adds it as it reads the branch (no add of its own, no sum written and read
    /// again), and the backward sums its gradient over the batch from the branch gradient, as
    /// autograd sums a broadcast add's (`at::sum_to`: the same bits). A bias of several rows
    /// needs a float32 branch there; otherwise, and on ATen's path, `add` and `dropout` compute
    /// the same. [`crate::transformer::ResidualStream::with_positions`] starts a stream so.
    ///
    /// ```no_run
    /// # fn main() -> tch_cuda_graphs::Result<()> {
    /// use tch::{nn, Device, Kind, Tensor};
    /// use tch_cuda_graphs::norm::{layer_norm, NormConfig};
    /// let vs = nn::VarStore::new(Device::Cuda(0));
    /// let ln_1 = layer_norm(vs.root() / "ln_1", vec![384], NormConfig::default());
    /// let tok = Tensor::randn([8, 256, 384], (Kind::Float, Device::Cuda(0)));
    /// let pos = Tensor::randn([256, 384], (Kind::Float, Device::Cuda(0)));
    /// // was: let (x, h) = ln_1.f_forward_dropout(&(&tok + &pos), 0.2, true)?;
    /// let (x, h) = ln_1.f_forward_dropout_biased(&tok, Some(&pos), 0.2, true)?;
    /// # let _ = (x, h); Ok(()) }
    /// ```
    pub fn f_forward_dropout_biased(
        &self,
        branch: &Tensor,
        branch_bias: Option<&Tensor>,
        p: f64,
        train: bool,
    ) -> Result<(Tensor, Tensor)> {
        let (x, y) = self.run(None, Some(branch), branch_bias, p, train)?;
        Ok((x.unwrap_or_else(|| branch.shallow_clone()), y))
    }

    /// `(x, y)`: the new residual stream `x = res + dropout(branch, p)` (dropout only when
    /// `train`) and its normalization `y`. Gradients flow into `res`, `branch` and the
    /// parameters from both outputs.
    pub fn f_forward_residual(&self, res: &Tensor, branch: &Tensor, p: f64, train: bool) -> Result<(Tensor, Tensor)> {
        self.f_forward_residual_biased(res, branch, None, p, train)
    }

    /// [`f_forward_residual`](Self::f_forward_residual) for a branch whose bias is still to be
    /// added: `x = res + dropout(branch + branch_bias, p)`. `branch` is the output of a linear
    /// layer run without its bias ([`crate::linear::Linear::f_forward_unbiased`]), `branch_bias`
    /// that layer's bias (`[width]`; or the branch's trailing dimensions, as
    /// [`f_forward_dropout_biased`](Self::f_forward_dropout_biased) takes them): the fused kernel
    /// adds it in float32 and sums its gradient from the branch gradient it writes anyway, so
    /// the linear layer's backward makes no pass for it. ATen's path computes the same with `add`.
    ///
    /// ```no_run
    /// # fn main() -> tch_cuda_graphs::Result<()> {
    /// use tch::{nn, Device, Kind, Tensor};
    /// use tch_cuda_graphs::linear::{linear, LinearConfig};
    /// use tch_cuda_graphs::norm::{layer_norm, NormConfig};
    /// let vs = nn::VarStore::new(Device::Cuda(0));
    /// let proj = linear(vs.root() / "c_proj", 384, 384, LinearConfig::default());
    /// let ln = layer_norm(vs.root() / "ln_2", vec![384], NormConfig::default());
    /// let (res, h) = (Tensor::randn([8, 256, 384], (Kind::Float, Device::Cuda(0))), Tensor::randn([8, 256, 384], (Kind::BFloat16, Device::Cuda(0))));
    /// // was: ln.f_forward_residual(&res, &proj.f_forward(&h)?, 0.2, true)
    /// let (res, y) = ln.f_forward_residual_biased(&res, &proj.f_forward_unbiased(&h)?, proj.bs.as_ref(), 0.2, true)?;
    /// # let _ = (res, y); Ok(()) }
    /// ```
    pub fn f_forward_residual_biased(
        &self,
        res: &Tensor,
        branch: &Tensor,
        branch_bias: Option<&Tensor>,
        p: f64,
        train: bool,
    ) -> Result<(Tensor, Tensor)> {
        let (x, y) = self.run(Some(res), Some(branch), branch_bias, p, train)?;
        Ok((x.unwrap_or_else(|| res.shallow_clone()), y))
    }

    /// [`f_forward_residual`](Self::f_forward_residual), panicking on an error as tch's layers do.
    pub fn forward_residual(&self, res: &Tensor, branch: &Tensor, p: f64, train: bool) -> (Tensor, Tensor) {
        self.f_forward_residual(res, branch, p, train).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Which kernels the last forward ran: [`KernelPath::Own`] for the crate's fused kernels,
    /// [`KernelPath::PyTorch`] for ATen's operators (None before the first).
    pub fn last_path(&self) -> Option<KernelPath> {
        self.last.get()
    }

    /// The configuration it was made with.
    pub fn config(&self) -> NormConfig {
        self.config
    }

    fn run(
        &self,
        res: Option<&Tensor>,
        branch: Option<&Tensor>,
        branch_bias: Option<&Tensor>,
        p: f64,
        train: bool,
    ) -> Result<(Option<Tensor>, Tensor)> {
        let c = &self.config;
        let options = NormOptions {
            eps: c.eps,
            dropout: p,
            kind: match c.kind {
                NormKind::Layer => RawNormKind::TCG_NORM_LAYER,
                NormKind::Rms => RawNormKind::TCG_NORM_RMS,
            },
            out: match c.output {
                NormOutput::Autocast => RawNormOut::TCG_NORM_OUT_AUTOCAST,
                NormOutput::Input => RawNormOut::TCG_NORM_OUT_INPUT,
            },
            train,
        };
        let inputs = NormInputs { res, branch, weight: self.ws.as_ref(), bias: self.bs.as_ref(), branch_bias };
        let out = raw::forward(&inputs, &options, c.kernels.raw())?;
        self.last.set(Some(KernelPath::of_one(out.ran_own)));
        Ok((out.res, out.y))
    }
}
