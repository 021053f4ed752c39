//! `csrc/cuda/dist.cpp` and `csrc/cuda/grad_buckets.cpp` (or `csrc/no_dist.cpp`): process groups
//! over c10d/NCCL, gradient buckets.
use super::{c_enum, tcg_status, tcg_tensor, tcg_tensors};
use std::os::raw::{c_char, c_int};

c_enum!(tcg_reduce_op { TCG_REDUCE_SUM = 0, TCG_REDUCE_AVG = 1 });
c_enum!(tcg_bucket_layout { TCG_BUCKET_LAYOUT_PACKED = 0, TCG_BUCKET_LAYOUT_VIEWS = 1, TCG_BUCKET_LAYOUT_GROUPED = 2 });
c_enum!(tcg_bucket_collective {
    TCG_BUCKET_COLLECTIVE_ALL_REDUCE = 0,
    TCG_BUCKET_COLLECTIVE_REDUCE_SCATTER_ALL_GATHER = 1,
});
c_enum!(tcg_bucket_compression { TCG_BUCKET_COMPRESSION_NONE = 0, TCG_BUCKET_COMPRESSION_BF16 = 1 });
c_enum!(tcg_bucket_buffers {
    TCG_BUCKET_BUFFERS_CACHING = 0,
    TCG_BUCKET_BUFFERS_NCCL_MEM = 1,
    TCG_BUCKET_BUFFERS_NCCL_REGISTERED = 2,
    TCG_BUCKET_BUFFERS_NCCL_WINDOW = 3,
});

#[repr(C)]
pub struct tcg_pg {
    _private: [u8; 0],
}

#[repr(C)]
pub struct tcg_buckets {
    _private: [u8; 0],
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct tcg_buckets_options {
    pub bucket_bytes: i64,
    pub first_bucket_bytes: i64,
    pub layout: tcg_bucket_layout,
    pub collective: tcg_bucket_collective,
    pub compression: tcg_bucket_compression,
    pub buffers: tcg_bucket_buffers,
    pub high_priority: bool,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct tcg_bucket_slot {
    pub bucket: usize,
    pub offset: i64,
}

extern "C" {
    pub fn tcg_pg_available() -> bool;
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
    pub fn tcg_pg_allreduce(p: *mut tcg_pg, t: tcg_tensor, op: tcg_reduce_op) -> tcg_status;
    pub fn tcg_pg_broadcast(p: *mut tcg_pg, t: tcg_tensor, root: c_int) -> tcg_status;
    pub fn tcg_pg_reduce_scatter(
        p: *mut tcg_pg,
        output: tcg_tensor,
        input: tcg_tensor,
        op: tcg_reduce_op,
    ) -> tcg_status;
    pub fn tcg_pg_all_gather(p: *mut tcg_pg, output: tcg_tensor, input: tcg_tensor) -> tcg_status;
    pub fn tcg_pg_barrier(p: *mut tcg_pg) -> tcg_status;
    pub fn tcg_pg_wait_device(p: *mut tcg_pg, timeout_ms: i64) -> tcg_status;
    pub fn tcg_pg_abort(p: *mut tcg_pg) -> tcg_status;
    pub fn tcg_buckets_new(
        pg: *mut tcg_pg,
        params: tcg_tensors,
        options: *const tcg_buckets_options,
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
    pub fn tcg_buckets_plan(
        numels: *const i64,
        n: usize,
        element_bytes: i64,
        options: *const tcg_buckets_options,
        world: c_int,
        slots: *mut tcg_bucket_slot,
        bucket_numels: *mut i64,
        cap: usize,
        n_buckets: *mut usize,
    ) -> tcg_status;
}
