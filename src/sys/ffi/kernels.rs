//! `csrc/kernels.cpp`: which kernels run, the own kernels' availability.
use super::{c_enum, tcg_status};
use std::os::raw::c_int;

c_enum!(tcg_kernels { TCG_KERNELS_PYTORCH = 0, TCG_KERNELS_AUTO = 1, TCG_KERNELS_OWN = 2 });

extern "C" {
    pub fn tcg_kernels_built() -> bool;
    pub fn tcg_kernels_check(device: c_int) -> tcg_status;
}
