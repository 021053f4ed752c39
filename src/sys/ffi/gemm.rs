//! `csrc/gemm.cpp`: how the crate's cuBLASLt GEMMs choose their algorithm.
use super::{c_enum, tcg_status};

c_enum!(tcg_gemm_choice { TCG_GEMM_HEURISTIC = 0, TCG_GEMM_TIMED = 1 });

extern "C" {
    pub fn tcg_gemm_set_choice(choice: tcg_gemm_choice) -> tcg_status;
    pub fn tcg_gemm_get_choice(out: *mut tcg_gemm_choice) -> tcg_status;
    pub fn tcg_gemm_shapes(chosen: *mut i64, timed: *mut i64) -> tcg_status;
}
