//! `csrc/cuda/graphed.cpp`: a graphed callable, the autograd function over a forward and a
//! backward graph and their static tensors.

use super::graph::GraphHandle;
use super::{adopt_some, check, ffi, non_null, opt_tensor_ptr, tensor_ptrs};
use crate::error::{Error, Result};
use std::ptr::NonNull;
use tch::Tensor;

/// Something that owns a shim graph (the crate's `CudaGraph`).
pub(crate) trait HoldsGraph {
    /// The graph, borrowed.
    fn graph_handle(&self) -> &GraphHandle;
}

/// The static tensors of a graphed callable, as `tcg_graphed_new` takes them.
pub(crate) struct GraphedStatics<'a> {
    /// The static inputs: the user's arguments first (`n_user` of them), then the parameters.
    pub(crate) surface: &'a [&'a Tensor],
    pub(crate) n_user: usize,
    /// The static outputs.
    pub(crate) outputs: &'a [Tensor],
    /// One entry per output: its static incoming gradient, if it requires grad.
    pub(crate) grad_outputs: &'a [Option<Tensor>],
    /// One entry per surface tensor: its static gradient, if any.
    pub(crate) grad_inputs: &'a [Option<Tensor>],
}

/// The shim's graphed callable. It owns the graphs it replays, so they outlive it: the handle
/// is freed first (fields drop in declaration order), cutting the tie that autograd nodes
/// still alive have to the graphs.
pub(crate) struct GraphedHandle<G> {
    raw: NonNull<ffi::tcg_graphed>,
    graphs: (G, Option<G>),
    n_out: usize,
}

// SAFETY: the shim's graphed state is reached only through its own mutex (calls, backwards on
// autograd's threads, and the free) and holds no thread-local state; the graphs are moved with
// it, so it is Send when they are.
unsafe impl<G: Send> Send for GraphedHandle<G> {}

impl<G: HoldsGraph> GraphedHandle<G> {
    /// Ties `fwd` (and `bwd`: none if no output requires grad) to the static tensors.
    pub(crate) fn new(fwd: G, bwd: Option<G>, statics: &GraphedStatics<'_>) -> Result<Self> {
        let s = statics;
        if s.n_user > s.surface.len()
            || s.grad_outputs.len() != s.outputs.len()
            || s.grad_inputs.len() != s.surface.len()
        {
            return Err(Error::Misuse("graphed callable: static tensor lists of unlike lengths".into()));
        }
        let surface = tensor_ptrs(s.surface.iter().copied());
        let outputs = tensor_ptrs(s.outputs);
        let optional =
            |ts: &[Option<Tensor>]| -> Vec<ffi::tcg_tensor> { ts.iter().map(|t| opt_tensor_ptr(t.as_ref())).collect() };
        let (gouts, gins) = (optional(s.grad_outputs), optional(s.grad_inputs));
        let bwd_raw = bwd.as_ref().map_or(std::ptr::null_mut(), |b| b.graph_handle().as_ptr());
        let mut raw = std::ptr::null_mut();
        // SAFETY: the graphs are live and moved into the handle built below, which frees the
        // shim's state before them; every array holds live tensor handles (or null where the
        // contract allows) with the lengths checked above, borrowed for the call; `raw` is a
        // valid out pointer, and on success holds a handle we own.
        check(unsafe {
            ffi::tcg_graphed_new(
                fwd.graph_handle().as_ptr(),
                bwd_raw,
                surface.as_ptr(),
                surface.len(),
                s.n_user,
                outputs.as_ptr(),
                outputs.len(),
                gouts.as_ptr(),
                gins.as_ptr(),
                &mut raw,
            )
        })?;
        let raw = non_null(raw, "graphed callable")?;
        Ok(GraphedHandle { raw, graphs: (fwd, bwd), n_out: s.outputs.len() })
    }

    /// Runs it on `inputs` (the user's arguments, then the parameters): the static outputs.
    pub(crate) fn apply(&self, inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
        let ptrs = tensor_ptrs(inputs.iter().copied());
        let mut out: Vec<ffi::tcg_tensor> = vec![std::ptr::null_mut(); self.n_out];
        // SAFETY: the handle is live (owned by self); `ptrs` holds live tensor handles borrowed
        // for the call (the shim checks the count); `out` has n_out slots.
        check(unsafe {
            ffi::tcg_graphed_apply(self.raw.as_ptr(), ptrs.as_ptr(), ptrs.len(), out.as_mut_ptr(), out.len())
        })?;
        // SAFETY: on success each slot is a new heap at::Tensor that nobody else owns.
        out.into_iter().map(|p| unsafe { adopt_some(p, "graphed callable") }).collect()
    }

    /// The forward graph and the backward graph.
    pub(crate) fn graphs(&self) -> (&G, Option<&G>) {
        (&self.graphs.0, self.graphs.1.as_ref())
    }
}

impl<G> Drop for GraphedHandle<G> {
    fn drop(&mut self) {
        // SAFETY: the pointer came from tcg_graphed_new and is freed exactly once, here, before
        // the graphs it refers to (fields drop after this). The shim never throws from it.
        unsafe { ffi::tcg_graphed_free(self.raw.as_ptr()) }
    }
}
