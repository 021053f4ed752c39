//! CUDA devices: availability and synchronization.

use crate::error::{check, Error, Result};
use crate::ffi;
use tch::Device;

/// Whether this crate was compiled against a libtorch with CUDA.
pub fn built_with_cuda() -> bool {
    // SAFETY: no arguments, no preconditions.
    unsafe { ffi::tcg_built_with_cuda() != 0 }
}

/// The number of visible CUDA devices (0 without a driver, a GPU, or a CUDA build).
pub fn cuda_device_count() -> usize {
    let mut n = 0;
    // SAFETY: `n` is a valid out pointer for the duration of the call.
    match check(unsafe { ffi::tcg_device_count(&mut n) }) {
        Ok(()) => n.max(0) as usize,
        Err(_) => 0,
    }
}

/// Whether at least one CUDA device is usable by this crate.
pub fn cuda_is_available() -> bool {
    cuda_device_count() > 0
}

/// The current CUDA device of this thread.
pub fn current_device() -> Result<Device> {
    let mut d = 0;
    // SAFETY: `d` is a valid out pointer for the duration of the call.
    check(unsafe { ffi::tcg_current_device(&mut d) })?;
    Ok(Device::Cuda(d as usize))
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
    // SAFETY: plain value argument; the shim validates the index.
    check(unsafe { ffi::tcg_device_synchronize(idx) })
}
