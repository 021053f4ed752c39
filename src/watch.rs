//! [`TensorWatch`]: tensors kept alive together with the storage they had, checked in one call.
//!
//! A captured graph reads and writes the addresses its tensors had at capture. If a tensor's
//! storage is replaced afterwards (`set_data`, `VarStore::set_kind`, a resize), the graph would
//! silently keep working on the old (possibly freed) memory. A watch notices.

use crate::error::{check, take_message, Error, Result};
use crate::ffi;
use std::ptr::NonNull;
use tch::Tensor;

/// References to tensors plus each one's data pointer, dtype and shape at the time it was
/// added. [`check`](TensorWatch::check) compares all of them with one FFI call (a few
/// nanoseconds per tensor) and names the first that changed.
///
/// ```
/// use tch::{Kind, Tensor};
/// use tch_cuda_graphs::{Error, TensorWatch};
/// let mut t = Tensor::zeros([4], (Kind::Float, tch::Device::Cpu));
/// let mut watch = TensorWatch::new()?;
/// watch.add(["t".to_string()], [&t])?;
/// watch.check()?;                                  // unchanged
/// t.set_data(&Tensor::zeros([4], (Kind::Double, tch::Device::Cpu)));
/// assert!(matches!(watch.check(), Err(Error::StaleGraph { .. })));
/// # Ok::<(), Error>(())
/// ```
#[derive(Debug)]
pub struct TensorWatch {
    raw: NonNull<ffi::tcg_watch>,
    names: Vec<String>,
}

// SAFETY: the C++ watch holds at::Tensor references (atomically reference-counted, usable from
// any thread) and plain data; it has no thread affinity. Mutation goes through `&mut self` and
// `check` only reads, but we do not claim Sync since nothing needs it.
unsafe impl Send for TensorWatch {}

impl TensorWatch {
    /// An empty watch.
    pub fn new() -> Result<Self> {
        let mut raw = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out pointer; on success it holds a watch we own.
        check(unsafe { ffi::tcg_watch_new(&mut raw) })?;
        let raw = NonNull::new(raw).ok_or_else(|| Error::Libtorch("tensor watch: null handle".into()))?;
        Ok(TensorWatch { raw, names: Vec::new() })
    }

    /// Adds `tensors` (named by `names`, in order, for error messages), recording their storage
    /// now. The watch keeps them alive.
    pub fn add<'a>(
        &mut self,
        names: impl IntoIterator<Item = String>,
        tensors: impl IntoIterator<Item = &'a Tensor>,
    ) -> Result<()> {
        let ptrs = ffi::tensor_ptrs(tensors);
        let names: Vec<String> = names.into_iter().collect();
        if names.len() != ptrs.len() {
            return Err(Error::Misuse(format!("watch: {} names for {} tensors", names.len(), ptrs.len())));
        }
        // SAFETY: `self.raw` is live; `ptrs` holds live tensor handles borrowed for the call
        // (the shim copies the at::Tensor references it keeps).
        check(unsafe { ffi::tcg_watch_add(self.raw.as_ptr(), ptrs.as_ptr(), ptrs.len()) })?;
        self.names.extend(names);
        Ok(())
    }

    /// How many tensors are watched.
    pub fn len(&self) -> usize {
        self.names.len()
    }

    /// Whether nothing is watched.
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    /// Records what every watched tensor's storage, dtype and shape are now, so that
    /// [`check`](Self::check) compares with them from here on (after whatever uses the tensors
    /// was rebuilt on the new storage, e.g. [`crate::TrainStep::recapture`]).
    pub fn refresh(&mut self) -> Result<()> {
        // SAFETY: `self.raw` is live and exclusively borrowed; the shim re-reads the tensors it holds.
        check(unsafe { ffi::tcg_watch_refresh(self.raw.as_ptr()) })
    }

    /// `Ok` when every watched tensor still has the storage, dtype and shape it had when added;
    /// otherwise [`Error::StaleGraph`] naming the first that changed.
    pub fn check(&self) -> Result<()> {
        let mut index = usize::MAX;
        // SAFETY: `self.raw` is live; `index` is a valid out pointer. The shim only reads.
        let status = unsafe { ffi::tcg_watch_check(self.raw.as_ptr(), &mut index) };
        if status != ffi::TCG_STALE {
            return check(status);
        }
        let detail = take_message();
        let what = self.names.get(index).cloned().unwrap_or_else(|| format!("watched tensor #{index}"));
        Err(Error::StaleGraph { what, detail })
    }
}

impl Drop for TensorWatch {
    fn drop(&mut self) {
        // SAFETY: `raw` came from tcg_watch_new and is freed exactly once, here; the shim's
        // free never throws.
        unsafe { ffi::tcg_watch_free(self.raw.as_ptr()) }
    }
}

/// Bytes of the storage `t` views (0 for an undefined tensor): more than `t`'s own bytes when it
/// is a view into a larger buffer, which keeps the whole buffer alive.
pub(crate) fn storage_nbytes(t: &Tensor) -> Result<usize> {
    let mut n = 0usize;
    // SAFETY: `t` is live for the call; `n` is a valid out pointer. The shim only reads.
    check(unsafe { ffi::tcg_tensor_storage_nbytes(ffi::tensor_ptr(t), &mut n) })?;
    Ok(n)
}
