//! The safe CUDA graph: [`CudaGraph`] owns one `at::cuda::CUDAGraph`. This is the graph owner
//! only: how captures are run (side streams, warmup, locking) is [`crate::capture`]'s business,
//! which builds on this module and not the other way round.

use crate::error::{Error, Result};
use crate::pool::PoolId;
use crate::sys::graph::{GraphHandle, RawCaptureMode, Update};
use crate::sys::graphed::HoldsGraph;
use std::any::Any;
use std::path::Path;

/// How strictly CUDA checks for unsafe API calls during capture (`cudaStreamCaptureMode`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(i32)]
pub enum CaptureMode {
    /// Unsafe calls from any thread invalidate the capture (PyTorch's default).
    #[default]
    Global = 0,
    /// Only unsafe calls from the capturing thread do.
    ThreadLocal = 1,
    /// No check: unsafe calls are allowed (and may break the graph).
    Relaxed = 2,
}

impl CaptureMode {
    fn raw(self) -> RawCaptureMode {
        match self {
            CaptureMode::Global => RawCaptureMode::TCG_CAPTURE_MODE_GLOBAL,
            CaptureMode::ThreadLocal => RawCaptureMode::TCG_CAPTURE_MODE_THREAD_LOCAL,
            CaptureMode::Relaxed => RawCaptureMode::TCG_CAPTURE_MODE_RELAXED,
        }
    }

    /// From PyTorch's names: "global", "thread_local", "relaxed".
    pub fn from_name(name: &str) -> Result<Self> {
        match name {
            "global" => Ok(CaptureMode::Global),
            "thread_local" => Ok(CaptureMode::ThreadLocal),
            "relaxed" => Ok(CaptureMode::Relaxed),
            other => Err(Error::Misuse(format!(
                "unknown capture mode {other:?} (expected \"global\", \"thread_local\" or \"relaxed\")"
            ))),
        }
    }

    /// PyTorch's name of the mode.
    pub fn name(self) -> &'static str {
        match self {
            CaptureMode::Global => "global",
            CaptureMode::ThreadLocal => "thread_local",
            CaptureMode::Relaxed => "relaxed",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Empty,
    Capturing,
    Captured,
}

pub use crate::sys::graph::NodeKinds;

/// A CUDA graph: work captured once from a stream, replayed with one launch.
///
/// # What a replay writes
/// A replay re-runs the captured kernels on the addresses they used at capture: it reads the
/// tensors the captured work read (static inputs, parameters, optimizer state) and writes
/// everything the captured work wrote, in place: the tensors returned by the capture (they live
/// in the graph's pool and are overwritten by every replay: copy what you need to keep), and
/// any tensor the work updated in place (parameters, optimizer state, accumulators). Nothing
/// else is allocated or freed. So every tensor the captured work touches must stay alive, with
/// the same storage, as long as the graph is replayed: own them elsewhere, or hand them to
/// [`retain`](Self::retain); [`crate::TrainStep`] does both and checks the storage before every
/// run.
///
/// Wraps libtorch's `at::cuda::CUDAGraph` (PyTorch's `torch.cuda.CUDAGraph`), so RNG ops and
/// the caching allocator cooperate with capture exactly as in PyTorch. [`CudaGraph::capture`]
/// is the safe way to capture: it runs on a side stream and ends the capture on every path.
///
/// ```no_run
/// # fn main() -> tch_cuda_graphs::Result<()> {
/// use tch::{Device, Kind, Tensor};
/// use tch_cuda_graphs::{CaptureOptions, CudaGraph};
/// let mut a = Tensor::ones([4], (Kind::Float, Device::Cuda(0)));
/// let b = Tensor::ones([4], (Kind::Float, Device::Cuda(0)));
/// let mut g = CudaGraph::new()?;
/// let out = g.capture(CaptureOptions::default(), || Ok(a.f_add(&b)?))?; // recorded, not run
/// a.fill_(2.0);
/// g.replay()?; // `out` now holds 3.0s
/// # Ok(()) }
/// ```
///
/// # Threads
/// `CudaGraph` is `Send`: the graph is not tied to the thread that captured it, and replay
/// launches on the calling thread's current stream of the capture device. It is not `Sync`:
/// replay mutates host state (the lazily instantiated executable, the RNG generators' offsets)
/// and CUDA graph objects are not internally synchronized, so every method that reaches the
/// C++ object takes `&mut self`. Share one between threads behind a `Mutex`.
pub struct CudaGraph {
    /// Freed first: fields drop in declaration order, so the C++ graph goes before what it
    /// retained.
    handle: GraphHandle,
    state: State,
    keep_graph: bool,
    retained: Vec<Box<dyn Any + Send>>,
}

impl std::fmt::Debug for CudaGraph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaGraph")
            .field("state", &self.state)
            .field("keep_graph", &self.keep_graph)
            .field("retained", &self.retained.len())
            .finish()
    }
}

impl CudaGraph {
    /// A new, empty graph (libtorch's default `keep_graph = false`: the `cudaGraph_t` is
    /// instantiated and freed at the end of capture). [`Error::NoCuda`] without a GPU.
    pub fn new() -> Result<Self> {
        Self::with_keep_graph(false)
    }

