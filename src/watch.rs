//! [`TensorWatch`]: tensors kept alive together with the storage they had, checked in one call.
//!
//! A captured graph reads and writes the addresses its tensors had at capture. If a tensor's
//! storage is replaced afterwards (`set_data`, `VarStore::set_kind`, a resize), the graph would
//! silently keep working on the old (possibly freed) memory. A watch notices.

use crate::error::{Error, Result};
use crate::sys::watch::{self as sys, Checked, WatchHandle};
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
    handle: WatchHandle,
    names: Vec<String>,
}

impl TensorWatch {
    /// An empty watch.
    pub fn new() -> Result<Self> {
        Ok(TensorWatch { handle: WatchHandle::new()?, names: Vec::new() })
    }

    /// Adds `tensors` (named by `names`, in order, for error messages), recording their storage
    /// now. The watch keeps them alive.
    pub fn add<'a>(
        &mut self,
        names: impl IntoIterator<Item = String>,
        tensors: impl IntoIterator<Item = &'a Tensor>,
    ) -> Result<()> {
        let tensors: Vec<&Tensor> = tensors.into_iter().collect();
        let names: Vec<String> = names.into_iter().collect();
        if names.len() != tensors.len() {
            return Err(Error::Misuse(format!("watch: {} names for {} tensors", names.len(), tensors.len())));
        }
        self.handle.add(&tensors)?;
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
        self.handle.refresh()
    }

    /// `Ok` when every watched tensor still has the storage, dtype and shape it had when added;
    /// otherwise [`Error::StaleGraph`] naming the first that changed.
    pub fn check(&self) -> Result<()> {
        match self.handle.check()? {
            Checked::Unchanged => Ok(()),
            Checked::Stale { index, detail } => {
                let what = self.names.get(index).cloned().unwrap_or_else(|| format!("watched tensor #{index}"));
                Err(Error::StaleGraph { what, detail })
            }
        }
    }
}

/// Bytes of the storage `t` views (0 for an undefined tensor): more than `t`'s own bytes when it
/// is a view into a larger buffer, which keeps the whole buffer alive.
pub(crate) fn storage_nbytes(t: &Tensor) -> Result<usize> {
    sys::storage_nbytes(t)
}
