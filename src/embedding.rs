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
use crate::sys::embedding as raw;
use std::borrow::Borrow;
use std::cell::Cell;
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
    Embedding { ws, config, last: Cell::new(None) }
}

impl Embedding {
    /// The rows of the table that int64 or int32 `indices` name, shape `indices`' + [dim].
    /// [`crate::Error::Misuse`] for indices of another dtype or a `padding_idx` past the table.
    pub fn f_forward(&self, indices: &Tensor) -> Result<Tensor> {
        let (y, own) = raw::embedding(&self.ws, indices, self.config.padding_idx, self.config.kernels.raw())?;
        self.last.set(Some(KernelPath::of_one(own)));
        Ok(y)
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
