//! A pre-norm transformer layer ([`TransformerLayer`], after Transformer Engine's
//! `TransformerLayer`) and the residual stream it carries between layers ([`ResidualStream`]),
//! so that every fusion of the crate applies without restructuring a model: each norm takes the
//! residual add and the dropout of the branch before it ([`crate::norm`]) and the bias of the
//! projection that made the branch ([`ResidualStream::f_push_linear`]), the MLP's GEMMs add the
//! bias of its first layer and apply the GELU in their epilogues ([`crate::mlp`]: the tanh form
//! in cuBLASLt's, the exact one in CUTLASS's on bf16 and sm_90; elsewhere the GELU kernel takes
//! that bias, [`crate::gelu`]), so each of those bias gradients is summed in a pass that runs
//! anyway, and the other linear layer (QKV) sums its bias gradient inside the
//! weight-gradient GEMM ([`crate::linear`]). Under [`Kernels::PyTorch`] the layer runs PyTorch's
//! operations in PyTorch's order (each bias in its linear layer).
//!
//! A GPT is N constructor calls; its forward threads one stream through the layers:
//!
//! ```no_run
//! # fn main() -> tch_cuda_graphs::Result<()> {
//! use tch::{nn, Device, Kind, Tensor};
//! use tch_cuda_graphs::norm::{layer_norm, NormConfig};
//! use tch_cuda_graphs::transformer::{ResidualStream, TransformerConfig, TransformerLayer};
//! let vs = nn::VarStore::new(Device::Cuda(0));
//! let cfg = TransformerConfig { heads: 6, dropout: 0.2, ..Default::default() };
//! let layers: Vec<TransformerLayer> = (0..6).map(|l| TransformerLayer::new(vs.root() / "h" / l, 384, cfg)).collect();
//! let ln_f = layer_norm(vs.root() / "ln_f", vec![384], NormConfig::default());
//! let x = Tensor::randn([8, 256, 384], (Kind::Float, Device::Cuda(0)));
//! let mut stream = ResidualStream::new(x);
//! for layer in &layers {
//!     layer.f_forward_t(&mut stream, true)?;
//! }
//! let h = stream.f_norm(&ln_f)?; // the last branch's add and dropout, in the final norm
//! # let _ = h; Ok(()) }
//! ```

use crate::error::{Error, Result};
use crate::gelu::{f_bias_gelu, GeluApproximate, GeluConfig};
use crate::kernels::Kernels;
use crate::linear::{linear, Linear, LinearConfig, WeightGrad};
use crate::mlp::{f_gelu_mlp_unbiased_own, f_gelu_tanh_mlp_unbiased};
use crate::norm::{layer_norm, LayerNorm, NormConfig, NormKind};
use std::borrow::Borrow;
use tch::{nn, Tensor};

/// The residual stream between pre-norm layers: the running sum `x`, and the branch that is
/// still to be added to it (with its dropout). The next norm adds it in the same kernel
/// ([`LayerNorm::f_forward_residual`]); [`f_into_tensor`](Self::f_into_tensor) adds it with
/// ATen's operators when no norm follows. The first norm takes the stream's start itself
/// ([`LayerNorm::f_forward_dropout`], with the start's dropout and position embeddings), so the
/// gradients coming back to the start along the stream and through that norm are added in the
/// norm's backward kernel.
#[derive(Debug)]
pub struct ResidualStream {
    x: Tensor,
    /// What the start `x` has yet to go through (in the first norm's kernel); `None` once the
    /// start is settled. Never set together with `pending`: a push settles it.
    start: Option<Start>,
    pending: Option<Pending>,
}

/// The start's position embeddings still to add and its dropout `(p, train)`.
#[derive(Debug)]
struct Start {
    positions: Option<Tensor>,
    p: f64,
    train: bool,
}

#[derive(Debug)]
struct Pending {
    branch: Tensor,
    bias: Option<Tensor>,
    p: f64,
    train: bool,
}

impl ResidualStream {
    /// A stream starting at `x` (the embeddings, say), nothing pending.
    pub fn new(x: Tensor) -> Self {
        Self::with_dropout(x, 0.0, false)
    }

