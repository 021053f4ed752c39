//! CUDA devices: availability and synchronization.

use crate::error::{Error, Result};
use crate::sys;
use tch::Device;

/// Whether this crate was compiled against a libtorch with CUDA.
pub fn built_with_cuda() -> bool {
    sys::device::built_with_cuda()
}

/// The number of visible CUDA devices (0 without a driver, a GPU, or a CUDA build).
pub fn cuda_device_count() -> usize {
    sys::device::device_count().map_or(0, |n| n.max(0) as usize)
}

/// Whether at least one CUDA device is usable by this crate.
pub fn cuda_is_available() -> bool {
    cuda_device_count() > 0
}

/// The current CUDA device of this thread.
pub fn current_device() -> Result<Device> {
    Ok(Device::Cuda(sys::device::current_device()?.max(0) as usize))
}

/// The CUDA index of `device`, or [`Error::Misuse`] for a non-CUDA device
/// ([`Error::NoCuda`] when no CUDA device exists at all).
pub fn cuda_index(device: Device) -> Result<i32> {
    match device {
        Device::Cuda(i) => i32::try_from(i).map_err(|_| Error::Misuse(format!("CUDA device index {i} is too large"))),
        other => {
            if cuda_is_available() {
                Err(Error::Misuse(format!("{other:?} is not a CUDA device")))
            } else {
                Err(Error::NoCuda(format!("{other:?} is not a CUDA device and no CUDA device is available")))
            }
        }
    }
}

/// Blocks the host until all work queued on `device` (every stream) has finished.
pub fn synchronize(device: Device) -> Result<()> {
    let idx = cuda_index(device)?;
    sys::device::device_synchronize(idx)
}
