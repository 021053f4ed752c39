//! CUDA streams: the current stream, side streams from libtorch's pool, a guard that restores
//! the previous stream, and the capture status of a stream.

use crate::device::cuda_index;
use crate::error::{check, Error, Result};
use crate::ffi;
use std::collections::HashMap;
use std::ptr::NonNull;
use std::sync::{Mutex, OnceLock};
use tch::Device;

/// The capture status of a CUDA stream (`cudaStreamCaptureStatus`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CaptureStatus {
    /// The stream is not capturing.
    None,
    /// The stream is capturing into a graph.
    Active,
    /// The stream was capturing and CUDA invalidated the capture; it must be ended.
    Invalidated,
}

impl CaptureStatus {
    /// Maps the shim's code (0 none, 1 active, 2 invalidated).
    pub fn from_code(code: i32) -> Result<Self> {
        match code {
            0 => Ok(CaptureStatus::None),
            1 => Ok(CaptureStatus::Active),
            2 => Ok(CaptureStatus::Invalidated),
            other => Err(Error::Libtorch(format!("unknown capture status code {other}"))),
        }
    }
}

/// A CUDA stream of libtorch, as plain data (libtorch owns the stream itself; copying this
/// handle is free and never frees anything).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Stream {
    raw: ffi::tcg_stream,
}

impl Stream {
    /// The current stream of `device` on this thread.
    pub fn current(device: Device) -> Result<Self> {
        let idx = cuda_index(device)?;
        let mut raw = ffi::tcg_stream::default();
        // SAFETY: `raw` is a valid out pointer for the duration of the call.
        check(unsafe { ffi::tcg_stream_current(idx, &mut raw) })?;
        Ok(Stream { raw })
    }

    /// The default (legacy, null) stream of `device`. Graphs cannot be captured on it.
    pub fn default_stream(device: Device) -> Result<Self> {
        let idx = cuda_index(device)?;
        let mut raw = ffi::tcg_stream::default();
        // SAFETY: `raw` is a valid out pointer for the duration of the call.
        check(unsafe { ffi::tcg_stream_default(idx, &mut raw) })?;
        Ok(Stream { raw })
    }

    /// A side stream from libtorch's stream pool on `device` (round-robin; never the default).
    pub fn from_pool(device: Device) -> Result<Self> {
        let idx = cuda_index(device)?;
        let mut raw = ffi::tcg_stream::default();
        // SAFETY: `raw` is a valid out pointer for the duration of the call.
        check(unsafe { ffi::tcg_stream_from_pool(idx, 0, &mut raw) })?;
        Ok(Stream { raw })
    }

    /// The stream this crate captures on for `device`: one side stream per device for the whole
    /// process, as `torch.cuda.graph` keeps one default capture stream. Using one stream matters
    /// for shared pools: the caching allocator reuses a freed block only on the stream that
    /// allocated it, so graphs captured on one stream into one pool share memory.
    pub fn capture_stream(device: Device) -> Result<Self> {
        static STREAMS: OnceLock<Mutex<HashMap<i32, Stream>>> = OnceLock::new();
        let idx = cuda_index(device)?;
        let map = STREAMS.get_or_init(|| Mutex::new(HashMap::new()));
        // A poisoned lock only means another thread panicked while inserting: the map is fine.
        let mut map = map.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = map.get(&idx) {
            return Ok(*s);
        }
        let s = Stream::from_pool(device)?;
        map.insert(idx, s);
        Ok(s)
    }

    /// The device this stream belongs to.
    pub fn device(&self) -> Device {
        Device::Cuda(self.raw.device_index.max(0) as usize)
    }

    /// Blocks the host until all work queued on this stream has finished.
    pub fn synchronize(&self) -> Result<()> {
        // SAFETY: plain value argument; the shim validates it.
        check(unsafe { ffi::tcg_stream_synchronize(self.raw) })
    }

    /// Makes this stream wait (on the device, without blocking the host) for all work queued so
    /// far on `other`.
    pub fn wait_stream(&self, other: &Stream) -> Result<()> {
        // SAFETY: plain value arguments; the shim validates them.
        check(unsafe { ffi::tcg_stream_wait_stream(self.raw, other.raw) })
    }

    /// This stream's capture status.
    pub fn capture_status(&self) -> Result<CaptureStatus> {
        let mut code = 0;
        // SAFETY: `code` is a valid out pointer for the duration of the call.
        check(unsafe { ffi::tcg_stream_capture_status(self.raw, &mut code) })?;
        CaptureStatus::from_code(code)
    }
}