    /// A stream starting at `dropout(x, p)` (dropout only when `train`), drawn by the first
    /// norm's kernel ([`LayerNorm::f_forward_dropout`]) or, where no norm follows, by ATen's
    /// `dropout`.
    ///
    /// ```
    /// # fn main() -> tch_cuda_graphs::Result<()> {
    /// use tch::{Device, Kind, Tensor};
    /// use tch_cuda_graphs::transformer::ResidualStream;
    /// let emb = Tensor::randn([2, 8], (Kind::Float, Device::Cpu));
    /// let stream = ResidualStream::with_dropout(emb, 0.2, true); // was: ResidualStream::new(emb.dropout(0.2, true))
    /// let x = stream.f_into_tensor()?;
    /// # let _ = x; Ok(()) }
    /// ```
    pub fn with_dropout(x: Tensor, p: f64, train: bool) -> Self {
        ResidualStream { x, start: Some(Start { positions: None, p, train }), pending: None }
    }

    /// A stream starting at `dropout(x + positions, p)`: `x` the token embeddings `[B, T, width]`,
    /// `positions` the position embeddings `[T, width]` (GPT-2's `wpe` rows), added in the first
    /// norm's kernel ([`LayerNorm::f_forward_dropout_biased`]) rather than by an add of their own,
    /// their gradient summed over the batch as autograd sums a broadcast add's. Where no norm
    /// follows, ATen's `add` and `dropout`.
    ///
    /// ```
    /// # fn main() -> tch_cuda_graphs::Result<()> {
    /// use tch::{Device, Kind, Tensor};
    /// use tch_cuda_graphs::transformer::ResidualStream;
    /// let (tok, pos) = (Tensor::randn([2, 8, 16], (Kind::Float, Device::Cpu)), Tensor::randn([8, 16], (Kind::Float, Device::Cpu)));
    /// let stream = ResidualStream::with_positions(tok, pos, 0.1, true); // was: ResidualStream::with_dropout(tok + pos, 0.1, true)
    /// let x = stream.f_into_tensor()?;
    /// # let _ = x; Ok(()) }
    /// ```
    pub fn with_positions(x: Tensor, positions: Tensor, p: f64, train: bool) -> Self {
        ResidualStream { x, start: Some(Start { positions: Some(positions), p, train }), pending: None }
    }

    /// `norm(x + dropout(branch))` for the pending branch (or `norm(x)`), the sum becoming the
    /// stream's `x`: one fused kernel where the norm's kernels apply.
    pub fn f_norm(&mut self, norm: &LayerNorm) -> Result<Tensor> {
        if let Some(Start { positions, p, train }) = self.start.take() {
            // nothing is pending before the first branch (a push settles the start)
            let (x, h) = norm.f_forward_dropout_biased(&self.x, positions.as_ref(), p, train)?;
            self.x = x;
            return Ok(h);
        }
        match self.pending.take() {
            Some(Pending { branch, bias, p, train }) => {
                let (x, h) = norm.f_forward_residual_biased(&self.x, &branch, bias.as_ref(), p, train)?;
                self.x = x;
                Ok(h)
            }
            None => norm.f_forward(&self.x),
        }
    }

    /// Records `branch` to be added, through dropout `p` when `train`, by the next norm. A branch
    /// still pending is added first.
    pub fn f_push(&mut self, branch: Tensor, p: f64, train: bool) -> Result<()> {
        self.push(branch, None, p, train)
    }

    /// Records `proj(input)` as the branch to be added: the projection runs without its bias
    /// ([`Linear::f_forward_unbiased`]), and the next norm adds the bias in its kernel and sums
    /// its gradient there ([`LayerNorm::f_forward_residual_biased`]), so the projection's
    /// backward makes no pass for it. The same values as `f_push(proj.f_forward(input)?, ..)`
    /// up to rounding (the bias is added in float32).
    pub fn f_push_linear(&mut self, proj: &Linear, input: &Tensor, p: f64, train: bool) -> Result<()> {
        self.push(proj.f_forward_unbiased(input)?, proj.bs.as_ref(), p, train)
    }

    /// Records `branch + bias` (the bias added by the next norm), a pending branch added first.
    fn push(&mut self, branch: Tensor, bias: Option<&Tensor>, p: f64, train: bool) -> Result<()> {
        self.settle()?;
        self.pending = Some(Pending { branch, bias: bias.map(Tensor::shallow_clone), p, train });
        Ok(())
    }

