//! Capture policy on top of [`CudaGraph`]: [`CaptureOptions`], [`CudaGraph::capture`] (one
//! capture on the device's capture stream), [`capture_with_warmup`], and the per-device
//! [`CaptureLock`] that keeps captures one at a time.
//!
//! # One capture at a time
//! This crate captures on one side stream per device (see [`Stream::capture_stream`]), so that
//! graphs sharing a pool reuse each other's freed blocks. Work queued on that stream by another
//! thread while a capture is under way would be recorded into the wrong graph, so
//! [`CudaGraph::capture`] and [`capture_with_warmup`] hold the device's [`CaptureLock`] from
//! the first warmup run to the end of the capture: a second thread's capture (warmup included)
//! waits for the first to finish. Capturing again from inside a captured closure (or its
//! warmup) on the same device is refused with [`Error::Misuse`] instead of deadlocking. The
//! low-level [`CudaGraph::capture_begin`] takes no lock: take [`CaptureLock::acquire`] yourself
//! around hand-rolled captures on the capture stream.
//!
//! # Failures
//! Whatever ends a capture early (the closure's error, a panic, an invalidating sync, OOM), the
//! capture is torn down (stream capture ended, allocator routing ended, pool reference
//! released), the previous stream is current again, and the lock is released; the process can
//! run eager work and capture again. Errors are classified by state, not message text: an
//! invalidated capture stream gives [`Error::CaptureInvalidated`], a rise of the allocator's OOM
//! counter gives [`Error::OutOfMemory`] (both keep the closure's error as `source`), anything
//! else comes back unchanged. A panic always resumes, after the clean-up.
//!
//! # tch ops with a `Scalar` argument panic where they should fail
//! In tch 0.24 an op that takes a `Scalar` (`f_add_scalar`, `f_mul_scalar`, `f_fill_`,
//! `f_clamp`, `f_le`, `f_full`, ..., and the operators `t * 2.0`) panics when the op fails,
//! even in its `f_` form: the temporary `Scalar`'s `Drop` reads the error the op just left and
//! unwraps it before the `f_` wrapper can return it. Under a capture that was invalidated (a
//! sync in the closure, or another thread's illegal call in [`CaptureMode::Global`]), every op
//! fails, so a closure written with `f_` ops and `?` alone panics there with "operation failed
//! due to a previous error during capture". The crate cleans up and re-raises the panic as
//! above; to get an `Err` instead, pass the scalar as a 0-d tensor (binary ops take a 0-d CPU
//! tensor like a scalar: no copy, no sync, the same numerics):
//!
//! ```
//! # fn main() -> Result<(), tch::TchError> {
//! use tch::Tensor;
//! let x = Tensor::from_slice(&[1.0f32, 2.0]);
//! let two = Tensor::from_slice(&[2.0f64]).f_reshape([0i64; 0])?; // 0-d, on the CPU
//! let y = x.f_mul(&two)?; // instead of x.f_mul_scalar(2.0)?
//! # assert_eq!(Vec::<f32>::try_from(&y).unwrap(), [2.0, 4.0]);
//! # Ok(()) }
//! ```
//!
//! The crate's own ops (schedules, learning-rate handles, buckets, the optimizers) take no
//! `Scalar` for this reason.

use crate::device::{cuda_index, current_device, synchronize};
use crate::error::{Error, Result};
use crate::graph::{CaptureMode, CudaGraph};
use crate::memory::{empty_cache, empty_host_cache, OomWatch};
use crate::pool::PoolId;
use crate::stream::{Stream, StreamGuard};
use std::any::Any;
use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::{Condvar, Mutex, OnceLock};
use tch::Device;

/// The number of warmup runs [`capture_with_warmup`] users are advised to start from (as in
/// PyTorch's examples): enough for cuBLAS/cuDNN handles, the allocator and autograd to settle.
pub const DEFAULT_WARMUP: usize = 3;

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

    /// Whether to return cached allocator memory (device and pinned host) to CUDA before
    /// capturing, as `torch.cuda.graph` does. Default: true.
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
    /// Whether the graph keeps its `cudaGraph_t` after instantiation (default false).
    pub fn get_keep_graph(&self) -> bool {
        self.keep_graph
    }

    fn resolve_device(&self) -> Result<Device> {
        match self.device {
            Some(d @ Device::Cuda(_)) => Ok(d),
            Some(other) => Err(Error::Misuse(format!("capture device must be a CUDA device, got {other:?}"))),
            None => current_device(),
        }
    }
}

