//! GELU with the bias of the linear layer before it folded in: [`f_bias_gelu`] (and [`Gelu`])
//! computes `gelu(x + bias)` in one pass forward and, backward, writes the input gradient and sums
//! the bias gradient in the same pass.
//!
//! An MLP written as `c_fc(x).gelu()` runs, under autocast, a GEMM with the bias in its epilogue,
//! ATen's GELU kernel, and in the backward ATen's GELU backward, then a reduction re-reading the
//! gradient it wrote for the bias gradient (cuBLASLt's `BGRADB`, or ATen's `sum`). Run the linear
//! layer without its bias ([`crate::linear::Linear::f_forward_unbiased`]) and give its bias
//! here: the kernels add it in float32, and the backward's one pass gives both gradients. Both
//! forms of `nn.GELU` are offered: the exact erf form (the default) and the tanh approximation
//! (GPT-2's and llm.c's), each computed with ATen's formula in float32 and rounded once to `x`'s
//! dtype.
//!
//! The kernels run where they apply (a contiguous CUDA float32 / bfloat16 / float16 `x` whose last
//! dimension is a multiple of 4, a float32 bias); elsewhere, and under [`Kernels::PyTorch`],
//! ATen's `add` and `gelu` compute the same (in the promoted dtype, then cast to `x`'s). Numerics
//! against that composition: `tests/gpu_gelu.rs` states the figures.
//!
//! ```
//! use tch::{Device, Kind, Tensor};
//! use tch_cuda_graphs::gelu::{f_bias_gelu, GeluConfig};
//! let x = Tensor::randn([4, 16], (Kind::Float, Device::Cpu)); // c_fc(h) without its bias
//! let bias = Tensor::zeros([16], (Kind::Float, Device::Cpu));
//! let y = f_bias_gelu(&x, Some(&bias), &GeluConfig::default())?;
//! assert_eq!(y.size(), [4, 16]);
//! # Ok::<(), tch_cuda_graphs::Error>(())
//! ```

use crate::error::Result;
use crate::kernels::{KernelPath, Kernels};
use crate::sys::gelu::{self as raw, RawGeluForm};
use std::cell::Cell;
use tch::{nn, Tensor};

/// Which GELU, as `torch.nn.GELU`'s `approximate`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum GeluApproximate {
    /// `approximate="none"`: `x · Φ(x)`, the exact erf form (GPT-2's model in nanoGPT).
    #[default]
    None,
    /// `approximate="tanh"`: `x/2 · (1 + tanh(√(2/π) · (x + 0.044715 x³)))` (GPT-2's original, llm.c's).
    Tanh,
}

/// How [`f_bias_gelu`] runs. Plain fields with [`Default`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GeluConfig {
    /// The exact form (default) or the tanh approximation.
    pub approximate: GeluApproximate,
    /// The crate's kernels where they apply ([`Kernels::Auto`], the default), ATen's `add` and
    /// `gelu` ([`Kernels::PyTorch`]), or the kernels only ([`Kernels::Own`]: an input they do not
    /// take fails with [`crate::Error::Unsupported`]).
    pub kernels: Kernels,
}

impl GeluApproximate {
    pub(crate) fn raw(self) -> RawGeluForm {
        match self {
            GeluApproximate::None => RawGeluForm::TCG_GELU_ERF,
            GeluApproximate::Tanh => RawGeluForm::TCG_GELU_TANH,
        }
    }
}

/// `gelu(x + bias)` of `x` [.., F] and `bias` [F] (or `gelu(x)` without one), in `x`'s dtype,
/// differentiable in both. [`crate::Error::Misuse`] for a bias of another width or device, or
/// integer tensors.
pub fn f_bias_gelu(x: &Tensor, bias: Option<&Tensor>, config: &GeluConfig) -> Result<Tensor> {
    Ok(raw::gelu(x, bias, config.approximate.raw(), config.kernels.raw())?.0)
}

/// [`f_bias_gelu`], panicking on an error as tch's operators do.
pub fn bias_gelu(x: &Tensor, bias: Option<&Tensor>, config: &GeluConfig) -> Tensor {
    f_bias_gelu(x, bias, config).unwrap_or_else(|e| panic!("{e}"))
}

/// GELU as a module (`nn::Module`, as `torch.nn.GELU`) that remembers which kernels it last ran;
/// [`Gelu::f_forward_biased`] takes the preceding layer's bias too.
#[derive(Debug, Default)]
pub struct Gelu {
    /// How it runs.
    pub config: GeluConfig,
    last: Cell<Option<KernelPath>>,
}

impl Gelu {
    /// The activation with `config`.
    pub fn new(config: GeluConfig) -> Self {
        Gelu { config, last: Cell::new(None) }
    }

    /// `gelu(x)`.
    pub fn f_forward(&self, x: &Tensor) -> Result<Tensor> {
        self.f_forward_biased(x, None)
    }

    /// `gelu(x + bias)`: [`f_bias_gelu`] with this module's config.
    pub fn f_forward_biased(&self, x: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
        let (y, own) = raw::gelu(x, bias, self.config.approximate.raw(), self.config.kernels.raw())?;
        self.last.set(Some(KernelPath::of_one(own)));
        Ok(y)
    }

    /// Which kernels the last forward ran (None before the first).
    pub fn last_path(&self) -> Option<KernelPath> {
        self.last.get()
    }
}

impl nn::Module for Gelu {
    fn forward(&self, x: &Tensor) -> Tensor {
        self.f_forward(x).unwrap_or_else(|e| panic!("{e}"))
    }
}
