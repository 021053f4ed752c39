//! What the training loop, the steps and the sampler ask of a language model, so that one loop
//! trains either architecture (`--arch gpt`, nanoGPT's; `--arch llama`, a Llama-style model):
//! [`LanguageModel`], implemented by `model::Gpt` and `llama::Llama`.
#![allow(dead_code)]

use tch::Tensor;

/// A causal language model over `[batch, time]` tokens.
pub trait LanguageModel {
    /// Logits `[batch, time, vocab]` for tokens `idx` (`time` ≤ [`block`](Self::block)).
    fn logits(&self, idx: &Tensor) -> tch_cuda_graphs::Result<Tensor>;
    /// Mean cross-entropy of the next-token predictions.
    fn loss(&self, idx: &Tensor, targets: &Tensor) -> tch_cuda_graphs::Result<Tensor>;
    /// The context length.
    fn block(&self) -> i64;
    /// Training (dropout on) or evaluation; a captured step records the mode it was captured in.
    fn set_train(&self, on: bool);
}
