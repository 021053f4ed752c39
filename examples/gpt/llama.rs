//! A Llama-style model in tch on the crate's drop-in layers: token embedding; per block RMSNorm,
//! q, k and v from one `wqkv` projection (grouped-query attention: fewer KV heads),
//! rotary embeddings on q and k, causal `scaled_dot_product_attention` (`enable_gqa`), `wo`;
//! RMSNorm, one `w13` projection read as [gate | up] by SwiGLU, `w2`; no biases; a final RMSNorm
//! and an untied head; the crate's cross-entropy. One [`ResidualStream`] runs through the blocks,
//! so each RMSNorm also takes the residual add before it. `fused` ([`Config::fused`]) runs the
//! crate's kernels (norms, rotary, SwiGLU, float32 weight gradients, loss); without it ATen's
//! operators run the same model (the plain graph a tch user gets). Shared by
//! `examples/gpt/main.rs` (`--arch llama`) and `benches/llama.rs`, and built the same way by
//! `benches/torch_llama.py`.
#![allow(dead_code)]

use tch::{nn, Tensor};
use tch_cuda_graphs::embedding::{embedding, Embedding, EmbeddingConfig};
use tch_cuda_graphs::kernels::Kernels;
use tch_cuda_graphs::linear::{linear, Linear, LinearConfig, WeightGrad};
use tch_cuda_graphs::loss::{
    f_cross_entropy, f_linear_cross_entropy, CrossEntropyConfig, LinearCrossEntropyConfig, LinearCrossEntropyMethod,
};
use tch_cuda_graphs::mlp::f_swiglu_mlp;
use tch_cuda_graphs::norm::{rms_norm, LayerNorm, NormConfig};
use tch_cuda_graphs::rotary::{Rotary, RotaryConfig};
use tch_cuda_graphs::swiglu::{SwiGlu, SwiGluConfig};
use tch_cuda_graphs::transformer::ResidualStream;

/// The model's shape.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Config {
    pub vocab: i64,
    pub block: i64,
    pub layers: i64,
    pub heads: i64,
    /// Key and value heads (grouped-query attention: `heads` a multiple of it).
    pub kv_heads: i64,
    pub embd: i64,
    /// SwiGLU's hidden width.
    pub hidden: i64,
    /// RMSNorm's epsilon.
    pub eps: f64,
    /// The rotary base θ.
    pub rope_base: f64,
    /// The crate's kernels (else ATen's operators).
    pub fused: bool,
    /// Key and value heads repeated to every query head before attention (else SDPA's
    /// `enable_gqa` reads the grouped heads as they are).
    pub expand_kv: bool,
    /// With `fused`: the MLP's layers apart (`w13`, the `SwiGlu` module, `w2`), else
    /// `mlp::f_swiglu_mlp` (SwiGLU's forward in the up half of `w13`'s GEMM, its backward in
    /// `w2`'s).
    pub swiglu_apart: bool,
    /// With `fused`: `wqkv` and the rotation as two calls (`Linear::f_forward`, then
    /// `Rotary::f_forward_qkv`: q and k rotated into new tensors, v copied), else one
    /// (`Rotary::f_project_qkv`: q and k rotated in the projection's GEMM, q, k and v views of
    /// the projection).
    pub rotary_apart: bool,
    /// With `fused`: how the linear layers' weight gradients reach the float32 parameters.
    pub weight_grad: WeightGrad,
    /// With `fused`: the head and the loss in one call with the exponentials in the head's GEMM
    /// (`loss::f_linear_cross_entropy`, `LinearCrossEntropyMethod::ExpInHead`; the default), else
    /// the head's logits and the fused cross-entropy over them.
    pub exp_loss: bool,
}

impl Config {
    /// 6 × 384, 6 heads / 2 KV, SwiGLU 1024, block 256 (9.5 M parameters at vocabulary 96).
    pub fn small(vocab: i64) -> Config {
        Config {
            vocab,
            block: 256,
            layers: 6,
            heads: 6,
            kv_heads: 2,
            embd: 384,
            hidden: 1024,
            eps: 1e-6,
            rope_base: 10_000.0,
            fused: false,
            expand_kv: false,
            swiglu_apart: false,
            rotary_apart: false,
            weight_grad: WeightGrad::Float32,
            exp_loss: true,
        }
    }

