//! The cross-entropy loss of a language model's head on the crate's fused kernels:
//! [`cross_entropy`].
//!
//! Under bf16 autocast ATen's `cross_entropy` casts the logits to fp32, runs `log_softmax` and
//! `nll_loss`, and its backward writes the fp32 gradient, the `log_softmax` gradient and the
//! cast back to bf16: five passes over the largest tensor of a language model ([tokens,
//! vocabulary]: 1.2 GB of bf16 logits for GPT-2 small at 12,288 tokens). The fused kernels read
//! the logits once in the forward (log-sum-exp and the target's logit, fp32 math, in the logits'
//! own dtype) and once in the backward, writing the gradient in the logits' dtype; the mean is
//! summed in a fixed order (deterministic), and the backward reads the loss's gradient and the
//! count on the device, so a captured step replays it. Against ATen the result differs by the
//! rounding of a different summation order (`tests/gpu_loss.rs` states the figures).
//!
//! The fused kernels run where they apply — contiguous CUDA float32 / bfloat16 / float16 logits —
//! and ATen's `cross_entropy_loss` (mean reduction) elsewhere ([`CrossEntropyConfig::kernels`]).
//! One difference: a target out of range gives a NaN loss (and a zero gradient for its row)
//! where ATen stops the device with an assertion.
//!
//! ```no_run
//! # fn main() -> tch_cuda_graphs::Result<()> {
//! use tch::{Device, Kind, Tensor};
//! use tch_cuda_graphs::loss::{cross_entropy, CrossEntropyConfig};
//! let logits = Tensor::randn([12288, 50304], (Kind::BFloat16, Device::Cuda(0))).set_requires_grad(true);
//! let targets = Tensor::randint(50304, [12288], (Kind::Int64, Device::Cuda(0)));
//! let loss = cross_entropy(&logits, &targets, &CrossEntropyConfig::default())?; // 0-d float32
//! loss.backward(); // logits.grad(): bf16
//! # Ok(()) }
//! ```

use crate::error::Result;
use crate::optim::Kernels;
use crate::sys::loss as raw;
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
/// class indices `targets` [rows], as `torch.nn.functional.cross_entropy` with mean reduction;
/// differentiable in `logits`.
pub fn cross_entropy(logits: &Tensor, targets: &Tensor, config: &CrossEntropyConfig) -> Result<Tensor> {
    Ok(cross_entropy_ran(logits, targets, config)?.0)
}

/// [`cross_entropy`], and whether the crate's fused kernels ran (else ATen's operators).
pub fn cross_entropy_ran(logits: &Tensor, targets: &Tensor, config: &CrossEntropyConfig) -> Result<(Tensor, bool)> {
    raw::cross_entropy(logits, targets, config.ignore_index, config.kernels.raw())
}
