//! The cross-entropy loss of a language model's head on the crate's fused kernels:
//! [`cross_entropy`] (and [`f_cross_entropy`], [`CrossEntropyLoss`]).
//!
//! Under bf16 autocast ATen's `cross_entropy` casts the logits to fp32, runs `log_softmax` and
//! `nll_loss`, and its backward writes the fp32 gradient, the `log_softmax` gradient and the
//! cast back to bf16: five passes over the largest tensor of a language model ([tokens,
//! vocabulary]: 1.2 GB of bf16 logits for GPT-2 small at 12,288 tokens). The fused kernel reads
//! the logits once from memory (log-sum-exp and the target's logit, fp32 math, in the logits'
//! own dtype) and, where the loss will be differentiated (grad mode on, logits that require
//! grad), writes the gradient as it goes, re-reading each row from the L2 cache: for a loss
//! gradient of 1, which the backward scales on the device where it is not 1 (so a captured step
//! replays it). The mean is summed in a fixed order (deterministic). Against ATen the result
//! differs by the rounding of a different summation order (`tests/gpu_loss.rs` states the
//! figures). Since the gradient is written by the forward, a second backward through one loss
//! (`retain_graph`) is refused with an error, and a forward under grad mode that is never
//! differentiated still writes it (compute such losses under `tch::no_grad`).
//!
//! The fused kernels run where they apply — contiguous CUDA float32 / bfloat16 / float16 logits —
//! and ATen's `cross_entropy_loss` (mean reduction) elsewhere ([`CrossEntropyConfig::kernels`]).
//! One difference: a target out of range gives a NaN loss (and a zero gradient for its row)
//! where ATen stops the device with an assertion.
//!
//! ```no_run
//! # fn main() -> tch_cuda_graphs::Result<()> {
//! use tch::{Device, Kind, Tensor};
//! use tch_cuda_graphs::loss::{f_cross_entropy, CrossEntropyConfig};
//! let logits = Tensor::randn([12288, 50304], (Kind::BFloat16, Device::Cuda(0))).set_requires_grad(true);
//! let targets = Tensor::randint(50304, [12288], (Kind::Int64, Device::Cuda(0)));
//! let loss = f_cross_entropy(&logits, &targets, &CrossEntropyConfig::default())?; // 0-d float32
//! loss.backward(); // logits.grad(): bf16
//! # Ok(()) }
//! ```

use crate::error::Result;
use crate::kernels::{KernelPath, Kernels};
use crate::linear::WeightGrad;
use crate::sys::loss as raw;
use crate::sys::loss::{RawLinearCeMethod, RawLinearCeOptions};
use std::cell::Cell;
use tch::Tensor;

/// How [`cross_entropy`] runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CrossEntropyConfig {
    /// Rows whose target is this are not counted (default -100, PyTorch's).
    pub ignore_index: i64,
    /// The crate's fused kernels where they apply ([`Kernels::Auto`], the default), ATen's
    /// `cross_entropy_loss` always ([`Kernels::PyTorch`]), or the fused kernels only
    /// ([`Kernels::Own`]: logits they do not take fail with [`crate::Error::Unsupported`]).
    pub kernels: Kernels,
}

impl Default for CrossEntropyConfig {
    fn default() -> Self {
        CrossEntropyConfig { ignore_index: -100, kernels: Kernels::Auto }
    }
}

/// The mean cross-entropy (a 0-d float32 tensor) of `logits` [rows, classes] against the int64
/// class indices `targets` \[rows\], as `torch.nn.functional.cross_entropy` with mean reduction;
/// differentiable in `logits`.
pub fn f_cross_entropy(logits: &Tensor, targets: &Tensor, config: &CrossEntropyConfig) -> Result<Tensor> {
    Ok(raw::cross_entropy(logits, targets, config.ignore_index, config.kernels.raw())?.0)
}

