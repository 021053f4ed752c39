//! Control flow on the device inside a capture: conditional IF and WHILE nodes (CUDA 12.3+),
//! whose condition is a device value, so a captured step can decide without a host sync.
//!
//! Inside a capture of this crate ([`crate::CudaGraph::capture`], [`crate::capture_with_warmup`],
//! a [`crate::TrainStep`]'s closure), [`capture_if`] and [`capture_while`] record their body
//! closure once, into the body of a conditional node; every replay then decides on the device:
//! - `capture_if(&cond, body)`: the body runs when `cond` (one value on the device: bool, uint8,
//!   int32, int64, float32, float64) is non-zero at that point of the replay; `capture_unless`
//!   when it is zero (e.g. [`crate::amp::GradScaler`]'s found-inf flag: see its
//!   `skip_with_if_node`).
//! - `capture_while(&cond, max, body)`: the body runs while `cond` is non-zero, checked before
//!   the first iteration and after each (the body updates `cond`), at most `max` times per
//!   replay. The returned [`WhileLoop`] holds, on the device, how many iterations the last
//!   replay ran and whether it stopped at `max`.
//!
//! PyTorch 2.11 has no conditional nodes; the semantics are this crate's. The condition is read
//! by a one-thread kernel of the crate's own (`cudaGraphSetConditional`), captured just before
//! the node (and, for WHILE, at the end of the body). The body is captured on a second stream
//! straight into the node's body graph, its allocations in a pool of its own that the graph
//! keeps. What a body may do: kernels, copies and memsets on its stream; no fork to another
//! stream (CUDA allows no event nodes in a body), no host sync (as in any capture).
//!
//! ```no_run
//! # fn main() -> tch_cuda_graphs::Result<()> {
//! use tch::{Device, Kind, Tensor};
//! use tch_cuda_graphs::control::{capture_if, capture_while};
//! use tch_cuda_graphs::{CaptureOptions, CudaGraph};
//! let d = Device::Cuda(0);
//! let (mut x, flag) = (Tensor::zeros([4], (Kind::Float, d)), Tensor::ones([], (Kind::Bool, d)));
//! let (mut i, mut more) = (Tensor::zeros([], (Kind::Int64, d)), Tensor::ones([], (Kind::Bool, d)));
//! let mut more_w = more.shallow_clone(); // the body writes the condition it is given
//! let mut g = CudaGraph::new()?;
//! let lp = g.capture(CaptureOptions::default(), || {
//!     capture_if(&flag, || { let _ = x.f_add_scalar_(1.0)?; Ok(()) })?; // x += 1 when flag
//!     let _ = i.f_zero_()?;
//!     let _ = more.f_fill_(1)?;
//!     capture_while(&more, 100, || {                                   // 7 times
//!         let _ = x.f_mul_scalar_(2.0)?;
//!         let _ = i.f_add_scalar_(1)?;
//!         more_w.f_copy_(&i.f_lt(7)?)?;
//!         Ok(())
//!     })
//! })?;
//! g.replay()?;
//! assert_eq!(i64::try_from(lp.iterations())?, 7);
//! # Ok(()) }
//! ```

use crate::capture::{recording, retain_in_capture};
use crate::error::{Error, Result};
use crate::pool::MemPool;
use crate::sys::conditional::CondHandle;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use tch::{Device, Kind, Tensor};

/// What a captured WHILE node did in the last replay, on the device (read after it, e.g.
/// `i64::try_from(lp.iterations())`).
#[derive(Debug)]
pub struct WhileLoop {
    counter: Tensor,
    hit: Tensor,
}

impl WhileLoop {
    /// Iterations run by the last replay (int32, one value).
    pub fn iterations(&self) -> &Tensor {
        &self.counter
    }

    /// 1 if the last replay stopped at the maximum with the condition still true, else 0 (int32).
    pub fn hit_limit(&self) -> &Tensor {
        &self.hit
    }
}

