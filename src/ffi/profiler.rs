//! `csrc/profiler.cpp`: Kineto profiling.
use super::tcg_status;
use std::os::raw::c_char;

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
    pub kind: i32,
}

pub const TCG_PROF_KERNEL: i32 = 0;
pub const TCG_PROF_MEMCPY: i32 = 1;
pub const TCG_PROF_MEMSET: i32 = 2;
pub const TCG_PROF_CPU_OP: i32 = 3;
pub const TCG_PROF_RUNTIME: i32 = 4;

extern "C" {
    pub fn tcg_profiler_start(cuda: i32) -> tcg_status;
    pub fn tcg_profiler_stop(out: *mut *mut tcg_profile) -> tcg_status;
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
