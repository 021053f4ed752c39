//! Feeding batches from the CPU without blocking the host, and reading metrics without syncs.
//!
//! - [`pinned`], [`pinned_empty`], [`is_pinned`]: page-locked host buffers, the kind a copy to
//!   the GPU can read asynchronously.
//! - [`copy_non_blocking`]: `dst.copy_(src, non_blocking=true)`.
//! - [`DeviceMeter`]: sums a metric (the loss) on the device; read it every N steps.
//! - `Stager` (internal, used by [`crate::TrainStep::run`] for CPU batches): copies each batch
//!   to the device on a copy stream into one of two staging sets, ordered with events, so the
//!   copy of the next batch overlaps the graph of the current one.

use crate::error::{Error, Result};
use crate::stream::{Event, Stream, StreamGuard};
use crate::sys::feed as sys;
use tch::{Device, Kind, Tensor};

/// `dst.copy_(src, non_blocking=true)`: from pinned host memory, or between device tensors, the
/// copy is queued on the current stream and the host does not wait. From pageable host memory
/// CUDA copies synchronously. `src` must not be overwritten until the copy has run.
pub fn copy_non_blocking(dst: &mut Tensor, src: &Tensor) -> Result<()> {
    sys::copy(dst, src, true)
}

/// A pinned copy of `t` (CPU), through the shim (libtorch's `pin_memory()` without the
/// deprecated device argument).
fn pin(t: &Tensor) -> Result<Tensor> {
    if !crate::device::cuda_is_available() {
        return Err(Error::NoCuda("pinned memory needs CUDA".into()));
    }
    sys::pin(t)
}

/// A page-locked (pinned) copy of the CPU tensor `t`. [`Error::NoCuda`] without CUDA.
///
/// ```no_run
/// # fn main() -> tch_cuda_graphs::Result<()> {
/// let x = tch::Tensor::randn([64, 32], (tch::Kind::Float, tch::Device::Cpu));
/// let xp = tch_cuda_graphs::feed::pinned(&x)?;
/// assert!(tch_cuda_graphs::feed::is_pinned(&xp));
/// # Ok(()) }
/// ```
pub fn pinned(t: &Tensor) -> Result<Tensor> {
    if t.device() != Device::Cpu {
        return Err(Error::Misuse(format!("pinned: the tensor is on {:?}, not the CPU", t.device())));
    }
    pin(t)
}

/// An uninitialized page-locked CPU tensor. [`Error::NoCuda`] without CUDA.
pub fn pinned_empty(shape: &[i64], kind: Kind) -> Result<Tensor> {
    pin(&Tensor::f_empty(shape, (kind, Device::Cpu))?)
}

/// Whether `t` lives in page-locked host memory (false for device tensors, and without CUDA).
pub fn is_pinned(t: &Tensor) -> bool {
    sys::is_pinned(t).unwrap_or(false)
}

/// Sums a scalar metric on the device, so a training loop reads it every N steps instead of
/// syncing on every step. Graphed outputs are overwritten in place by each replay: add them
/// right after the step that produced them (the add is queued on the same stream, after it).
///
/// ```no_run
/// # fn main() -> tch_cuda_graphs::Result<()> {
/// # let loss = tch::Tensor::from(1.0f32);
/// let mut meter = tch_cuda_graphs::feed::DeviceMeter::new();
/// meter.add(&loss)?;          // no sync
/// let mean = meter.take()?;   // one sync: Some(mean) since the last take
/// # let _ = mean; Ok(()) }
/// ```
#[derive(Debug, Default)]
pub struct DeviceMeter {
    sum: Option<Tensor>,
    count: u64,
}

impl DeviceMeter {
    /// An empty meter.
    pub fn new() -> Self {
        DeviceMeter::default()
    }

    /// Adds `value` (a one-element tensor, on any device) to the sum, in float64, on its device.
    pub fn add(&mut self, value: &Tensor) -> Result<()> {
        let v = value.f_detach()?.f_to_kind(Kind::Double)?.f_sum(Kind::Double)?;
        match &mut self.sum {
            Some(s) => {
                let _ = s.f_add_(&v)?;
            }
            None => self.sum = Some(v),
        }
        self.count += 1;
        Ok(())
    }

    /// How many values were added since the last [`take`](Self::take).
    pub fn count(&self) -> u64 {
        self.count
    }

