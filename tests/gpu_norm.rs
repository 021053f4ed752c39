//! The crate's fused normalization kernels (`norm::LayerNorm`) against ATen's operators on a
//! GPU: LayerNorm and RMSNorm in fp32 (output and every gradient within 1e-5 of the largest
//! value, several widths), the residual add with dropout under bf16 autocast (the dropout rate,
//! the kept values scaled, the bf16 output equal to ATen's fp32 norm of the same sum rounded, the
//! branch gradient the residual gradient masked and scaled, bit for bit), and the choice of
//! kernels (`Kernels::Own` refuses a width it does not take, `Kernels::Auto` falls back).
//! Ignored without a GPU; fails loudly there.
mod common;

use common::{captured_minus_eager, cuda, kernels_of};
use tch::{nn, Device, Kind, Tensor};
use tch_cuda_graphs::amp::Autocast;
use tch_cuda_graphs::kernels::{KernelPath, Kernels};
use tch_cuda_graphs::norm::{layer_norm, LayerNorm, NormConfig, NormKind};
use tch_cuda_graphs::Error;

/// Two norms of the same kind and parameters (random weight and bias): the fused one
/// (`Kernels::Own`) and ATen's (`Kernels::PyTorch`).
fn twins(device: Device, dim: i64, kind: NormKind) -> (nn::VarStore, LayerNorm, nn::VarStore, LayerNorm) {
    let make = |kernels| {
        let vs = nn::VarStore::new(device);
        let ln = layer_norm(
            vs.root(),
            vec![dim],
            NormConfig { kind, kernels, bias: kind == NormKind::Layer, ..Default::default() },
        );
        (vs, ln)
    };
    let (vs_a, a) = make(Kernels::Own);
    let (mut vs_b, b) = make(Kernels::PyTorch);
    tch::no_grad(|| {
        for (_, t) in vs_a.variables() {
            t.shallow_clone().copy_(&(Tensor::randn_like(&t) * 0.5 + 1.0));
        }
    });
    vs_b.copy(&vs_a).expect("the same parameters");
    (vs_a, a, vs_b, b)
}

/// max |a - b| / max |b|.
fn rel(a: &Tensor, b: &Tensor) -> f64 {
    let (a, b) = (a.to_kind(Kind::Float), b.to_kind(Kind::Float));
    f64::try_from((&a - &b).abs().max()).unwrap() / f64::try_from(b.abs().max()).unwrap().max(1e-30)
}

