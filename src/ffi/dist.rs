//! `csrc/cuda/dist.cpp` and `csrc/cuda/grad_buckets.cpp` (or `csrc/no_dist.cpp`): process groups
//! over c10d/NCCL, gradient buckets.
use super::{tcg_status, tcg_tensor};
use std::os::raw::{c_char, c_int};

#[repr(C)]
pub struct tcg_pg {
    _private: [u8; 0],
}

#[repr(C)]
pub struct tcg_buckets {
    _private: [u8; 0],
}

/// `tcg_buckets_new` flags (csrc/tcg.h).
pub const TCG_BUCKETS_VIEWS: c_int = 1;
pub const TCG_BUCKETS_BF16: c_int = 2;
pub const TCG_BUCKETS_HIGH_PRIORITY: c_int = 4;
pub const TCG_BUCKETS_NCCL_MEM: c_int = 8;
pub const TCG_BUCKETS_NCCL_REGISTER: c_int = 16;
pub const TCG_BUCKETS_NCCL_WINDOW: c_int = 32;
pub const TCG_BUCKETS_SPLIT: c_int = 64;
pub const TCG_BUCKETS_GROUPED: c_int = 128;

extern "C" {
    pub fn tcg_dist_available() -> c_int;
    pub fn tcg_pg_new_from_env(timeout_ms: i64, out: *mut *mut tcg_pg) -> tcg_status;
    pub fn tcg_pg_new_tcp(
        host: *const c_char,
        port: c_int,
        rank: c_int,
        size: c_int,
        device: c_int,
        timeout_ms: i64,
        out: *mut *mut tcg_pg,
    ) -> tcg_status;
    pub fn tcg_pg_new_file(
        path: *const c_char,
        rank: c_int,
        size: c_int,
        device: c_int,
        timeout_ms: i64,
        out: *mut *mut tcg_pg,
    ) -> tcg_status;
    pub fn tcg_pg_free(p: *mut tcg_pg);
    pub fn tcg_pg_info(p: *mut tcg_pg, rank: *mut c_int, size: *mut c_int, device: *mut c_int) -> tcg_status;
    pub fn tcg_pg_allreduce(p: *mut tcg_pg, t: tcg_tensor, op: c_int) -> tcg_status;
    pub fn tcg_pg_broadcast(p: *mut tcg_pg, t: tcg_tensor, root: c_int) -> tcg_status;
    pub fn tcg_pg_barrier(p: *mut tcg_pg) -> tcg_status;
    pub fn tcg_pg_wait_device(p: *mut tcg_pg, timeout_ms: i64) -> tcg_status;
    pub fn tcg_pg_abort(p: *mut tcg_pg) -> tcg_status;
    pub fn tcg_buckets_new(
        pg: *mut tcg_pg,
        params: *const tcg_tensor,
        n: usize,
        bucket_bytes: i64,
        first_bucket_bytes: i64,
        flags: c_int,
        out: *mut *mut tcg_buckets,
    ) -> tcg_status;
    pub fn tcg_buckets_free(b: *mut tcg_buckets);
    pub fn tcg_buckets_count(b: *mut tcg_buckets, out: *mut usize) -> tcg_status;
    pub fn tcg_buckets_arm(b: *mut tcg_buckets) -> tcg_status;
    pub fn tcg_buckets_finish(b: *mut tcg_buckets) -> tcg_status;
    pub fn tcg_buckets_launch_rest(b: *mut tcg_buckets) -> tcg_status;
    pub fn tcg_buckets_wait_bucket(b: *mut tcg_buckets, k: usize) -> tcg_status;
    pub fn tcg_buckets_join(b: *mut tcg_buckets) -> tcg_status;
    pub fn tcg_buckets_members(b: *mut tcg_buckets, k: usize, out: *mut usize, cap: usize, n: *mut usize)
        -> tcg_status;
}
