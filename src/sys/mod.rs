//! The safe layer over the C++ shim (`csrc/tcg.h`): the only module that calls into it.
//!
//! Three layers, as in cudarc's driver API: [`ffi`] declares the C functions (raw, private to
//! this module); the files here wrap them one shim family each, mirroring `csrc/` (a handle type
//! per owning family, whose `Drop` frees it; functions with typed arguments that return
//! [`Result`]); the policy modules of the crate (`graph`, `capture`, `optim`, ...) call these
//! and write no `unsafe` and no pointer handling of their own.
//!
//! | here | shim |
//! |---|---|
//! | `error.rs` | `csrc/error.cpp` |
//! | `device.rs` | `csrc/cuda/device.cpp` (devices, streams, events) |
//! | `graph.rs` | `csrc/cuda/graph.cpp` |
//! | `conditional.rs` | `csrc/cuda/conditional.cpp` |
//! | `memory.rs` | `csrc/cuda/memory.cpp` (pool ids and holds, allocator figures) |
//! | `graphed.rs` | `csrc/cuda/graphed.cpp` |
//! | `autograd.rs` | `csrc/autograd.cpp` |
//! | `amp.rs` | `csrc/amp.cpp` |
//! | `kernels.rs` | `csrc/kernels.cpp` (the own kernels' choice and availability) |
//! | `gemm.rs` | `csrc/gemm.cpp`, `csrc/cuda/lt_matmul.cpp` (the cuBLASLt GEMMs' algorithms) |
//! | `optim.rs` | `csrc/optim.cpp`, `csrc/cuda/optim_own.cpp` |
//! | `norm.rs` | `csrc/norm.cpp`, `csrc/cuda/norm_own.cpp` |
//! | `shadow.rs` | `csrc/shadow.cpp` |
//! | `linear.rs` | `csrc/linear.cpp`, `csrc/cuda/linear_own.cpp` |
//! | `loss.rs` | `csrc/loss.cpp`, `csrc/cuda/loss_own.cpp` |
//! | `rotary.rs` | `csrc/rotary.cpp`, `csrc/cuda/rotary_own.cpp` |
//! | `swiglu.rs` | `csrc/swiglu.cpp`, `csrc/cuda/swiglu_own.cpp` |
//! | `embedding.rs` | `csrc/embedding.cpp`, `csrc/cuda/embedding_own.cpp` |
//! | `gelu.rs` | `csrc/gelu.cpp`, `csrc/cuda/gelu_own.cpp` |
//! | `mlp.rs` | `csrc/mlp.cpp`, `csrc/cuda/mlp_own.cpp` |
//! | `dist.rs` | `csrc/cuda/dist.cpp`, `csrc/cuda/grad_buckets.cpp`, `csrc/bucket_plan.cpp` |
//! | `profiler.rs` | `csrc/profiler.cpp` |
//! | `watch.rs` | `csrc/watch.cpp` |
//! | `feed.rs` | `csrc/feed.cpp` |
//! | `layout.rs` | `csrc/layout.cpp` (checks of the structs both sides share) |

pub(crate) mod amp;
pub(crate) mod autograd;
pub(crate) mod conditional;
pub(crate) mod device;
pub(crate) mod dist;
pub(crate) mod embedding;
pub(crate) mod error;
pub(crate) mod feed;
mod ffi;
pub(crate) mod gelu;
pub(crate) mod gemm;
pub(crate) mod graph;
pub(crate) mod graphed;
pub(crate) mod kernels;
#[cfg(test)]
mod layout;
pub(crate) mod linear;
pub(crate) mod loss;
pub(crate) mod memory;
pub(crate) mod mlp;
pub(crate) mod norm;
pub(crate) mod optim;
pub(crate) mod profiler;
pub(crate) mod rotary;
pub(crate) mod shadow;
pub(crate) mod swiglu;
pub(crate) mod watch;

pub(crate) use error::{check, take_message};

use crate::error::{Error, Result};
use std::ptr::NonNull;
use tch::Tensor;

/// The shim's handle of a tch tensor. The shim reads the `at::Tensor` handle and may update
/// tensor data in place; it never replaces the handle object, so handing out a mutable pointer
/// to a shared handle is sound.
fn tensor_ptr(t: &Tensor) -> ffi::tcg_tensor {
    t.as_ptr() as ffi::tcg_tensor
}

/// [`tensor_ptr`] of each tensor.
fn tensor_ptrs<'a>(ts: impl IntoIterator<Item = &'a Tensor>) -> Vec<ffi::tcg_tensor> {
    ts.into_iter().map(tensor_ptr).collect()
}

/// [`tensor_ptr`] of an optional tensor (null for `None`).
fn opt_tensor_ptr(t: Option<&Tensor>) -> ffi::tcg_tensor {
    t.map_or(std::ptr::null_mut(), tensor_ptr)
}

/// A tensor the shim returned through an out slot, owned from here on by tch (which frees it on
/// drop); `None` for a null slot.
///
/// # Safety
/// `p` is null or a heap `at::Tensor` handle the shim made for this call, not owned elsewhere.
unsafe fn adopt(p: ffi::tcg_tensor) -> Option<Tensor> {
    if p.is_null() {
        None
    } else {
        // SAFETY: per this function's contract, `p` is a new handle nobody else owns.
        Some(unsafe { Tensor::from_ptr(p) })
    }
}

/// A tensor the shim must have returned (a null slot is a shim bug, reported as an error).
///
/// # Safety
/// As [`adopt`].
unsafe fn adopt_some(p: ffi::tcg_tensor, what: &str) -> Result<Tensor> {
    // SAFETY: forwarded contract.
    unsafe { adopt(p) }.ok_or_else(|| Error::Libtorch(format!("{what}: the shim returned no tensor")))
}

/// A handle the shim made through an out pointer; null on success is a shim bug.
fn non_null<T>(p: *mut T, what: &str) -> Result<NonNull<T>> {
    NonNull::new(p).ok_or_else(|| Error::Libtorch(format!("{what}: null handle")))
}
