//! The crate's linear layer (`linear::Linear`) against `at::linear` on a GPU, under bf16
//! autocast at the GPT's shapes: the forward equal bit for bit, the input gradient too; the
//! weight and bias gradients within a bf16 rounding of ATen's (rounded mode), and with float32
//! weight gradients within 1e-5 of a float32 reference computed from the same bf16 operands,
//! closer to it than the rounded ones; the backward launches no separate reduction for the bias
//! gradient and no cast in float32 mode (the profiler's kernel names); the choice of path
//! (`Kernels::Own` refuses float32 without autocast, `Kernels::Auto` falls back to `at::linear`);
//! a split output's backward packs the pieces' gradients and sums the bias gradient in one pass.
//! Ignored without a GPU; fails loudly there.
mod common;

use common::{cuda, kernels_of};
use tch::{nn, Kind, Tensor};
use tch_cuda_graphs::amp::Autocast;
use tch_cuda_graphs::kernels::{KernelPath, Kernels};
use tch_cuda_graphs::linear::{linear, Linear, LinearConfig, WeightGrad};
use tch_cuda_graphs::Error;

/// max |a - b| / max |b|.
fn rel(a: &Tensor, b: &Tensor) -> f64 {
    let (a, b) = (a.to_kind(Kind::Float), b.to_kind(Kind::Float));
    f64::try_from((&a - &b).abs().max()).unwrap() / f64::try_from(b.abs().max()).unwrap().max(1e-30)
}

/// A layer `inp -> out` with bias under `vs`, of random weights and bias.
fn layer(vs: &nn::VarStore, inp: i64, out: i64, weight_grad: WeightGrad, kernels: Kernels) -> Linear {
    let l = linear(vs.root(), inp, out, LinearConfig { weight_grad, kernels, ..Default::default() });
    tch::no_grad(|| {
        let _ = l.bs.as_ref().unwrap().shallow_clone().normal_(0.0, 0.1);
    });
    l
}

/// Forward and backward of `l` under bf16 autocast on the bf16 input `x0` (batch of 8 rows of
/// the token dimension) with output gradient `dy`: (y, dx, dweight, dbias).
fn run(l: &Linear, x0: &Tensor, dy: &Tensor) -> (Tensor, Tensor, Tensor, Tensor) {
    let x = x0.detach().set_requires_grad(true);
    let y = {
        let _autocast = Autocast::new(Kind::BFloat16, false).expect("autocast");
        l.f_forward(&x).expect("forward")
    };
    (&y.to_kind(Kind::Float) * dy).sum(Kind::Float).backward();
    (y, x.grad(), l.ws.grad(), l.bs.as_ref().unwrap().grad())
}

#[test]
#[ignore = "needs a CUDA device"]
fn the_linear_layer_matches_aten_under_bf16_autocast() {
    let dev = cuda();
    // the GPT's layers at batch 8 (2048 tokens): c_attn, c_proj, c_fc, mlp c_proj
    for (inp, out) in [(384i64, 1152i64), (384, 384), (384, 1536), (1536, 384)] {
        tch::manual_seed(3);
        let vs_aten = nn::VarStore::new(dev);
        let aten = layer(&vs_aten, inp, out, WeightGrad::Rounded, Kernels::PyTorch);
        let mk = |mode| {
            let mut vs = nn::VarStore::new(dev);
            let l = layer(&vs, inp, out, mode, Kernels::Own);
            vs.copy(&vs_aten).expect("the same parameters");
            (vs, l)
        };
        let (_vs_r, rounded) = mk(WeightGrad::Rounded);
        let (_vs_f, fp32) = mk(WeightGrad::Float32);
        let x0 = Tensor::randn([8, 256, inp], (Kind::Float, dev)).to_kind(Kind::BFloat16);
        // bf16 values, as a bf16 step's gradients are
        let dy = Tensor::randn([8, 256, out], (Kind::Float, dev)).to_kind(Kind::BFloat16).to_kind(Kind::Float);
        let (ya, dxa, dwa, dba) = run(&aten, &x0, &dy);
        let (yr, dxr, dwr, dbr) = run(&rounded, &x0, &dy);
        assert!(
            rounded.last_path() == Some(KernelPath::Own) && aten.last_path() == Some(KernelPath::PyTorch),
            "the crate's path ran (and ATen's for the twin)"
        );
        let (yf, dxf, dwf, dbf) = run(&fp32, &x0, &dy);
        // float32 references from the same bf16 operands
        let (x2, dy2) = (x0.to_kind(Kind::Float).view([-1, inp]), dy.view([-1, out]));
        let dw_ref = dy2.tr().matmul(&x2);
        let db_ref = dy2.sum_dim_intlist(0, false, Kind::Float);
        let same_forward = ya.equal(&yr) && ya.equal(&yf);
        let same_dx = dxa.equal(&dxr) && dxa.equal(&dxf);
        let figures = [
            ("dweight rounded vs ATen", rel(&dwr, &dwa)),
            ("dbias rounded vs ATen", rel(&dbr, &dba)),
            ("dweight ATen vs fp32 reference", rel(&dwa, &dw_ref)),
            ("dweight fp32 vs fp32 reference", rel(&dwf, &dw_ref)),
            ("dbias ATen vs fp32 reference", rel(&dba, &db_ref)),
            ("dbias fp32 vs fp32 reference", rel(&dbf, &db_ref)),
        ];
        println!(
            "[2048, {inp}] -> {out}: forward equal to ATen's {same_forward}, input gradient equal {same_dx}; max |a - b| / max |b|: {figures:?}"
        );
        assert!(same_forward, "the forward is at::linear on the same operands");
        assert!(same_dx, "the input gradient is the same GEMM");
        assert_eq!((dwf.kind(), dbf.kind(), dwr.kind()), (Kind::Float, Kind::Float, Kind::Float));
        assert!(
            figures[0].1 <= 1.0 / 128.0 && figures[1].1 <= 1.0 / 128.0,
            "rounded: within a bf16 rounding of ATen's"
        );
        assert!(figures[3].1 <= 1e-5 && figures[5].1 <= 1e-5, "fp32: within 1e-5 of the fp32 reference");
        assert!(figures[3].1 < figures[2].1, "fp32 weight gradients are closer to the reference than rounded ones");
    }
}

