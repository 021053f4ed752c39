//! Capture helpers: [`CaptureOptions`], [`capture_with_warmup`], and the side-stream capture
//! that [`CudaGraph::capture`] uses.

use crate::device::{current_device, synchronize};
use crate::error::{Error, Result};
use crate::graph::CudaGraph;
use crate::memory::empty_cache;
use crate::pool::PoolId;
use crate::stream::{Stream, StreamGuard};
use std::any::Any;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use tch::Device;

/// The number of warmup runs [`capture_with_warmup`] users are advised to start from (as in
/// PyTorch's examples): enough for cuBLAS/cuDNN handles, the allocator and autograd to settle.
pub const DEFAULT_WARMUP: usize = 3;

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

/// Options of a capture. Builder style; each setter says its default.
///
/// ```
/// use tch_cuda_graphs::{CaptureMode, CaptureOptions};
/// let o = CaptureOptions::default().mode(CaptureMode::ThreadLocal).empty_cache(false);
/// assert_eq!(o.get_mode(), CaptureMode::ThreadLocal);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CaptureOptions {
    pool: PoolId,
    mode: CaptureMode,
    device: Option<Device>,
    empty_cache: bool,
    keep_graph: bool,
}

impl Default for CaptureOptions {
    fn default() -> Self {
        CaptureOptions {
            pool: PoolId::PRIVATE,
            mode: CaptureMode::Global,
            device: None,
            empty_cache: true,
            keep_graph: false,
        }
    }
}

impl CaptureOptions {
    /// The memory pool to capture into. Default: a private pool of the graph's own. Give several
    /// captures the same id ([`crate::graph_pool_handle`], [`CudaGraph::pool`]) to share memory;
    /// then replay them in capture order.
    pub fn pool(mut self, pool: PoolId) -> Self {
        self.pool = pool;
        self
    }

    /// The capture mode. Default: [`CaptureMode::Global`], as PyTorch.
    pub fn mode(mut self, mode: CaptureMode) -> Self {
        self.mode = mode;
        self
    }

    /// The device to capture on. Default: the thread's current CUDA device. Use the device of
    /// the tensors the work touches.
    pub fn device(mut self, device: Device) -> Self {
        self.device = Some(device);
        self
    }

    /// Whether to return cached allocator memory to CUDA before capturing, as
    /// `torch.cuda.graph` does. Default: true.
    pub fn empty_cache(mut self, yes: bool) -> Self {
        self.empty_cache = yes;
        self
    }

    /// For [`capture_with_warmup`]: whether the new graph keeps its `cudaGraph_t` (node queries,
    /// debug dumps). Default: false.
    pub fn keep_graph(mut self, yes: bool) -> Self {
        self.keep_graph = yes;
        self
    }

    /// The pool set by [`pool`](Self::pool).
    pub fn get_pool(&self) -> PoolId {
        self.pool
    }

    /// The mode set by [`mode`](Self::mode).
    pub fn get_mode(&self) -> CaptureMode {
        self.mode
    }

    /// The device set by [`device`](Self::device), if any.
    pub fn get_device(&self) -> Option<Device> {
        self.device
    }

    fn resolve_device(&self) -> Result<Device> {
        match self.device {
            Some(d @ Device::Cuda(_)) => Ok(d),
            Some(other) => Err(Error::Misuse(format!("capture device must be a CUDA device, got {other:?}"))),
            None => current_device(),
        }
    }
}

/// Synchronizes the capture device and returns the capture stream ordered after its current
/// stream.
fn side_stream(options: &CaptureOptions) -> Result<Stream> {
    let device = options.resolve_device()?;
    synchronize(device)?;
    let side = Stream::capture_stream(device)?;
    side.wait_stream(&Stream::current(device)?)?;
    Ok(side)
}

/// Aborts the capture under way when dropped (errors, panics), unless disarmed.
struct AbortOnDrop<'a> {
    graph: &'a mut CudaGraph,
    armed: bool,
}