    /// 12 × 768, 12 heads / 4 KV, SwiGLU 2048, block 1024 (124.7 M at vocabulary 32,000).
    pub fn base(vocab: i64) -> Config {
        Config { block: 1024, layers: 12, heads: 12, kv_heads: 4, embd: 768, hidden: 2048, ..Config::small(vocab) }
    }

    pub fn kernels(&self) -> Kernels {
        if self.fused {
            Kernels::Auto
        } else {
            Kernels::PyTorch
        }
    }

    /// A tiny model for CPU runs and tests: 2 × 32, 4 heads / 2 KV, SwiGLU 64, block 32.
    pub fn tiny(vocab: i64) -> Config {
        Config { block: 32, layers: 2, heads: 4, kv_heads: 2, embd: 32, hidden: 64, ..Config::small(vocab) }
    }

    /// FLOPs of one forward and backward per token (nanoGPT's `estimate_mfu`: 6N + 12·L·H·Q·T).
    pub fn flops_per_token(&self, params: i64) -> f64 {
        6.0 * params as f64 + 12.0 * (self.layers * self.embd * self.block) as f64
    }

    fn head_dim(&self) -> i64 {
        self.embd / self.heads
    }
}

#[derive(Debug)]
struct Block {
    attn_norm: LayerNorm,
    wqkv: Linear,
    wo: Linear,
    mlp_norm: LayerNorm,
    w13: Linear,
    w2: Linear,
    swiglu: SwiGlu,
}

/// The model.
#[derive(Debug)]
pub struct Llama {
    pub config: Config,
    tok: Embedding,
    blocks: Vec<Block>,
    norm: LayerNorm,
    head: Linear,
    rope: Rotary,
}

impl Llama {
    /// Builds the model under `p`: normal(0.02) weights, the output projections
    /// 0.02 / sqrt(2 · layers), norms at one.
    pub fn new(p: &nn::Path, c: Config) -> Llama {
        let normal = |stdev| nn::Init::Randn { mean: 0.0, stdev };
        let lin = |init| LinearConfig {
            ws_init: normal(init),
            bias: false,
            weight_grad: c.weight_grad,
            kernels: c.kernels(),
            ..Default::default()
        };
        let (inner, out) = (lin(0.02), lin(0.02 / (2.0 * c.layers as f64).sqrt()));
        let norm = NormConfig { eps: c.eps, kernels: c.kernels(), ..Default::default() };
        let (e, d) = (c.embd, c.head_dim());
        let blocks = (0..c.layers)
            .map(|l| {
                let b = p / "layers" / l;
                Block {
                    attn_norm: rms_norm(&b / "attn_norm", vec![e], norm),
                    wqkv: linear(&b / "wqkv", e, (c.heads + 2 * c.kv_heads) * d, inner),
                    wo: linear(&b / "wo", c.heads * d, e, out),
                    mlp_norm: rms_norm(&b / "mlp_norm", vec![e], norm),
                    w13: linear(&b / "w13", e, 2 * c.hidden, inner),
                    w2: linear(&b / "w2", c.hidden, e, out),
                    swiglu: SwiGlu::new(SwiGluConfig { kernels: c.kernels() }),
                }
            })
            .collect();
        let rope = RotaryConfig { base: c.rope_base, kernels: c.kernels(), ..Default::default() };
        Llama {
            config: c,
            tok: embedding(
                p / "tok",
                c.vocab,
                e,
                EmbeddingConfig { ws_init: normal(0.02), kernels: c.kernels(), ..Default::default() },
            ),
            blocks,
            norm: rms_norm(p / "norm", vec![e], norm),
            head: linear(p / "head", e, c.vocab, inner),
            rope: Rotary::new(d, c.block, p.device(), rope),
        }
    }

