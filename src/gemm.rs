//! How the crate's GEMMs choose their algorithm: cuBLASLt's heuristic (the default) or timing.
//!
//! The crate's own path of the linear layer ([`crate::linear::Linear`]), of the MLP
//! ([`crate::mlp`]) and of the chunked loss ([`crate::loss::f_linear_cross_entropy`]) runs its
//! GEMMs through cuBLASLt. Each GEMM shape's algorithm is chosen once, on its first call, and kept
//! for the process:
//! - [`GemmChoice::Heuristic`] (the default): cuBLASLt's heuristic's first. Every process makes
//!   the same choice on the same GPU, library and shapes, so results repeat bit for bit.
//! - [`GemmChoice::Timed`]: the fastest of the heuristic's first 32 candidates, each timed on
//!   the shape's first call outside a stream capture (into scratch outputs; the call's own
//!   outputs are written once, by the chosen algorithm). A candidate replaces the heuristic's
//!   first only when 3% faster. As with PyTorch's `torch.backends.cudnn.benchmark = True`, two
//!   processes may choose differently and so differ in their results' last bits; within one
//!   process the eager and the captured calls of a shape run the same algorithm. A shape first
//!   met under a capture keeps the heuristic's first: run a step eagerly before capturing it
//!   (as [`crate::TrainStep`]'s warm-up does) so that the choice is timed.
//!
//! The choice is the process's, as cuDNN's benchmark flag is PyTorch's: set it once, before the
//! first step. Setting it forgets the choices made so far.
//!
//! ```no_run
//! # fn main() -> tch_cuda_graphs::Result<()> {
//! use tch_cuda_graphs::gemm::{self, GemmChoice};
//! gemm::f_set_choice(GemmChoice::Timed)?;
//! // ... build the model and the step; the warm-up times each GEMM shape once
//! let shapes = gemm::f_shapes()?;
//! println!("{} GEMM shapes, {} timed", shapes.chosen, shapes.timed);
//! # Ok(()) }
//! ```

use crate::error::Result;
use crate::sys::gemm::{self as sys, RawGemmChoice};

/// How a GEMM shape's algorithm is chosen (see the [module](self)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum GemmChoice {
    /// cuBLASLt's heuristic's first: the same in every process (the default).
    #[default]
    Heuristic,
    /// The fastest of the heuristic's first 32, timed on the shape's first eager call.
    Timed,
}

impl GemmChoice {
    fn raw(self) -> RawGemmChoice {
        match self {
            GemmChoice::Heuristic => RawGemmChoice::TCG_GEMM_HEURISTIC,
            GemmChoice::Timed => RawGemmChoice::TCG_GEMM_TIMED,
        }
    }
}

/// How many GEMM shapes have their algorithm chosen ([`f_shapes`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GemmShapes {
    /// Shapes with an algorithm chosen since the process began or the choice was last set.
    pub chosen: usize,
    /// Of those, the ones chosen by timing.
    pub timed: usize,
}

/// Sets how GEMM shapes choose their algorithm, for the whole process, and forgets the choices
/// made so far (each shape chooses again on its next call).
pub fn f_set_choice(choice: GemmChoice) -> Result<()> {
    sys::set_choice(choice.raw())
}

/// [`f_set_choice`], panicking on an error.
pub fn set_choice(choice: GemmChoice) {
    f_set_choice(choice).unwrap_or_else(|e| panic!("{e}"))
}

/// The process's choice.
pub fn f_choice() -> Result<GemmChoice> {
    Ok(if sys::choice()? == RawGemmChoice::TCG_GEMM_TIMED { GemmChoice::Timed } else { GemmChoice::Heuristic })
}

/// How many GEMM shapes have their algorithm chosen, and how many of them by timing (none without
/// CUDA).
pub fn f_shapes() -> Result<GemmShapes> {
    let (chosen, timed) = sys::shapes()?;
    Ok(GemmShapes { chosen: chosen.max(0) as usize, timed: timed.max(0) as usize })
}
