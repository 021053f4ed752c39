//! nanoGPT's model in tch (karpathy/nanoGPT `model.py`): token and position embeddings, the
//! crate's pre-norm [`TransformerLayer`]s (causal `scaled_dot_product_attention`, cuDNN's / the
//! flash kernel on a GPU, and a GELU MLP), dropout, a final LayerNorm and a head tied to the token
//! embedding. One [`ResidualStream`] runs through the layers, so each norm also takes the residual
//! add and the dropout of the branch before it: ATen's operators by default (the same operations
//! as nanoGPT's), the crate's fused kernels with `fused` ([`Config::fused`]). Its matmuls are the
//! crate's `Linear`s (and the token embedding's [`Embedding::f_attend`] for the tied head), which
//! read the weights' bf16 shadows in a step run with them: `at::linear` by default, and with `fused` a backward that computes each
//! bias gradient inside the weight-gradient GEMM ([`Config::weight_grad`]). Its loss is the
//! crate's cross-entropy: ATen's by default, the fused kernels with `fused`.
//! Shared by `examples/gpt/main.rs` (`--arch gpt`) and `benches/gpt.rs`, and built the same way
//! by `benches/torch_gpt.py`.
#![allow(dead_code)]

use std::cell::Cell;
use tch::{nn, Tensor};
use tch_cuda_graphs::embedding::{embedding, Embedding, EmbeddingConfig};
use tch_cuda_graphs::kernels::Kernels;
use tch_cuda_graphs::linear::{LinearConfig, WeightGrad};
use tch_cuda_graphs::loss::{f_cross_entropy, f_linear_cross_entropy, CrossEntropyConfig, LinearCrossEntropyConfig};
use tch_cuda_graphs::norm::{layer_norm, LayerNorm, NormConfig};
use tch_cuda_graphs::transformer::{Activation, ResidualStream, TransformerConfig, TransformerLayer};

/// The model's shape.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Config {
    /// Characters (or tokens) in the vocabulary.
    pub vocab: i64,
    /// Context length.
    pub block: i64,
    /// Transformer blocks.
    pub layers: i64,
    /// Attention heads.
    pub heads: i64,
    /// Width.
    pub embd: i64,
    /// Dropout probability (embeddings, attention, residual branches).
    pub dropout: f64,
    /// The norms, residual adds and residual dropouts on the crate's fused kernels, and the
    /// linear layers' bias gradients in their weight-gradient GEMMs (else ATen's operators).
    pub fused: bool,
    /// With `fused`: how the linear layers' weight gradients reach the float32 parameters.
    pub weight_grad: WeightGrad,
    /// The MLP's activation: exact GELU (nanoGPT's, the default) or its tanh approximation
    /// (GPT-2's original; with `fused`, in the MLP's GEMM epilogues).
    pub activation: Activation,
    /// With `fused`: the head and the loss in chunks of rows (`loss::f_linear_cross_entropy`), so
    /// the logits are never all in memory.
    pub chunked_loss: bool,
}

impl Config {
    /// nanoGPT's `shakespeare_char`: 6 layers, 6 heads, 384 wide, block 256, dropout 0.2.
    pub fn shakespeare_char(vocab: i64) -> Config {
        Config {
            vocab,
            block: 256,
            layers: 6,
            heads: 6,
            embd: 384,
            dropout: 0.2,
            fused: false,
            weight_grad: WeightGrad::Float32,
            activation: Activation::Gelu,
            chunked_loss: false,
        }
    }

    /// GPT-2 small's shape (12 × 768, block 1024), dropout 0.
    pub fn gpt2_small(vocab: i64) -> Config {
        Config {
            vocab,
            block: 1024,
            layers: 12,
            heads: 12,
            embd: 768,
            dropout: 0.0,
            fused: false,
            weight_grad: WeightGrad::Float32,
            activation: Activation::Gelu,
            chunked_loss: false,
        }
    }

    /// The kernels of the norms, linear layers and loss: the crate's where they apply with
    /// `fused`, ATen's otherwise.
    pub fn kernels(&self) -> Kernels {
        if self.fused {
            Kernels::Auto
        } else {
            Kernels::PyTorch
        }
    }

    /// FLOPs of one forward and backward per token (nanoGPT's `estimate_mfu`: 6N + 12·L·H·Q·T).
    pub fn flops_per_token(&self, params: i64) -> f64 {
        6.0 * params as f64 + 12.0 * (self.layers * self.heads * (self.embd / self.heads) * self.block) as f64
    }

    /// A tiny model for CPU runs and tests.
    pub fn tiny(vocab: i64) -> Config {
        Config {
            vocab,
            block: 32,
            layers: 2,
            heads: 2,
            embd: 32,
            dropout: 0.1,
            fused: false,
            weight_grad: WeightGrad::Float32,
            activation: Activation::Gelu,
            chunked_loss: false,
        }
    }
}