impl AbortOnDrop<'_> {
    fn abort(&mut self) -> bool {
        self.armed = false;
        // An abort that fails leaves nothing more to do: the shim already tore down what it could.
        self.graph.capture_abort().unwrap_or(true)
    }
}

impl Drop for AbortOnDrop<'_> {
    fn drop(&mut self) {
        if self.armed {
            let _ = self.graph.capture_abort();
        }
    }
}

fn panic_message(p: &(dyn Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "panic with a non-string payload".to_owned()
    }
}

/// Whether an error message is libtorch or CUDA refusing something because a capture is under
/// way (e.g. "Cannot copy between CPU and CUDA tensors during CUDA graph capture", "operation
/// not permitted when stream is capturing"): libtorch refuses some syncs before CUDA sees them,
/// so the capture is not invalidated, but the closure did something a graph cannot hold.
fn illegal_during_capture(msg: &str) -> bool {
    msg.contains("graph capture") || msg.contains("is capturing") || msg.contains("StreamCapture")
}

/// Records `f` into `graph` on `side`, restoring the previous stream on every path.
fn record<T>(
    graph: &mut CudaGraph,
    options: &CaptureOptions,
    side: &Stream,
    f: impl FnOnce() -> Result<T>,
) -> Result<T> {
    if options.empty_cache {
        empty_cache()?;
    }
    let _stream = StreamGuard::new(side)?; // dropped last: the capture ends on `side`
    graph.capture_begin(options.pool, options.mode)?;
    let mut guard = AbortOnDrop { graph, armed: true };
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(out)) => {
            guard.armed = false;
            guard.graph.capture_end()?; // tears down by itself on failure
            Ok(out)
        }
        Ok(Err(e)) => {
            let msg = e.to_string();
            if guard.abort() || illegal_during_capture(&msg) {
                Err(Error::CaptureInvalidated(msg))
            } else {
                Err(e)
            }
        }
        Err(panic) => {
            let msg = panic_message(&*panic);
            if guard.abort() || illegal_during_capture(&msg) {
                Err(Error::CaptureInvalidated(format!("the closure panicked: {msg}")))
            } else {
                drop(guard);
                drop(_stream);
                resume_unwind(panic)
            }
        }
    }
}

pub(crate) fn capture_on_side_stream<T>(
    graph: &mut CudaGraph,
    options: &CaptureOptions,
    f: impl FnOnce() -> Result<T>,
) -> Result<T> {
    let side = side_stream(options)?;
    record(graph, options, &side, f)
}

/// Runs `f` `warmup` times on a side stream (so cuBLAS/cuDNN handles, autograd's device threads,
/// the allocator and lazily created state settle), synchronizes, then captures one more call of
/// `f` into a new graph on the same side stream. Returns the graph and what the captured call
/// returned. `f` runs `warmup + 1` times in all; the warmup runs are real runs (a training step
/// trains).
///
/// ```no_run
/// # fn main() -> tch_cuda_graphs::Result<()> {
/// use tch::{Device, Kind, Tensor};
/// use tch_cuda_graphs::{capture_with_warmup, CaptureOptions, DEFAULT_WARMUP};
/// let x = Tensor::randn([64, 64], (Kind::Float, Device::Cuda(0)));
/// let (mut graph, y) = capture_with_warmup(DEFAULT_WARMUP, CaptureOptions::default(), || Ok(x.f_matmul(&x)?.f_relu()?))?;
/// graph.replay()?; // recomputes `y` from the current contents of `x`
/// # let _ = y; Ok(()) }
/// ```
pub fn capture_with_warmup<T>(
    warmup: usize,
    options: CaptureOptions,
    mut f: impl FnMut() -> Result<T>,
) -> Result<(CudaGraph, T)> {
    let side = side_stream(&options)?;
    {
        let _stream = StreamGuard::new(&side)?;
        for _ in 0..warmup {
            drop(f()?);
        }
    }
    side.synchronize()?;
    let mut graph = CudaGraph::with_keep_graph(options.keep_graph)?;
    let out = record(&mut graph, &options, &side, &mut f)?;
    Ok((graph, out))
}
