//! The crate's fused cross-entropy (`loss::CrossEntropyLoss`) against ATen's on a GPU: float32 logits
//! (the loss and the gradient within 1e-5 of ATen's, relative, for a character vocabulary, GPT-2's
//! and a tiny one), bf16 logits under autocast as the GPT's head makes them (the loss within 1e-5 of
//! the float32 computation on the same values, the bf16 gradient within one bf16 rounding of it;
//! ATen's autocast path printed beside), ignored targets
//! (not counted, zero gradient; all ignored: NaN as ATen), and the choice of kernels
//! (`Kernels::Own` refuses CPU logits, `Kernels::Auto` falls back).
//! Ignored without a GPU; fails loudly there.
mod common;

use common::{cross_entropy_ran, cuda};
use tch::{Device, Kind, Reduction, Tensor};
use tch_cuda_graphs::amp::Autocast;
use tch_cuda_graphs::kernels::Kernels;
use tch_cuda_graphs::loss::CrossEntropyConfig;
use tch_cuda_graphs::Error;

/// max |a - b| / max |b|.
fn rel(a: &Tensor, b: &Tensor) -> f64 {
    let (a, b) = (a.to_kind(Kind::Float), b.to_kind(Kind::Float));
    f64::try_from((&a - &b).abs().max()).unwrap() / f64::try_from(b.abs().max()).unwrap().max(1e-30)
}

/// (loss, gradient of the logits, whether the fused kernels ran) of `kernels` on `logits0`,
/// under bf16 autocast when `autocast`.
fn run(logits0: &Tensor, targets: &Tensor, kernels: Kernels, autocast: bool) -> (Tensor, Tensor, bool) {
    let logits = logits0.detach().set_requires_grad(true);
    let (loss, ran) = {
        let _guard = autocast.then(|| Autocast::new(Kind::BFloat16, false).expect("autocast"));
        let config = CrossEntropyConfig { kernels, ..Default::default() };
        cross_entropy_ran(&logits, targets, &config).expect("cross_entropy")
    };
    (loss.shallow_clone() * 3.0).backward(); // a gradient of the loss other than 1
    (loss, logits.grad(), ran)
}

