//! Memory pools for graphs: pool ids that several captures can share, and libtorch's `MemPool`.

use crate::device::cuda_index;
use crate::error::{Error, Result};
use crate::sys::memory::{self as sys, PoolHoldHandle, RawPoolId};
use tch::Device;

/// The id of a memory pool of libtorch's CUDA caching allocator (`MempoolId_t`).
///
/// Graphs captured into one pool share its memory; they must then be replayed in the order
/// they were captured (PyTorch's rule for shared pools). A `PoolId` is plain data: the pool
/// lives as long as a graph captured into it (or a [`MemPool`]) holds it; see [`MemPool`] for
/// why a pool reused across captures must be held.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct PoolId {
    first: u64,
    second: u64,
}

impl PoolId {
    /// The "no pool" id: a capture given it makes a private pool of its own.
    pub const PRIVATE: PoolId = PoolId { first: 0, second: 0 };

    /// Builds an id from its two halves, as libtorch prints them. At most one may be non-zero:
    /// a graph-made pool sets `first`, a user-made handle sets `second`.
    pub fn from_raw(first: u64, second: u64) -> Result<Self> {
        if first != 0 && second != 0 {
            return Err(Error::Misuse(format!(
                "invalid pool id ({first}, {second}): at most one half may be non-zero"
            )));
        }
        Ok(PoolId { first, second })
    }

    /// The two halves of the id.
    pub fn to_raw(self) -> (u64, u64) {
        (self.first, self.second)
    }

    /// Whether this is [`PoolId::PRIVATE`].
    pub fn is_private(self) -> bool {
        self == PoolId::PRIVATE
    }

    pub(crate) fn raw(self) -> RawPoolId {
        RawPoolId { first: self.first, second: self.second }
    }

    pub(crate) fn from_raw_id(raw: RawPoolId) -> Self {
        PoolId { first: raw.first, second: raw.second }
    }
}

/// A fresh pool id to share between captures (`torch.cuda.graph_pool_handle()`).
///
/// ```no_run
/// # fn main() -> tch_cuda_graphs::Result<()> {
/// use tch_cuda_graphs::{graph_pool_handle, CaptureOptions};
/// let pool = graph_pool_handle()?;
/// let options = CaptureOptions::default().pool(pool); // give the same to several captures
/// # Ok(()) }
/// ```
pub fn graph_pool_handle() -> Result<PoolId> {
    Ok(PoolId::from_raw_id(sys::new_pool_id()?))
}

/// A hold on a memory pool of libtorch's caching allocators (PyTorch's `torch.cuda.MemPool`,
/// extended to the pinned host allocator, which captures also route to the pool).
///
/// # Why hold a pool
/// A pool lives as long as something holds it: a graph captured into it, or a `MemPool`. When
/// the last holder goes, libtorch marks the pool to be freed; until the next empty-cache erases
/// it, capturing into the same id again fails inside libtorch (`use_count > 0 INTERNAL ASSERT`).
/// So whoever reuses a pool id across captures whose graphs may all be gone in between (a
/// [`crate::TrainStep`] that evicts graphs, a cache of graphs keyed by shape) holds it with a
/// `MemPool` for as long as it may capture into it. [`crate::TrainStep`] holds its own.
///
/// ```no_run
/// # fn main() -> tch_cuda_graphs::Result<()> {
/// use tch_cuda_graphs::{CaptureOptions, CudaGraph, MemPool};
/// let pool = MemPool::new()?; // a fresh id, held
/// let options = CaptureOptions::default().pool(pool.id());
/// let mut g = CudaGraph::new()?;
/// g.capture(options, || Ok(()))?;
/// drop(g); // the pool stays open: `pool` holds it
/// let mut g = CudaGraph::new()?;
/// g.capture(options, || Ok(()))?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct MemPool {
    hold: PoolHoldHandle,
    id: PoolId,
    device: Device,
}

impl MemPool {
    /// A fresh pool on the current device, held.
    pub fn new() -> Result<Self> {
        Self::make(-1, PoolId::PRIVATE)
    }

    /// A fresh pool on `device`, held.
    pub fn on(device: Device) -> Result<Self> {
        Self::make(cuda_index(device)?, PoolId::PRIVATE)
    }

    /// A hold on the existing (or not yet used) pool `id` on `device`, e.g. the pool of
    /// another step that this one shares. [`Error::Misuse`] if every holder of `id` is already
    /// gone while tensors allocated in it still live (libtorch then keeps the pool only to free
    /// it); a pool whose tensors are all gone is opened afresh.
    pub fn hold(device: Device, id: PoolId) -> Result<Self> {
        if id.is_private() {
            return Err(Error::Misuse("MemPool::hold: PoolId::PRIVATE names no pool; use MemPool::on".into()));
        }
        Self::make(cuda_index(device)?, id)
    }

    fn make(device: i32, id: PoolId) -> Result<Self> {
        let hold = PoolHoldHandle::new(device, id.raw())?;
        let (id, dev) = hold.id()?; // on failure `hold` is dropped: released
        Ok(MemPool { hold, id: PoolId::from_raw_id(id), device: Device::Cuda(dev.max(0) as usize) })
    }

    /// The pool's id, for [`crate::CaptureOptions::pool`].
    pub fn id(&self) -> PoolId {
        self.id
    }

    /// The device the pool is held on.
    pub fn device(&self) -> Device {
        self.device
    }

    /// How many hold the pool in the device allocator: this hold, other `MemPool`s, and one per
    /// graph captured into it.
    pub fn use_count(&self) -> Result<i32> {
        self.hold.use_count()
    }
}