/// Which conditional node [`conditional`] adds.
#[derive(Clone, Copy)]
enum NodeKind {
    If,
    IfNot,
    While,
}

fn conditional(
    kind: NodeKind,
    cond: &Tensor,
    max: i64,
    counters: Option<(&Tensor, &Tensor)>,
    body: impl FnOnce() -> Result<()>,
) -> Result<()> {
    if !cond.defined() {
        return Err(Error::Misuse("conditional node: the condition is an undefined tensor".into()));
    }
    let device = cond.device();
    if !matches!(device, Device::Cuda(_)) {
        return Err(Error::Misuse(format!("conditional node: the condition is on {device:?}, not a CUDA device")));
    }
    if !recording(device) {
        return Err(Error::Misuse(
            "conditional node: only inside a capture of this crate (CudaGraph::capture, capture_with_warmup, a \
             TrainStep), which keeps the body's memory alive with the graph"
                .into(),
        ));
    }
    let pool = MemPool::on(device)?;
    let counters = if matches!(kind, NodeKind::While) { counters } else { None };
    let node = CondHandle::begin(cond, matches!(kind, NodeKind::IfNot), pool.id().raw(), max, counters)?;
    let outcome = catch_unwind(AssertUnwindSafe(body));
    let ended = match &outcome {
        Ok(Ok(())) => node.end(),
        _ => {
            drop(node); // ends and discards the body's capture
            Ok(())
        }
    };
    // The graph keeps the body's pool (on every path: a caller that went on capturing after an
    // error must not leave the node's body on freed memory) and the tensors its kernels use.
    retain_in_capture(device, pool);
    let keep: Vec<Tensor> = [Some(cond), counters.map(|c| c.0), counters.map(|c| c.1)]
        .into_iter()
        .flatten()
        .map(Tensor::shallow_clone)
        .collect();
    retain_in_capture(device, keep);
    match outcome {
        Ok(result) => result.and(ended),
        Err(panic) => resume_unwind(panic),
    }
}

/// Inside a capture: records `body` into an IF node that runs it, at each replay, when `cond`
/// (one device value) is non-zero at that point. See the [module docs](self). Errors:
/// [`Error::Unsupported`] without a CUDA 12.3 driver or the crate's own kernels,
/// [`Error::Misuse`] outside a capture or for an unfit condition, and whatever `body`
/// returns (the body's capture is undone; the enclosing capture then fails as usual).
pub fn capture_if(cond: &Tensor, body: impl FnOnce() -> Result<()>) -> Result<()> {
    conditional(NodeKind::If, cond, 0, None, body)
}

/// Inside a capture: records `body` into an IF node that runs it, at each replay, when `cond`
/// is zero at that point (the negation of [`capture_if`], with no kernel to negate `cond`).
/// Errors as [`capture_if`].
pub fn capture_unless(cond: &Tensor, body: impl FnOnce() -> Result<()>) -> Result<()> {
    conditional(NodeKind::IfNot, cond, 0, None, body)
}

/// Inside a capture: records `body` into a WHILE node that, at each replay, runs it while
/// `cond` (one device value the body updates) is non-zero, at most `max_iterations` times.
/// Returns where the replays report what they did. Errors as [`capture_if`].
pub fn capture_while(cond: &Tensor, max_iterations: i64, body: impl FnOnce() -> Result<()>) -> Result<WhileLoop> {
    if !cond.defined() {
        return Err(Error::Misuse("conditional node: the condition is an undefined tensor".into()));
    }
    let device = cond.device();
    // Written by the node's kernels at every replay; made here, inside the capture, so they live
    // in the graph's pool (no kernel: nothing to record).
    let counter = Tensor::f_empty([1], (Kind::Int, device))?;
    let hit = Tensor::f_empty([1], (Kind::Int, device))?;
    conditional(NodeKind::While, cond, max_iterations, Some((&counter, &hit)), body)?;
    Ok(WhileLoop { counter, hit })
}
