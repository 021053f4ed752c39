//! The crate's fused cross-entropy (`loss::CrossEntropyLoss`) against ATen's on a GPU: float32 logits
//! (the loss and the gradient within 1e-5 of ATen's, relative, for a character vocabulary, GPT-2's
//! and a tiny one), bf16 logits under autocast as the GPT's head makes them (the loss within 1e-5 of
//! the float32 computation on the same values, the bf16 gradient within one bf16 rounding of it;
//! ATen's autocast path printed beside), ignored targets
//! (not counted, zero gradient; all ignored: NaN as ATen), and the choice of kernels
//! (`Kernels::Own` refuses CPU logits, `Kernels::Auto` falls back).
//! Ignored without a GPU; fails loudly there.
mod common;

use common::{captured_minus_eager, cross_entropy_ran, cuda};
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
    // [2048, 50304] and [1001, 131072]: rows wide enough that their blocks get 1024 threads
    for (rows, classes) in [(16384i64, 65i64), (2048, 50304), (3, 7), (4096, 1024), (1001, 131072)] {
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

/// The head's GEMM and the loss over `h` and `head`, and their gradients: chunked
/// (`f_linear_cross_entropy`) or the fused loss on the whole logits (`linear::f_apply` +
/// `f_cross_entropy`), under bf16 autocast; with the peak of allocated bytes over the call.
fn head_and_loss(
    h0: &Tensor,
    head0: &Tensor,
    targets: &Tensor,
    chunk_rows: Option<i64>,
) -> (Tensor, Tensor, Tensor, i64) {
    use tch_cuda_graphs::linear::{f_apply, LinearConfig};
    use tch_cuda_graphs::loss::{f_cross_entropy, f_linear_cross_entropy, LinearCrossEntropyConfig};
    let dev = h0.device();
    let (h, head) = (h0.detach().set_requires_grad(true), head0.detach().set_requires_grad(true));
    tch_cuda_graphs::synchronize(dev).unwrap();
    let before = tch_cuda_graphs::memory_stats(dev).unwrap().allocated;
    tch_cuda_graphs::reset_peak_stats(dev).unwrap();
    let loss = {
        let _bf16 = Autocast::new(Kind::BFloat16, false).unwrap();
        match chunk_rows {
            Some(chunk_rows) => {
                let config = LinearCrossEntropyConfig { chunk_rows, kernels: Kernels::Own, ..Default::default() };
                f_linear_cross_entropy(&h, &head, targets, &config).unwrap()
            }
            None => {
                let logits =
                    f_apply(&h, &head, None, &LinearConfig { kernels: Kernels::Own, ..Default::default() }).unwrap();
                let c = CrossEntropyConfig { kernels: Kernels::Own, ..Default::default() };
                f_cross_entropy(&logits.view([-1, head.size()[0]]), &targets.view([-1]), &c).unwrap()
            }
        }
    };
    loss.backward();
    tch_cuda_graphs::synchronize(dev).unwrap();
    let peak = tch_cuda_graphs::memory_stats(dev).unwrap().allocated_peak - before;
    (loss.detach(), h.grad(), head.grad(), peak)
}

/// The largest difference between a captured and an eager `f_linear_cross_entropy` under bf16
/// autocast with its backward for a loss gradient of 3 (the loss and both gradients).
fn head_and_loss_captured_minus_eager(
    h: &Tensor,
    head: &Tensor,
    targets: &Tensor,
    config: &tch_cuda_graphs::loss::LinearCrossEntropyConfig,
) -> f64 {
    let step = || -> tch_cuda_graphs::Result<Tensor> {
        let (hh, ww) = (h.detach().set_requires_grad(true), head.detach().set_requires_grad(true));
        let loss = {
            let _bf16 = Autocast::new(Kind::BFloat16, false)?;
            tch_cuda_graphs::loss::f_linear_cross_entropy(&hh, &ww, targets, config)?
        };
        let g = tch_cuda_graphs::autograd::grad(
            &[&loss * 3.0],
            &[hh.shallow_clone(), ww.shallow_clone()],
            None,
            false,
            false,
        )?;
        let parts =
            [loss.detach().reshape([-1]), g[0].as_ref().unwrap().reshape([-1]), g[1].as_ref().unwrap().reshape([-1])];
        Ok(Tensor::cat(&parts, 0))
    };
    captured_minus_eager(step)
}

/// The chunked head + loss (`loss::f_linear_cross_entropy`) against the fused loss on the whole
/// logits, at GPT-2 small's head (8192 tokens × 768 → 50,304, some targets ignored): the loss
/// within 1e-5, the gradients within 1e-2 of the largest (bf16 logits' roundings; the weight's
/// summed in float32 over the chunks), the peak of allocated memory printed and below the whole
/// logits' by at least their gradient; a captured loss and backward equals eager bit for bit; a
/// target count that does not match is a misuse.
#[test]
#[ignore = "needs a CUDA device"]
fn the_chunked_head_and_loss_matches_the_whole_logits_in_less_memory() {
    use tch_cuda_graphs::loss::{f_linear_cross_entropy, LinearCrossEntropyConfig};
    let dev = cuda();
    tch::manual_seed(3);
    let (rows, c, v) = (8192, 768, 50304);
    let h = Tensor::randn([4, rows / 4, c], (Kind::Float, dev));
    let head = Tensor::randn([v, c], (Kind::Float, dev)) * 0.05;
    let targets = Tensor::randint(v, [4, rows / 4], (Kind::Int64, dev));
    let _ = targets.narrow(1, 0, 7).fill_(-100);
    let (l1, dh1, dw1, whole) = head_and_loss(&h, &head, &targets, None);
    let (l2, dh2, dw2, chunked) = head_and_loss(&h, &head, &targets, Some(1000));
    let (l3, _, _, auto) = head_and_loss(&h, &head, &targets, Some(0));
    let (fl, fh, fw) = (rel(&l2, &l1), rel(&dh2, &dh1), rel(&dw2, &dw1));
    let mib = |b: i64| b as f64 / (1u64 << 20) as f64;
    println!(
        "chunked (1000 rows) against the whole logits: loss {fl:e} ({:.6} / {:.6}), dh {fh:e}, dW {fw:e}; auto chunks: loss {:e}",
        f64::try_from(&l2).unwrap(),
        f64::try_from(&l1).unwrap(),
        rel(&l3, &l1)
    );
    println!(
        "peak allocated over the head, loss and backward: whole logits {:.0} MiB, chunks of 1000 rows {:.0} MiB, auto chunks {:.0} MiB",
        mib(whole),
        mib(chunked),
        mib(auto)
    );
    assert!(fl <= 1e-5 && fh <= 1e-2 && fw <= 1e-2);
    assert_eq!((dh2.kind(), dw2.kind()), (Kind::Float, Kind::Float));
    let logits_bytes = rows * v * 2;
    assert!(chunked + logits_bytes <= whole, "the chunks save at least the logits' gradient");

    // captured == eager
    let config = LinearCrossEntropyConfig { chunk_rows: 3000, ..Default::default() };
    let d = head_and_loss_captured_minus_eager(&h, &head, &targets, &config);
    println!("captured chunked head + loss (gradient scaled by 3) against eager: max |difference| {d:e}");
    assert_eq!(d, 0.0);

    let short = targets.narrow(1, 0, 10);
    let e = f_linear_cross_entropy(&h, &head, &short, &LinearCrossEntropyConfig::default()).expect_err("misuse");
    assert!(matches!(e, Error::Misuse(_)), "{e:?}");
}

/// The head and loss with the exponentials in the head's GEMM (`LinearCrossEntropyMethod::ExpInHead`)
/// at the 124 M Llama's head (12,288 tokens × 768 → 32,000, some targets ignored) under bf16
/// autocast, against the same loss in float32 on the same bf16 operands (ATen), beside the fused
/// loss on the whole bf16 logits; then again with 4 rows in 1024 whose logits are 8 times as large
/// (past the window in which a row's tiles share their exponent, so that the rows' pass rescales
/// them). Each time: the loss within 1e-5 of float32's; the gradients no further from float32's
/// than 1.5 times the whole logits' (each rounds the logits' gradient to bf16 once, the new path
/// the exponentials where the old one rounds the gradient), all figures printed; the gradient of a
/// loss gradient of 3 scaled once; a captured loss and backward equal to eager bit for bit. And it
/// runs under `Kernels::Own` (which refuses what it does not take), with `WeightGrad::Rounded`
/// giving the weight gradient in bf16 values within 4e-3 of the float32 one.
#[test]
#[ignore = "needs a CUDA device"]
fn the_exponentials_in_the_head_match_the_float32_loss() {
    use tch_cuda_graphs::loss::{f_linear_cross_entropy, LinearCrossEntropyConfig, LinearCrossEntropyMethod};
    let dev = cuda();
    tch::manual_seed(5);
    let (rows, c, v) = (12288, 768, 32000);
    let h = Tensor::randn([12, rows / 12, c], (Kind::Float, dev));
    let head = Tensor::randn([v, c], (Kind::Float, dev)) * 0.08;
    let targets = Tensor::randint(v, [12, rows / 12], (Kind::Int64, dev));
    let _ = targets.narrow(1, 0, 5).fill_(-100);
    let config = LinearCrossEntropyConfig {
        method: LinearCrossEntropyMethod::ExpInHead,
        kernels: Kernels::Own,
        ..Default::default()
    };
    for large in [false, true] {
        let h = if large {
            let h = h.copy();
            let _ = h.narrow(1, 9, 4).f_mul_scalar_(8.0).unwrap(); // logits up to about 80
            h
        } else {
            h.shallow_clone()
        };
        let (hh, ww) = (h.detach().set_requires_grad(true), head.detach().set_requires_grad(true));
        let l_exp = {
            let _bf16 = Autocast::new(Kind::BFloat16, false).unwrap();
            f_linear_cross_entropy(&hh, &ww, &targets, &config).unwrap()
        };
        (&l_exp * 3.0).backward();
        let (l_exp, dh_exp, dw_exp) = (l_exp.detach(), hh.grad(), ww.grad());
        let (l_whole, dh_whole, dw_whole, _) = head_and_loss(&h, &head, &targets, None);
        // float32 on the bf16-rounded operands
        let (h32, w32) = (
            h.to_kind(Kind::BFloat16).to_kind(Kind::Float).set_requires_grad(true),
            head.to_kind(Kind::BFloat16).to_kind(Kind::Float).set_requires_grad(true),
        );
        let logits = h32.view([-1, c]).matmul(&w32.tr());
        let l32 = logits.cross_entropy_loss::<Tensor>(&targets.view([-1]), None, Reduction::Mean, -100, 0.0);
        l32.backward();
        let (dh32, dw32) = (h32.grad(), w32.grad());
        let (fl, fh, fw) = (rel(&l_exp, &l32), rel(&(&dh_exp / 3.0), &dh32), rel(&(&dw_exp / 3.0), &dw32));
        let (wl, wh, ww) = (rel(&l_whole, &l32), rel(&dh_whole, &dh32), rel(&dw_whole, &dw32));
        let rows_kind = if large { "with rows of large logits" } else { "ordinary rows" };
        println!(
            "{rows_kind}, against float32 (max |diff| / max): exponentials in the head: loss {fl:e} ({:.6} / {:.6}), \
             dh {fh:e}, dW {fw:e}; the whole bf16 logits: loss {wl:e}, dh {wh:e}, dW {ww:e}",
            f64::try_from(&l_exp).unwrap(),
            f64::try_from(&l32).unwrap()
        );
        assert!(fl <= 1e-5, "loss {fl:e}");
        assert!(fh <= 1.5 * wh && fw <= 1.5 * ww, "dh {fh:e} against {wh:e}, dW {fw:e} against {ww:e}");
        assert_eq!((dh_exp.kind(), dw_exp.kind()), (Kind::Float, Kind::Float));

        // captured == eager
        let d = head_and_loss_captured_minus_eager(&h, &head, &targets, &config);
        println!("{rows_kind}: captured head + loss (gradient scaled by 3) against eager: max |difference| {d:e}");
        assert_eq!(d, 0.0);
    }

    // WeightGrad::Rounded: the weight gradient rounded to bf16, then cast to the float32 weight
    let rounded = LinearCrossEntropyConfig { weight_grad: tch_cuda_graphs::linear::WeightGrad::Rounded, ..config };
    let grads = |config: &LinearCrossEntropyConfig| {
        let ww = head.detach().set_requires_grad(true);
        let loss = {
            let _bf16 = Autocast::new(Kind::BFloat16, false).unwrap();
            f_linear_cross_entropy(&h, &ww, &targets, config).unwrap()
        };
        loss.backward();
        ww.grad()
    };
    let (dw_rounded, dw_f32) = (grads(&rounded), grads(&config));
    let d = rel(&dw_rounded, &dw_f32);
    println!("rounded weight gradient against float32's: {d:e} (max |diff| / max)");
    assert_eq!(dw_rounded.kind(), Kind::Float);
    assert!(dw_rounded.to_kind(Kind::BFloat16).to_kind(Kind::Float).equal(&dw_rounded), "bf16 values");
    assert!(d <= 4e-3, "{d:e}");

    // float32 compute (no autocast) is not the path's: Own refuses it
    let e = f_linear_cross_entropy(&h, &head, &targets, &config).expect_err("float32 refused under Own");
    assert!(matches!(e, Error::Unsupported(_)), "{e:?}");
}
