//! `csrc/error.cpp`: the thread-local error message and fault injection.
use super::tcg_status;
use std::os::raw::c_char;

extern "C" {
    pub fn tcg_error_take_last() -> *mut c_char;
    pub fn tcg_string_free(s: *mut c_char);
    pub fn tcg_testing_fail_next(point: *const c_char) -> tcg_status;
}
