//! Figures of libtorch's CUDA caching allocator: per device and per pool.

use crate::device::cuda_index;
use crate::error::{check, Error, Result};
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

/// Also returns the pinned host allocator's unused cached memory (`torch._C._host_emptyCache()`),
/// which `torch.cuda.graph` does before every capture beside [`empty_cache`]: pinned memory that
/// a capture allocated goes to the graph's pool, and this is when a released pool's goes back.
pub fn empty_host_cache() -> Result<()> {
    // SAFETY: no arguments; the shim checks for CUDA.
    check(unsafe { ffi::tcg_host_empty_cache() })
}

/// One block of a pool's memory: a piece of one of the segments (`cudaMalloc`s) the pool owns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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

/// Every block of the segments `pool` owns on `device`, segment by segment in address order:
/// where a pool's memory goes (which blocks stay allocated between captures, how segments are
/// split). From an allocator snapshot; not for hot loops.
///
/// ```no_run
/// # fn main() -> tch_cuda_graphs::Result<()> {
/// use tch_cuda_graphs::{graph_pool_handle, memory::pool_blocks};
/// let pool = graph_pool_handle()?;
/// let live: u64 = pool_blocks(tch::Device::Cuda(0), pool)?.iter().filter(|b| b.allocated).map(|b| b.size).sum();
/// # let _ = live; Ok(()) }
/// ```
pub fn pool_blocks(device: Device, pool: PoolId) -> Result<Vec<PoolBlock>> {
    let idx = cuda_index(device)?;
    let mut raw: Vec<ffi::tcg_pool_block> = Vec::new();
    loop {
        let mut n = 0usize;
        // SAFETY: `raw` has room for `raw.len()` blocks, which is the capacity passed; `n` is a
        // valid out pointer. The shim writes at most that many.
        check(unsafe { ffi::tcg_pool_blocks(idx, pool.ffi(), raw.as_mut_ptr(), raw.len(), &mut n) })?;
        if n <= raw.len() {
            raw.truncate(n);
            break;
        }
        raw = vec![ffi::tcg_pool_block::default(); n]; // blocks came and went: ask again
    }
    Ok(raw
        .into_iter()
        .map(|b| PoolBlock {
            segment: b.segment,
            segment_size: b.segment_size,
            offset: b.offset,
            size: b.size,
            requested: b.requested,
            allocated: b.allocated != 0,
            large: b.large != 0,
        })
        .collect())
}

/// Watches the caching allocator's OOM counter of one device around a call of the user's work,
/// so that an out-of-memory error is [`Error::OutOfMemory`] on every path that runs it (eager,
/// warmup, capture), whatever layer reported it (tch passes libtorch's `OutOfMemoryError` on as
/// a message only). Classification is by state, never by message text: the counter rose.
///
/// On the CPU there is no such counter (libtorch's CPU allocator counts no OOMs), so errors
/// there come back unchanged. Another thread's OOM on the same device during the call would be
/// taken for this call's.
pub(crate) struct OomWatch {
    device: Device,
    before: Option<i64>,
}

impl OomWatch {
    /// Reads the counter of `device` now (nothing to watch on the CPU).
    pub(crate) fn start(device: Device) -> Result<Self> {
        let before = match device {
            Device::Cuda(_) => Some(memory_stats(device)?.ooms),
            _ => None,
        };
        Ok(OomWatch { device, before })
    }

    /// Whether the counter rose since [`start`](Self::start).
    pub(crate) fn rose(&self) -> bool {
        self.before.is_some_and(|b| memory_stats(self.device).map(|s| s.ooms > b).unwrap_or(false))
    }

    /// `e` as [`Error::OutOfMemory`] if the counter rose (and it is not already classified).
    pub(crate) fn classify(&self, e: Error) -> Error {
        if e.is_out_of_memory() || e.is_capture_invalidated() || !self.rose() {
            e
        } else {
            Error::OutOfMemory { source: Box::new(e) }
        }
    }
}