    /// A pre-norm residual sublayer, `x += dropout(f(norm(x)), p)`: `f` gets the normalized
    /// stream (the pending branch added in the norm's kernel), and its output is left pending
    /// for the next norm. Dropout only when `train`.
    ///
    /// ```
    /// # fn main() -> tch_cuda_graphs::Result<()> {
    /// use tch::{nn, nn::Module, Device, Kind, Tensor};
    /// use tch_cuda_graphs::norm::{layer_norm, NormConfig};
    /// use tch_cuda_graphs::transformer::ResidualStream;
    /// let vs = nn::VarStore::new(Device::Cpu);
    /// let (ln, fc) = (layer_norm(vs.root() / "ln", vec![8], NormConfig::default()), nn::linear(vs.root() / "fc", 8, 8, Default::default()));
    /// let mut x = ResidualStream::new(Tensor::randn([2, 8], (Kind::Float, Device::Cpu)));
    /// x.f_residual(&ln, 0.1, true, |h| Ok(h.apply(&fc)))?; // was: x = &x + x.apply(&ln).apply(&fc).dropout(0.1, true)
    /// let y = x.f_into_tensor()?;
    /// # let _ = y; Ok(()) }
    /// ```
    pub fn f_residual(
        &mut self,
        norm: &LayerNorm,
        p: f64,
        train: bool,
        f: impl FnOnce(&Tensor) -> Result<Tensor>,
    ) -> Result<()> {
        let h = self.f_norm(norm)?;
        let branch = f(&h)?;
        self.f_push(branch, p, train)
    }

    /// [`f_residual`](Self::f_residual) for a branch written with tch's panicking operators,
    /// panicking on an error as they do.
    pub fn residual(&mut self, norm: &LayerNorm, p: f64, train: bool, f: impl FnOnce(&Tensor) -> Tensor) {
        self.f_residual(norm, p, train, |h| Ok(f(h))).unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`f_norm`](Self::f_norm), panicking on an error.
    pub fn norm(&mut self, norm: &LayerNorm) -> Tensor {
        self.f_norm(norm).unwrap_or_else(|e| panic!("{e}"))
    }

    /// The stream's value, any pending branch added (ATen's `dropout` and `add`).
    pub fn f_into_tensor(mut self) -> Result<Tensor> {
        self.settle()?;
        Ok(self.x)
    }

    /// [`f_into_tensor`](Self::f_into_tensor), panicking on an error.
    pub fn into_tensor(self) -> Tensor {
        self.f_into_tensor().unwrap_or_else(|e| panic!("{e}"))
    }

    fn settle(&mut self) -> Result<()> {
        if let Some(Start { positions, p, train }) = self.start.take() {
            if let Some(positions) = positions {
                self.x = self.x.f_add(&positions)?;
            }
            if train && p > 0.0 {
                self.x = self.x.f_dropout(p, true)?;
            }
        }
        if let Some(Pending { branch, bias, p, train }) = self.pending.take() {
            let branch = match bias {
                Some(bias) => branch.f_add(&bias)?,
                None => branch,
            };
            let b = if train && p > 0.0 { branch.f_dropout(p, true)? } else { branch };
            self.x = self.x.f_add(&b)?;
        }
        Ok(())
    }
}

/// The MLP's activation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Activation {
    /// `nn::GELU`: the exact erf form (GPT-2's and nanoGPT's model): with the crate's kernels,
    /// computed in the MLP's GEMM epilogues where CUTLASS's GEMMs run (bf16, sm_90), else in the
    /// bias + GELU kernels ([`crate::mlp`]).
    #[default]
    Gelu,
    /// GELU's tanh approximation (GPT-2's original, llm.c's): with the crate's kernels, computed
    /// in the MLP's GEMM epilogues ([`crate::mlp`]).
    GeluTanh,
    /// ReLU.
    Relu,
}

/// How a [`TransformerLayer`] is made and run. Plain fields with [`Default`].
#[derive(Clone, Copy, Debug)]
pub struct TransformerConfig {
    /// Attention heads; the width must be a multiple (default 1).
    pub heads: i64,
    /// The MLP's hidden width as a multiple of the layer's width (default 4).
    pub mlp_ratio: i64,
    /// The MLP's activation (default exact GELU).
    pub activation: Activation,
    /// Biases on the linear layers and norms (default true).
    pub bias: bool,
    /// Dropout on the attention weights and on both residual branches (default 0).
    pub dropout: f64,
    /// Causal attention (default true).
    pub causal: bool,
    /// LayerNorm or RMSNorm (default LayerNorm), its epsilon (default 1e-5).
    pub norm: NormKind,
    /// The norms' epsilon.
    pub eps: f64,
    /// The initialisation of the QKV and first MLP weights (default normal, std 0.02).
    pub init: nn::Init,
    /// The initialisation of the two output projections (default normal, std 0.02; GPT-2
    /// scales it by 1/sqrt(2 · layers)).
    pub output_init: nn::Init,
    /// How the linear layers' weight gradients reach float32 parameters (see [`WeightGrad`]).
    pub weight_grad: WeightGrad,
    /// The crate's fused kernels where they apply, or ATen's ([`Kernels`]).
    pub kernels: Kernels,
}

