//! Figures of libtorch's CUDA caching allocator: per device and per pool.

use crate::device::cuda_index;
use crate::error::{Error, Result};
use crate::pool::PoolId;
use crate::sys::memory as sys;
use tch::Device;

pub use crate::sys::memory::{MemoryStats, PoolBlock};

/// The allocator's statistics for `device`.
pub fn memory_stats(device: Device) -> Result<MemoryStats> {
    sys::stats(cuda_index(device)?)
}

/// Resets the peak figures of `device`.
pub fn reset_peak_stats(device: Device) -> Result<()> {
    sys::reset_peak(cuda_index(device)?)
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
    let (reserved, allocated) = sys::pool_memory(cuda_index(device)?, pool.raw())?;
    Ok(PoolMemory { reserved, allocated })
}

/// Returns the allocator's unused cached memory to CUDA (`torch.cuda.empty_cache()`); this is
/// also when the memory of released graph pools goes back.
pub fn empty_cache() -> Result<()> {
    sys::empty_cache(false)
}

/// Also returns the pinned host allocator's unused cached memory (`torch._C._host_emptyCache()`),
/// which `torch.cuda.graph` does before every capture beside [`empty_cache`]: pinned memory that
/// a capture allocated goes to the graph's pool, and this is when a released pool's goes back.
pub fn empty_host_cache() -> Result<()> {
    sys::empty_cache(true)
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
    sys::pool_blocks(cuda_index(device)?, pool.raw())
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
