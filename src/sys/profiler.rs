//! `csrc/profiler.cpp`: Kineto profiling.

use super::{check, error::c_string, error::take_string, ffi, non_null};
use crate::error::Result;
use std::marker::PhantomData;
use std::ptr::NonNull;

/// One recorded event as the shim gives it (`tcg_prof_event`).
pub(crate) type RawEvent = ffi::tcg_prof_event;
/// `TCG_PROF_*`: what an event is.
pub(crate) use ffi::tcg_prof_kind as RawEventKind;

/// A running profiler; dropped without [`stop`](Self::stop), it stops and discards. Kineto's
/// CPU-side state belongs to the thread that started it, so this is `!Send`.
#[derive(Debug)]
pub(crate) struct ProfilerSession {
    stopped: bool,
    _thread: PhantomData<*const ()>,
}

impl ProfilerSession {
    /// Starts CPU-op profiling on this thread and, with `cuda`, GPU activity of the process.
    pub(crate) fn start(cuda: bool) -> Result<Self> {
        // SAFETY: no pointers; the shim refuses a second profiler.
        check(unsafe { ffi::tcg_profile_start(cuda) })?;
        Ok(ProfilerSession { stopped: false, _thread: PhantomData })
    }

    /// Stops and returns what was recorded.
    pub(crate) fn stop(mut self) -> Result<ProfileHandle> {
        self.stopped = true;
        let mut raw = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out pointer; on success it holds a profile we own.
        check(unsafe { ffi::tcg_profile_stop(&mut raw) })?;
        non_null(raw, "profiler").map(ProfileHandle)
    }
}

impl Drop for ProfilerSession {
    fn drop(&mut self) {
        if !self.stopped {
            // SAFETY: a null out pointer discards the result; the shim never throws.
            let _ = unsafe { ffi::tcg_profile_stop(std::ptr::null_mut()) };
        }
    }
}

/// What a profiler recorded, freed on drop.
#[derive(Debug)]
pub(crate) struct ProfileHandle(NonNull<ffi::tcg_profile>);

// SAFETY: the shim's profile is immutable after stop (events copied out, the Kineto result only
// read by save); no thread affinity.
unsafe impl Send for ProfileHandle {}

impl ProfileHandle {
    pub(crate) fn len(&self) -> Result<usize> {
        let mut n = 0usize;
        // SAFETY: the handle is live; `n` is a valid out pointer.
        check(unsafe { ffi::tcg_profile_len(self.0.as_ptr(), &mut n) })?;
        Ok(n)
    }

    /// Event `i` and its name.
    pub(crate) fn event(&self, i: usize) -> Result<(RawEvent, String)> {
        let mut e = RawEvent::default();
        let mut name = std::ptr::null_mut();
        // SAFETY: the handle is live; out pointers valid (the shim checks `i`).
        let status = unsafe { ffi::tcg_profile_event(self.0.as_ptr(), i, &mut e, &mut name) };
        // SAFETY: `name` is NULL or a string the shim malloc'ed for us, taken once here.
        let name = unsafe { take_string(name) }.unwrap_or_default();
        check(status)?;
        Ok((e, name))
    }

    /// Writes a Chrome trace to `path`.
    pub(crate) fn save(&self, path: &str) -> Result<()> {
        let c = c_string(path, "the profile path")?;
        // SAFETY: the handle is live; `c` outlives the call.
        check(unsafe { ffi::tcg_profile_save(self.0.as_ptr(), c.as_ptr()) })
    }
}

impl Drop for ProfileHandle {
    fn drop(&mut self) {
        // SAFETY: the pointer came from tcg_profile_stop and is freed once, here; never throws.
        unsafe { ffi::tcg_profile_free(self.0.as_ptr()) }
    }
}
