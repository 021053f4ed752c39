//! `csrc/cuda/device.cpp`: devices, streams, events.

use super::{check, ffi, non_null};
use crate::error::Result;
use std::ptr::NonNull;

/// A CUDA stream of libtorch as plain data (`c10::Stream::pack3()`); libtorch owns the stream.
pub(crate) type RawStream = ffi::tcg_stream;

/// The capture status of a stream (`cudaStreamCaptureStatus`), as the shim reports it.
pub(crate) use ffi::tcg_capture_status as RawCaptureStatus;

/// Whether the shim was compiled against a libtorch with CUDA.
pub(crate) fn built_with_cuda() -> bool {
    // SAFETY: no arguments, no preconditions.
    unsafe { ffi::tcg_device_built_with_cuda() }
}

/// The number of visible CUDA devices.
pub(crate) fn device_count() -> Result<i32> {
    let mut n = 0;
    // SAFETY: `n` is a valid out pointer for the duration of the call.
    check(unsafe { ffi::tcg_device_count(&mut n) })?;
    Ok(n)
}

/// The current CUDA device index of this thread.
pub(crate) fn current_device() -> Result<i32> {
    let mut d = 0;
    // SAFETY: `d` is a valid out pointer for the duration of the call.
    check(unsafe { ffi::tcg_device_current(&mut d) })?;
    Ok(d)
}

/// Blocks the host until device `index` is idle.
pub(crate) fn device_synchronize(index: i32) -> Result<()> {
    // SAFETY: plain value argument; the shim validates the index.
    check(unsafe { ffi::tcg_device_synchronize(index) })
}

/// Which of a device's streams [`stream_of`] asks for.
#[derive(Clone, Copy, Debug)]
pub(crate) enum WhichStream {
    /// The thread's current stream.
    Current,
    /// The default (legacy) stream.
    Default,
    /// A side stream from libtorch's pool (round-robin).
    FromPool {
        /// Of high priority.
        high_priority: bool,
    },
}

/// A stream of device `index`.
pub(crate) fn stream_of(index: i32, which: WhichStream) -> Result<RawStream> {
    let mut raw = RawStream::default();
    // SAFETY: `raw` is a valid out pointer for the duration of each call; plain value arguments.
    check(unsafe {
        match which {
            WhichStream::Current => ffi::tcg_stream_current(index, &mut raw),
            WhichStream::Default => ffi::tcg_stream_default(index, &mut raw),
            WhichStream::FromPool { high_priority } => ffi::tcg_stream_from_pool(index, high_priority, &mut raw),
        }
    })?;
    Ok(raw)
}

/// Blocks the host until `s` is idle.
pub(crate) fn stream_synchronize(s: RawStream) -> Result<()> {
    // SAFETY: plain value argument; the shim validates it.
    check(unsafe { ffi::tcg_stream_synchronize(s) })
}

/// `waiter` waits on the device for the work queued so far on `waitee`.
pub(crate) fn stream_wait_stream(waiter: RawStream, waitee: RawStream) -> Result<()> {
    // SAFETY: plain value arguments; the shim validates them.
    check(unsafe { ffi::tcg_stream_wait_stream(waiter, waitee) })
}

/// The capture status of `s`.
pub(crate) fn stream_capture_status(s: RawStream) -> Result<RawCaptureStatus> {
    let mut status = RawCaptureStatus::default();
    // SAFETY: `status` is a valid out pointer (any value the shim writes is a valid one).
    check(unsafe { ffi::tcg_stream_capture_status(s, &mut status) })?;
    Ok(status)
}

/// The shim's stream guard: `s` current until dropped, then what was current before.
#[derive(Debug)]
pub(crate) struct StreamGuardHandle(NonNull<ffi::tcg_stream_guard>);

impl StreamGuardHandle {
    pub(crate) fn new(s: RawStream) -> Result<Self> {
        let mut raw = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out pointer; on success it holds a guard we own.
        check(unsafe { ffi::tcg_stream_guard_new(s, &mut raw) })?;
        non_null(raw, "stream guard").map(StreamGuardHandle)
    }
}

impl Drop for StreamGuardHandle {
    fn drop(&mut self) {
        // SAFETY: the pointer came from tcg_stream_guard_new and is freed exactly once, here; the
        // shim's free never throws.
        unsafe { ffi::tcg_stream_guard_free(self.0.as_ptr()) }
    }
}

/// The shim's CUDA event (timing disabled).
#[derive(Debug)]
pub(crate) struct EventHandle(NonNull<ffi::tcg_event>);

// SAFETY: a CUDA event is a driver handle usable from any thread; the shim's wrapper holds only
// the handle and its device index. Recording takes `&mut self`; waits only read the handle.
unsafe impl Send for EventHandle {}

impl EventHandle {
    pub(crate) fn new(index: i32) -> Result<Self> {
        let mut raw = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out pointer; on success it holds an event we own.
        check(unsafe { ffi::tcg_event_new(index, &mut raw) })?;
        non_null(raw, "event").map(EventHandle)
    }

    /// Records the work queued so far on `s`.
    pub(crate) fn record(&mut self, s: RawStream) -> Result<()> {
        // SAFETY: the handle is live (owned by self); the stream is plain data the shim checks.
        check(unsafe { ffi::tcg_event_record(self.0.as_ptr(), s) })
    }

    /// Blocks the host until the last record has finished.
    pub(crate) fn synchronize(&self) -> Result<()> {
        // SAFETY: the handle is live; cudaEventSynchronize only reads it.
        check(unsafe { ffi::tcg_event_synchronize(self.0.as_ptr()) })
    }

    /// `s` waits on the device for the last record.
    pub(crate) fn wait_on(&self, s: RawStream) -> Result<()> {
        // SAFETY: plain stream data; the handle is live for the call and only read.
        check(unsafe { ffi::tcg_stream_wait_event(s, self.0.as_ptr()) })
    }
}

impl Drop for EventHandle {
    fn drop(&mut self) {
        // SAFETY: the pointer came from tcg_event_new and is freed exactly once, here; the shim's
        // free never throws.
        unsafe { ffi::tcg_event_free(self.0.as_ptr()) }
    }
}