#[test]
#[ignore = "needs a CUDA device"]
fn fused_norms_match_aten_in_fp32() {
    let dev = cuda();
    for kind in [NormKind::Layer, NormKind::Rms] {
        for (rows, dim) in [(4096, 32), (16384, 384), (2048, 512), (2048, 768), (1024, 1024), (3, 4)] {
            tch::manual_seed(1);
            let (vs_a, a, vs_b, b) = twins(dev, dim, kind);
            let x0 = Tensor::randn([rows, dim], (Kind::Float, dev)) * 3.0 + 0.7;
            let dy = Tensor::randn([rows, dim], (Kind::Float, dev));
            let run = |ln: &LayerNorm| {
                let x = x0.detach().set_requires_grad(true);
                let y = ln.f_forward(&x).expect("forward");
                (&y * &dy).sum(Kind::Float).backward();
                (y, x.grad())
            };
            let (ya, dxa) = run(&a);
            assert!(a.last_path() == Some(KernelPath::Own), "the fused kernels ran");
            let (yb, dxb) = run(&b);
            assert!(b.last_path() == Some(KernelPath::PyTorch));
            let mut figures = vec![("y", rel(&ya, &yb)), ("dx", rel(&dxa, &dxb))];
            let grads = |vs: &nn::VarStore| {
                let mut v: Vec<(String, Tensor)> = vs.variables().into_iter().map(|(n, t)| (n, t.grad())).collect();
                v.sort_by(|p, q| p.0.cmp(&q.0));
                v
            };
            for ((name, ga), (_, gb)) in grads(&vs_a).iter().zip(grads(&vs_b).iter()) {
                figures.push((if name.ends_with("weight") { "dweight" } else { "dbias" }, rel(ga, gb)));
            }
            println!("{kind:?} [{rows}, {dim}] fp32, max |fused - ATen| / max |ATen|: {figures:?}");
            for (what, r) in figures {
                assert!(r <= 1e-5, "{kind:?} [{rows}, {dim}] {what}: {r:e} > 1e-5");
            }
        }
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn residual_add_with_dropout_under_bf16_autocast() {
    let dev = cuda();
    let (rows, dim, p) = (16384i64, 384i64, 0.2);
    tch::manual_seed(2);
    let (_vs_a, a, _vs_b, b) = twins(dev, dim, NormKind::Layer);
    // a zero residual stream: x is then the dropped-out branch itself, so the mask reads off x
    let res = Tensor::zeros([rows, dim], (Kind::Float, dev)).set_requires_grad(true);
    let branch = Tensor::randn([rows, dim], (Kind::Float, dev)).to_kind(Kind::BFloat16).set_requires_grad(true);
    let (x, y) = {
        let _autocast = Autocast::new(Kind::BFloat16, false).expect("autocast");
        a.f_forward_residual(&res, &branch, p, true).expect("forward")
    };
    assert!(a.last_path() == Some(KernelPath::Own), "the fused kernels ran");
    assert_eq!((x.kind(), y.kind()), (Kind::Float, Kind::BFloat16));
    let kept = x.ne(0.0);
    let rate = 1.0 - f64::try_from(kept.to_kind(Kind::Float).mean(Kind::Float)).unwrap();
    let scaled = branch.detach().to_kind(Kind::Float) * (1.0 / (1.0 - p));
    let kept_error = f64::try_from((x.detach() - &scaled * kept.to_kind(Kind::Float)).abs().max()).unwrap();
    // ATen's fp32 LayerNorm of the same sum, rounded to bf16
    let reference = b.f_forward(&x.detach()).expect("ATen's norm").to_kind(Kind::BFloat16);
    let differ = f64::try_from(y.ne_tensor(&reference).to_kind(Kind::Float).mean(Kind::Float)).unwrap();
    // in bf16 ulps of each value, or of a thousandth of the largest where the norm cancels to
    // near zero (there an fp32 rounding of the sum moves the result by more than its own ulp)
    let r = reference.to_kind(Kind::Float);
    let floor = f64::try_from(r.abs().max()).unwrap() * 1e-3;
    let ulps =
        f64::try_from(((y.to_kind(Kind::Float) - &r).abs() / ((r.abs() + floor) * (1.0 / 128.0))).max()).unwrap();
    println!(
        "[{rows}, {dim}], p = {p}: dropped {rate:.5}; max |kept x - branch / (1 - p)| = {kept_error:e}; bf16 y unlike ATen's fp32 norm rounded: {:.4}% of elements, at most {ulps:.2} bf16 ulps (of the value, or of a thousandth of the largest)",
        differ * 100.0
    );
    assert!((rate - p).abs() < 0.003, "dropout rate {rate}");
    assert_eq!(kept_error, 0.0, "kept values are the branch scaled by 1 / (1 - p)");
    assert!(ulps <= 1.0, "bf16 output within one bf16 ulp of ATen's fp32 norm rounded");

    // gradients into both outputs: dy (bf16 values) into y, dx into x
    let dy = Tensor::randn([rows, dim], (Kind::Float, dev)).to_kind(Kind::BFloat16).to_kind(Kind::Float);
    let dx = Tensor::randn([rows, dim], (Kind::Float, dev));
    ((y.to_kind(Kind::Float) * &dy).sum(Kind::Float) + (&x * &dx).sum(Kind::Float)).backward();
    let (dres, dbranch) = (res.grad(), branch.grad());
    assert_eq!(dbranch.kind(), Kind::BFloat16);
    let expected = (&dres * kept.to_kind(Kind::Float) * (1.0 / (1.0 - p))).to_kind(Kind::BFloat16);
    let equal = dbranch.equal(&expected);
    println!("dbranch equals dres masked and scaled, rounded to bf16: {equal}");
    assert!(equal, "the branch gradient is the residual gradient through the same mask");
}

#[test]
#[ignore = "needs a CUDA device"]
fn own_kernels_refuse_what_they_do_not_take_and_auto_falls_back() {
    let dev = cuda();
    let vs = nn::VarStore::new(dev);
    let x = Tensor::randn([8, 30], (Kind::Float, dev));
    let own = layer_norm(vs.root() / "own", vec![30], NormConfig { kernels: Kernels::Own, ..Default::default() });
    match own.f_forward(&x) {
        Err(Error::Unsupported(why)) => println!("Kernels::Own on width 30: {why}"),
        other => panic!("expected Unsupported, got {other:?}"),
    }
    let auto = layer_norm(vs.root() / "auto", vec![30], NormConfig::default());
    let reference =
        layer_norm(vs.root() / "aten", vec![30], NormConfig { kernels: Kernels::PyTorch, ..Default::default() });
    let (ya, yr) = (auto.f_forward(&x).expect("auto"), reference.f_forward(&x).expect("ATen"));
    println!(
        "Kernels::Auto on width 30: fused {}, equal to ATen's {}",
        auto.last_path() == Some(KernelPath::Own),
        ya.equal(&yr)
    );
    assert!(auto.last_path() == Some(KernelPath::PyTorch) && ya.equal(&yr), "Auto falls back to ATen's operators");
    // a bf16 residual stream is not taken either: ATen's, the same result
    let xb = x.to_kind(Kind::BFloat16);
    assert!(matches!(own.f_forward(&xb), Err(Error::Unsupported(_))));
}

/// The residual add with the branch's bias folded in (`f_forward_residual_biased`, the output
/// projection run without its bias): fp32 against ATen's `branch + bias`, `add` and
/// `layer_norm`: x bit for bit, y and every gradient (the branch bias's summed from the branch
/// gradient in the kernel) within 1e-5 of the largest; with dropout under bf16 autocast, the bias
/// gradient is the sum of the masked and scaled residual gradient.
#[test]
#[ignore = "needs a CUDA device"]
fn residual_add_takes_the_branch_bias_and_sums_its_gradient() {
    let dev = cuda();
    for (rows, dim) in [(12288, 768), (4096, 384), (3, 4)] {
        tch::manual_seed(3);
        let (_vs_a, a, _vs_b, b) = twins(dev, dim, NormKind::Layer);
        let res0 = Tensor::randn([rows, dim], (Kind::Float, dev));
        let branch0 = Tensor::randn([rows, dim], (Kind::Float, dev));
        let bias0 = Tensor::randn([dim], (Kind::Float, dev)) * 0.1;
        let (dx_out, dy) =
            (Tensor::randn([rows, dim], (Kind::Float, dev)), Tensor::randn([rows, dim], (Kind::Float, dev)));
        let run = |ln: &LayerNorm| {
            let (res, branch, bias) = (
                res0.detach().set_requires_grad(true),
                branch0.detach().set_requires_grad(true),
                bias0.detach().set_requires_grad(true),
            );
            let (x, y) = ln.f_forward_residual_biased(&res, &branch, Some(&bias), 0.0, true).expect("forward");
            ((&x * &dx_out).sum(Kind::Float) + (&y * &dy).sum(Kind::Float)).backward();
            (x, y, res.grad(), branch.grad(), bias.grad())
        };
        let (x1, y1, dr1, db1, dbias1) = run(&a);
        assert_eq!(a.last_path(), Some(KernelPath::Own));
        let (x2, y2, dr2, db2, dbias2) = run(&b);
        let (ey, er, eb, ebias) = (rel(&y1, &y2), rel(&dr1, &dr2), rel(&db1, &db2), rel(&dbias1, &dbias2));
        println!(
            "[{rows}, {dim}] with a branch bias, fp32: x equal {}; y {ey:e}, dres {er:e}, dbranch {eb:e}, dbias {ebias:e} (relative to the largest)",
            x1.equal(&x2)
        );
        assert!(x1.equal(&x2), "x = res + (branch + bias) rounds as ATen's two adds");
        assert!(ey <= 1e-5 && er <= 1e-5 && eb <= 1e-5 && ebias <= 1e-5);
    }
    // dropout 0.2 under bf16 autocast: the bias gradient is the sum over rows of the branch
    // gradient before its rounding, i.e. of dres through the mask and scale
    let (rows, dim, p) = (8192i64, 768i64, 0.2);
    let (_vs, a, _vs_b, _b) = twins(dev, dim, NormKind::Layer);
    let res = Tensor::zeros([rows, dim], (Kind::Float, dev)).set_requires_grad(true);
    let branch = Tensor::randn([rows, dim], (Kind::Float, dev)).to_kind(Kind::BFloat16).set_requires_grad(true);
    let bias = Tensor::randn([dim], (Kind::Float, dev)).set_requires_grad(true);
    let (x, _y) = {
        let _autocast = Autocast::new(Kind::BFloat16, false).expect("autocast");
        a.f_forward_residual_biased(&res, &branch, Some(&bias), p, true).expect("forward")
    };
    let kept = x.ne(0.0).to_kind(Kind::Float);
    let dx = Tensor::randn([rows, dim], (Kind::Float, dev));
    (&x * &dx).sum(Kind::Float).backward();
    let want = (&dx * &kept * (1.0 / (1.0 - p))).sum_dim_intlist(0, false, Kind::Double);
    let e = rel(&bias.grad(), &want);
    println!(
        "dropout {p}, bf16 branch: the bias gradient against the sum of the masked, scaled gradient (fp64): {e:e}"
    );
    assert!(e <= 1e-5);
    // the bias of another width is a typed error
    let wrong = Tensor::zeros([dim - 4], (Kind::Float, dev));
    assert!(matches!(a.f_forward_residual_biased(&res, &branch, Some(&wrong), p, true), Err(Error::Misuse(_))));
}

/// The stream's start (`f_forward_dropout`, what `ResidualStream`'s first norm runs): without
/// dropout, x is the input itself (no copy: the same storage), y and the input's gradient (the
/// norm's and the stream's, added in the kernel) within 1e-5 of ATen's; with dropout 0.2 under
/// bf16 autocast, the kept values are the input scaled, y ATen's fp32 norm of the same x within
/// one bf16 ulp, and the input's gradient the two gradients' sum through the same mask (ATen's
/// norm backward beside it, within 1e-5 of the largest). A bf16 start is refused by the fused
/// kernels (its stream would be float32 there, its own dtype in ATen's).
#[test]
#[ignore = "needs a CUDA device"]
fn the_stream_start_folds_its_dropout_and_gradient_add() {
    let dev = cuda();
    let (rows, dim) = (16384i64, 384i64);
    tch::manual_seed(5);
    let (_vs_a, a, _vs_b, b) = twins(dev, dim, NormKind::Rms);
    let e0 = Tensor::randn([rows, dim], (Kind::Float, dev));
    let (dx_out, dy) = (Tensor::randn([rows, dim], (Kind::Float, dev)), Tensor::randn([rows, dim], (Kind::Float, dev)));
    let run = |ln: &LayerNorm| {
        let e = e0.detach().set_requires_grad(true);
        let (x, y) = ln.f_forward_dropout(&e, 0.0, true).expect("forward");
        let same_storage = x.data_ptr() == e.data_ptr();
        ((&x * &dx_out).sum(Kind::Float) + (&y * &dy).sum(Kind::Float)).backward();
        (x, y, e.grad(), same_storage)
    };
    let (x1, y1, de1, shared) = run(&a);
    assert_eq!(a.last_path(), Some(KernelPath::Own), "the fused kernels ran");
    let (x2, y2, de2, _) = run(&b);
    let (ey, ede) = (rel(&y1, &y2), rel(&de1, &de2));
    println!(
        "[{rows}, {dim}] RMSNorm start, fp32, no dropout: x equal {}, x the input's storage {shared}; y {ey:e}, d input {ede:e} (relative to the largest)",
        x1.equal(&x2)
    );
    assert!(x1.equal(&e0) && shared, "x is the input itself");
    assert!(ey <= 1e-5 && ede <= 1e-5);

    let p = 0.2;
    let (_vs_c, c, _vs_d, d) = twins(dev, dim, NormKind::Layer);
    let e = e0.detach().set_requires_grad(true);
    let (x, y) = {
        let _autocast = Autocast::new(Kind::BFloat16, false).expect("autocast");
        c.f_forward_dropout(&e, p, true).expect("forward")
    };
    assert_eq!(c.last_path(), Some(KernelPath::Own), "the fused kernels ran");
    assert_eq!((x.kind(), y.kind()), (Kind::Float, Kind::BFloat16));
    let kept = x.ne(0.0).to_kind(Kind::Float);
    let rate = 1.0 - f64::try_from(kept.mean(Kind::Float)).unwrap();
    let kept_error = f64::try_from((x.detach() - &e0 * (1.0 / (1.0 - p)) * &kept).abs().max()).unwrap();
    // ATen's fp32 LayerNorm of the same x: y within one bf16 ulp of it rounded, and its backward
    let xr = x.detach().set_requires_grad(true);
    let yr = d.f_forward(&xr).expect("ATen's norm");
    let r = yr.detach().to_kind(Kind::BFloat16).to_kind(Kind::Float);
    let floor = f64::try_from(r.abs().max()).unwrap() * 1e-3;
    let ulps =
        f64::try_from(((y.to_kind(Kind::Float) - &r).abs() / ((r.abs() + floor) * (1.0 / 128.0))).max()).unwrap();
    let dyb = dy.to_kind(Kind::BFloat16).to_kind(Kind::Float);
    ((y.to_kind(Kind::Float) * &dyb).sum(Kind::Float) + (&x * &dx_out).sum(Kind::Float)).backward();
    (&yr * &dyb).sum(Kind::Float).backward();
    let want = (xr.grad() + &dx_out) * &kept * (1.0 / (1.0 - p));
    let ede = rel(&e.grad(), &want);
    println!(
        "[{rows}, {dim}] LayerNorm start, dropout {p}, bf16 autocast: dropped {rate:.5}; max |kept x - input / (1 - p)| = {kept_error:e}; y within {ulps:.2} bf16 ulps of ATen's fp32 norm rounded; d input against ATen's norm backward plus the stream's gradient, masked and scaled: {ede:e}"
    );
    assert!((rate - p).abs() < 0.003, "dropout rate {rate}");
    assert_eq!(kept_error, 0.0, "kept values are the input scaled by 1 / (1 - p)");
    assert!(ulps <= 1.0 && ede <= 1e-5);

    let own = layer_norm(
        nn::VarStore::new(dev).root(),
        vec![dim],
        NormConfig { kernels: Kernels::Own, ..Default::default() },
    );
    match own.f_forward_dropout(&e0.to_kind(Kind::BFloat16), p, true) {
        Err(Error::Unsupported(why)) => println!("a bf16 start under Kernels::Own: {why}"),
        other => panic!("expected Unsupported, got {other:?}"),
    }
}

/// Position embeddings folded into the stream's start (`f_forward_dropout_biased` with a
/// `[T, width]` bias, what `ResidualStream::with_positions` runs) against the same fused norm fed
/// `tokens + positions` from ATen's add: x, y and every gradient (the tokens', the positions',
/// summed over the batch, and the norm's weight and bias) bit for bit, in fp32 without dropout
/// and under bf16 autocast with dropout 0.2 (the generator seeded alike: the same mask), with
/// one kernel fewer (no add); captured equals eager. A bias that is not the branch's trailing
/// dimensions is a typed error, and a bf16 branch with one takes ATen's path under
/// `Kernels::Auto` (its sum of the rounded branch gradient would not be the sum before rounding).
#[test]
#[ignore = "needs a CUDA device"]
fn position_embeddings_fold_into_the_stream_start() {
    let dev = cuda();
    let (b, t, dim) = (16i64, 256i64, 384i64);
    tch::manual_seed(7);
    let (_vs_a, a, _vs_b, _b) = twins(dev, dim, NormKind::Layer);
    let tok0 = Tensor::randn([b, t, dim], (Kind::Float, dev));
    let pos0 = Tensor::randn([t, dim], (Kind::Float, dev)) * 0.3;
    let (dx_out, dy) = (Tensor::randn([b, t, dim], (Kind::Float, dev)), Tensor::randn([b, t, dim], (Kind::Float, dev)));
    let params = [a.ws.as_ref().expect("a weight"), a.bs.as_ref().expect("a bias")];
    // (x, y, d tokens, d positions, d weight, d bias), the folded start or ATen's add before it
    let run = |folded: bool, p: f64, autocast: bool| {
        let (tok, pos) = (tok0.detach().set_requires_grad(true), pos0.detach().set_requires_grad(true));
        let (x, y) = {
            let _autocast = autocast.then(|| Autocast::new(Kind::BFloat16, false).expect("autocast"));
            if folded {
                a.f_forward_dropout_biased(&tok, Some(&pos), p, true).expect("forward")
            } else {
                a.f_forward_dropout(&(&tok + &pos), p, true).expect("forward")
            }
        };
        assert_eq!(a.last_path(), Some(KernelPath::Own), "the fused kernels ran");
        let loss = (&x * &dx_out).sum(Kind::Float) + (y.to_kind(Kind::Float) * &dy).sum(Kind::Float);
        let g = Tensor::run_backward(&[&loss], &[&tok, &pos, params[0], params[1]], false, false);
        [x, y, g[0].shallow_clone(), g[1].shallow_clone(), g[2].shallow_clone(), g[3].shallow_clone()]
    };
    for (p, autocast) in [(0.0, false), (0.2, true)] {
        // the same seed before each: the same dropout mask
        let (folded, names_folded) = kernels_of(dev, || {
            tch::manual_seed(11);
            run(true, p, autocast)
        });
        let (added, names_added) = kernels_of(dev, || {
            tch::manual_seed(11);
            run(false, p, autocast)
        });
        let equal: Vec<bool> = folded.iter().zip(&added).map(|(f, a)| f.equal(a)).collect();
        let dropped = 1.0 - f64::try_from(folded[0].ne(0.0).to_kind(Kind::Float).mean(Kind::Float)).unwrap();
        println!(
            "[{b}, {t}, {dim}] start + [{t}, {dim}] positions, dropout {p}, autocast {autocast}: x, y, d tokens, d positions, d weight, d bias equal to ATen's add before the norm: {equal:?}; dropped {dropped:.4}; kernels {} against {}",
            names_folded.len(),
            names_added.len()
        );
        assert!(equal.iter().all(|&e| e), "the folded start equals the add before it, bit for bit");
        assert_eq!(
            names_folded.len() + 1,
            names_added.len(),
            "one kernel fewer: {names_folded:?} against {names_added:?}"
        );
    }
    let captured = captured_minus_eager(|| {
        let [x, y, dt, dp, _, _] = run(true, 0.0, false);
        Ok(Tensor::cat(&[x.flatten(0, -1), y.flatten(0, -1), dt.flatten(0, -1), dp.flatten(0, -1)], 0))
    });
    println!("the folded start captured and replayed against eager: max |difference| {captured:e}");
    assert_eq!(captured, 0.0);

    // a bias that is not the branch's trailing dimensions: a typed error
    for wrong in [Tensor::zeros([t + 1, dim], (Kind::Float, dev)), Tensor::zeros([2, t, dim], (Kind::Float, dev))] {
        let r = a.f_forward_dropout_biased(&tok0, Some(&wrong), 0.0, true);
        println!("positions {:?} for tokens {:?}: {r:?}", wrong.size(), tok0.size());
        assert!(matches!(r, Err(Error::Misuse(_))));
    }
    // a bf16 branch with positions: ATen's add and norm (Kernels::Auto), the same as the composition
    let auto = layer_norm(nn::VarStore::new(dev).root(), vec![dim], NormConfig::default());
    let tok_bf16 = tok0.to_kind(Kind::BFloat16);
    let (x, _) = auto.f_forward_dropout_biased(&tok_bf16, Some(&pos0), 0.0, true).expect("ATen's path");
    println!("a bf16 branch with positions under Kernels::Auto: {:?}", auto.last_path());
    assert_eq!(auto.last_path(), Some(KernelPath::PyTorch));
    assert!(x.equal(&(&tok_bf16 + &pos0)));
}
