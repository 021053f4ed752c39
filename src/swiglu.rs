//! SwiGLU, `silu(gate) · up`, on the crate's kernels: [`swiglu`] (and [`f_swiglu`], [`SwiGlu`])
//! read the fused `[gate | up]` projection of a Llama-style MLP in one pass and write both
//! gradients in one more.
//!
//! Written as PyTorch models write it (`w13(x).chunk(2, -1)`, `F.silu(gate) * up`), SwiGLU is a
//! SiLU kernel, a multiply, and in the backward a multiply, a SiLU backward, another multiply and
//! the concatenation of the two gradients: six passes over the MLP's widest activations. The
//! kernels compute in fp32 and round once; ATen's silu and mul (in the input's dtype, as
//! autocast leaves them) run where the kernels do not apply: on a CPU, a half width that is not
//! a multiple of 4, or under [`Kernels::PyTorch`].
//!
//! ```
//! use tch::{Device, Kind, Tensor};
//! use tch_cuda_graphs::swiglu::{swiglu, SwiGluConfig};
//! let h = Tensor::randn([4, 2 * 1024], (Kind::Float, Device::Cpu)); // w13(x): [gate | up]
//! let y = swiglu(&h, &SwiGluConfig::default());
//! assert_eq!(y.size(), [4, 1024]);
//! ```

use crate::error::Result;
use crate::kernels::{KernelPath, Kernels};
use crate::sys::swiglu as raw;
use std::cell::Cell;
use tch::{nn, Tensor};

/// How [`swiglu`] runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SwiGluConfig {
    /// The crate's kernels where they apply ([`Kernels::Auto`], the default), ATen's silu and
    /// mul ([`Kernels::PyTorch`]), or the kernels only ([`Kernels::Own`]).
    pub kernels: Kernels,
}

/// `silu(h[.., :F]) · h[.., F:]` of `h` [.., 2F], differentiable in `h`. [`crate::Error::Misuse`]
/// for an odd last dimension or an integer tensor.
pub fn f_swiglu(h: &Tensor, config: &SwiGluConfig) -> Result<Tensor> {
    Ok(raw::swiglu(h, config.kernels.raw())?.0)
}

/// [`f_swiglu`], panicking on an error as tch's operators do.
pub fn swiglu(h: &Tensor, config: &SwiGluConfig) -> Tensor {
    f_swiglu(h, config).unwrap_or_else(|e| panic!("{e}"))
}

/// SwiGLU as a module (`nn::Module`: input `[gate | up]`, output `silu(gate) · up`) that
/// remembers which kernels it last ran.
#[derive(Debug, Default)]
pub struct SwiGlu {
    /// How it runs.
    pub config: SwiGluConfig,
    last: Cell<Option<KernelPath>>,
}

impl SwiGlu {
    /// The activation with `config`.
    pub fn new(config: SwiGluConfig) -> Self {
        SwiGlu { config, last: Cell::new(None) }
    }

    /// [`f_swiglu`] with this module's config.
    pub fn f_forward(&self, h: &Tensor) -> Result<Tensor> {
        let (y, own) = raw::swiglu(h, self.config.kernels.raw())?;
        self.last.set(Some(KernelPath::of_one(own)));
        Ok(y)
    }

    /// Which kernels the last forward ran (None before the first).
    pub fn last_path(&self) -> Option<KernelPath> {
        self.last.get()
    }
}

impl nn::Module for SwiGlu {
    fn forward(&self, h: &Tensor) -> Tensor {
        self.f_forward(h).unwrap_or_else(|e| panic!("{e}"))
    }
}
