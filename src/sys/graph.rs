//! `csrc/cuda/graph.cpp`: the shim's graph (an `at::cuda::CUDAGraph`).

use super::{check, error::c_string, ffi, non_null};
use crate::error::Result;
use std::ptr::NonNull;

/// A pool id as the shim takes it (`MempoolId_t`).
pub(crate) type RawPoolId = ffi::tcg_pool_id;
/// `cudaStreamCaptureMode` as the shim takes it.
pub(crate) use ffi::tcg_capture_mode as RawCaptureMode;

/// Node counts of a captured graph, by kind ([`crate::CudaGraph::node_kinds`]).
#[repr(C)] // C's tcg_node_kinds: the shim writes it (checked by sys::layout)
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NodeKinds {
    /// Kernel launches.
    pub kernel: usize,
    /// Memory copies.
    pub memcpy: usize,
    /// Memory sets.
    pub memset: usize,
    /// Host callbacks.
    pub host: usize,
    /// Child graphs.
    pub graph: usize,
    /// Empty (dependency) nodes.
    pub empty: usize,
    /// Event waits and records.
    pub event: usize,
    /// Memory allocation and free nodes.
    pub mem_alloc_free: usize,
    /// Any other kind (semaphores, conditionals, kinds newer than this crate).
    pub other: usize,
}

impl NodeKinds {
    /// All nodes.
    pub fn total(&self) -> usize {
        self.kernel
            + self.memcpy
            + self.memset
            + self.host
            + self.graph
            + self.empty
            + self.event
            + self.mem_alloc_free
            + self.other
    }
}

/// The shim's graph, freed on drop (a capture still under way is aborted first).
#[derive(Debug)]
pub(crate) struct GraphHandle(NonNull<ffi::tcg_graph>);

// SAFETY: the C++ CUDAGraph holds no thread-local state: its capture stream and device are
// explicit members, its replay takes the calling thread's current stream and sets the device
// itself, and libtorch's capture bookkeeping is behind global mutexes. Moving it to another
// thread is sound; concurrent use is prevented by `&mut self` on every method that reaches it.
unsafe impl Send for GraphHandle {}

/// What [`GraphHandle::update_from`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Update {
    /// This graph's executable now runs the other's work.
    Updated,
    /// CUDA refused (`cudaGraphExecUpdateResult` code); nothing changed.
    Refused(i32),
}

impl GraphHandle {
    pub(crate) fn new(keep_graph: bool) -> Result<Self> {
        let mut raw = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out pointer; on success it holds a graph that we own.
        check(unsafe { ffi::tcg_graph_new(keep_graph, &mut raw) })?;
        non_null(raw, "CUDAGraph").map(GraphHandle)
    }

    pub(crate) fn capture_begin(&mut self, pool: RawPoolId, mode: RawCaptureMode) -> Result<()> {
        // SAFETY: the handle is live (owned by self); plain value arguments.
        check(unsafe { ffi::tcg_graph_capture_begin(self.0.as_ptr(), pool, mode) })
    }

    pub(crate) fn capture_end(&mut self) -> Result<()> {
        // SAFETY: the handle is live (owned by self).
        check(unsafe { ffi::tcg_graph_capture_end(self.0.as_ptr()) })
    }

    /// Tears down a capture under way; whether CUDA had invalidated it.
    pub(crate) fn capture_abort(&mut self) -> Result<bool> {
        let mut invalidated = false;
        // SAFETY: the handle is live (owned by self); `invalidated` is a valid out pointer.
        check(unsafe { ffi::tcg_graph_capture_abort(self.0.as_ptr(), &mut invalidated) })?;
        Ok(invalidated)
    }

    pub(crate) fn instantiate(&mut self) -> Result<()> {
        // SAFETY: the handle is live (owned by self).
        check(unsafe { ffi::tcg_graph_instantiate(self.0.as_ptr()) })
    }

    pub(crate) fn replay(&mut self) -> Result<()> {
        // SAFETY: the handle is live (owned by self).
        check(unsafe { ffi::tcg_graph_replay(self.0.as_ptr()) })
    }

    pub(crate) fn upload(&mut self) -> Result<()> {
        // SAFETY: the handle is live (owned by self).
        check(unsafe { ffi::tcg_graph_upload(self.0.as_ptr()) })
    }

    pub(crate) fn update_from(&mut self, other: &mut GraphHandle) -> Result<Update> {
        let (mut updated, mut result) = (false, 0);
        // SAFETY: both handles are live and distinct (two `&mut` borrows); out pointers valid.
        check(unsafe { ffi::tcg_graph_update_from(self.0.as_ptr(), other.0.as_ptr(), &mut updated, &mut result) })?;
        Ok(if updated { Update::Updated } else { Update::Refused(result) })
    }

    pub(crate) fn reset(&mut self) -> Result<()> {
        // SAFETY: the handle is live (owned by self).
        check(unsafe { ffi::tcg_graph_reset(self.0.as_ptr()) })
    }

    pub(crate) fn pool(&self) -> Result<RawPoolId> {
        let mut raw = RawPoolId::default();
        // SAFETY: the handle is live; `raw` is a valid out pointer. pool() only reads.
        check(unsafe { ffi::tcg_graph_pool(self.0.as_ptr(), &mut raw) })?;
        Ok(raw)
    }

    pub(crate) fn debug_dump(&mut self, path: &str) -> Result<()> {
        let c = c_string(path, "debug_dump: the path")?;
        // SAFETY: the handle is live; `c` is a NUL-terminated string that outlives the call.
        check(unsafe { ffi::tcg_graph_debug_dump(self.0.as_ptr(), c.as_ptr()) })
    }

    pub(crate) fn node_count(&mut self) -> Result<usize> {
        let mut n = 0usize;
        // SAFETY: the handle is live; `n` is a valid out pointer.
        check(unsafe { ffi::tcg_graph_node_count(self.0.as_ptr(), &mut n) })?;
        Ok(n)
    }

    pub(crate) fn node_kinds(&mut self) -> Result<NodeKinds> {
        let mut kinds = NodeKinds::default();
        // SAFETY: the handle is live; `kinds` is a valid out pointer of C's layout.
        check(unsafe { ffi::tcg_graph_node_kinds(self.0.as_ptr(), &mut kinds) })?;
        Ok(kinds)
    }

    /// The raw handle, for the other shim families that take a graph (graphed callables).
    pub(super) fn as_ptr(&self) -> *mut ffi::tcg_graph {
        self.0.as_ptr()
    }
}

impl Drop for GraphHandle {
    fn drop(&mut self) {
        // SAFETY: the pointer came from tcg_graph_new and is freed exactly once, here. The shim
        // aborts a capture still under way and never throws.
        unsafe { ffi::tcg_graph_free(self.0.as_ptr()) }
    }
}
