//! nanoGPT's model in tch (karpathy/nanoGPT `model.py`): token and position embeddings,
//! pre-LayerNorm blocks with causal `scaled_dot_product_attention` (cuDNN's / the flash kernel on
//! a GPU) and a GELU MLP, dropout, a final LayerNorm and a head tied to the token embedding.
//! Shared by `examples/gpt/main.rs` and `benches/gpt.rs`, and built the same way by
//! `benches/torch_gpt.py`.
#![allow(dead_code)]

use std::cell::Cell;
use tch::{nn, nn::Module, Kind, Reduction, Tensor};

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
}

impl Config {
    /// nanoGPT's `shakespeare_char`: 6 layers, 6 heads, 384 wide, block 256, dropout 0.2.
    pub fn shakespeare_char(vocab: i64) -> Config {
        Config { vocab, block: 256, layers: 6, heads: 6, embd: 384, dropout: 0.2 }
    }

    /// GPT-2 small's shape (12 × 768, block 1024), dropout 0.
    pub fn gpt2_small(vocab: i64) -> Config {
        Config { vocab, block: 1024, layers: 12, heads: 12, embd: 768, dropout: 0.0 }
    }

    /// FLOPs of one forward and backward per token (nanoGPT's `estimate_mfu`: 6N + 12·L·H·Q·T).
    pub fn flops_per_token(&self, params: i64) -> f64 {
        6.0 * params as f64 + 12.0 * (self.layers * self.heads * (self.embd / self.heads) * self.block) as f64
    }

    /// A tiny model for CPU runs and tests.
    pub fn tiny(vocab: i64) -> Config {
        Config { vocab, block: 32, layers: 2, heads: 2, embd: 32, dropout: 0.1 }
    }
}

#[derive(Debug)]
struct Block {
    ln_1: nn::LayerNorm,
    c_attn: nn::Linear,
    attn_proj: nn::Linear,
    ln_2: nn::LayerNorm,
    c_fc: nn::Linear,
    mlp_proj: nn::Linear,
}

/// The GPT. Its dropout is on while [`Gpt::set_train`] says so; a captured step records what
/// the flag was at capture.
#[derive(Debug)]
pub struct Gpt {
    pub config: Config,
    wte: nn::Embedding,
    wpe: nn::Embedding,
    blocks: Vec<Block>,
    ln_f: nn::LayerNorm,
    train: Cell<bool>,
}

impl Gpt {
    /// Builds the model under `p`, initialised as nanoGPT does (normal 0.02, residual
    /// projections 0.02 / sqrt(2 · layers), zero biases).
    pub fn new(p: &nn::Path, config: Config) -> Gpt {
        let std = 0.02;
        let proj_std = 0.02 / (2.0 * config.layers as f64).sqrt();
        let lin = |p: nn::Path, i: i64, o: i64, s: f64| {
            nn::linear(
                p,
                i,
                o,
                nn::LinearConfig {
                    ws_init: nn::Init::Randn { mean: 0.0, stdev: s },
                    bs_init: Some(nn::Init::Const(0.0)),
                    bias: true,
                },
            )
        };
        let emb = nn::EmbeddingConfig { ws_init: nn::Init::Randn { mean: 0.0, stdev: std }, ..Default::default() };
        let e = config.embd;
        let blocks = (0..config.layers)
            .map(|l| {
                let b = p / "h" / l;
                Block {
                    ln_1: nn::layer_norm(&b / "ln_1", vec![e], Default::default()),
                    c_attn: lin(&b / "attn" / "c_attn", e, 3 * e, std),
                    attn_proj: lin(&b / "attn" / "c_proj", e, e, proj_std),
                    ln_2: nn::layer_norm(&b / "ln_2", vec![e], Default::default()),
                    c_fc: lin(&b / "mlp" / "c_fc", e, 4 * e, std),
                    mlp_proj: lin(&b / "mlp" / "c_proj", 4 * e, e, proj_std),
                }
            })
            .collect();
        Gpt {
            config,
            wte: nn::embedding(p / "wte", config.vocab, e, emb),
            wpe: nn::embedding(p / "wpe", config.block, e, emb),
            blocks,
            ln_f: nn::layer_norm(p / "ln_f", vec![e], Default::default()),
            train: Cell::new(true),
        }
    }

    /// Dropout on (training) or off (evaluation, sampling).
    pub fn set_train(&self, on: bool) {
        self.train.set(on);
    }

    fn attention(&self, b: &Block, x: &Tensor, train: bool) -> Result<Tensor, tch::TchError> {
        let (n, t, e) = x.size3()?;
        let h = self.config.heads;
        let qkv = b.c_attn.forward(x).f_split(e, 2)?;
        let heads = |t_: &Tensor| t_.f_view([n, t, h, e / h])?.f_transpose(1, 2);
        let (q, k, v) = (heads(&qkv[0])?, heads(&qkv[1])?, heads(&qkv[2])?);
        let p = if train { self.config.dropout } else { 0.0 };
        let y = Tensor::f_scaled_dot_product_attention::<Tensor>(&q, &k, &v, None, p, true, None, false)?;
        let y = y.f_transpose(1, 2)?.f_contiguous()?.f_view([n, t, e])?;
        b.attn_proj.forward(&y).f_dropout(self.config.dropout, train)
    }

    /// Logits for tokens `idx` ([batch, time], time ≤ block).
    pub fn logits(&self, idx: &Tensor) -> Result<Tensor, tch::TchError> {
        let train = self.train.get();
        let t = idx.size()[1];
        let pos = Tensor::f_arange(t, (Kind::Int64, idx.device()))?;
        let mut x = self.wte.forward(idx).f_add(&self.wpe.forward(&pos))?.f_dropout(self.config.dropout, train)?;
        for b in &self.blocks {
            x = x.f_add(&self.attention(b, &b.ln_1.forward(&x), train)?)?;
            let m = b.mlp_proj.forward(&b.c_fc.forward(&b.ln_2.forward(&x)).f_gelu("none")?);
            x = x.f_add(&m.f_dropout(self.config.dropout, train)?)?;
        }
        // the head is the token embedding, transposed (weight tying)
        self.ln_f.forward(&x).f_linear::<Tensor>(&self.wte.ws, None)
    }

    /// Mean cross-entropy of the next-token predictions.
    pub fn loss(&self, idx: &Tensor, targets: &Tensor) -> Result<Tensor, tch::TchError> {
        let logits = self.logits(idx)?;
        logits.f_view([-1, self.config.vocab])?.f_cross_entropy_loss::<Tensor>(
            &targets.f_reshape([-1])?,
            None,
            Reduction::Mean,
            -100,
            0.0,
        )
    }

    /// Parameters as nanoGPT counts them (without the position embedding).
    pub fn param_count(vs: &nn::VarStore) -> i64 {
        vs.variables().iter().filter(|(n, _)| !n.ends_with("wpe.weight")).map(|(_, t)| t.numel() as i64).sum()
    }
}