/// The per-device capture lock (see the module docs): held, a capture or warmup of this crate
/// on that device waits. Released on drop, panics included.
///
/// ```no_run
/// # fn main() -> tch_cuda_graphs::Result<()> {
/// use tch_cuda_graphs::CaptureLock;
/// let _lock = CaptureLock::acquire(tch::Device::Cuda(0))?;
/// // a hand-rolled capture on Stream::capture_stream(Device::Cuda(0)) goes here
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct CaptureLock {
    device: usize,
}

struct Locks {
    held: Mutex<HashSet<usize>>,
    freed: Condvar,
}

fn locks() -> &'static Locks {
    static LOCKS: OnceLock<Locks> = OnceLock::new();
    LOCKS.get_or_init(|| Locks { held: Mutex::new(HashSet::new()), freed: Condvar::new() })
}

thread_local! {
    /// Devices whose capture lock this thread holds: a second acquire would deadlock.
    static HELD_HERE: RefCell<HashSet<usize>> = RefCell::new(HashSet::new());
}

impl CaptureLock {
    /// Waits until no other capture of this crate is under way on `device`, then holds its lock.
    /// [`Error::Misuse`] if this thread already holds it (a capture inside a capture).
    pub fn acquire(device: Device) -> Result<Self> {
        let device = match device {
            Device::Cuda(i) => i,
            other => return Err(Error::Misuse(format!("capture lock: {other:?} is not a CUDA device"))),
        };
        if HELD_HERE.with(|h| h.borrow().contains(&device)) {
            return Err(Error::Misuse(format!(
                "a capture on cuda:{device} is already under way on this thread: captures cannot nest"
            )));
        }
        let locks = locks();
        // A poisoned mutex only means a thread panicked while holding the set: it is consistent.
        let mut held = locks.held.lock().unwrap_or_else(|p| p.into_inner());
        while held.contains(&device) {
            held = locks.freed.wait(held).unwrap_or_else(|p| p.into_inner());
        }
        held.insert(device);
        HELD_HERE.with(|h| h.borrow_mut().insert(device));
        Ok(CaptureLock { device })
    }
}

impl Drop for CaptureLock {
    fn drop(&mut self) {
        HELD_HERE.with(|h| h.borrow_mut().remove(&self.device));
        let locks = locks();
        locks.held.lock().unwrap_or_else(|p| p.into_inner()).remove(&self.device);
        locks.freed.notify_all();
    }
}

type KeepAlive = Vec<Box<dyn Any + Send>>;

/// Per device, while one of this crate's captures is being recorded there: what the captured
/// work asked to keep alive ([`retain_in_capture`]).
fn keep_alive() -> &'static Mutex<HashMap<usize, KeepAlive>> {
    static SLOTS: OnceLock<Mutex<HashMap<usize, KeepAlive>>> = OnceLock::new();
    SLOTS.get_or_init(|| Mutex::new(HashMap::new()))
}

/// While this crate records a capture on `device` ([`CudaGraph::capture`],
/// [`capture_with_warmup`], [`crate::TrainStep`]), hands `object` to the graph being recorded:
/// the graph drops it after itself, as with [`CudaGraph::retain`]. Returns whether such a
/// capture was under way (otherwise `object` is dropped at once). Called from any thread (work
/// queued by autograd's device threads belongs to the capture too).
///
/// This is how a graph keeps alive what its kernels use beyond tensors: a
/// [`dist::ProcessGroup`](crate::dist::ProcessGroup) registers itself on every collective
/// issued under capture, so its NCCL communicator outlives every graph holding its kernels.
/// A hand-rolled capture through [`CudaGraph::capture_begin`] gets nothing: retain yourself.
pub fn retain_in_capture<T: Send + 'static>(device: Device, object: T) -> bool {
    let Device::Cuda(i) = device else { return false };
    // A poisoned mutex only means a thread panicked while holding the map: it is consistent.
    let mut slots = keep_alive().lock().unwrap_or_else(|p| p.into_inner());
    match slots.get_mut(&i) {
        Some(v) => {
            v.push(Box::new(object));
            true
        }
        None => false,
    }
}

/// Whether one of this crate's captures is being recorded on `device` (so that
/// [`retain_in_capture`] keeps what it is given).
pub(crate) fn recording(device: Device) -> bool {
    let Device::Cuda(i) = device else { return false };
    keep_alive().lock().unwrap_or_else(|p| p.into_inner()).contains_key(&i)
}

/// The keep-alive slot of one capture: open while it records, emptied into the graph on
/// success, and closed (its objects dropped, outside the lock) on every path.
struct KeepAliveSlot(usize);