impl Default for TransformerConfig {
    fn default() -> Self {
        let normal = nn::Init::Randn { mean: 0.0, stdev: 0.02 };
        TransformerConfig {
            heads: 1,
            mlp_ratio: 4,
            activation: Activation::Gelu,
            bias: true,
            dropout: 0.0,
            causal: true,
            norm: NormKind::Layer,
            eps: 1e-5,
            init: normal,
            output_init: normal,
            weight_grad: WeightGrad::Float32,
            kernels: Kernels::Auto,
        }
    }
}

/// A pre-norm transformer layer: `x += dropout(proj(attention(norm_1(x))))`, then
/// `x += dropout(mlp(norm_2(x)))`, each add folded into the norm after it through the
/// [`ResidualStream`]. Variables (nanoGPT's names): `ln_1`, `attn.c_attn` (the fused QKV
/// projection), `attn.c_proj`, `ln_2`, `mlp.c_fc`, `mlp.c_proj`. Attention is
/// `scaled_dot_product_attention` (cuDNN's or the flash kernel on a GPU).
#[derive(Debug)]
pub struct TransformerLayer {
    ln_1: LayerNorm,
    c_attn: Linear,
    attn_proj: Linear,
    ln_2: LayerNorm,
    c_fc: Linear,
    mlp_proj: Linear,
    width: i64,
    config: TransformerConfig,
}

