//! The embedding with a deterministic backward of its own: [`Embedding`], built by [`embedding`]
//! as tch's `nn::embedding` is (the same `ws`, the same `nn::Module`).
//!
//! ATen's embedding backward sorts the indices as 64-bit keys, then sums and scatters the rows
//! in several kernels and zero-fills the whole gradient first: about ten kernels, 0.27 ms for
//! 12,288 tokens into a 32,000 × 768 table on an H200. The crate's backward sorts 32-bit ids
//! (ATen's stable sort) and one kernel writes every row of the gradient, each the sum of its
//! positions' output gradients in a fixed order (float32 accumulation): the same every run, with
//! no atomics, and no separate zero-fill. The forward is ATen's gather. ATen's
//! `at::embedding` runs where the kernel does not apply: on a CPU, a width that is not a multiple
//! of 4, a weight dtype other than float32, bfloat16 and float16, or under [`Kernels::PyTorch`].
//!
//! A head tied to the table (GPT-2's, nanoGPT's) is [`Embedding::f_attend`]: `x · wsᵀ` on the
//! crate's linear layer. With the crate's kernels on both sides the head's weight gradient is
//! sent to the embedding's autograd node, whose backward adds the rows its indices name into it
//! in place, where autograd would write a second [vocab, dim] gradient and add the two (on GPT-2
//! small's 50,304 × 768 table, 0.6 GB of traffic in two passes).
//!
//! ```
//! use tch::{nn, nn::Module, Device, Kind, Tensor};
//! use tch_cuda_graphs::embedding::{embedding, EmbeddingConfig};
//! let vs = nn::VarStore::new(Device::Cpu);
//! let tok = embedding(vs.root() / "tok", 96, 384, EmbeddingConfig::default());
//! let idx = Tensor::randint(96, [4, 256], (Kind::Int64, Device::Cpu));
//! assert_eq!(tok.forward(&idx).size(), [4, 256, 384]);
//! ```

use crate::error::Result;
use crate::kernels::{KernelPath, Kernels};
use crate::linear::LinearConfig;
use crate::sys::embedding as raw;
use crate::sys::linear as raw_linear;
use std::borrow::Borrow;
use std::cell::{Cell, RefCell};
use tch::{nn, Tensor};

/// How an [`Embedding`] is made and runs. Plain fields with [`Default`] (tch's defaults).
#[derive(Clone, Copy, Debug)]
pub struct EmbeddingConfig {
    /// The weight's initialization (default: standard normal, as tch's and PyTorch's).
    pub ws_init: nn::Init,
    /// A row that gets no gradient (negative: none, the default).
    pub padding_idx: i64,
    /// The crate's backward where it applies ([`Kernels::Auto`], the default), ATen's always
    /// ([`Kernels::PyTorch`]), or the crate's only ([`Kernels::Own`]).
    pub kernels: Kernels,
}

impl Default for EmbeddingConfig {
    fn default() -> Self {
        EmbeddingConfig { ws_init: nn::Init::Randn { mean: 0.0, stdev: 1.0 }, padding_idx: -1, kernels: Kernels::Auto }
    }
}

/// An embedding table: `forward(indices)` gives the rows `indices` name.
#[derive(Debug)]
pub struct Embedding {
    /// The table [num_embeddings, embedding_dim] (tch's `nn::Embedding::ws`).
    pub ws: Tensor,
    /// How it runs.
    pub config: EmbeddingConfig,
    last: Cell<Option<KernelPath>>,
    /// Whether a head has attended to the table: from then on a forward in grad mode keeps its
    /// tie for the next [`Embedding::f_attend`].
    attends: Cell<bool>,
    /// The last forward's tie (an alias of `ws` whose gradient goes to that forward's node), not
    /// yet taken by a head.
    tie: RefCell<Option<Tensor>>,
}

/// An embedding of `num_embeddings` rows of `embedding_dim` under `vs` (its weight named "weight",
/// as tch's).
pub fn embedding<'a, T: Borrow<nn::Path<'a>>>(
    vs: T,
    num_embeddings: i64,
    embedding_dim: i64,
    config: EmbeddingConfig,
) -> Embedding {
    let ws = vs.borrow().var("weight", &[num_embeddings, embedding_dim], config.ws_init);
    Embedding { ws, config, last: Cell::new(None), attends: Cell::new(false), tie: RefCell::new(None) }
}

impl Embedding {
    /// The rows of the table that int64 or int32 `indices` name, shape `indices`' + [dim].
    /// [`crate::Error::Misuse`] for indices of another dtype or a `padding_idx` past the table.
    pub fn f_forward(&self, indices: &Tensor) -> Result<Tensor> {
        let (padding_idx, tie) = (self.config.padding_idx, self.attends.get());
        let (y, tie, own) = raw::embedding(&self.ws, indices, padding_idx, tie, self.config.kernels.raw())?;
        self.last.set(Some(KernelPath::of_one(own)));
        *self.tie.borrow_mut() = tie;
        Ok(y)
    }

    /// The head tied to the table: `x · wsᵀ` ([vocab] logits for each row of `x`), the crate's
    /// linear layer as [`crate::linear::f_apply`] runs it (`config.weight_grad` and
    /// `config.kernels` read). Where this table's last forward ran the crate's kernels in grad
    /// mode and the head runs the crate's path, the head's weight gradient goes to that forward's
    /// autograd node, whose backward adds the embedding's rows into it in place: the gradient
    /// autograd would sum, in one pass over the rows the indices name. Otherwise (the first
    /// call, ATen's kernels, no grad) the gradient takes autograd's way. [`Embedding::attend`] is
    /// the same, panicking on an error. (Flax calls it `Embed.attend`.)
    ///
    /// ```no_run
    /// # fn main() -> tch_cuda_graphs::Result<()> {
    /// use tch::{nn, Device, Kind, Tensor};
    /// use tch_cuda_graphs::embedding::{embedding, EmbeddingConfig};
    /// use tch_cuda_graphs::linear::LinearConfig;
    /// let vs = nn::VarStore::new(Device::Cuda(0));
    /// let wte = embedding(vs.root() / "wte", 50304, 768, EmbeddingConfig::default());
    /// let idx = Tensor::randint(50304, [12, 1024], (Kind::Int64, Device::Cuda(0)));
    /// let h = wte.f_forward(&idx)?; // ... the transformer
    /// let logits = wte.f_attend(&h, &LinearConfig::default())?;
    /// # let _ = logits; Ok(()) }
    /// ```
    pub fn f_attend(&self, x: &Tensor, config: &LinearConfig) -> Result<Tensor> {
        self.attends.set(true);
        let tie = self.tie.borrow_mut().take();
        let (wgrad, kernels) = (config.weight_grad.raw(), config.kernels.raw());
        Ok(raw_linear::forward(x, &self.ws, tie.as_ref(), None, wgrad, kernels)?.0)
    }

    /// [`Embedding::f_attend`], panicking on an error.
    pub fn attend(&self, x: &Tensor, config: &LinearConfig) -> Tensor {
        self.f_attend(x, config).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Whether the last forward's backward is the crate's (None before the first).
    pub fn last_path(&self) -> Option<KernelPath> {
        self.last.get()
    }
}

impl nn::Module for Embedding {
    fn forward(&self, indices: &Tensor) -> Tensor {
        self.f_forward(indices).unwrap_or_else(|e| panic!("{e}"))
    }
}