impl KeepAliveSlot {
    fn open(device: usize) -> Self {
        keep_alive().lock().unwrap_or_else(|p| p.into_inner()).insert(device, Vec::new());
        KeepAliveSlot(device)
    }

    fn take(&self) -> KeepAlive {
        let mut slots = keep_alive().lock().unwrap_or_else(|p| p.into_inner());
        slots.get_mut(&self.0).map(std::mem::take).unwrap_or_default()
    }
}

impl Drop for KeepAliveSlot {
    fn drop(&mut self) {
        let left = keep_alive().lock().unwrap_or_else(|p| p.into_inner()).remove(&self.0);
        drop(left); // outside the lock: dropping may shut a process group down
    }
}

/// `Err(Misuse)` when CUDA autocast is on with its weight-cast cache: a graph recorded then would
/// replay the casts of the weights as they were at capture (PyTorch refuses it too). `what`
/// names the refused operation in the message.
pub(crate) fn refuse_cached_autocast(what: &str) -> Result<()> {
    let (enabled, _, cache) = crate::sys::amp::autocast_state()?;
    if enabled && cache {
        return Err(Error::Misuse(format!(
            "{what} under autocast with the weight-cast cache on: replays would read casts of stale weights; \
             use Autocast::new(dtype, false) (or StepOptions::autocast)"
        )));
    }
    Ok(())
}

/// What every capture of the crate sets up first, in one place: the device's capture lock,
/// the device synchronized and its capture stream ordered after the current stream, and an
/// out-of-memory watch for the eager runs on that stream (warmups).
pub(crate) struct CaptureSession {
    _lock: CaptureLock,
    side: Stream,
    oom: OomWatch,
    device: Device,
}

impl CaptureSession {
    /// The lock, the capture stream ordered after the current one, the OOM watch; no host sync.
    fn enter(device: Device) -> Result<Self> {
        let lock = CaptureLock::acquire(device)?;
        let side = Stream::capture_stream(device)?;
        side.wait_stream(&Stream::current(device)?)?;
        let oom = OomWatch::start(device)?;
        Ok(CaptureSession { _lock: lock, side, oom, device })
    }

    /// [`enter`](Self::enter), and the device synchronized: what a capture starts from.
    pub(crate) fn open(device: Device) -> Result<Self> {
        let session = CaptureSession::enter(device)?;
        synchronize(device)?;
        Ok(session)
    }

    /// Runs `f` eagerly on the capture stream (a warmup run); an out-of-memory error is
    /// [`Error::OutOfMemory`], as in a capture.
    pub(crate) fn run<T>(&self, f: impl FnOnce() -> Result<T>) -> Result<T> {
        let _stream = StreamGuard::new(&self.side)?;
        f().map_err(|e| self.oom.classify(e))
    }

    /// Waits on the host for the eager runs, before the first capture.
    pub(crate) fn settle(&self) -> Result<()> {
        self.side.synchronize()
    }

    /// Records `f` into `graph` on the capture stream.
    pub(crate) fn record<T>(
        &self,
        graph: &mut CudaGraph,
        options: &CaptureOptions,
        f: impl FnOnce() -> Result<T>,
    ) -> Result<T> {
        record(graph, options, &self.side, self.device, f)
    }
}

/// Aborts the capture under way when dropped (errors, panics), unless disarmed.
struct AbortOnDrop<'a> {
    graph: &'a mut CudaGraph,
    armed: bool,
}

impl AbortOnDrop<'_> {
    /// Aborts now; whether CUDA had invalidated the capture (false if that cannot be told).
    fn abort(&mut self) -> bool {
        self.armed = false;
        // An abort that fails leaves nothing more to do: the shim already tore down what it could.
        self.graph.capture_abort().unwrap_or(false)
    }
}

impl Drop for AbortOnDrop<'_> {
    fn drop(&mut self) {
        if self.armed {
            let _ = self.graph.capture_abort();
        }
    }
}

/// Classifies an error that ended a capture (or its warmup) by state: a rise of the allocator's
/// OOM counter first, then whether CUDA invalidated the capture.
fn classify(e: Error, invalidated: bool, oom: &OomWatch) -> Error {
    let e = oom.classify(e);
    if invalidated && !e.is_out_of_memory() && !e.is_capture_invalidated() {
        Error::CaptureInvalidated { source: Box::new(e) }
    } else {
        e
    }
}