/// The backward's kernels, by name: the input-gradient GEMM and the weight-gradient GEMM, whose
/// bias gradient cuBLASLt makes (in the GEMM's epilogue, or in a companion kernel of its own where
/// it chooses so: on an H100 it does), never ATen's reduction; in float32 mode no cast kernel.
#[test]
#[ignore = "needs a CUDA device"]
fn the_bias_gradient_comes_out_of_the_gemm() {
    let dev = cuda();
    for mode in [WeightGrad::Rounded, WeightGrad::Float32] {
        let vs = nn::VarStore::new(dev);
        let l = layer(&vs, 384, 1536, mode, Kernels::Own);
        let x0 = Tensor::randn([2048, 384], (Kind::Float, dev)).to_kind(Kind::BFloat16);
        let dy = Tensor::randn([2048, 1536], (Kind::Float, dev));
        let x = x0.detach().set_requires_grad(true);
        let y = {
            let _autocast = Autocast::new(Kind::BFloat16, false).expect("autocast");
            l.f_forward(&x).expect("forward")
        };
        // the output gradient in bf16 already, so the backward is the layer's alone
        let dy = dy.to_kind(Kind::BFloat16);
        tch::Cuda::synchronize(0);
        let inputs = [x.shallow_clone(), l.ws.shallow_clone(), l.bs.as_ref().unwrap().shallow_clone()];
        let (grads, kernels) =
            kernels_of(x.device(), || tch_cuda_graphs::autograd::grad(&[y], &inputs, Some(&[dy]), false, false));
        let grads = grads.expect("backward");
        assert!(grads.iter().all(Option::is_some), "every gradient");
        println!("{mode:?}: backward kernels {kernels:?}");
        let reductions = kernels.iter().filter(|k| k.contains("reduce_kernel")).count();
        let casts = kernels.iter().filter(|k| k.contains("copy")).count();
        assert_eq!(reductions, 0, "no separate bias-gradient reduction");
        assert!(
            kernels.len() >= 2 && kernels.len() <= 3 + casts,
            "two GEMMs (input and weight gradients), cuBLASLt's bias-gradient kernel if it has one, and the casts"
        );
        if mode == WeightGrad::Float32 {
            assert_eq!(casts, 0, "float32 gradients come out of the GEMM without a cast");
        }
    }
}