/// [`f_cross_entropy`], panicking on an error as tch's `Tensor::cross_entropy_for_logits` does.
pub fn cross_entropy(logits: &Tensor, targets: &Tensor, config: &CrossEntropyConfig) -> Tensor {
    f_cross_entropy(logits, targets, config).unwrap_or_else(|e| panic!("{e}"))
}

/// The loss as a value that remembers which kernels it last ran (PyTorch's
/// `nn.CrossEntropyLoss`): [`cross_entropy`] with a [`last_path`](Self::last_path).
///
/// ```
/// use tch::{Device, Kind, Tensor};
/// use tch_cuda_graphs::kernels::KernelPath;
/// use tch_cuda_graphs::loss::CrossEntropyLoss;
/// let loss_fn = CrossEntropyLoss::default();
/// let logits = Tensor::randn([4, 10], (Kind::Float, Device::Cpu));
/// let loss = loss_fn.forward(&logits, &Tensor::from_slice(&[1i64, 2, 3, 4]));
/// assert_eq!(loss_fn.last_path(), Some(KernelPath::PyTorch)); // the fused kernels are CUDA's
/// ```
#[derive(Debug, Default)]
pub struct CrossEntropyLoss {
    /// How it runs.
    pub config: CrossEntropyConfig,
    last: Cell<Option<KernelPath>>,
}

impl CrossEntropyLoss {
    /// The loss with `config`.
    pub fn new(config: CrossEntropyConfig) -> Self {
        CrossEntropyLoss { config, last: Cell::new(None) }
    }

    /// [`f_cross_entropy`] with this loss's config.
    pub fn f_forward(&self, logits: &Tensor, targets: &Tensor) -> Result<Tensor> {
        let c = &self.config;
        let (loss, own) = raw::cross_entropy(logits, targets, c.ignore_index, c.kernels.raw())?;
        self.last.set(Some(KernelPath::of_one(own)));
        Ok(loss)
    }

    /// [`f_forward`](Self::f_forward), panicking on an error.
    pub fn forward(&self, logits: &Tensor, targets: &Tensor) -> Tensor {
        self.f_forward(logits, targets).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Which kernels the last forward ran: [`KernelPath::Own`] for the fused kernels,
    /// [`KernelPath::PyTorch`] for ATen's operators (None before the first).
    pub fn last_path(&self) -> Option<KernelPath> {
        self.last.get()
    }
}

/// How [`f_linear_cross_entropy`]'s path runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum LinearCrossEntropyMethod {
    /// Chunks of `chunk_rows` rows: each chunk's GEMM, the fused kernel writing the chunk's
    /// gradient over its logits, and the chunk's share of both gradients, so peak memory stays one
    /// chunk of logits as the vocabulary grows.
    #[default]
    Chunks,
    /// The exponentials taken in the head GEMM's epilogue (each logit replaced by its exponential,
    /// against an exponent a row's tiles share), and the loss's gradient formed by the two
    /// backward GEMMs reading them as they lie, with a factor per row: no pass of the loss's own
    /// over the logits. Holds [rows, classes] of bf16 exponentials through the call. bf16 compute
    /// dtype, sm_90 and the crate's CUTLASS GEMMs; the chunks elsewhere.
    ExpInHead,
}

impl LinearCrossEntropyMethod {
    fn raw(self) -> RawLinearCeMethod {
        match self {
            LinearCrossEntropyMethod::Chunks => RawLinearCeMethod::TCG_LINEAR_CE_CHUNKED,
            LinearCrossEntropyMethod::ExpInHead => RawLinearCeMethod::TCG_LINEAR_CE_EXP_IN_HEAD,
        }
    }
}

