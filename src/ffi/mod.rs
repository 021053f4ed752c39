//! Raw bindings to the C++ shim (`csrc/tcg.h`), one module per shim file. Nothing here is safe
//! to call directly: the safe layer is [`crate::graph`], [`crate::stream`], [`crate::pool`],
//! [`crate::memory`], [`crate::watch`] and [`crate::optim`]. Every function returns a status
//! that [`crate::error`] turns into a [`crate::Error`].
#![allow(non_camel_case_types, missing_docs)]

mod amp;
mod autograd;
mod cuda;
mod dist;
mod error;
mod feed;
mod optim;
mod profiler;
mod watch;

pub use amp::*;
pub use autograd::*;
pub use cuda::*;
pub use dist::*;
pub use error::*;
pub use feed::*;
pub use optim::*;
pub use profiler::*;
pub use watch::*;

use std::os::raw::c_int;

pub type tcg_status = c_int;
pub const TCG_OK: tcg_status = 0;
pub const TCG_ERROR: tcg_status = 1;
pub const TCG_NO_CUDA: tcg_status = 2;
pub const TCG_CAPTURE_INVALIDATED: tcg_status = 3;
pub const TCG_MISUSE: tcg_status = 4;
pub const TCG_OUT_OF_MEMORY: tcg_status = 5;
pub const TCG_STALE: tcg_status = 6;
pub const TCG_DIST: tcg_status = 7;
pub const TCG_DIST_TIMEOUT: tcg_status = 8;
pub const TCG_UNSUPPORTED: tcg_status = 9;

/// tch's `C_tensor`: a pointer to a heap-allocated `at::Tensor`.
pub type tcg_tensor = *mut torch_sys::C_tensor;

/// The shim's handle of a tch tensor. The shim reads the `at::Tensor` handle and may update
/// tensor data in place; it never replaces the handle object, so handing out a mutable pointer
/// to a shared handle is sound.
pub(crate) fn tensor_ptr(t: &tch::Tensor) -> tcg_tensor {
    t.as_ptr() as tcg_tensor
}

/// [`tensor_ptr`] of each tensor.
pub(crate) fn tensor_ptrs<'a>(ts: impl IntoIterator<Item = &'a tch::Tensor>) -> Vec<tcg_tensor> {
    ts.into_iter().map(tensor_ptr).collect()
}