/// A split output (attention's q, k, v of one projection), at the GPT's and GPT-2's shapes: the
/// pieces equal `f_forward(..).split(..)`'s bit for bit, and so does the input gradient (the
/// same GEMM on the same packed gradient); the weight gradient within 1e-5 of a float32
/// reference, the bias gradient (the split kernel's column sums) within 1e-6; a piece without
/// a gradient counts as zeros; the backward runs the split's kernel and its finish, and neither
/// a concatenation nor cuBLASLt's bias-gradient kernel.
#[test]
#[ignore = "needs a CUDA device"]
fn the_split_packs_the_gradients_and_sums_the_bias_in_one_pass() {
    let dev = cuda();
    for (rows, width, use_k) in [(2048i64, 384i64, true), (2048, 768, false), (3000, 64, true)] {
        tch::manual_seed(4);
        let vs_whole = nn::VarStore::new(dev);
        let whole = layer(&vs_whole, width, 3 * width, WeightGrad::Float32, Kernels::Own);
        let mut vs = nn::VarStore::new(dev);
        let split = layer(&vs, width, 3 * width, WeightGrad::Float32, Kernels::Own);
        vs.copy(&vs_whole).expect("the same parameters");
        let x0 = Tensor::randn([rows, width], (Kind::Float, dev)).to_kind(Kind::BFloat16);
        let seeds: Vec<Tensor> =
            (0..3).map(|_| Tensor::randn([rows, width], (Kind::Float, dev)).to_kind(Kind::BFloat16)).collect();
        // q·s0 + (k·s1 where used) + v·s2, over bf16 pieces
        let run = |pieces: &[Tensor]| {
            let mut loss = (&pieces[0] * &seeds[0]).sum(Kind::Float) + (&pieces[2] * &seeds[2]).sum(Kind::Float);
            if use_k {
                loss += (&pieces[1] * &seeds[1]).sum(Kind::Float);
            }
            loss
        };
        let (xa, xb) = (x0.detach().set_requires_grad(true), x0.detach().set_requires_grad(true));
        let (pa, pb) = {
            let _autocast = Autocast::new(Kind::BFloat16, false).expect("autocast");
            (whole.f_forward(&xa).expect("forward").split(width, -1), split.f_forward_split(&xb, 3).expect("split"))
        };
        assert_eq!(split.last_path(), Some(KernelPath::Own));
        let same_forward = pa.iter().zip(&pb).all(|(a, b)| a.equal(b));
        run(&pa).backward();
        let inputs = [xb.shallow_clone(), split.ws.shallow_clone(), split.bs.as_ref().unwrap().shallow_clone()];
        let loss = run(&pb);
        let (grads, kernels) =
            kernels_of(dev, || tch_cuda_graphs::autograd::grad(&[loss], &inputs, None, false, false));
        let grads: Vec<Tensor> = grads.expect("backward").into_iter().map(|g| g.expect("a gradient")).collect();
        let dy = Tensor::cat(
            &[&seeds[0], &(if use_k { seeds[1].shallow_clone() } else { seeds[1].zeros_like() }), &seeds[2]],
            1,
        )
        .to_kind(Kind::Float);
        let dw_ref = dy.tr().matmul(&x0.to_kind(Kind::Float));
        let db_ref = dy.sum_dim_intlist(0, false, Kind::Double);
        let same_dx = grads[0].equal(&xa.grad());
        let figures = [
            ("dweight vs fp32 reference", rel(&grads[1], &dw_ref)),
            ("dweight vs the whole output's", rel(&grads[1], &whole.ws.grad())),
            ("dbias vs fp64 reference", rel(&grads[2].to_kind(Kind::Double), &db_ref)),
            ("dbias vs the whole output's (BGRADB)", rel(&grads[2], &whole.bs.as_ref().unwrap().grad())),
        ];
        println!(
            "[{rows}, {width}] -> 3 × {width} (k used {use_k}): pieces equal {same_forward}, input gradient equal {same_dx}; \
             max |a - b| / max |b|: {figures:?}; backward kernels {kernels:?}"
        );
        assert!(same_forward, "the pieces are views of the same GEMM's output");
        assert!(same_dx, "the input gradient is the same GEMM on the same packed gradient");
        assert!(figures[0].1 <= 1e-5 && figures[2].1 <= 1e-6, "the weight and bias gradients");
        let has = |name: &str| kernels.iter().any(|k| k.contains(name));
        assert!(has("tcg_split_bwd") && has("tcg_split_finish"), "the split's kernels ran");
        assert!(!has("CatArray") && !has("Bgrad"), "no concatenation and no separate bias-gradient kernel");
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn the_crate_path_refuses_what_it_does_not_take_and_auto_falls_back() {
    let dev = cuda();
    let vs = nn::VarStore::new(dev);
    let x = Tensor::randn([8, 64], (Kind::Float, dev));
    let own = linear(vs.root() / "own", 64, 32, LinearConfig { kernels: Kernels::Own, ..Default::default() });
    match own.f_forward(&x) {
        Err(Error::Unsupported(why)) => println!("Kernels::Own on float32 without autocast: {why}"),
        other => panic!("expected Unsupported, got {other:?}"),
    }
    let auto = linear(vs.root() / "auto", 64, 32, LinearConfig::default());
    let y = auto.f_forward(&x).expect("auto");
    let expected = x.linear(&auto.ws, auto.bs.as_ref());
    println!(
        "Kernels::Auto on float32: crate's path {}, equal to Tensor::linear {}",
        auto.last_path() == Some(KernelPath::Own),
        y.equal(&expected)
    );
    assert!(auto.last_path() == Some(KernelPath::PyTorch) && y.equal(&expected), "Auto falls back to at::linear");
    // the same layer under autocast takes the crate's path
    let _autocast = Autocast::new(Kind::BFloat16, false).expect("autocast");
    let yb = own.f_forward(&x).expect("own under autocast");
    assert!(own.last_path() == Some(KernelPath::Own) && yb.kind() == Kind::BFloat16);
    // a misuse: a weight that does not fit the input
    let narrow = Tensor::randn([8, 48], (Kind::Float, dev));
    assert!(matches!(own.f_forward(&narrow), Err(Error::Misuse(_))));
}