    /// A new graph; with `keep_graph` the captured `cudaGraph_t` is kept so that
    /// [`node_count`](Self::node_count), [`node_kinds`](Self::node_kinds) and
    /// [`debug_dump`](Self::debug_dump) can read it; it is instantiated at the first
    /// [`replay`](Self::replay) or [`instantiate`](Self::instantiate).
    pub fn with_keep_graph(keep_graph: bool) -> Result<Self> {
        let handle = GraphHandle::new(keep_graph)?;
        Ok(CudaGraph { handle, state: State::Empty, keep_graph, retained: Vec::new() })
    }

    /// Whether this graph holds a successful capture.
    pub fn is_captured(&self) -> bool {
        self.state == State::Captured
    }

    /// Whether the captured `cudaGraph_t` is kept (see [`with_keep_graph`](Self::with_keep_graph)).
    pub fn keeps_graph(&self) -> bool {
        self.keep_graph
    }

    /// Low level (`CUDAGraph::capture_begin`): starts capturing the *current* stream, which
    /// must not be the default stream. Prefer [`capture`](Self::capture) (in
    /// [`crate::capture`]), which also takes the device's capture lock; this does not. A capture begun here
    /// must be ended with [`capture_end`](Self::capture_end) or
    /// [`capture_abort`](Self::capture_abort); dropping the graph aborts it.
    pub fn capture_begin(&mut self, pool: PoolId, mode: CaptureMode) -> Result<()> {
        match self.state {
            State::Capturing => return Err(Error::Misuse("capture_begin: this graph is already capturing".into())),
            State::Captured => {
                return Err(Error::Misuse(
                    "capture_begin: this graph already holds a capture; call reset() to capture again".into(),
                ))
            }
            State::Empty => {}
        }
        self.handle.capture_begin(pool.raw(), mode.raw())?;
        self.state = State::Capturing;
        Ok(())
    }

    /// Low level (`CUDAGraph::capture_end`): ends the capture begun by
    /// [`capture_begin`](Self::capture_begin), on the same stream. On failure the capture is
    /// torn down and the graph is empty again.
    pub fn capture_end(&mut self) -> Result<()> {
        if self.state != State::Capturing {
            return Err(Error::Misuse("capture_end without capture_begin".into()));
        }
        let r = self.handle.capture_end();
        self.state = if r.is_ok() { State::Captured } else { State::Empty };
        r
    }

    /// Low level: tears down a capture under way without keeping anything. Returns whether
    /// CUDA had invalidated it. A no-op (`Ok(false)`) when not capturing.
    pub fn capture_abort(&mut self) -> Result<bool> {
        if self.state != State::Capturing {
            return Ok(false);
        }
        let r = self.handle.capture_abort();
        self.state = State::Empty;
        r
    }

    /// Instantiates a kept graph now (otherwise the first replay does it).
    pub fn instantiate(&mut self) -> Result<()> {
        self.require_captured("instantiate")?;
        if !self.keep_graph {
            return Ok(()); // already instantiated at capture end
        }
        self.handle.instantiate()
    }

    /// Launches the captured work on the current stream of the capture device.
    pub fn replay(&mut self) -> Result<()> {
        self.require_captured("replay")?;
        self.handle.replay()
    }

    /// Uploads the executable graph to the device (`cudaGraphUpload`) so that the first replay
    /// does not pay for it. libtorch's replay does not do this.
    pub fn upload(&mut self) -> Result<()> {
        self.require_captured("upload")?;
        self.handle.upload()
    }

