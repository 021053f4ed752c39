//! `csrc/cuda/*.cpp` (or `csrc/no_cuda.cpp`): devices, streams, graphs, pools, allocator figures.
use super::tcg_status;
use std::os::raw::{c_char, c_int};

#[repr(C)]
pub struct tcg_graph {
    _private: [u8; 0],
}
#[repr(C)]
pub struct tcg_stream_guard {
    _private: [u8; 0],
}
#[repr(C)]
pub struct tcg_mempool {
    _private: [u8; 0],
}
#[repr(C)]
pub struct tcg_event {
    _private: [u8; 0],
}
#[repr(C)]
pub struct tcg_cond {
    _private: [u8; 0],
}

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct tcg_stream {
    pub id: i64,
    pub device_index: i8,
    pub device_type: i8,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct tcg_pool_id {
    pub first: u64,
    pub second: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct tcg_mem_stats {
    pub allocated_current: i64,
    pub allocated_peak: i64,
    pub reserved_current: i64,
    pub reserved_peak: i64,
    pub active_current: i64,
    pub num_alloc_retries: i64,
    pub num_ooms: i64,
}

/// One block of a pool's segment (`tcg_pool_block`; the safe API is [`crate::memory::PoolBlock`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct tcg_pool_block {
    pub segment: u64,
    pub segment_size: u64,
    pub offset: u64,
    pub size: u64,
    pub requested: u64,
    pub allocated: c_int,
    pub large: c_int,
}

/// Node counts of a captured graph, by `cudaGraphNodeType` (C's `tcg_node_kinds`; the safe
/// layer turns it into [`crate::NodeKinds`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct tcg_node_kinds {
    /// Kernel launches.
    pub kernel: usize,
    /// Memory copies.
    pub memcpy: usize,
    /// Memory sets.
    pub memset: usize,
    /// Host callbacks.
    pub host: usize,
    /// Child graphs.
    pub graph: usize,
    /// Empty (dependency) nodes.
    pub empty: usize,
    /// Event waits and records.
    pub event: usize,
    /// Memory allocation and free nodes.
    pub mem_alloc_free: usize,
    /// Any other kind (semaphores, conditionals, kinds newer than this crate).
    pub other: usize,
}

extern "C" {
    // cuda/device.cpp
    pub fn tcg_built_with_cuda() -> c_int;
    pub fn tcg_device_count(out: *mut c_int) -> tcg_status;
    pub fn tcg_current_device(out: *mut c_int) -> tcg_status;
    pub fn tcg_device_synchronize(device: c_int) -> tcg_status;
    pub fn tcg_stream_from_pool(device: c_int, high_priority: c_int, out: *mut tcg_stream) -> tcg_status;
    pub fn tcg_stream_current(device: c_int, out: *mut tcg_stream) -> tcg_status;
    pub fn tcg_stream_default(device: c_int, out: *mut tcg_stream) -> tcg_status;
    pub fn tcg_stream_synchronize(s: tcg_stream) -> tcg_status;
    pub fn tcg_stream_wait_stream(waiter: tcg_stream, waitee: tcg_stream) -> tcg_status;
    pub fn tcg_stream_capture_status(s: tcg_stream, out: *mut c_int) -> tcg_status;
    pub fn tcg_stream_guard_new(s: tcg_stream, out: *mut *mut tcg_stream_guard) -> tcg_status;
    pub fn tcg_stream_guard_free(g: *mut tcg_stream_guard);
    pub fn tcg_event_new(device: c_int, out: *mut *mut tcg_event) -> tcg_status;
    pub fn tcg_event_free(e: *mut tcg_event);
    pub fn tcg_event_record(e: *mut tcg_event, s: tcg_stream) -> tcg_status;
    pub fn tcg_stream_wait_event(s: tcg_stream, e: *mut tcg_event) -> tcg_status;
    pub fn tcg_event_synchronize(e: *mut tcg_event) -> tcg_status;

    // cuda/graph.cpp
    pub fn tcg_graph_new(keep_graph: c_int, out: *mut *mut tcg_graph) -> tcg_status;
    pub fn tcg_graph_free(g: *mut tcg_graph);
    pub fn tcg_graph_capture_begin(g: *mut tcg_graph, pool: tcg_pool_id, mode: c_int) -> tcg_status;
    pub fn tcg_graph_capture_end(g: *mut tcg_graph) -> tcg_status;
    pub fn tcg_graph_capture_abort(g: *mut tcg_graph, was_invalidated: *mut c_int) -> tcg_status;
    pub fn tcg_graph_instantiate(g: *mut tcg_graph) -> tcg_status;
    pub fn tcg_graph_replay(g: *mut tcg_graph) -> tcg_status;
    pub fn tcg_graph_upload(g: *mut tcg_graph) -> tcg_status;
    pub fn tcg_graph_update_from(
        g: *mut tcg_graph,
        other: *mut tcg_graph,
        updated: *mut c_int,
        result: *mut c_int,
    ) -> tcg_status;
    pub fn tcg_graph_reset(g: *mut tcg_graph) -> tcg_status;
    pub fn tcg_graph_pool(g: *mut tcg_graph, out: *mut tcg_pool_id) -> tcg_status;
    pub fn tcg_graph_debug_dump(g: *mut tcg_graph, path: *const c_char) -> tcg_status;
    pub fn tcg_graph_node_count(g: *mut tcg_graph, out: *mut usize) -> tcg_status;
    pub fn tcg_graph_node_kinds(g: *mut tcg_graph, out: *mut tcg_node_kinds) -> tcg_status;

    // cuda/conditional.cpp
    pub fn tcg_cond_begin(
        kind: c_int,
        cond: super::tcg_tensor,
        body_pool: tcg_pool_id,
        max_iters: i64,
        counter: super::tcg_tensor,
        hit: super::tcg_tensor,
        out: *mut *mut tcg_cond,
    ) -> tcg_status;
    pub fn tcg_cond_end(c: *mut tcg_cond) -> tcg_status;
    pub fn tcg_cond_free(c: *mut tcg_cond);

    // cuda/memory.cpp
    pub fn tcg_graph_pool_handle(out: *mut tcg_pool_id) -> tcg_status;
    pub fn tcg_mempool_new(device: c_int, pool: tcg_pool_id, out: *mut *mut tcg_mempool) -> tcg_status;
    pub fn tcg_mempool_free(p: *mut tcg_mempool);
    pub fn tcg_mempool_id(p: *mut tcg_mempool, out: *mut tcg_pool_id, device: *mut c_int) -> tcg_status;
    pub fn tcg_mempool_use_count(p: *mut tcg_mempool, out: *mut c_int) -> tcg_status;
    pub fn tcg_memory_stats(device: c_int, out: *mut tcg_mem_stats) -> tcg_status;
    pub fn tcg_reset_peak_stats(device: c_int) -> tcg_status;
    pub fn tcg_pool_memory(device: c_int, pool: tcg_pool_id, reserved: *mut i64, allocated: *mut i64) -> tcg_status;
    pub fn tcg_pool_blocks(
        device: c_int,
        pool: tcg_pool_id,
        out: *mut tcg_pool_block,
        cap: usize,
        n: *mut usize,
    ) -> tcg_status;
    pub fn tcg_empty_cache() -> tcg_status;
    pub fn tcg_host_empty_cache() -> tcg_status;
}
