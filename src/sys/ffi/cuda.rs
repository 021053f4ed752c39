//! `csrc/cuda/*.cpp` (or `csrc/no_cuda.cpp`): devices, streams, graphs, pools, allocator figures.
use super::{c_enum, tcg_status, tcg_tensor};
use std::os::raw::{c_char, c_int};

c_enum!(tcg_capture_mode { TCG_CAPTURE_MODE_GLOBAL = 0, TCG_CAPTURE_MODE_THREAD_LOCAL = 1, TCG_CAPTURE_MODE_RELAXED = 2 });
c_enum!(tcg_capture_status { TCG_CAPTURE_STATUS_NONE = 0, TCG_CAPTURE_STATUS_ACTIVE = 1, TCG_CAPTURE_STATUS_INVALIDATED = 2 });
c_enum!(tcg_cond_kind { TCG_COND_IF = 0, TCG_COND_WHILE = 1, TCG_COND_IF_NOT = 2 });

#[repr(C)]
pub struct tcg_graph {
    _private: [u8; 0],
}
#[repr(C)]
pub struct tcg_stream_guard {
    _private: [u8; 0],
}
#[repr(C)]
pub struct tcg_pool_hold {
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

/// C's `tcg_mem_stats`: the public [`crate::MemoryStats`].
pub type tcg_mem_stats = crate::sys::memory::MemoryStats;
/// C's `tcg_pool_block`: the public [`crate::memory::PoolBlock`].
pub type tcg_pool_block = crate::sys::memory::PoolBlock;
/// Node counts of a captured graph (C's `tcg_node_kinds`): the public [`crate::NodeKinds`].
pub type tcg_node_kinds = crate::sys::graph::NodeKinds;

extern "C" {
    // cuda/device.cpp
    pub fn tcg_device_built_with_cuda() -> bool;
    pub fn tcg_device_count(out: *mut c_int) -> tcg_status;
    pub fn tcg_device_current(out: *mut c_int) -> tcg_status;
    pub fn tcg_device_synchronize(device: c_int) -> tcg_status;
    pub fn tcg_stream_from_pool(device: c_int, high_priority: bool, out: *mut tcg_stream) -> tcg_status;
    pub fn tcg_stream_current(device: c_int, out: *mut tcg_stream) -> tcg_status;
    pub fn tcg_stream_default(device: c_int, out: *mut tcg_stream) -> tcg_status;
    pub fn tcg_stream_synchronize(s: tcg_stream) -> tcg_status;
    pub fn tcg_stream_wait_stream(waiter: tcg_stream, waitee: tcg_stream) -> tcg_status;
    pub fn tcg_stream_capture_status(s: tcg_stream, out: *mut tcg_capture_status) -> tcg_status;
    pub fn tcg_stream_guard_new(s: tcg_stream, out: *mut *mut tcg_stream_guard) -> tcg_status;
    pub fn tcg_stream_guard_free(g: *mut tcg_stream_guard);
    pub fn tcg_event_new(device: c_int, out: *mut *mut tcg_event) -> tcg_status;
    pub fn tcg_event_free(e: *mut tcg_event);
    pub fn tcg_event_record(e: *mut tcg_event, s: tcg_stream) -> tcg_status;
    pub fn tcg_stream_wait_event(s: tcg_stream, e: *mut tcg_event) -> tcg_status;
    pub fn tcg_event_synchronize(e: *mut tcg_event) -> tcg_status;

    // cuda/graph.cpp
    pub fn tcg_graph_new(keep_graph: bool, out: *mut *mut tcg_graph) -> tcg_status;
    pub fn tcg_graph_free(g: *mut tcg_graph);
    pub fn tcg_graph_capture_begin(g: *mut tcg_graph, pool: tcg_pool_id, mode: tcg_capture_mode) -> tcg_status;
    pub fn tcg_graph_capture_end(g: *mut tcg_graph) -> tcg_status;
    pub fn tcg_graph_capture_abort(g: *mut tcg_graph, was_invalidated: *mut bool) -> tcg_status;
    pub fn tcg_graph_instantiate(g: *mut tcg_graph) -> tcg_status;
    pub fn tcg_graph_replay(g: *mut tcg_graph) -> tcg_status;
    pub fn tcg_graph_upload(g: *mut tcg_graph) -> tcg_status;
    pub fn tcg_graph_update_from(
        g: *mut tcg_graph,
        other: *mut tcg_graph,
        updated: *mut bool,
        result: *mut c_int,
    ) -> tcg_status;
    pub fn tcg_graph_reset(g: *mut tcg_graph) -> tcg_status;
    pub fn tcg_graph_pool(g: *mut tcg_graph, out: *mut tcg_pool_id) -> tcg_status;
    pub fn tcg_graph_debug_dump(g: *mut tcg_graph, path: *const c_char) -> tcg_status;
    pub fn tcg_graph_node_count(g: *mut tcg_graph, out: *mut usize) -> tcg_status;
    pub fn tcg_graph_node_kinds(g: *mut tcg_graph, out: *mut tcg_node_kinds) -> tcg_status;

    // cuda/conditional.cpp
    pub fn tcg_cond_begin(
        kind: tcg_cond_kind,
        cond: tcg_tensor,
        body_pool: tcg_pool_id,
        max_iters: i64,
        counter: tcg_tensor,
        hit: tcg_tensor,
        out: *mut *mut tcg_cond,
    ) -> tcg_status;
    pub fn tcg_cond_end(c: *mut tcg_cond) -> tcg_status;
    pub fn tcg_cond_free(c: *mut tcg_cond);

    // cuda/memory.cpp
    pub fn tcg_pool_id_new(out: *mut tcg_pool_id) -> tcg_status;
    pub fn tcg_pool_hold_new(device: c_int, pool: tcg_pool_id, out: *mut *mut tcg_pool_hold) -> tcg_status;
    pub fn tcg_pool_hold_free(p: *mut tcg_pool_hold);
    pub fn tcg_pool_hold_id(p: *mut tcg_pool_hold, out: *mut tcg_pool_id, device: *mut c_int) -> tcg_status;
    pub fn tcg_pool_hold_use_count(p: *mut tcg_pool_hold, out: *mut c_int) -> tcg_status;
    pub fn tcg_memory_stats(device: c_int, out: *mut tcg_mem_stats) -> tcg_status;
    pub fn tcg_memory_reset_peak(device: c_int) -> tcg_status;
    pub fn tcg_pool_memory(device: c_int, pool: tcg_pool_id, reserved: *mut i64, allocated: *mut i64) -> tcg_status;
    pub fn tcg_pool_blocks(
        device: c_int,
        pool: tcg_pool_id,
        out: *mut tcg_pool_block,
        cap: usize,
        n: *mut usize,
    ) -> tcg_status;
    pub fn tcg_memory_empty_cache() -> tcg_status;
    pub fn tcg_memory_host_empty_cache() -> tcg_status;
}
