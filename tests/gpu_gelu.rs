//! Bias + GELU on the crate's kernels (`gelu::f_bias_gelu`) against ATen's composition,
//! `gelu(x + bias)`, on a GPU, both forms (exact and tanh), each figure printed: float32 within
//! 1e-6 of the largest value forward and backward, the bias gradient (summed in the backward's
//! pass) within 1e-5; bf16 within one bf16 ulp of the exact values rounded once (the exact form:
//! x · Φ(x) through erfc in float64; the tanh form: ATen's float32 computation on the same
//! values); the exact form's tail, relative to the exact values; the choice of kernels
//! (`Kernels::Own` refuses, `Kernels::Auto` falls back) and typed errors. Ignored without a GPU;
//! fails loudly there.
mod common;

use common::{bf16_ulps, captured_minus_eager, cuda, rel};
use tch::{Kind, Tensor};
use tch_cuda_graphs::gelu::{Gelu, GeluApproximate, GeluConfig};
use tch_cuda_graphs::kernels::{KernelPath, Kernels};
use tch_cuda_graphs::Error;

/// y, dx and dbias of `module` on x and bias, the loss sum(y · w).
fn run(module: &Gelu, x: &Tensor, bias: &Tensor, w: &Tensor) -> (Tensor, Tensor, Tensor) {
    let (x, bias) = (x.detach().set_requires_grad(true), bias.detach().set_requires_grad(true));
    let y = module.f_forward_biased(&x, Some(&bias)).expect("gelu");
    (&y.to_kind(Kind::Float) * w).sum(Kind::Float).backward();
    (y, x.grad(), bias.grad())
}

#[test]
#[ignore = "needs a CUDA device"]
fn bias_gelu_kernels_match_the_composition() {
    let dev = cuda();
    for approximate in [GeluApproximate::None, GeluApproximate::Tanh] {
        tch::manual_seed(5);
        let (rows, f) = (12288, 3072);
        let x = Tensor::randn([rows, f], (Kind::Float, dev)) * 2.0;
        let bias = Tensor::randn([f], (Kind::Float, dev)) * 0.5;
        let w = Tensor::randn([rows, f], (Kind::Float, dev));
        let own = Gelu::new(GeluConfig { approximate, kernels: Kernels::Own });
        let aten = Gelu::new(GeluConfig { approximate, kernels: Kernels::PyTorch });
        let (y1, dx1, db1) = run(&own, &x, &bias, &w);
        assert_eq!(own.last_path(), Some(KernelPath::Own));
        let (y2, dx2, db2) = run(&aten, &x, &bias, &w);
        assert_eq!(aten.last_path(), Some(KernelPath::PyTorch));
        let (fy, fx, fb) = (rel(&y1, &y2), rel(&dx1, &dx2), rel(&db1, &db2));
        println!(
            "gelu {approximate:?} fp32 [{rows}, {f}]: y {fy:e}, dx {fx:e}, dbias {fb:e} (relative to ATen's add and gelu); y equal {}",
            y1.equal(&y2)
        );
        assert!(fy <= 1e-6 && fx <= 1e-6 && fb <= 1e-5);
        // bf16 x (a linear layer's output), fp32 bias: against the fp32 computation on the same
        // values, rounded once
        let xb = x.to_kind(Kind::BFloat16);
        let wb = w.to_kind(Kind::BFloat16).to_kind(Kind::Float);
        let (y3, dx3, db3) = run(&own, &xb, &bias, &wb);
        let (y4, dx4, db4) = run(&aten, &xb.to_kind(Kind::Float), &bias, &wb);
        // the exact form against the exact values; its dx where |Φ + x·φ| ≥ 2^-10, away from
        // the derivative's zero at x ≈ -0.75, where float32's absolute error (2e-7, ATen's
        // computation's too) is many bf16 ulps of a value near 0 (the float32 check above
        // bounds it there)
        let (y4, dx4, keep) = match approximate {
            GeluApproximate::None => {
                let (y, g) = exact_gelu(&(xb.to_kind(Kind::Double) + bias.to_kind(Kind::Double)));
                let keep = g.abs().ge(1.0 / 1024.0);
                let aten_ulps = bf16_ulps(
                    &dx4.to_kind(Kind::BFloat16).masked_select(&keep),
                    &(&g * &wb).to_kind(Kind::BFloat16).masked_select(&keep),
                );
                println!("gelu exact bf16: ATen's float32 dx max {aten_ulps} ulp from the exact result rounded");
                (y, g * wb.to_kind(Kind::Double), keep)
            }
            _ => (y4, dx4, x.ones_like().to_kind(Kind::Bool)),
        };
        let uy = bf16_ulps(&y3, &y4.to_kind(Kind::BFloat16));
        let ux = bf16_ulps(&dx3.masked_select(&keep), &dx4.to_kind(Kind::BFloat16).masked_select(&keep));
        let fb = rel(&db3, &db4);
        println!(
            "gelu {approximate:?} bf16: y max {uy} ulp, dx max {ux} ulp from the exact result rounded; dbias {fb:e} relative to the fp32 one; dtypes {:?} {:?} {:?}",
            y3.kind(),
            dx3.kind(),
            db3.kind()
        );
        assert!(uy <= 1.0 && ux <= 1.0 && fb <= 1e-5);
        assert_eq!((y3.kind(), dx3.kind(), db3.kind()), (Kind::BFloat16, Kind::BFloat16, Kind::Float));
    }
}