    /// The mean of the values added since the last take (`None` if none), and a fresh start.
    /// Reads the device: one sync.
    pub fn take(&mut self) -> Result<Option<f64>> {
        let count = std::mem::take(&mut self.count);
        match self.sum.take() {
            Some(s) if count > 0 => Ok(Some(f64::try_from(&s)? / count as f64)),
            _ => Ok(None),
        }
    }
}

/// One of the two staging sets of a [`Stager`].
struct StageSet {
    /// Device buffers the copy stream writes (shapes and dtypes of the static inputs).
    device: Vec<Tensor>,
    /// Pinned host buffers for inputs that arrive in pageable memory (made on first need).
    host: Vec<Option<Tensor>>,
    /// Recorded on the copy stream after this set's copies to the device.
    copied: Event,
    /// Recorded on the compute stream after the static inputs were filled from this set.
    consumed: Event,
    used: bool,
}

/// Copies CPU batches into static inputs through a copy stream and two staging sets (see the
/// module docs). Every ordering is an event: the host never waits, except before reusing a
/// pinned host buffer whose previous copy (two batches ago) has not finished.
pub(crate) struct Stager {
    sets: [StageSet; 2],
    next: usize,
    copy_stream: Stream,
    device: Device,
}

impl Stager {
    pub(crate) fn new(device: Device, statics: &[Tensor]) -> Result<Self> {
        let set = || -> Result<StageSet> {
            Ok(StageSet {
                device: statics.iter().map(|s| Ok(s.f_empty_like()?)).collect::<Result<Vec<_>>>()?,
                host: statics.iter().map(|_| None).collect(),
                copied: Event::new(device)?,
                consumed: Event::new(device)?,
                used: false,
            })
        };
        let sets = [set()?, set()?];
        // The staging buffers were allocated on the compute stream, which may still have work
        // queued on those blocks' previous tensors; the copy stream writes them, so it waits for
        // that work first (the caching allocator orders reuse only on the allocating stream).
        let copy_stream = Stream::from_pool(device)?;
        copy_stream.wait_stream(&Stream::current(device)?)?;
        Ok(Stager { sets, next: 0, copy_stream, device })
    }

    /// Fills `statics` (on the compute stream, the current one) from the CPU tensors `batch`.
    /// Call it on the stream the stager was made on.
    pub(crate) fn feed(&mut self, statics: &mut [Tensor], batch: &[&Tensor]) -> Result<()> {
        let set = &mut self.sets[self.next];
        self.next ^= 1;
        if set.used {
            // the compute stream has finished reading this set (two batches ago)
            self.copy_stream.wait_event(&set.consumed)?;
        }
        let pinned_src: Vec<bool> = batch.iter().map(|b| is_pinned(b)).collect();
        if set.used && pinned_src.iter().any(|p| !p) {
            set.copied.synchronize()?; // this set's host buffers are free again
        }
        {
            let _on_copy_stream = StreamGuard::new(&self.copy_stream)?;
            for (i, b) in batch.iter().enumerate() {
                let dst = &mut set.device[i];
                if pinned_src[i] {
                    copy_non_blocking(dst, b)?;
                } else {
                    let host = match &mut set.host[i] {
                        Some(h) => h,
                        empty => empty.insert(pinned_empty(&dst.size(), dst.kind())?),
                    };
                    host.f_copy_(b)?; // CPU to pinned: a host memcpy
                    copy_non_blocking(dst, host)?;
                }
            }
            set.copied.record(&self.copy_stream)?;
        }
        let compute = Stream::current(self.device)?;
        compute.wait_event(&set.copied)?;
        for (dst, src) in statics.iter_mut().zip(&set.device) {
            copy_non_blocking(dst, src)?; // device to device, on the compute stream
        }
        set.consumed.record(&compute)?;
        set.used = true;
        Ok(())
    }
}

impl Drop for Stager {
    /// The staging buffers go back to the caching allocator on the compute stream, which knows
    /// nothing of the copy stream: the compute stream first waits for the copies still writing
    /// them. Errors cannot be reported from a drop; a failed wait leaves the order to CUDA's.
    fn drop(&mut self) {
        if let Ok(compute) = Stream::current(self.device) {
            for set in self.sets.iter().filter(|s| s.used) {
                let _ = compute.wait_event(&set.copied);
            }
        }
    }
}