    fn attention(&self, b: &Block, h: &Tensor) -> tch_cuda_graphs::Result<Tensor> {
        let c = &self.config;
        let (bsz, t, d) = (h.size()[0], h.size()[1], c.head_dim());
        // one projection, q | k | v along the heads, rotated in its GEMM in one node (fused) whose
        // backward writes the projection's gradient in place of the concatenation of dq, dk and dv
        let (q, k, v) = if c.rotary_apart {
            let qkv = b.wqkv.f_forward(h)?.f_view([bsz, t, c.heads + 2 * c.kv_heads, d])?;
            self.rope.f_forward_qkv(&qkv, c.heads, c.kv_heads, 0)?
        } else {
            self.rope.f_project_qkv(&b.wqkv, h, c.heads, c.kv_heads, 0)?
        };
        let (q, mut k, mut v) = (q.f_transpose(1, 2)?, k.f_transpose(1, 2)?, v.f_transpose(1, 2)?);
        let group = c.heads / c.kv_heads;
        if c.expand_kv && group > 1 {
            k = k.f_repeat_interleave_self_int(group, 1, None)?;
            v = v.f_repeat_interleave_self_int(group, 1, None)?;
        }
        let gqa = !c.expand_kv && group > 1;
        let y = Tensor::f_scaled_dot_product_attention::<Tensor>(&q, &k, &v, None, 0.0, true, None, gqa)?;
        b.wo.f_forward(&y.f_transpose(1, 2)?.f_reshape([bsz, t, c.heads * d])?)
    }

    fn mlp(&self, b: &Block, h: &Tensor) -> tch_cuda_graphs::Result<Tensor> {
        if self.config.swiglu_apart {
            b.w2.f_forward(&b.swiglu.f_forward(&b.w13.f_forward(h)?)?)
        } else {
            f_swiglu_mlp(h, &b.w13, &b.w2)
        }
    }

    /// The final norm's output for tokens `idx` [batch, time]: what the head reads.
    fn hidden(&self, idx: &Tensor) -> tch_cuda_graphs::Result<Tensor> {
        let mut stream = ResidualStream::new(self.tok.f_forward(idx)?);
        for b in &self.blocks {
            stream.f_residual(&b.attn_norm, 0.0, false, |h| self.attention(b, h))?;
            stream.f_residual(&b.mlp_norm, 0.0, false, |h| self.mlp(b, h))?;
        }
        stream.f_norm(&self.norm)
    }

    /// Logits for tokens `idx` [batch, time].
    pub fn logits(&self, idx: &Tensor) -> tch_cuda_graphs::Result<Tensor> {
        self.head.f_forward(&self.hidden(idx)?)
    }

    /// Mean cross-entropy of the next-token predictions.
    pub fn loss(&self, idx: &Tensor, targets: &Tensor) -> tch_cuda_graphs::Result<Tensor> {
        if self.config.fused && self.config.exp_loss {
            let config = LinearCrossEntropyConfig {
                weight_grad: self.config.weight_grad,
                method: LinearCrossEntropyMethod::ExpInHead,
                kernels: self.config.kernels(),
                ..Default::default()
            };
            return f_linear_cross_entropy(&self.hidden(idx)?, &self.head.ws, targets, &config);
        }
        let logits = self.logits(idx)?;
        let config = CrossEntropyConfig { kernels: self.config.kernels(), ..Default::default() };
        f_cross_entropy(&logits.f_view([-1, self.config.vocab])?, &targets.f_reshape([-1])?, &config)
    }
}

impl crate::lm::LanguageModel for Llama {
    fn logits(&self, idx: &Tensor) -> tch_cuda_graphs::Result<Tensor> {
        Llama::logits(self, idx)
    }

    fn loss(&self, idx: &Tensor, targets: &Tensor) -> tch_cuda_graphs::Result<Tensor> {
        Llama::loss(self, idx, targets)
    }

    fn block(&self) -> i64 {
        self.config.block
    }

    /// No dropout: nothing changes between training and evaluation.
    fn set_train(&self, _on: bool) {}
}