/// x · Φ(x) and its derivative Φ(x) + x · φ(x) in float64, Φ through erfc (no cancellation
/// below 0, where 1 + erf(x/√2) loses every digit from x ≈ -8.3 on in float64).
fn exact_gelu(z: &Tensor) -> (Tensor, Tensor) {
    let cdf = (z * (-std::f64::consts::FRAC_1_SQRT_2)).erfc() * 0.5;
    let pdf = (z.square() * -0.5).exp() * (0.5 * std::f64::consts::FRAC_2_SQRT_PI * std::f64::consts::FRAC_1_SQRT_2);
    (z * &cdf, cdf + z * pdf)
}

/// The exact form in float32 over x from -14.5 to 14.5 keeps its relative accuracy in the
/// negative tail, where ATen's 0.5 · (1 + erf(x/√2)) cancels: against the exact values, each
/// figure printed, the kernel's within 2e-5 relative wherever x · Φ(x) is a normal float32, and
/// Φ(x) + x · φ(x) within 1e-6 absolute.
#[test]
#[ignore = "needs a CUDA device"]
fn exact_gelu_keeps_its_tail() {
    let dev = cuda();
    let x = Tensor::linspace(-14.5, 14.5, 1 << 20, (Kind::Float, dev)).reshape([256, -1]);
    let module = Gelu::new(GeluConfig { approximate: GeluApproximate::None, kernels: Kernels::Own });
    let ones = Tensor::ones([256, 4096], (Kind::Float, dev));
    let (y, dx, _) = run(&module, &x, &Tensor::zeros([4096], (Kind::Float, dev)), &ones);
    assert_eq!(module.last_path(), Some(KernelPath::Own));
    let (ye, ge) = exact_gelu(&x.to_kind(Kind::Double));
    let normal = ye.abs().ge(f64::from(f32::MIN_POSITIVE));
    let relative = |a: &Tensor| -> f64 {
        let r = (a.to_kind(Kind::Double) - &ye).abs() / ye.abs().clamp_min(1e-300);
        f64::try_from(r.masked_select(&normal).max()).unwrap()
    };
    let (ry, ra) = (relative(&y), relative(&x.gelu("none")));
    let gx = f64::try_from((dx.to_kind(Kind::Double) - &ge).abs().max()).unwrap();
    println!(
        "exact GELU, float32, x in [-14.5, 14.5]: y within {ry:e} relative where normal (ATen's: {ra:e}); derivative within {gx:e} absolute"
    );
    assert!(ry <= 2e-5 && gx <= 1e-6);
}

/// A captured forward and backward equals its eager run bit for bit, and the choice of kernels
/// and the typed errors.
#[test]
#[ignore = "needs a CUDA device"]
fn bias_gelu_captures_and_refuses_bad_input() {
    let dev = cuda();
    tch::manual_seed(6);
    let x0 = Tensor::randn([1000, 512], (Kind::BFloat16, dev));
    let bias0 = Tensor::randn([512], (Kind::Float, dev));
    let module = Gelu::new(GeluConfig::default());
    // fresh leaves each call: no autograd node outlives its stream
    let step = || -> tch_cuda_graphs::Result<Tensor> {
        let (x, bias) = (x0.detach().set_requires_grad(true), bias0.detach().set_requires_grad(true));
        let y = module.f_forward_biased(&x, Some(&bias))?;
        let loss = y.to_kind(Kind::Float).square().sum(Kind::Float);
        let g =
            tch_cuda_graphs::autograd::grad(&[loss], &[x.shallow_clone(), bias.shallow_clone()], None, false, false)?;
        let (dx, db) = (g[0].as_ref().expect("x was used"), g[1].as_ref().expect("the bias was used"));
        Ok(Tensor::cat(
            &[y.to_kind(Kind::Float).reshape([-1]), dx.to_kind(Kind::Float).reshape([-1]), db.reshape([-1])],
            0,
        ))
    };
    let d = captured_minus_eager(step);
    println!("captured bias + GELU forward and backward against eager: max |difference| {d:e}");
    assert_eq!(d, 0.0);

    let odd = Tensor::randn([8, 30], (Kind::Float, dev));
    let own = Gelu::new(GeluConfig { kernels: Kernels::Own, ..Default::default() });
    match own.f_forward(&odd) {
        Err(Error::Unsupported(why)) => println!("Kernels::Own on width 30: {why}"),
        other => panic!("expected Unsupported, got {other:?}"),
    }
    let auto = Gelu::new(GeluConfig::default());
    let (ya, yr) = (auto.f_forward(&odd).expect("auto"), odd.gelu("none"));
    assert!(auto.last_path() == Some(KernelPath::PyTorch) && ya.equal(&yr), "Auto falls back to ATen's gelu");
    let wrong = Tensor::zeros([29], (Kind::Float, dev));
    assert!(matches!(auto.f_forward_biased(&odd, Some(&wrong)), Err(Error::Misuse(_))));
    let ints = Tensor::zeros([8, 32], (Kind::Int, dev));
    assert!(matches!(auto.f_forward(&ints), Err(Error::Misuse(_))));
}