impl TransformerLayer {
    /// A layer of `width` under `path`.
    ///
    /// # Panics
    /// If `width` is not a positive multiple of `config.heads` (a model's shape is fixed when it
    /// is written), or the VarStore cannot make the variables (as tch's constructors panic).
    pub fn new<'a>(path: impl Borrow<nn::Path<'a>>, width: i64, config: TransformerConfig) -> Self {
        assert!(
            width > 0 && config.heads > 0 && width % config.heads == 0,
            "TransformerLayer: width {width} is not a positive multiple of {} heads",
            config.heads
        );
        let p = path.borrow();
        let c = &config;
        let lin = |p: nn::Path, i: i64, o: i64, init: nn::Init| {
            let bs_init = Some(nn::Init::Const(0.0));
            let cfg =
                LinearConfig { ws_init: init, bs_init, bias: c.bias, weight_grad: c.weight_grad, kernels: c.kernels };
            linear(p, i, o, cfg)
        };
        let norm_cfg = NormConfig { eps: c.eps, bias: c.bias, kind: c.norm, kernels: c.kernels, ..Default::default() };
        let ln = |p: nn::Path| layer_norm(p, vec![width], norm_cfg);
        let hidden = c.mlp_ratio * width;
        TransformerLayer {
            ln_1: ln(p / "ln_1"),
            c_attn: lin(p / "attn" / "c_attn", width, 3 * width, c.init),
            attn_proj: lin(p / "attn" / "c_proj", width, width, c.output_init),
            ln_2: ln(p / "ln_2"),
            c_fc: lin(p / "mlp" / "c_fc", width, hidden, c.init),
            mlp_proj: lin(p / "mlp" / "c_proj", hidden, width, c.output_init),
            width,
            config,
        }
    }

    /// The configuration it was made with.
    pub fn config(&self) -> TransformerConfig {
        self.config
    }

    /// Runs the layer on `stream` (`[batch, time, width]`): dropout only when `train`. The MLP
    /// branch is left pending in the stream, for the next layer's (or the final) norm.
    pub fn f_forward_t(&self, stream: &mut ResidualStream, train: bool) -> Result<()> {
        let p = if train { self.config.dropout } else { 0.0 };
        let h = stream.f_norm(&self.ln_1)?;
        let y = self.attention(&h, p)?;
        let (branch, bias) = self.linear_parts(&self.attn_proj, &y)?;
        stream.push(branch, bias, p, train)?;
        let h = stream.f_norm(&self.ln_2)?;
        let (branch, bias) = self.mlp(&h)?;
        stream.push(branch, bias, p, train)
    }

    /// `lin(x)` as `(output, bias still to add)`: with the crate's kernels the bias goes into the
    /// fused kernel after the layer (the next norm, the GELU), which also sums its gradient;
    /// ATen's path (`Kernels::PyTorch`) keeps PyTorch's order of operations (the bias in the
    /// linear layer).
    fn linear_parts<'l>(&self, lin: &'l Linear, x: &Tensor) -> Result<(Tensor, Option<&'l Tensor>)> {
        if self.config.kernels == Kernels::PyTorch {
            Ok((lin.f_forward(x)?, None))
        } else {
            Ok((lin.f_forward_unbiased(x)?, lin.bs.as_ref()))
        }
    }

    /// The MLP's branch, and the bias still to add (see [`linear_parts`](Self::linear_parts)):
    /// with GELU's tanh form on the crate's kernels, both GEMMs with the GELU in their epilogues
    /// ([`crate::mlp`]); with the exact form too where those GEMMs take it (CUTLASS's: bf16 on
    /// sm_90), else the GEMMs and the GELU kernels apart.
    fn mlp<'l>(&'l self, h: &Tensor) -> Result<(Tensor, Option<&'l Tensor>)> {
        if self.config.activation == Activation::GeluTanh && self.config.kernels != Kernels::PyTorch {
            return Ok((f_gelu_tanh_mlp_unbiased(h, &self.c_fc, &self.mlp_proj)?, self.mlp_proj.bs.as_ref()));
        }
        if self.config.activation == Activation::Gelu && self.config.kernels != Kernels::PyTorch {
            match f_gelu_mlp_unbiased_own(h, &self.c_fc, &self.mlp_proj, GeluApproximate::None) {
                Ok(y) => return Ok((y, self.mlp_proj.bs.as_ref())),
                Err(Error::Unsupported(_)) => {} // the layers apart, below
                Err(e) => return Err(e),
            }
        }
        let a = self.mlp_hidden(h)?;
        self.linear_parts(&self.mlp_proj, &a)
    }

    /// The MLP's activation of its first layer (`c_fc`'s bias added in the GELU kernel, see
    /// [`linear_parts`](Self::linear_parts)).
    fn mlp_hidden(&self, h: &Tensor) -> Result<Tensor> {
        let approximate = match self.config.activation {
            Activation::Gelu => GeluApproximate::None,
            Activation::GeluTanh => GeluApproximate::Tanh,
            Activation::Relu => return self.c_fc.f_forward(h)?.f_relu().map_err(Into::into),
        };
        let (pre, bias) = self.linear_parts(&self.c_fc, h)?;
        f_bias_gelu(&pre, bias, &GeluConfig { approximate, kernels: self.config.kernels })
    }

    /// Attention up to its output projection (the projection is the caller's, so its bias can be
    /// deferred into the next norm).
    fn attention(&self, h: &Tensor, p: f64) -> Result<Tensor> {
        let size = h.size();
        let [n, t, e] = size[..] else {
            return Err(Error::Misuse(format!("TransformerLayer: input of shape {size:?}, not [batch, time, width]")));
        };
        if e != self.width {
            return Err(Error::Misuse(format!(
                "TransformerLayer: the input's last dimension (dimension 2, size {e}) differs from the layer's width ({})",
                self.width
            )));
        }
        let nh = self.config.heads;
        // q, k and v as views of one projection; their gradients packed back with the bias's
        // summed in one kernel (Linear::f_forward_split)
        let qkv = self.c_attn.f_forward_split(h, 3)?;
        let heads = |x: &Tensor| x.f_view([n, t, nh, e / nh])?.f_transpose(1, 2);
        let (q, k, v) = (heads(&qkv[0])?, heads(&qkv[1])?, heads(&qkv[2])?);
        let y = Tensor::f_scaled_dot_product_attention::<Tensor>(&q, &k, &v, None, p, self.config.causal, None, false)?;
        Ok(y.f_transpose(1, 2)?.f_contiguous()?.f_view([n, t, e])?)
    }
}

/// One layer on its own, as tch's `ModuleT`: the input is the residual stream's value, the output
/// too (the MLP branch added). Panics on an error, as tch's layers do; a model that stacks layers
/// threads one [`ResidualStream`] through [`TransformerLayer::f_forward_t`] instead, so that each
/// add is fused into the next norm.
impl nn::ModuleT for TransformerLayer {
    fn forward_t(&self, xs: &Tensor, train: bool) -> Tensor {
        let mut stream = ResidualStream::new(xs.shallow_clone());
        let out = self.f_forward_t(&mut stream, train).and_then(|()| stream.f_into_tensor());
        out.unwrap_or_else(|e| panic!("{e}"))
    }
}
