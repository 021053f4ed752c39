//! Figures of libtorch's CUDA caching allocator: per device and per pool.

use crate::device::cuda_index;
use crate::error::{check, Result};
use crate::ffi;
use crate::pool::PoolId;
use tch::Device;

/// The caching allocator's statistics for one device (bytes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryStats {
    /// Bytes held by live tensors.
    pub allocated: i64,
    /// Peak of `allocated` since the last [`reset_peak_stats`].
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

/// The allocator's statistics for `device`.
pub fn memory_stats(device: Device) -> Result<MemoryStats> {
    let idx = cuda_index(device)?;
    let mut s = ffi::tcg_mem_stats::default();
    // SAFETY: `s` is a valid out pointer for the duration of the call.
    check(unsafe { ffi::tcg_memory_stats(idx, &mut s) })?;
    Ok(MemoryStats {
        allocated: s.allocated_current,
        allocated_peak: s.allocated_peak,
        reserved: s.reserved_current,
        reserved_peak: s.reserved_peak,
        active: s.active_current,
        alloc_retries: s.num_alloc_retries,
        ooms: s.num_ooms,
    })
}

/// Resets the peak figures of `device`.
pub fn reset_peak_stats(device: Device) -> Result<()> {
    let idx = cuda_index(device)?;
    // SAFETY: plain value argument; the shim validates it.
    check(unsafe { ffi::tcg_reset_peak_stats(idx) })
}

/// Memory of one pool on one device (bytes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolMemory {
    /// Bytes of the segments the pool owns.
    pub reserved: i64,
    /// Bytes of those segments held by live blocks.
    pub allocated: i64,
}

/// The memory `pool` holds on `device` (from an allocator snapshot; not for hot loops).
pub fn pool_memory(device: Device, pool: PoolId) -> Result<PoolMemory> {
    let idx = cuda_index(device)?;
    let (mut reserved, mut allocated) = (0i64, 0i64);
    // SAFETY: both out pointers are valid for the duration of the call.
    check(unsafe { ffi::tcg_pool_memory(idx, pool.ffi(), &mut reserved, &mut allocated) })?;
    Ok(PoolMemory { reserved, allocated })
}

/// Returns the allocator's unused cached memory to CUDA (`torch.cuda.empty_cache()`); this is
/// also when the memory of released graph pools goes back.
pub fn empty_cache() -> Result<()> {
    // SAFETY: no arguments; the shim checks for CUDA.
    check(unsafe { ffi::tcg_empty_cache() })
}
