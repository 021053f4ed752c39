//! Which kernels run: the crate's own or ATen's. One choice ([`Kernels`]) that every layer,
//! loss and optimizer of the crate takes in its config, and one answer ([`KernelPath`]) that each
//! gives through its `last_path()` ([`crate::linear::Linear::last_path`],
//! [`crate::norm::LayerNorm::last_path`], [`crate::optim::Optimizer::last_path`]).
//!
//! The own kernels (the fused norms, the linear layer's cuBLASLt path, the fused cross-entropy,
//! the optimizers' multi-tensor kernels) each take a set of inputs their module states; under
//! [`Kernels::Auto`], the default, anything else runs ATen's operators with the same semantics.
//! [`Kernels::Own`] refuses instead ([`crate::Error::Unsupported`], with the reason, nothing done):
//! what tests and benchmarks use to be sure what they measure.
//!
//! ```no_run
//! # fn main() -> tch_cuda_graphs::Result<()> {
//! use tch::{nn, nn::Module, Device, Kind, Tensor};
//! use tch_cuda_graphs::kernels::{KernelPath, Kernels};
//! use tch_cuda_graphs::norm::{layer_norm, NormConfig};
//! let vs = nn::VarStore::new(Device::Cuda(0));
//! let ln = layer_norm(vs.root() / "ln", vec![384], NormConfig { kernels: Kernels::Auto, ..Default::default() });
//! let _y = Tensor::randn([8, 384], (Kind::Float, Device::Cuda(0))).apply(&ln);
//! assert_eq!(ln.last_path(), Some(KernelPath::Own)); // a float32 CUDA input of width 384
//! # Ok(()) }
//! ```

use crate::error::{Error, Result};
use crate::sys::kernels::{self as sys, RawKernels};
use tch::Device;

/// Which kernels to run: a field of every config of the crate's layers, loss and optimizers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Kernels {
    /// The crate's own where they apply, ATen's elsewhere (the default).
    #[default]
    Auto,
    /// The crate's own only: an input they do not take fails with [`Error::Unsupported`].
    Own,
    /// ATen's (PyTorch's operators and fused kernels) always.
    PyTorch,
}

impl Kernels {
    /// The shim's argument for this choice.
    pub(crate) fn raw(self) -> RawKernels {
        match self {
            Kernels::Auto => RawKernels::TCG_KERNELS_AUTO,
            Kernels::Own => RawKernels::TCG_KERNELS_OWN,
            Kernels::PyTorch => RawKernels::TCG_KERNELS_PYTORCH,
        }
    }
}

/// Which kernels ran: the answer of every `last_path()`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelPath {
    /// The crate's own, for every launch.
    Own,
    /// ATen's, for every launch.
    PyTorch,
    /// Some launches each (an optimizer under [`Kernels::Auto`] with a group or dtype the own
    /// kernels do not take).
    Mixed,
}

impl KernelPath {
    /// The path of `own` launches of the own kernels and `aten` of ATen's (None: no launch).
    pub(crate) fn of_counts(own: usize, aten: usize) -> Option<KernelPath> {
        match (own, aten) {
            (0, 0) => None,
            (_, 0) => Some(KernelPath::Own),
            (0, _) => Some(KernelPath::PyTorch),
            _ => Some(KernelPath::Mixed),
        }
    }

    /// The path of one launch.
    pub(crate) fn of_one(own: bool) -> KernelPath {
        if own {
            KernelPath::Own
        } else {
            KernelPath::PyTorch
        }
    }
}

/// Whether the crate's own kernels were built into this binary (build.rs compiles them with
/// nvcc; without one they are left out and everything runs ATen's).
pub fn own_kernels_built() -> bool {
    sys::built()
}

/// Ok if the crate's own kernels run on `device` (loading them there on first call):
/// [`Error::Unsupported`] with the reason if not (not built, no code for this GPU, not a CUDA
/// device), [`Error::NoCuda`] without CUDA.
///
/// ```no_run
/// use tch_cuda_graphs::kernels::own_kernels_available;
/// match own_kernels_available(tch::Device::Cuda(0)) {
///     Ok(()) => println!("own kernels"),
///     Err(e) => println!("ATen's kernels: {e}"),
/// }
/// ```
pub fn own_kernels_available(device: Device) -> Result<()> {
    match device {
        Device::Cuda(_) => sys::check_device(crate::device::cuda_index(device)?),
        other => Err(Error::Unsupported(format!("the crate's own kernels run on CUDA devices, not {other:?}"))),
    }
}