#[test]
#[ignore = "needs a CUDA device"]
fn fused_cross_entropy_matches_aten() {
    let dev = cuda();
    for (rows, classes) in [(16384i64, 65i64), (2048, 50304), (3, 7), (4096, 1024)] {
        tch::manual_seed(4);
        let logits = Tensor::randn([rows, classes], (Kind::Float, dev)) * 4.0;
        let targets = Tensor::randint(classes, [rows], (Kind::Int64, dev));
        let (lf, gf, ran) = run(&logits, &targets, Kernels::Own, false);
        let (la, ga, _) = run(&logits, &targets, Kernels::PyTorch, false);
        assert!(ran, "the fused kernels ran");
        let (loss_rel, grad_rel) = (rel(&lf, &la), rel(&gf, &ga));
        println!(
            "fp32 [{rows}, {classes}]: loss {:.6} / ATen {:.6}, max |fused - ATen| / max |ATen|: loss {loss_rel:e}, gradient {grad_rel:e}",
            f64::try_from(&lf).unwrap(),
            f64::try_from(&la).unwrap()
        );
        assert!(loss_rel <= 1e-5 && grad_rel <= 1e-5, "fp32 within 1e-5 of ATen");

        // bf16 logits under autocast, as the GPT's head makes them, against the exact float32
        // computation on the same values (ATen on the logits cast to float32, no autocast)
        let lb = logits.to_kind(Kind::BFloat16);
        let (lf, gf, _) = run(&lb, &targets, Kernels::Own, true);
        let (la, ga, _) = run(&lb, &targets, Kernels::PyTorch, true);
        let (lr, gr, _) = run(&lb.to_kind(Kind::Float), &targets, Kernels::PyTorch, false);
        assert_eq!((lf.kind(), gf.kind(), ga.kind()), (Kind::Float, Kind::BFloat16, Kind::BFloat16));
        let (loss_rel, grad_rel) = (rel(&lf, &lr), rel(&gf, &gr));
        println!(
            "bf16 [{rows}, {classes}] under autocast, max |x - fp32 reference| / max |reference|: fused: loss {loss_rel:e}, gradient {grad_rel:e}; ATen under autocast: loss {:e}, gradient {:e}",
            rel(&la, &lr),
            rel(&ga, &gr)
        );
        assert!(loss_rel <= 1e-5, "bf16: the loss within 1e-5 of the fp32 computation");
        assert!(grad_rel <= 1.0 / 128.0, "bf16: the gradient within a bf16 rounding");
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn ignored_targets_are_not_counted() {
    let dev = cuda();
    tch::manual_seed(5);
    let logits = Tensor::randn([64, 96], (Kind::Float, dev));
    let targets = Tensor::randint(96, [64], (Kind::Int64, dev));
    let _ = targets.narrow(0, 0, 16).fill_(-1);
    let config = CrossEntropyConfig { ignore_index: -1, kernels: Kernels::Own };
    let l = logits.detach().set_requires_grad(true);
    let (loss, ran) = cross_entropy_ran(&l, &targets, &config).expect("fused");
    loss.backward();
    let expected = logits.cross_entropy_loss::<Tensor>(&targets, None, Reduction::Mean, -1, 0.0);
    let diff = f64::try_from((&loss - &expected).abs()).unwrap();
    let ignored_grad = f64::try_from(l.grad().narrow(0, 0, 16).abs().max()).unwrap();
    println!("16 of 64 rows ignored: loss {diff:e} from ATen's; max |gradient| on ignored rows {ignored_grad}");
    assert!(ran && diff <= 1e-5 && ignored_grad == 0.0);
    let all = Tensor::full([64], -1, (Kind::Int64, dev));
    let (nan, _) = cross_entropy_ran(&logits, &all, &config).expect("all ignored");
    assert!(f64::try_from(&nan).unwrap().is_nan(), "no row counted: NaN, as ATen's mean");
}

#[test]
#[ignore = "needs a CUDA device"]
fn own_kernels_refuse_cpu_logits_and_auto_falls_back() {
    let _ = cuda();
    let logits = Tensor::randn([8, 10], (Kind::Float, Device::Cpu));
    let targets = Tensor::randint(10, [8], (Kind::Int64, Device::Cpu));
    let own = CrossEntropyConfig { kernels: Kernels::Own, ..Default::default() };
    match cross_entropy_ran(&logits, &targets, &own) {
        Err(Error::Unsupported(why)) => println!("Kernels::Own on CPU logits: {why}"),
        other => panic!("expected Unsupported, got {other:?}"),
    }
    let (loss, ran) = cross_entropy_ran(&logits, &targets, &CrossEntropyConfig::default()).expect("auto");
    let expected = logits.cross_entropy_loss::<Tensor>(&targets, None, Reduction::Mean, -100, 0.0);
    assert!(!ran && loss.equal(&expected), "Auto falls back to ATen's cross_entropy_loss");
    // a misuse: targets of another length
    let short = Tensor::randint(10, [7], (Kind::Int64, Device::Cpu));
    assert!(matches!(cross_entropy_ran(&logits, &short, &own), Err(Error::Misuse(_))));
}

/// Where the loss will be differentiated, the fused forward writes the gradient as it reads the
/// logits (for a loss gradient of 1) and the backward scales it on the device: with a gradient
/// of 1 the result is the same as with a gradient of 0.5 doubled (a power of two: exact), the
/// loss without grad mode is the same loss, and a second backward through the same loss
/// (`retain_graph`) is refused with an error, not a gradient scaled twice.
#[test]
#[ignore = "needs a CUDA device"]
fn the_gradient_written_by_the_forward_is_scaled_once() {
    let dev = cuda();
    tch::manual_seed(9);
    let logits = Tensor::randn([256, 1000], (Kind::Float, dev)).to_kind(Kind::BFloat16);
    let targets = Tensor::randint(1000, [256], (Kind::Int64, dev));
    let config = CrossEntropyConfig { kernels: Kernels::Own, ..Default::default() };
    let grad_at = |scale: f64| {
        let l = logits.detach().set_requires_grad(true);
        let (loss, ran) = cross_entropy_ran(&l, &targets, &config).expect("fused");
        assert!(ran, "the fused kernels ran");
        (loss.shallow_clone() * scale).backward();
        (loss, l.grad())
    };
    let (loss1, g1) = grad_at(1.0);
    let (_, g_half) = grad_at(0.5);
    let doubled = (&g_half.to_kind(Kind::Float) * 2.0).to_kind(Kind::BFloat16);
    println!("gradient at 1 against the gradient at 0.5 doubled: equal {}", g1.equal(&doubled));
    assert!(g1.equal(&doubled), "the scale is applied on the device, once");
    let no_grad = tch::no_grad(|| cross_entropy_ran(&logits, &targets, &config).expect("no grad").0);
    assert!(no_grad.equal(&loss1), "the same loss without grad mode");

    let l = logits.detach().set_requires_grad(true);
    let (loss, _) = cross_entropy_ran(&l, &targets, &config).expect("fused");
    let first = Tensor::f_run_backward(&[&loss], &[&l], true, false).expect("the first backward");
    let second = Tensor::f_run_backward(&[&loss], &[&l], true, false);
    println!("a second backward through the fused loss: {:?}", second.as_ref().err());
    assert!(first[0].equal(&g1), "the first backward's gradient");
    assert!(second.is_err(), "a second backward is refused");
}
