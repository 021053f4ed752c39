//! `csrc/profiler.cpp`: Kineto profiling.
use super::{c_enum, tcg_status};
use std::os::raw::c_char;

c_enum!(tcg_prof_kind {
    TCG_PROF_KERNEL = 0,
    TCG_PROF_MEMCPY = 1,
    TCG_PROF_MEMSET = 2,
    TCG_PROF_CPU_OP = 3,
    TCG_PROF_RUNTIME = 4,
    TCG_PROF_OTHER = 5,
});

#[repr(C)]
pub struct tcg_profile {
    _private: [u8; 0],
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct tcg_prof_event {
    pub start_ns: u64,
    pub end_ns: u64,
    pub stream: i64,
    pub device: i32,
    pub kind: tcg_prof_kind,
}

extern "C" {
    pub fn tcg_profile_start(cuda: bool) -> tcg_status;
    pub fn tcg_profile_stop(out: *mut *mut tcg_profile) -> tcg_status;
    pub fn tcg_profile_free(p: *mut tcg_profile);
    pub fn tcg_profile_len(p: *mut tcg_profile, n: *mut usize) -> tcg_status;
    pub fn tcg_profile_event(
        p: *mut tcg_profile,
        i: usize,
        out: *mut tcg_prof_event,
        name: *mut *mut c_char,
    ) -> tcg_status;
    pub fn tcg_profile_save(p: *mut tcg_profile, path: *const c_char) -> tcg_status;
}