/// Records `f` into `graph` on `side`, restoring the previous stream on every path. The caller
/// holds the device's capture lock ([`CaptureSession::record`]).
fn record<T>(
    graph: &mut CudaGraph,
    options: &CaptureOptions,
    side: &Stream,
    device: Device,
    f: impl FnOnce() -> Result<T>,
) -> Result<T> {
    refuse_cached_autocast("capture")?;
    if options.empty_cache {
        empty_cache()?;
        empty_host_cache()?;
    }
    let oom = OomWatch::start(device)?;
    let _stream = StreamGuard::new(side)?; // dropped last: the capture ends on `side`
    let index = cuda_index(device)?;
    let keep = KeepAliveSlot::open(usize::try_from(index).unwrap_or(usize::MAX));
    // The crate's own kernels (optimizers, conditional nodes) load outside the capture, where a
    // load is allowed; without them (not built, no code for this GPU) the capture goes on and
    // what needs them says so (a refusal's message is read and dropped here).
    let _ = crate::sys::kernels::check_device(index);
    graph.capture_begin(options.pool, options.mode)?;
    let mut guard = AbortOnDrop { graph, armed: true };
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(out)) => {
            guard.armed = false;
            // capture_end tears down by itself on failure
            guard.graph.capture_end().map_err(|e| classify(e, false, &oom))?;
            for object in keep.take() {
                guard.graph.retain(object);
            }
            Ok(out)
        }
        Ok(Err(e)) => {
            let invalidated = guard.abort();
            Err(classify(e, invalidated, &oom))
        }
        Err(panic) => {
            drop(guard); // abort the capture
            drop(_stream); // restore the stream
            resume_unwind(panic)
        }
    }
}

impl CudaGraph {
    /// Captures the work `f` queues into this graph and returns what `f` returned (tensors whose
    /// memory the graph will write on each replay).
    ///
    /// Like `torch.cuda.graph`: holds the device's [`CaptureLock`], synchronizes the device,
    /// frees cached memory (see [`CaptureOptions::empty_cache`]), switches to the device's
    /// capture stream, captures, and restores the previous stream. On failure see the module
    /// docs: the capture is torn down and the graph is empty again; an invalidated capture is
    /// [`Error::CaptureInvalidated`], an OOM [`Error::OutOfMemory`], other errors come back as
    /// they are, and a panic resumes after the clean-up.
    pub fn capture<T>(&mut self, options: CaptureOptions, f: impl FnOnce() -> Result<T>) -> Result<T> {
        CaptureSession::open(options.resolve_device()?)?.record(self, &options, f)
    }
}

/// Runs `f` once, eagerly, the way a warmup run of [`capture_with_warmup`] runs: holding the
/// device's [`CaptureLock`], on the device's capture stream (so lazily made per-stream state,
/// such as cuBLAS workspaces, is the capture's). The current stream then waits for that work,
/// so what follows on it is ordered after. No host sync. An out-of-memory error of `f` is
/// [`Error::OutOfMemory`], as in a capture.
pub fn run_on_capture_stream<T>(device: Device, f: impl FnOnce() -> Result<T>) -> Result<T> {
    let session = CaptureSession::enter(device)?;
    let out = session.run(f)?;
    Stream::current(device)?.wait_stream(&session.side)?;
    Ok(out)
}

/// Holds the device's [`CaptureLock`], runs `f` `warmup` times on the capture stream (so cuBLAS/cuDNN handles, autograd's device threads,
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
    let session = CaptureSession::open(options.resolve_device()?)?;
    for _ in 0..warmup {
        drop(session.run(&mut f)?);
    }
    session.settle()?;
    let mut graph = CudaGraph::with_keep_graph(options.keep_graph)?;
    let out = session.record(&mut graph, &options, &mut f)?;
    Ok((graph, out))
}

#[cfg(test)]
mod tests {
    use super::refuse_cached_autocast;
    use crate::sys::amp::AutocastHandle;
    use crate::Error;
    use tch::Kind;

    #[test]
    fn captures_are_refused_only_under_autocast_with_its_cache_on() {
        assert!(refuse_cached_autocast("capture").is_ok(), "no autocast");
        {
            let _amp = AutocastHandle::enter(Kind::BFloat16, false).expect("autocast, cache off");
            assert!(refuse_cached_autocast("capture").is_ok(), "cache off");
        }
        let _amp = AutocastHandle::enter(Kind::BFloat16, true).expect("autocast, cache on");
        match refuse_cached_autocast("capture") {
            Err(Error::Misuse(msg)) => assert!(msg.starts_with("capture under autocast"), "{msg}"),
            r => panic!("expected Misuse, got {r:?}"),
        }
    }
}
