//! CUDA streams: the current stream, side streams from libtorch's pool, a guard that restores
//! the previous stream, and the capture status of a stream.

use crate::device::cuda_index;
use crate::error::{Error, Result};
use crate::sys::device::{self as sys, EventHandle, RawCaptureStatus, RawStream, StreamGuardHandle, WhichStream};
use std::collections::HashMap;
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
    /// Maps the shim's status.
    fn from_raw(raw: RawCaptureStatus) -> Result<Self> {
        match raw {
            RawCaptureStatus::TCG_CAPTURE_STATUS_NONE => Ok(CaptureStatus::None),
            RawCaptureStatus::TCG_CAPTURE_STATUS_ACTIVE => Ok(CaptureStatus::Active),
            RawCaptureStatus::TCG_CAPTURE_STATUS_INVALIDATED => Ok(CaptureStatus::Invalidated),
            other => Err(Error::Libtorch(format!("unknown capture status code {}", other.0))),
        }
    }
}

/// A CUDA stream of libtorch, as plain data (libtorch owns the stream itself; copying this
/// handle is free and never frees anything).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Stream {
    raw: RawStream,
}

impl Stream {
    /// The current stream of `device` on this thread.
    pub fn current(device: Device) -> Result<Self> {
        Ok(Stream { raw: sys::stream_of(cuda_index(device)?, WhichStream::Current)? })
    }

    /// The default (legacy, null) stream of `device`. Graphs cannot be captured on it.
    pub fn default_stream(device: Device) -> Result<Self> {
        Ok(Stream { raw: sys::stream_of(cuda_index(device)?, WhichStream::Default)? })
    }

    /// A side stream from libtorch's stream pool on `device` (round-robin; never the default).
    pub fn from_pool(device: Device) -> Result<Self> {
        let which = WhichStream::FromPool { high_priority: false };
        Ok(Stream { raw: sys::stream_of(cuda_index(device)?, which)? })
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
        sys::stream_synchronize(self.raw)
    }

    /// Makes this stream wait (on the device, without blocking the host) for all work queued so
    /// far on `other`.
    pub fn wait_stream(&self, other: &Stream) -> Result<()> {
        sys::stream_wait_stream(self.raw, other.raw)
    }

    /// This stream's capture status.
    pub fn capture_status(&self) -> Result<CaptureStatus> {
        CaptureStatus::from_raw(sys::stream_capture_status(self.raw)?)
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
    _handle: StreamGuardHandle,
}

impl StreamGuard {
    /// Makes `stream` current on its device, remembering what to restore.
    pub fn new(stream: &Stream) -> Result<Self> {
        Ok(StreamGuard { _handle: StreamGuardHandle::new(stream.raw)? })
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
    handle: EventHandle,
}

impl Event {
    /// A new event on `device`.
    pub fn new(device: Device) -> Result<Self> {
        Ok(Event { handle: EventHandle::new(cuda_index(device)?)? })
    }

    /// Records the work queued so far on `stream` (which must be on the event's device).
    pub fn record(&mut self, stream: &Stream) -> Result<()> {
        self.handle.record(stream.raw)
    }

    /// Blocks the host until the work of the last [`record`](Self::record) has finished.
    pub fn synchronize(&self) -> Result<()> {
        self.handle.synchronize()
    }
}

impl Stream {
    /// Makes this stream wait (on the device) for the last record of `event`.
    pub fn wait_event(&self, event: &Event) -> Result<()> {
        event.handle.wait_on(self.raw)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capture_statuses_map_and_unknown_codes_are_errors() {
        assert_eq!(CaptureStatus::from_raw(RawCaptureStatus::TCG_CAPTURE_STATUS_NONE).unwrap(), CaptureStatus::None);
        assert_eq!(
            CaptureStatus::from_raw(RawCaptureStatus::TCG_CAPTURE_STATUS_ACTIVE).unwrap(),
            CaptureStatus::Active
        );
        assert_eq!(
            CaptureStatus::from_raw(RawCaptureStatus::TCG_CAPTURE_STATUS_INVALIDATED).unwrap(),
            CaptureStatus::Invalidated
        );
        assert!(matches!(CaptureStatus::from_raw(RawCaptureStatus(7)), Err(Error::Libtorch(_))));
    }
}