/// The GPT. Its dropout is on while [`Gpt::set_train`] says so; a captured step records what
/// the flag was at capture.
#[derive(Debug)]
pub struct Gpt {
    pub config: Config,
    wte: Embedding,
    wpe: Embedding,
    blocks: Vec<TransformerLayer>,
    ln_f: LayerNorm,
    train: Cell<bool>,
}

impl Gpt {
    /// Builds the model under `p`, initialised as nanoGPT does (normal 0.02, residual
    /// projections 0.02 / sqrt(2 · layers), zero biases).
    pub fn new(p: &nn::Path, config: Config) -> Gpt {
        let normal = |stdev| nn::Init::Randn { mean: 0.0, stdev };
        let (e, kernels) = (config.embd, config.kernels());
        let layer = TransformerConfig {
            heads: config.heads,
            dropout: config.dropout,
            output_init: normal(0.02 / (2.0 * config.layers as f64).sqrt()),
            weight_grad: config.weight_grad,
            activation: config.activation,
            kernels,
            ..Default::default()
        };
        let blocks = (0..config.layers).map(|l| TransformerLayer::new(p / "h" / l, e, layer)).collect();
        let emb = EmbeddingConfig { ws_init: normal(0.02), kernels, ..Default::default() };
        Gpt {
            config,
            wte: embedding(p / "wte", config.vocab, e, emb),
            wpe: embedding(p / "wpe", config.block, e, emb),
            blocks,
            ln_f: layer_norm(p / "ln_f", vec![e], NormConfig { kernels, ..Default::default() }),
            train: Cell::new(true),
        }
    }

    /// Dropout on (training) or off (evaluation, sampling).
    pub fn set_train(&self, on: bool) {
        self.train.set(on);
    }

    /// Logits for tokens `idx` ([batch, time], time ≤ block).
    pub fn logits(&self, idx: &Tensor) -> Result<Tensor, tch::TchError> {
        let h = self.hidden(idx)?;
        // the head is the token embedding, transposed (weight tying)
        let head =
            LinearConfig { weight_grad: self.config.weight_grad, kernels: self.config.kernels(), ..Default::default() };
        Ok(self.wte.f_attend(&h, &head)?)
    }

    /// The final norm's output for tokens `idx`: what the head reads.
    fn hidden(&self, idx: &Tensor) -> Result<Tensor, tch::TchError> {
        let train = self.train.get();
        let (t, p) = (idx.size()[1], self.config.dropout);
        // the positions' embeddings, wpe(arange(t)), are the table's first t rows: the table
        // itself at full length (its gradient then is the sum over the batch, no gather and no
        // sort of positions), a view of it otherwise
        let pos = if t == self.config.block { self.wpe.ws.shallow_clone() } else { self.wpe.ws.f_narrow(0, 0, t)? };
        // each norm takes the residual stream and the branch before it: x += dropout(branch);
        // the first takes the start, dropout(tokens + positions), adding the positions itself
        let mut stream = ResidualStream::with_positions(self.wte.f_forward(idx)?, pos, p, train);
        for b in &self.blocks {
            b.f_forward_t(&mut stream, train)?;
        }
        Ok(stream.f_norm(&self.ln_f)?)
    }

    /// Mean cross-entropy of the next-token predictions (with `fused`, on the crate's fused
    /// kernels: one read of the logits, the gradient written with the loss, in bf16 under autocast;
    /// with `chunked_loss` too, the head and the loss a chunk of rows at a time).
    pub fn loss(&self, idx: &Tensor, targets: &Tensor) -> Result<Tensor, tch::TchError> {
        if self.config.fused && self.config.chunked_loss {
            let config = LinearCrossEntropyConfig { weight_grad: self.config.weight_grad, ..Default::default() };
            return Ok(f_linear_cross_entropy(&self.hidden(idx)?, &self.wte.ws, targets, &config)?);
        }
        let logits = self.logits(idx)?;
        let config = CrossEntropyConfig { kernels: self.config.kernels(), ..Default::default() };
        Ok(f_cross_entropy(&logits.f_view([-1, self.config.vocab])?, &targets.f_reshape([-1])?, &config)?)
    }

    /// Parameters as nanoGPT counts them (without the position embedding).
    pub fn param_count(vs: &nn::VarStore) -> i64 {
        vs.variables().iter().filter(|(n, _)| !n.ends_with("wpe.weight")).map(|(_, t)| t.numel() as i64).sum()
    }
}

impl crate::lm::LanguageModel for Gpt {
    fn logits(&self, idx: &Tensor) -> tch_cuda_graphs::Result<Tensor> {
        Ok(Gpt::logits(self, idx)?)
    }

    fn loss(&self, idx: &Tensor, targets: &Tensor) -> tch_cuda_graphs::Result<Tensor> {
        Ok(Gpt::loss(self, idx, targets)?)
    }

    fn block(&self) -> i64 {
        self.config.block
    }

    fn set_train(&self, on: bool) {
        Gpt::set_train(self, on)
    }
}
