//! Memory pools for graphs: pool ids that several captures can share, and libtorch's `MemPool`.

use crate::device::cuda_index;
use crate::error::{check, Error, Result};
use crate::ffi;
use std::ptr::NonNull;
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

    pub(crate) fn ffi(self) -> ffi::tcg_pool_id {
        ffi::tcg_pool_id { first: self.first, second: self.second }
    }

    pub(crate) fn from_ffi(raw: ffi::tcg_pool_id) -> Self {
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
    let mut raw = ffi::tcg_pool_id::default();
    // SAFETY: `raw` is a valid out pointer for the duration of the call.
    check(unsafe { ffi::tcg_graph_pool_handle(&mut raw) })?;
    Ok(PoolId::from_ffi(raw))
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
    raw: NonNull<ffi::tcg_mempool>,
    id: PoolId,
    device: Device,
}

// SAFETY: the shim's hold is plain data (a pool id and a device index); creating and releasing
// references locks the caching allocators' own mutexes, so it may be dropped on any thread. No
// `&self` method mutates it, but nothing needs Sync, so it is not claimed.
unsafe impl Send for MemPool {}

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
        let mut raw = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out pointer; on success it holds a hold that we own.
        check(unsafe { ffi::tcg_mempool_new(device, id.ffi(), &mut raw) })?;
        let raw = NonNull::new(raw).ok_or_else(|| Error::Libtorch("MemPool: null handle".into()))?;
        // Dropped (released) if reading the id fails.
        let mut pool = MemPool { raw, id, device: Device::Cpu };
        let (mut out, mut dev) = (ffi::tcg_pool_id::default(), 0);
        // SAFETY: `pool.raw` is live (owned by `pool`); both out pointers are valid.
        check(unsafe { ffi::tcg_mempool_id(pool.raw.as_ptr(), &mut out, &mut dev) })?;
        pool.id = PoolId::from_ffi(out);
        pool.device = Device::Cuda(dev as usize);
        Ok(pool)
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
        let mut n = 0;
        // SAFETY: `self.raw` is live (owned by self); `n` is a valid out pointer.
        check(unsafe { ffi::tcg_mempool_use_count(self.raw.as_ptr(), &mut n) })?;
        Ok(n)
    }
}

impl Drop for MemPool {
    fn drop(&mut self) {
        // SAFETY: `raw` came from tcg_mempool_new and is freed exactly once, here; the shim's
        // free never throws.
        unsafe { ffi::tcg_mempool_free(self.raw.as_ptr()) }
    }
}