/// Whether the current stream of the current device is capturing (active or invalidated).
/// `Ok(false)` without CUDA, so eager code can ask it unconditionally.
pub fn is_current_stream_capturing() -> Result<bool> {
    if !crate::device::cuda_is_available() {
        return Ok(false);
    }
    let device = crate::device::current_device()?;
    Ok(Stream::current(device)?.capture_status()? != CaptureStatus::None)
}

/// Makes a stream (and its device) current until dropped; then the stream and device that were
/// current before come back (not the default stream). A guard, so it restores on every path
/// out, panics included.
///
/// ```no_run
/// # fn main() -> tch_cuda_graphs::Result<()> {
/// use tch_cuda_graphs::{Stream, StreamGuard};
/// let side = Stream::from_pool(tch::Device::Cuda(0))?;
/// {
///     let _guard = StreamGuard::new(&side)?;
///     // work queued here runs on `side`
/// }
/// // the previous stream is current again
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct StreamGuard {
    raw: NonNull<ffi::tcg_stream_guard>,
}

impl StreamGuard {
    /// Makes `stream` current on its device, remembering what to restore.
    pub fn new(stream: &Stream) -> Result<Self> {
        let mut raw = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out pointer; on success it holds a guard we own.
        check(unsafe { ffi::tcg_stream_guard_new(stream.raw, &mut raw) })?;
        NonNull::new(raw)
            .map(|raw| StreamGuard { raw })
            .ok_or_else(|| Error::Libtorch("stream guard: null handle".into()))
    }
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        // SAFETY: `raw` came from tcg_stream_guard_new and is freed exactly once, here; the
        // shim's free never throws.
        unsafe { ffi::tcg_stream_guard_free(self.raw.as_ptr()) }
    }
}

/// A CUDA event (timing disabled): records a point in a stream's work so that another stream,
/// or the host, can wait for it without synchronizing the whole device.
///
/// ```no_run
/// # fn main() -> tch_cuda_graphs::Result<()> {
/// use tch_cuda_graphs::{Event, Stream};
/// let d = tch::Device::Cuda(0);
/// let (copy, compute) = (Stream::from_pool(d)?, Stream::current(d)?);
/// let mut done = Event::new(d)?;
/// // ... queue copies on `copy` ...
/// done.record(&copy)?;
/// compute.wait_event(&done)?; // later work on `compute` runs after the copies
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Event {
    raw: NonNull<ffi::tcg_event>,
}

// SAFETY: a CUDA event is a driver handle usable from any thread; the shim's wrapper holds only
// the handle and its device index. Recording takes `&mut self`; waits only read the handle.
unsafe impl Send for Event {}

impl Event {
    /// A new event on `device`.
    pub fn new(device: Device) -> Result<Self> {
        let idx = cuda_index(device)?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out pointer; on success it holds an event we own.
        check(unsafe { ffi::tcg_event_new(idx, &mut raw) })?;
        NonNull::new(raw).map(|raw| Event { raw }).ok_or_else(|| Error::Libtorch("event: null handle".into()))
    }

    /// Records the work queued so far on `stream` (which must be on the event's device).
    pub fn record(&mut self, stream: &Stream) -> Result<()> {
        // SAFETY: `self.raw` is live (owned by self); the stream is plain data the shim checks.
        check(unsafe { ffi::tcg_event_record(self.raw.as_ptr(), stream.raw) })
    }

    /// Blocks the host until the work of the last [`record`](Self::record) has finished.
    pub fn synchronize(&self) -> Result<()> {
        // SAFETY: `self.raw` is live; cudaEventSynchronize only reads the handle.
        check(unsafe { ffi::tcg_event_synchronize(self.raw.as_ptr()) })
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: `raw` came from tcg_event_new and is freed exactly once, here; the shim's free
        // never throws.
        unsafe { ffi::tcg_event_free(self.raw.as_ptr()) }
    }
}

impl Stream {
    /// Makes this stream wait (on the device) for the last record of `event`.
    pub fn wait_event(&self, event: &Event) -> Result<()> {
        // SAFETY: plain stream data; `event.raw` is live for the call and only read.
        check(unsafe { ffi::tcg_stream_wait_event(self.raw, event.raw.as_ptr()) })
    }
}
