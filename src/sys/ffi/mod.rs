//! Raw declarations of the C shim (`csrc/tcg.h`), one module per shim family. Private to
//! [`crate::sys`], the safe layer; nothing else calls these.
//!
//! C enums are declared here as `#[repr(transparent)]` integers with named constants (as
//! bindgen's "newtype" enums), so a value the C side writes that this side does not name is a
//! value, never undefined behaviour. C `bool` is Rust `bool`. The structs both sides read are
//! checked field by field against C's `offsetof` by `sys::layout`.
#![allow(non_camel_case_types, missing_docs, dead_code)]

mod amp;
mod autograd;
mod cuda;
mod dist;
mod embedding;
mod error;
mod feed;
mod gelu;
mod gemm;
mod kernels;
#[cfg(test)]
mod layout;
mod linear;
mod loss;
mod mlp;
mod norm;
mod optim;
mod profiler;
mod rotary;
mod shadow;
mod swiglu;
mod watch;

pub use amp::*;
pub use autograd::*;
pub use cuda::*;
pub use dist::*;
pub use embedding::*;
pub use error::*;
pub use feed::*;
pub use gelu::*;
pub use gemm::*;
pub use kernels::*;
#[cfg(test)]
pub use layout::*;
pub use linear::*;
pub use loss::*;
pub use mlp::*;
pub use norm::*;
pub use optim::*;
pub use profiler::*;
pub use rotary::*;
pub use shadow::*;
pub use swiglu::*;
pub use watch::*;

/// Declares a C enum as a transparent integer with named constants.
macro_rules! c_enum {
    ($(#[$m:meta])* $name:ident { $($(#[$vm:meta])* $var:ident = $val:expr),* $(,)? }) => {
        $(#[$m])*
        #[repr(transparent)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
        pub struct $name(pub ::std::os::raw::c_int);
        impl $name {
            $($(#[$vm])* pub const $var: $name = $name($val);)*
        }
    };
}
pub(crate) use c_enum;

c_enum!(tcg_status {
    TCG_OK = 0,
    TCG_ERROR = 1,
    TCG_NO_CUDA = 2,
    TCG_CAPTURE_INVALIDATED = 3,
    TCG_MISUSE = 4,
    TCG_OUT_OF_MEMORY = 5,
    TCG_STALE = 6,
    TCG_DIST = 7,
    TCG_DIST_TIMEOUT = 8,
    TCG_UNSUPPORTED = 9,
});

/// tch's `C_tensor`: a pointer to a heap-allocated `at::Tensor`.
pub type tcg_tensor = *mut torch_sys::C_tensor;

/// A list of tensor handles the callee reads (`tcg_tensors` in C).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct tcg_tensors {
    pub data: *const tcg_tensor,
    pub len: usize,
}

impl tcg_tensors {
    /// The list over `v`, borrowed: `v` must outlive every use of the result.
    pub fn of(v: &[tcg_tensor]) -> Self {
        tcg_tensors { data: v.as_ptr(), len: v.len() }
    }
}
