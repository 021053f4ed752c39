//! The architecture `examples/gpt` trains (`--arch`): a shape of either kind, which builds its
//! model as a [`LanguageModel`].

use crate::lm::LanguageModel;
use tch::nn;
use tch_cuda_graphs::transformer::Activation;

/// A model's shape, of either architecture.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Arch {
    Gpt(crate::model::Config),
    Llama(crate::llama::Config),
}

impl Arch {
    /// Builds the model under `p`.
    pub fn build(&self, p: &nn::Path) -> Box<dyn LanguageModel> {
        match *self {
            Arch::Gpt(c) => Box::new(crate::model::Gpt::new(p, c)),
            Arch::Llama(c) => Box::new(crate::llama::Llama::new(p, c)),
        }
    }

    /// The context length.
    pub fn block(&self) -> i64 {
        match self {
            Arch::Gpt(c) => c.block,
            Arch::Llama(c) => c.block,
        }
    }

    /// FLOPs of one forward and backward per token (nanoGPT's `estimate_mfu`: 6N + 12·L·H·Q·T).
    pub fn flops_per_token(&self, params: i64) -> f64 {
        match self {
            Arch::Gpt(c) => c.flops_per_token(params),
            Arch::Llama(c) => c.flops_per_token(params),
        }
    }

    /// Parameters as nanoGPT counts them (without a position embedding).
    pub fn param_count(vs: &nn::VarStore) -> i64 {
        crate::model::Gpt::param_count(vs)
    }

    /// What it is, in a few words.
    pub fn describe(&self) -> String {
        match self {
            Arch::Gpt(c) => format!(
                "GPT {} layers × {} wide, {} heads, block {}{}",
                c.layers,
                c.embd,
                c.heads,
                c.block,
                if c.activation == Activation::GeluTanh { ", GELU (tanh)" } else { "" }
            ),
            Arch::Llama(c) => format!(
                "Llama-style {} layers × {} wide, {} heads / {} KV heads, SwiGLU {}, block {}",
                c.layers, c.embd, c.heads, c.kv_heads, c.hidden, c.block
            ),
        }
    }

    /// Whether the crate's fused layers run.
    pub fn fused(&self) -> bool {
        match self {
            Arch::Gpt(c) => c.fused,
            Arch::Llama(c) => c.fused,
        }
    }
}
