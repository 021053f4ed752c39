//! `csrc/cuda/memory.cpp`: pool ids, holds on pools, the caching allocator's figures. Every
//! function here may be the first CUDA call of a process (the shim initializes CUDA lazily).

use super::{check, ffi, non_null};
use crate::error::Result;
use std::ptr::NonNull;

pub(crate) use super::graph::RawPoolId;

/// The caching allocator's statistics for one device (bytes).
#[repr(C)] // C's tcg_mem_stats: the shim writes it (checked by sys::layout)
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryStats {
    /// Bytes held by live tensors.
    pub allocated: i64,
    /// Peak of `allocated` since the last [`crate::reset_peak_stats`].
    pub allocated_peak: i64,
    /// Bytes reserved from CUDA by the allocator (cached or in use).
    pub reserved: i64,
    /// Peak of `reserved`.
    pub reserved_peak: i64,
    /// Bytes of active blocks (allocated, or freed but awaiting stream use).
    pub active: i64,
    /// Times a cudaMalloc failed and the allocator freed its cache to retry.
    pub alloc_retries: i64,
    /// Out-of-memory errors raised.
    pub ooms: i64,
}

/// One block of a pool's memory: a piece of one of the segments (`cudaMalloc`s) the pool owns.
#[repr(C)] // C's tcg_pool_block: the shim writes it (checked by sys::layout)
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolBlock {
    /// The device address of the block's segment.
    pub segment: u64,
    /// The segment's size (bytes).
    pub segment_size: u64,
    /// Where the block starts within its segment.
    pub offset: u64,
    /// The block's size (bytes, rounded by the allocator).
    pub size: u64,
    /// The size that was asked for (for allocated blocks).
    pub requested: u64,
    /// Held by a live tensor (or by a graph's captured work), rather than free in the pool.
    pub allocated: bool,
    /// From the allocator's large-block pool (segments of 2 MiB and more).
    pub large: bool,
}

/// A fresh pool id (`graph_pool_handle`).
pub(crate) fn new_pool_id() -> Result<RawPoolId> {
    let mut raw = RawPoolId::default();
    // SAFETY: `raw` is a valid out pointer for the duration of the call.
    check(unsafe { ffi::tcg_pool_id_new(&mut raw) })?;
    Ok(raw)
}

/// The shim's hold on a pool in both caching allocators, released on drop.
#[derive(Debug)]
pub(crate) struct PoolHoldHandle(NonNull<ffi::tcg_pool_hold>);

// SAFETY: the shim's hold is plain data (a pool id and a device index); creating and releasing
// references locks the caching allocators' own mutexes, so it may be dropped on any thread.
unsafe impl Send for PoolHoldHandle {}

impl PoolHoldHandle {
    /// A hold on `pool` ({0, 0}: a fresh id) on device `index` (-1: the current one).
    pub(crate) fn new(index: i32, pool: RawPoolId) -> Result<Self> {
        let mut raw = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out pointer; on success it holds a hold that we own.
        check(unsafe { ffi::tcg_pool_hold_new(index, pool, &mut raw) })?;
        non_null(raw, "MemPool").map(PoolHoldHandle)
    }

    /// The pool held and its device index.
    pub(crate) fn id(&self) -> Result<(RawPoolId, i32)> {
        let (mut out, mut dev) = (RawPoolId::default(), 0);
        // SAFETY: the handle is live (owned by self); both out pointers are valid.
        check(unsafe { ffi::tcg_pool_hold_id(self.0.as_ptr(), &mut out, &mut dev) })?;
        Ok((out, dev))
    }

    pub(crate) fn use_count(&self) -> Result<i32> {
        let mut n = 0;
        // SAFETY: the handle is live (owned by self); `n` is a valid out pointer.
        check(unsafe { ffi::tcg_pool_hold_use_count(self.0.as_ptr(), &mut n) })?;
        Ok(n)
    }
}

impl Drop for PoolHoldHandle {
    fn drop(&mut self) {
        // SAFETY: the pointer came from tcg_pool_hold_new and is freed exactly once, here; the
        // shim's free never throws.
        unsafe { ffi::tcg_pool_hold_free(self.0.as_ptr()) }
    }
}

/// The allocator's statistics for device `index`.
pub(crate) fn stats(index: i32) -> Result<MemoryStats> {
    let mut s = MemoryStats::default();
    // SAFETY: `s` is a valid out pointer of C's layout for the duration of the call.
    check(unsafe { ffi::tcg_memory_stats(index, &mut s) })?;
    Ok(s)
}

/// Resets the peak figures of device `index`.
pub(crate) fn reset_peak(index: i32) -> Result<()> {
    // SAFETY: plain value argument; the shim validates it.
    check(unsafe { ffi::tcg_memory_reset_peak(index) })
}

/// Bytes reserved and allocated by `pool`'s segments on device `index`.
pub(crate) fn pool_memory(index: i32, pool: RawPoolId) -> Result<(i64, i64)> {
    let (mut reserved, mut allocated) = (0i64, 0i64);
    // SAFETY: both out pointers are valid for the duration of the call.
    check(unsafe { ffi::tcg_pool_memory(index, pool, &mut reserved, &mut allocated) })?;
    Ok((reserved, allocated))
}

/// The blocks of `pool`'s segments on device `index`.
pub(crate) fn pool_blocks(index: i32, pool: RawPoolId) -> Result<Vec<PoolBlock>> {
    let mut blocks: Vec<PoolBlock> = Vec::new();
    loop {
        let mut n = 0usize;
        // SAFETY: `blocks` has room for `blocks.len()` blocks of C's layout, the capacity passed;
        // `n` is a valid out pointer. The shim writes at most that many.
        check(unsafe { ffi::tcg_pool_blocks(index, pool, blocks.as_mut_ptr(), blocks.len(), &mut n) })?;
        if n <= blocks.len() {
            blocks.truncate(n);
            return Ok(blocks);
        }
        blocks = vec![PoolBlock::default(); n]; // blocks came and went: ask again
    }
}

/// Returns the device allocator's (or, with `host`, the pinned host allocator's) unused cached
/// memory.
pub(crate) fn empty_cache(host: bool) -> Result<()> {
    // SAFETY: no arguments; the shim checks for CUDA.
    check(unsafe {
        if host {
            ffi::tcg_memory_host_empty_cache()
        } else {
            ffi::tcg_memory_empty_cache()
        }
    })
}
