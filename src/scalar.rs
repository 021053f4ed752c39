//! Scalars as 0-d CPU tensors, for the crate's own ops on paths that may run under capture.
//!
//! tch 0.24's ops that take a `Scalar` (`f_add_scalar`, `f_mul_scalar`, `f_fill_`, `f_clamp`,
//! `f_le`, ...) panic instead of returning `Err` when the op fails: the temporary `Scalar`'s
//! `Drop` reads the error the op just left and unwraps it before the op's own `f_` wrapper can
//! return it. Under a capture that was invalidated (by a sync, or by another thread in global
//! mode) every op fails, so the crate passes scalars as 0-d CPU tensors instead: binary and
//! comparison ops (add, sub, mul, div, le, ...) take them like scalars (the value is read on the
//! host; no copy, no sync), with the same numerics. Ops with a device check on every argument
//! (`clamp_min.Tensor`, ...) refuse a CPU tensor beside CUDA ones: give those a device tensor
//! (`zeros_like`, `ones_like`).

use crate::error::Result;
use tch::Tensor;

/// `v` as a 0-d float64 CPU tensor, built without a tch `Scalar`.
pub(crate) fn cpu_f64(v: f64) -> Result<Tensor> {
    Ok(Tensor::f_from_slice(&[v])?.f_reshape([0i64; 0])?)
}

/// `v` as a 0-d int64 CPU tensor, built without a tch `Scalar`.
pub(crate) fn cpu_i64(v: i64) -> Result<Tensor> {
    Ok(Tensor::f_from_slice(&[v])?.f_reshape([0i64; 0])?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scalars_are_0d_cpu_tensors_of_the_value() {
        let f = cpu_f64(2.5).unwrap();
        assert_eq!((f.dim(), f.kind(), f.device()), (0, tch::Kind::Double, tch::Device::Cpu));
        assert_eq!(f64::try_from(&f).unwrap(), 2.5);
        let i = cpu_i64(-7).unwrap();
        assert_eq!((i.dim(), i.kind()), (0, tch::Kind::Int64));
        assert_eq!(i64::try_from(&i).unwrap(), -7);
    }
}