/// How [`f_linear_cross_entropy`] runs. Plain fields with [`Default`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LinearCrossEntropyConfig {
    /// Rows whose target is this are not counted (default -100, PyTorch's).
    pub ignore_index: i64,
    /// Rows of logits per chunk (default 0: as many as 256 MiB of logits hold); the chunks' only.
    pub chunk_rows: i64,
    /// How the weight gradient reaches a float32 weight (default [`WeightGrad::Float32`], as
    /// [`crate::linear::LinearConfig`]'s).
    pub weight_grad: WeightGrad,
    /// How the crate's path runs (default [`LinearCrossEntropyMethod::Chunks`]).
    pub method: LinearCrossEntropyMethod,
    /// The crate's path where it applies ([`Kernels::Auto`], the default: `method`'s, else the
    /// chunks), ATen's `linear` and `cross_entropy_loss` always ([`Kernels::PyTorch`]), or
    /// `method`'s path only ([`Kernels::Own`]: inputs it does not take fail with
    /// [`crate::Error::Unsupported`]).
    pub kernels: Kernels,
}

impl Default for LinearCrossEntropyConfig {
    fn default() -> Self {
        LinearCrossEntropyConfig {
            ignore_index: -100,
            chunk_rows: 0,
            weight_grad: WeightGrad::Float32,
            method: LinearCrossEntropyMethod::Chunks,
            kernels: Kernels::Auto,
        }
    }
}

/// The mean cross-entropy of the logits `h · weightᵀ` against `targets` without all the logits in
/// memory at once: a language model's head and its loss in one call (Liger-Kernel's
/// `FusedLinearCrossEntropy`).
///
/// `h` is [.., C] (the final norm's output), `weight` [V, C] (an untied head's, or the token
/// embedding's for a tied one), `targets` int64, one per row of `h`. [`f_cross_entropy`] of the
/// logits holds [rows, V] of them and, in grad mode, their gradient: 2 × 1.2 GB in bf16 for GPT-2
/// small at 12,288 tokens. Here each chunk of `config.chunk_rows` rows runs its GEMM, the fused
/// kernel (which overwrites the chunk's logits with their gradient), and its share of `h`'s and
/// the weight's gradients (the weight's accumulated in the weight-gradient GEMM), so peak memory
/// stays one chunk of logits as the vocabulary grows. The gradients are made in the forward, for
/// a loss gradient of 1, and scaled on the device by the backward (a second backward through one
/// loss is refused, as [`f_cross_entropy`]'s). The crate's path runs where the linear layer's does
/// (CUDA, a 16-bit compute dtype: autocast's, or bf16 / f16 `h` and weight), reading the weight's
/// shadow in a step with [`crate::StepOptions::weight_shadows`]; elsewhere ATen's `linear` and
/// `cross_entropy_loss`. [`crate::Error::Misuse`] where the shapes do not match.
///
/// ```
/// use tch::{Device, Kind, Tensor};
/// use tch_cuda_graphs::loss::{f_linear_cross_entropy, LinearCrossEntropyConfig};
/// let h = Tensor::randn([2, 8, 16], (Kind::Float, Device::Cpu));
/// let head = Tensor::randn([50, 16], (Kind::Float, Device::Cpu));
/// let targets = Tensor::randint(50, [2, 8], (Kind::Int64, Device::Cpu));
/// let loss = f_linear_cross_entropy(&h, &head, &targets, &LinearCrossEntropyConfig::default())?;
/// assert_eq!(loss.size(), Vec::<i64>::new());
/// # Ok::<(), tch_cuda_graphs::Error>(())
/// ```
pub fn f_linear_cross_entropy(
    h: &Tensor,
    weight: &Tensor,
    targets: &Tensor,
    config: &LinearCrossEntropyConfig,
) -> Result<Tensor> {
    let c = config;
    let options = RawLinearCeOptions {
        ignore_index: c.ignore_index,
        chunk_rows: c.chunk_rows,
        wgrad: c.weight_grad.raw(),
        method: c.method.raw(),
    };
    let raw = raw::linear_cross_entropy(h, weight, targets, options, c.kernels.raw());
    Ok(raw?.0)
}

/// [`f_linear_cross_entropy`], panicking on an error.
pub fn linear_cross_entropy(
    h: &Tensor,
    weight: &Tensor,
    targets: &Tensor,
    config: &LinearCrossEntropyConfig,
) -> Tensor {
    f_linear_cross_entropy(h, weight, targets, config).unwrap_or_else(|e| panic!("{e}"))
}
