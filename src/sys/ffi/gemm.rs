//! `csrc/gemm.cpp`: how the crate's cuBLASLt GEMMs choose their algorithm.
use super::{c_enum, tcg_status};

c_enum!(tcg_gemm_choice { TCG_GEMM_HEURISTIC = 0, TCG_GEMM_TIMED = 1 });

/// The values of a GEMM shape's key (`TCG_GEMM_KEY_LEN`).
pub const TCG_GEMM_KEY_LEN: usize = 30;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct tcg_gemm_entry {
    pub key: [i64; TCG_GEMM_KEY_LEN],
    pub algo: [u64; 8],
    pub timed: bool,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct tcg_gemm_identity {
    pub device: [std::ffi::c_char; 256],
    pub cublaslt_version: i64,
    pub torch_version: i64,
}

extern "C" {
    pub fn tcg_gemm_set_choice(choice: tcg_gemm_choice) -> tcg_status;
    pub fn tcg_gemm_get_choice(out: *mut tcg_gemm_choice) -> tcg_status;
    pub fn tcg_gemm_shapes(chosen: *mut i64, timed: *mut i64, from_file: *mut i64) -> tcg_status;
    pub fn tcg_gemm_get_identity(out: *mut tcg_gemm_identity) -> tcg_status;
    pub fn tcg_gemm_export(out: *mut tcg_gemm_entry, cap: i64, n: *mut i64) -> tcg_status;
    pub fn tcg_gemm_import(entries: *const tcg_gemm_entry, n: i64) -> tcg_status;
}
