//! Memory pools for graphs: pool ids that several captures can share, and libtorch's `MemPool`.

use crate::error::{check, Error, Result};
use crate::ffi;
use std::ptr::NonNull;

/// The id of a memory pool of libtorch's CUDA caching allocator (`MempoolId_t`).
///
/// Graphs captured into one pool share its memory; they must then be replayed in the order
/// they were captured (PyTorch's rule for shared pools). A `PoolId` is plain data: the pool
/// lives as long as a graph captured into it (or a [`MemPool`]) holds it.
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

/// A user-owned pool of the CUDA caching allocator (`at::cuda::MemPool`, PyTorch's
/// `torch.cuda.MemPool`). Its [`id`](MemPool::id) can be given to captures; graphs captured into
/// it keep the pool's memory alive after this handle is dropped.
#[derive(Debug)]
pub struct MemPool {
    raw: NonNull<ffi::tcg_mempool>,
}

// SAFETY: at::cuda::MemPool holds only ids and a device index; its methods lock the caching
// allocator's own mutex, so moving it to another thread is sound. It is not Sync (no &self
// method may race another) because we do not rely on that for anything.
unsafe impl Send for MemPool {}

impl MemPool {
    /// Creates a pool on the current device.
    pub fn new() -> Result<Self> {
        let mut raw = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out pointer; on success it holds a pool we own.
        check(unsafe { ffi::tcg_mempool_new(&mut raw) })?;
        NonNull::new(raw).map(|raw| MemPool { raw }).ok_or_else(|| Error::Libtorch("MemPool: null handle".into()))
    }

    /// The pool's id, for [`crate::CaptureOptions::pool`].
    pub fn id(&self) -> Result<PoolId> {
        let mut raw = ffi::tcg_pool_id::default();
        // SAFETY: `self.raw` is live (owned by self); `raw` is a valid out pointer.
        check(unsafe { ffi::tcg_mempool_id(self.raw.as_ptr(), &mut raw) })?;
        Ok(PoolId::from_ffi(raw))
    }

    /// How many users (this handle, graphs captured into it) hold the pool.
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