    /// Makes this graph's executable run `other`'s captured work without instantiating it
    /// (`cudaGraphExecUpdate`), and returns whether it could. Instantiating a large graph costs
    /// milliseconds; an update, when the topology matches, a fraction of that. Use it to capture
    /// the same step again (new tensor addresses after a parameter's storage was replaced, a
    /// shape captured again after eviction) and keep the executable.
    ///
    /// `other` must keep its `cudaGraph_t` ([`CudaGraph::with_keep_graph`]`(true)`) and be captured
    /// on this graph's device; this graph is instantiated first if it was not yet.
    ///
    /// - `Ok(true)`: updated. This graph takes over `other`'s capture (its graph, its pool
    ///   reference, its RNG state increments, what it [`retain`](Self::retain)s) and replays
    ///   `other`'s work from now on; its own old capture is released, and `other` is left empty
    ///   (it can capture again).
    /// - `Ok(false)`: CUDA refused the update; nothing changed on either side.
    ///
    /// What updates: the same nodes with the same dependencies (the same sequence of kernels
    /// and copies), whose kernel arguments (tensor addresses, sizes, scalars), launch
    /// dimensions, kernel functions (cuBLAS choosing another kernel for another shape) and
    /// memcpy/memset addresses may differ. What does not: a different number of nodes or other
    /// edges (a shape that changes the kernel sequence, e.g. a split-K GEMM with an extra
    /// reduction kernel; an extra op), a node of another type, memory on another device. A
    /// graph with [`crate::control`] nodes updates too when both captures have the same nodes
    /// (seen on driver 580: an IF node's graph captured again on other tensors updated and
    /// replayed the new capture's work).
    ///
    /// ```no_run
    /// # fn main() -> tch_cuda_graphs::Result<()> {
    /// use tch::{Device, Kind, Tensor};
    /// use tch_cuda_graphs::{CaptureOptions, CudaGraph};
    /// let (a, b) = (Tensor::ones([8], (Kind::Float, Device::Cuda(0))), Tensor::ones([8], (Kind::Float, Device::Cuda(0))));
    /// let mut g = CudaGraph::new()?;
    /// let _out_a = g.capture(CaptureOptions::default(), || Ok(a.f_mul_scalar(2.0)?))?;
    /// let mut next = CudaGraph::with_keep_graph(true)?;
    /// let out_b = next.capture(CaptureOptions::default(), || Ok(b.f_mul_scalar(2.0)?))?;
    /// assert!(g.update_from(&mut next)?); // same kernel, other addresses: updated in place
    /// g.replay()?; // writes out_b
    /// # let _ = out_b; Ok(()) }
    /// ```
    pub fn update_from(&mut self, other: &mut CudaGraph) -> Result<bool> {
        self.require_captured("update_from")?;
        other.require_captured("update_from (the other graph)")?;
        if let Update::Refused(_) = self.handle.update_from(&mut other.handle)? {
            return Ok(false);
        }
        // This graph now runs other's work: it keeps what other's capture needs alive; its own
        // old objects go (after the shim released the old capture).
        let old = std::mem::replace(&mut self.retained, std::mem::take(&mut other.retained));
        other.state = State::Empty;
        drop(old);
        Ok(true)
    }

    /// Frees the captured graph and releases its pool reference; the graph can capture again.
    /// Tensors returned by the capture stay valid (their blocks return to the pool when freed).
    /// What was [`retain`](Self::retain)ed is released too.
    pub fn reset(&mut self) -> Result<()> {
        if self.state == State::Capturing {
            return Err(Error::Misuse("reset during a capture: end or abort it first".into()));
        }
        self.handle.reset()?;
        self.state = State::Empty;
        self.retained.clear();
        Ok(())
    }

    /// Keeps `object` alive as long as this graph holds its capture (until
    /// [`reset`](Self::reset) or drop), like PyTorch's `CUDAGraph` keeping the objects its
    /// capture used. Give it what the captured work reads or writes and nothing else owns:
    /// input tensors, parameters, optimizer state, a model, a `VarStore`.
    ///
    /// ```no_run
    /// # fn main() -> tch_cuda_graphs::Result<()> {
    /// use tch::{Device, Kind, Tensor};
    /// use tch_cuda_graphs::{CaptureOptions, CudaGraph};
    /// let x = Tensor::ones([4], (Kind::Float, Device::Cuda(0)));
    /// let mut g = CudaGraph::new()?;
    /// let y = g.capture(CaptureOptions::default(), || Ok(x.f_mul_scalar(2.0)?))?;
    /// g.retain(x); // the caller's handle can go: the graph keeps the input's memory
    /// g.replay()?;
    /// # let _ = y; Ok(()) }
    /// ```
    pub fn retain<T: Send + 'static>(&mut self, object: T) {
        self.retained.push(Box::new(object));
    }

    /// The id of the pool this graph's memory lives in; give it to another capture to share it.
    pub fn pool(&self) -> Result<PoolId> {
        self.require_captured("pool")?;
        Ok(PoolId::from_raw_id(self.handle.pool()?))
    }

    /// Writes the kept graph as Graphviz DOT (`cudaGraphDebugDotPrint`, verbose).
    pub fn debug_dump(&mut self, path: impl AsRef<Path>) -> Result<()> {
        self.require_kept("debug_dump")?;
        let p = path.as_ref().to_str().ok_or_else(|| Error::Misuse("debug_dump: path is not UTF-8".into()))?;
        self.handle.debug_dump(p)
    }

    /// The number of nodes of the kept graph.
    pub fn node_count(&mut self) -> Result<usize> {
        self.require_kept("node_count")?;
        self.handle.node_count()
    }

    /// The nodes of the kept graph by kind.
    pub fn node_kinds(&mut self) -> Result<NodeKinds> {
        self.require_kept("node_kinds")?;
        self.handle.node_kinds()
    }

    fn require_captured(&self, what: &str) -> Result<()> {
        match self.state {
            State::Captured => Ok(()),
            State::Capturing => Err(Error::Misuse(format!("{what} during a capture"))),
            State::Empty => Err(Error::Misuse(format!("{what} before a successful capture"))),
        }
    }

    fn require_kept(&self, what: &str) -> Result<()> {
        self.require_captured(what)?;
        if !self.keep_graph {
            return Err(Error::Misuse(format!(
                "{what} needs the cudaGraph_t: create the graph with CudaGraph::with_keep_graph(true)"
            )));
        }
        Ok(())
    }
}

impl HoldsGraph for CudaGraph {
    fn graph_handle(&self) -> &GraphHandle {
        &self.handle
    }
}
