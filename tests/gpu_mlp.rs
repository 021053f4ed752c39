//! The MLP with GELU in its GEMMs' epilogues on a GPU: the exact form in CUTLASS's
//! (`mlp::f_gelu_mlp`, the last test), and the tanh approximation in cuBLASLt's
//! (`mlp::f_gelu_tanh_mlp`), each figure printed: its GELU output against the tanh form computed in float64 on the same
//! operands and rounded once (within one bf16 ulp where |gelu| >= 2^-6, within 1e-4 below); the
//! forward and every gradient against the
//! same computation in float32 on the bf16 operands, rounded where the step rounds (within 1e-2
//! of the largest value) and against ATen's composition (`Kernels::PyTorch`); a captured forward
//! and backward equal to eager bit for bit; the exact form's fallback on a misaligned input; the
//! choice of kernels and typed errors. Ignored
//! without a GPU; fails loudly there.
mod common;

use common::{bf16_ulps, captured_minus_eager, cuda, kernels_of, output_and_grads, rel};
use tch::{nn, Kind, Tensor};
use tch_cuda_graphs::amp::Autocast;
use tch_cuda_graphs::gelu::GeluApproximate;
use tch_cuda_graphs::kernels::Kernels;
use tch_cuda_graphs::linear::{linear, Linear, LinearConfig};
use tch_cuda_graphs::mlp::{f_gelu_mlp, f_gelu_tanh_mlp};
use tch_cuda_graphs::Error;

fn layers(vs: &nn::VarStore, c: i64, h: i64, kernels: Kernels) -> (Linear, Linear) {
    let cfg = LinearConfig { kernels, bs_init: Some(nn::Init::Randn { mean: 0.0, stdev: 0.5 }), ..Default::default() };
    (linear(vs.root() / "fc", c, h, cfg), linear(vs.root() / "proj", h, c, cfg))
}

/// y and the gradients of x, fc's weight and bias, proj's weight and bias, for the loss
/// sum(y · w), under bf16 autocast, with GELU's tanh or exact form.
fn run(x: &Tensor, fc: &Linear, proj: &Linear, w: &Tensor, approximate: GeluApproximate) -> Vec<Tensor> {
    let x = x.detach().set_requires_grad(true);
    let y = {
        let _bf16 = Autocast::new(Kind::BFloat16, false).expect("autocast");
        f_gelu_mlp(&x, fc, proj, approximate).expect("mlp")
    };
    (&y.to_kind(Kind::Float) * w).sum(Kind::Float).backward();
    let bias = |l: &Linear| l.bs.as_ref().expect("a bias").grad();
    vec![y, x.grad(), fc.ws.grad(), bias(fc), proj.ws.grad(), bias(proj)]
}

fn bf16(t: &Tensor) -> Tensor {
    t.to_kind(Kind::BFloat16).to_kind(Kind::Float)
}

/// The same computation in float32 on the bf16-rounded operands, rounded where the crate's step
/// rounds (GELU's output, the gradient that fc's GEMMs read, and what the backward reads: the tanh
/// form's input in bf16, the exact form's derivative in float16). fc's bias: rounded to bf16 for
/// the tanh form (cuBLASLt's epilogue takes it in the compute dtype, as autocast's at::linear),
/// float32 for the exact form (added to the float32 product in CUTLASS's epilogue, GELU and its
/// derivative applied to that sum, its bias gradient summed before dpre's rounding).
fn reference(x: &Tensor, fc: &Linear, proj: &Linear, w: &Tensor, approximate: GeluApproximate) -> Vec<Tensor> {
    let form = if approximate == GeluApproximate::Tanh { "tanh" } else { "none" };
    let (wf, bf) = (bf16(&fc.ws), fc.bs.as_ref().unwrap().detach());
    let bf = if approximate == GeluApproximate::Tanh { bf16(&bf) } else { bf };
    let (wp, bp) = (bf16(&proj.ws), proj.bs.as_ref().unwrap().detach());
    let xb = bf16(x);
    let pre = xb.matmul(&wf.tr()) + bf;
    let h = bf16(&pre.gelu(form));
    let y = h.matmul(&wp.tr()) + bf16(&bp);
    let dy = bf16(w);
    let dh = dy.matmul(&wp);
    let dpre = if approximate == GeluApproximate::Tanh {
        bf16(&pre).gelu_backward(&dh, form)
    } else {
        dh * pre.gelu_backward(&pre.ones_like(), form).to_kind(Kind::Half).to_kind(Kind::Float)
    };
    let dpre_b = bf16(&dpre);
    vec![
        y,
        dpre_b.matmul(&wf),
        dpre_b.tr().matmul(&xb),
        dpre.sum_dim_intlist(0, false, Kind::Float),
        dy.tr().matmul(&h),
        dy.sum_dim_intlist(0, false, Kind::Float),
    ]
}

const NAMES: [&str; 6] = ["y", "dx", "dW_fc", "db_fc", "dW_proj", "db_proj"];

/// GPT-2 small's MLP twice, on the crate's path and ATen's (the same parameters), an input x
/// [8192, C] and the loss's weights w.
struct Twins {
    x: Tensor,
    w: Tensor,
    own: nn::VarStore,
    fc1: Linear,
    proj1: Linear,
    fc2: Linear,
    proj2: Linear,
}

fn twins(dev: tch::Device, c: i64, h: i64) -> Twins {
    let rows = 8192;
    let x = Tensor::randn([rows, c], (Kind::Float, dev));
    let w = Tensor::randn([rows, c], (Kind::Float, dev));
    let (own, aten) = (nn::VarStore::new(dev), nn::VarStore::new(dev));
    let (fc1, proj1) = layers(&own, c, h, Kernels::Own);
    let (fc2, proj2) = layers(&aten, c, h, Kernels::PyTorch);
    tch::no_grad(|| {
        for (a, b) in aten.trainable_variables().iter().zip(own.trainable_variables()) {
            a.shallow_clone().copy_(&b);
        }
    });
    Twins { x, w, own, fc1, proj1, fc2, proj2 }
}

/// The MLP of layers without biases (256 → 1024 → 256, `Kernels::Own`) on `x` [.., 256] under
/// bf16 autocast: y within 1e-2 of ATen's composition, and every gradient made.
fn without_biases(x: &Tensor, approximate: GeluApproximate) {
    let form = if approximate == GeluApproximate::Tanh { "tanh" } else { "none" };
    let vs = nn::VarStore::new(x.device());
    let bare = LinearConfig { bias: false, kernels: Kernels::Own, ..Default::default() };
    let (fb, pb) = (linear(vs.root() / "fc", 256, 1024, bare), linear(vs.root() / "proj", 1024, 256, bare));
    let xb = x.detach().set_requires_grad(true);
    let yb = {
        let _bf16 = Autocast::new(Kind::BFloat16, false).expect("autocast");
        f_gelu_mlp(&xb, &fb, &pb, approximate).expect("no biases")
    };
    yb.to_kind(Kind::Float).sum(Kind::Float).backward();
    let y_ref = {
        let _bf16 = Autocast::new(Kind::BFloat16, false).expect("autocast");
        x.linear::<Tensor>(&fb.ws, None).gelu(form).linear::<Tensor>(&pb.ws, None)
    };
    let fy = rel(&yb, &y_ref);
    println!("{form} GELU without biases: y {fy:e} from ATen's composition; dx defined {}", xb.grad().defined());
    assert!(fy <= 1e-2 && xb.grad().defined() && fb.ws.grad().defined() && pb.ws.grad().defined());
}

/// The exact form on a bf16 input 2 bytes past a 16-byte boundary (so no cast makes an aligned
/// copy): CUTLASS's GEMMs refuse it, ATen's linear and gelu run forward and ATen's GELU backward
/// at the input they kept; y and every gradient within 1e-2 of those of the same input aligned
/// (CUTLASS's GEMMs, the derivative kept).
fn misaligned_input_falls_back(dev: tch::Device) {
    let (rows, c, h) = (2048, 256, 1024);
    let vs = nn::VarStore::new(dev);
    let (fc, proj) = layers(&vs, c, h, Kernels::Own);
    let flat = Tensor::randn([rows * c + 1], (Kind::Float, dev)).to_kind(Kind::BFloat16);
    let x = flat.narrow(0, 1, rows * c).view([rows, c]);
    let w = Tensor::randn([rows, c], (Kind::Float, dev));
    let mut results = vec![];
    for input in [x.shallow_clone(), x.copy()] {
        let (out, kernels) = kernels_of(dev, || run(&input, &fc, &proj, &w, GeluApproximate::None));
        results.push((
            out.iter().map(Tensor::copy).collect::<Vec<_>>(),
            kernels.iter().filter(|k| k.contains("gelu_gemm")).count(),
        ));
        for p in vs.trainable_variables() {
            let _ = p.grad().zero_();
        }
    }
    let ((odd, odd_cutlass), (aligned, aligned_cutlass)) = (&results[0], &results[1]);
    // (the crate's CUTLASS kernels by their namespace: cuBLAS's kernels for misaligned operands
    // are CUTLASS's too)
    println!("misaligned input: {odd_cutlass} of the crate's CUTLASS GEMMs ran (aligned: {aligned_cutlass})");
    assert_eq!((*odd_cutlass, *aligned_cutlass), (0, 2));
    for ((name, a), b) in NAMES.iter().zip(odd).zip(aligned) {
        let r = rel(a, b);
        println!("  misaligned against aligned, {name}: {r:e}");
        assert!(r <= 1e-2, "{name}: {r:e} between the fallback and CUTLASS's GEMMs");
    }
}

/// GELU's output itself, through the MLP with proj the identity (so y is h exactly: one nonzero
/// product a sum) under bf16 autocast: fc [768 → 768] (with its bias), x [4096, 768] and y.
fn gelu_output(dev: tch::Device, approximate: GeluApproximate) -> (Linear, Tensor, Tensor) {
    let vs = nn::VarStore::new(dev);
    let (fc, proj) = layers(&vs, 768, 768, Kernels::Own);
    tch::no_grad(|| {
        proj.ws.shallow_clone().copy_(&Tensor::eye(768, (Kind::Float, dev)));
        let _ = proj.bs.as_ref().unwrap().shallow_clone().zero_();
    });
    let x = Tensor::randn([4096, 768], (Kind::Float, dev));
    let y = {
        let _bf16 = Autocast::new(Kind::BFloat16, false).expect("autocast");
        tch::no_grad(|| f_gelu_mlp(&x, &fc, &proj, approximate).expect("mlp"))
    };
    (fc, x, y)
}

/// A GELU output `h` (bf16) against the exact values in float64: the most bf16 ulps from them
/// rounded once where |gelu| >= 2^-6, the largest absolute error below (where 1 + tanh or 1 + erf
/// cancel in float32 formulas), and the share of values equal to them rounded.
fn output_errors(h: &Tensor, exact: &Tensor) -> (f64, f64, f64) {
    let rounded = exact.to_kind(Kind::BFloat16);
    let large = exact.abs().ge(1.0 / 64.0);
    let ulps = bf16_ulps(&h.where_self(&large, &rounded), &rounded);
    let small = (h.to_kind(Kind::Double) - exact).abs() * large.logical_not().to_kind(Kind::Double);
    let same = f64::try_from(h.eq_tensor(&rounded).to_kind(Kind::Float).mean(Kind::Float)).unwrap();
    (ulps, f64::try_from(small.max()).unwrap(), same)
}

/// GELU's output `y` and ATen's `aten` against `exact` (float64) by output_errors, printed under
/// `what` (ATen's under `aten_what`); asserts `y` within one bf16 ulp where |gelu| >= 2^-6 and
/// within 1e-4 below.
fn check_output(what: &str, y: &Tensor, aten: &Tensor, exact: &Tensor, aten_what: &str) {
    let (ulps, small, same) = output_errors(y, exact);
    let (aten_ulps, aten_small, aten_same) = output_errors(aten, exact);
    println!(
        "{what}: max {ulps} bf16 ulp where |gelu| >= 2^-6, max |error| {small:e} below, {:.3}% equal ({aten_what}: {aten_ulps} ulp, {aten_small:e}, {:.3}%)",
        100.0 * same,
        100.0 * aten_same
    );
    assert!(ulps <= 1.0 && small <= 1e-4, "{what}: the epilogue's GELU is not that form");
}

/// Each of the forward and gradients (NAMES) against the float32 reference and ATen's
/// composition, printed; asserts within `to_ref` of the reference (and `to_aten` of ATen's).
fn compare(ours: &[Tensor], refs: &[Tensor], aten: &[Tensor], to_ref: f64, to_aten: Option<f64>) {
    for (i, name) in NAMES.iter().enumerate() {
        let (r, a) = (rel(&ours[i], &refs[i]), rel(&ours[i], &aten[i]));
        let aten_to_ref = rel(&aten[i], &refs[i]);
        println!(
            "{name} ({:?}): {r:e} from the float32 reference (ATen's composition: {aten_to_ref:e}), {a:e} from ATen's composition",
            ours[i].kind()
        );
        assert!(r <= to_ref, "{name}: {r:e} from the float32 reference");
        if let Some(most) = to_aten {
            assert!(a <= most, "{name}: {a:e} from ATen's composition");
        }
    }
}

/// One forward and backward of the MLP on `x0` (autocast bf16): y and the gradients of x and
/// `params`, flattened into one tensor.
fn mlp_step(
    x0: &Tensor,
    fc: &Linear,
    proj: &Linear,
    params: &[Tensor],
    approximate: GeluApproximate,
) -> tch_cuda_graphs::Result<Tensor> {
    let x = x0.detach().set_requires_grad(true);
    let y = {
        let _bf16 = Autocast::new(Kind::BFloat16, false)?;
        f_gelu_mlp(&x, fc, proj, approximate)?
    };
    let loss = y.to_kind(Kind::Float).square().sum(Kind::Float);
    let mut inputs = vec![x.shallow_clone()];
    inputs.extend(params.iter().map(|p| p.shallow_clone()));
    let g = tch_cuda_graphs::autograd::grad(&[loss], &inputs, None, false, false)?;
    Ok(output_and_grads(&y, &g))
}

#[test]
#[ignore = "needs a CUDA device"]
fn gelu_tanh_mlp_matches_the_epilogue_formula_and_the_composition() {
    let dev = cuda();
    tch::manual_seed(7);
    let (fc, x, y) = gelu_output(dev, GeluApproximate::Tanh);
    // against the tanh form in float64 on the same operands (the bias rounded to bf16, as
    // at::linear's under autocast), rounded once; ATen's float32 formula beside it
    let f64_of = |t: &Tensor| bf16(t).to_kind(Kind::Double);
    let pre = f64_of(&x).matmul(&f64_of(&fc.ws).tr()) + f64_of(fc.bs.as_ref().unwrap());
    let exact = pre.gelu("tanh");
    let aten = pre.to_kind(Kind::Float).gelu("tanh").to_kind(Kind::BFloat16);
    check_output(
        "GELU_AUX_BIAS epilogue [4096, 768] against the tanh form in float64 rounded once",
        &y,
        &aten,
        &exact,
        "ATen's float32 formula",
    );

    // GPT-2 small's MLP: forward and gradients against the float32 reference and the composition
    let (c, h) = (768, 3072);
    let Twins { x, w, fc1, proj1, fc2, proj2, .. } = twins(dev, c, h);
    // the crate's path runs no GELU kernel and no bias-gradient reduction of its own
    let (ours, kernels) = kernels_of(dev, || run(&x, &fc1, &proj1, &w, GeluApproximate::Tanh));
    let gemms = kernels.iter().filter(|k| k.contains("gemm") || k.contains("nvjet")).count();
    println!("forward and backward: {} kernels, {gemms} of them GEMMs", kernels.len());
    for k in &kernels {
        println!("  {}", k.chars().take(110).collect::<String>());
    }
    let gelu_kernels: Vec<&String> = kernels.iter().filter(|k| k.contains("Gelu") || k.contains("tcg_gelu")).collect();
    assert!(gelu_kernels.is_empty(), "a GELU kernel ran: {gelu_kernels:?}");
    let aten = run(&x, &fc2, &proj2, &w, GeluApproximate::Tanh);
    let refs = tch::no_grad(|| reference(&x, &fc1, &proj1, &w, GeluApproximate::Tanh));
    compare(&ours, &refs, &aten, 1e-2, None);
    assert_eq!(ours[0].kind(), Kind::BFloat16);
    assert!(ours[2..].iter().all(|g| g.kind() == Kind::Float));
}

/// A captured forward and backward equals its eager run bit for bit; `Kernels::Own` refuses what
/// the path does not take and `Kernels::Auto` falls back to ATen's composition; typed errors.
#[test]
#[ignore = "needs a CUDA device"]
fn gelu_tanh_mlp_captures_and_refuses_bad_input() {
    let dev = cuda();
    tch::manual_seed(8);
    let vs = nn::VarStore::new(dev);
    let (fc, proj) = layers(&vs, 256, 1024, Kernels::Own);
    let x0 = Tensor::randn([2048, 256], (Kind::Float, dev));
    let params = vs.trainable_variables();
    let step = || mlp_step(&x0, &fc, &proj, &params, GeluApproximate::Tanh);
    let d = captured_minus_eager(step);
    println!("captured GELU-epilogue MLP forward and backward against eager: max |difference| {d:e}");
    assert_eq!(d, 0.0);

    // float32 without autocast: no 16-bit compute dtype
    let x = Tensor::randn([16, 256], (Kind::Float, dev));
    match f_gelu_tanh_mlp(&x, &fc, &proj) {
        Err(Error::Unsupported(why)) => println!("Kernels::Own without autocast: {why}"),
        other => panic!("expected Unsupported, got {other:?}"),
    }
    let auto_vs = nn::VarStore::new(dev);
    let (fa, pa) = layers(&auto_vs, 256, 1024, Kernels::Auto);
    let y = f_gelu_tanh_mlp(&x, &fa, &pa).expect("auto");
    let y_ref = x.linear(&fa.ws, fa.bs.as_ref()).gelu("tanh").linear(&pa.ws, pa.bs.as_ref());
    assert!(y.equal(&y_ref), "Kernels::Auto falls back to ATen's composition");
    // without biases: the GELU_AUX and DGELU epilogues, against ATen's composition
    without_biases(&x, GeluApproximate::Tanh);

    let wrong = Tensor::randn([16, 255], (Kind::Float, dev));
    assert!(matches!(f_gelu_tanh_mlp(&wrong, &fa, &pa), Err(Error::Misuse(_))));
    assert!(matches!(f_gelu_tanh_mlp(&x, &fa, &fa), Err(Error::Misuse(_))), "proj must take fc's width");
}

/// GELU's exact form in CUTLASS's epilogues (sm_90, bf16): its GELU output against the exact
/// value of the float32 pre-activation rounded once, the forward and every gradient against the
/// float32 reference and ATen's composition, no GELU kernel and no bias-gradient pass, the bias
/// gradient the same bits run after run, and a captured step equal to eager bit for bit.
#[test]
#[ignore = "needs a CUDA device"]
fn gelu_mlp_exact_form_in_cutlass_epilogues() {
    let dev = cuda(); // and an sm_90 GPU: elsewhere Kernels::Own refuses the exact form, and this fails saying why
    tch::manual_seed(9);
    let (fc, x, y) = gelu_output(dev, GeluApproximate::None);
    let f64_of = |t: &Tensor| bf16(t).to_kind(Kind::Double);
    let pre = f64_of(&x).matmul(&f64_of(&fc.ws).tr()) + fc.bs.as_ref().unwrap().to_kind(Kind::Double);
    let exact = pre.gelu("none");
    let aten = {
        let _bf16 = Autocast::new(Kind::BFloat16, false).expect("autocast");
        tch::no_grad(|| x.linear(&fc.ws, fc.bs.as_ref()).gelu("none"))
    };
    check_output(
        "CUTLASS GELU epilogue [4096, 768] against GELU of the float64 pre-activation rounded once",
        &y,
        &aten,
        &exact,
        "ATen's linear then gelu, rounding the pre-activation first",
    );

    // GPT-2 small's MLP against the float32 reference and ATen's composition
    let (c, h) = (768, 3072);
    let Twins { x, w, own: vs1, fc1, proj1, fc2, proj2, .. } = twins(dev, c, h);
    let (ours, kernels) = kernels_of(dev, || run(&x, &fc1, &proj1, &w, GeluApproximate::None));
    println!("forward and backward: {} kernels", kernels.len());
    for k in &kernels {
        println!("  {}", k.chars().take(110).collect::<String>());
    }
    // (CUTLASS's kernel names hold their epilogue's activation: "Gelu" alone names no kernel);
    // fc's bias gradient: one finishing sum of the backward GEMM's partials
    let gelu_kernels: Vec<&String> = kernels
        .iter()
        .filter(|k| !k.contains("cutlass") && (k.contains("Gelu") || k.contains("gelu")) && *k != "tcg_gelu_finish")
        .collect();
    assert!(gelu_kernels.is_empty(), "a GELU kernel ran: {gelu_kernels:?}");
    assert_eq!(kernels.iter().filter(|k| k.contains("cutlass")).count(), 2, "CUTLASS's two GEMMs ran");
    let db_again = {
        for p in vs1.trainable_variables() {
            let _ = p.grad().zero_();
        }
        run(&x, &fc1, &proj1, &w, GeluApproximate::None)[3].copy()
    };
    assert!(db_again.equal(&ours[3]), "fc's bias gradient, summed in the GEMM's epilogue, is the same bits twice");
    let aten = run(&x, &fc2, &proj2, &w, GeluApproximate::None); // Kernels::PyTorch: linear, gelu, linear
    let refs = tch::no_grad(|| reference(&x, &fc1, &proj1, &w, GeluApproximate::None));
    compare(&ours, &refs, &aten, 1e-2, Some(2e-2));

    // captured equals eager, bit for bit (layers of their own: no accumulator of the runs above)
    let vs3 = nn::VarStore::new(dev);
    let (fc3, proj3) = layers(&vs3, c, h, Kernels::Own);
    let params = vs3.trainable_variables();
    let x0 = x.narrow(0, 0, 2048);
    let step = || mlp_step(&x0, &fc3, &proj3, &params, GeluApproximate::None);
    let d = captured_minus_eager(step);
    println!("captured exact-GELU MLP forward and backward against eager: max |difference| {d:e}");
    assert_eq!(d, 0.0);
    // without biases: the backward GEMM with no bias-gradient sums
    without_biases(&Tensor::randn([2048, 256], (Kind::Float, dev)), GeluApproximate::None);
    misaligned_input_falls_back(dev);
    // float32 without autocast: Kernels::Own refuses
    let xf = Tensor::randn([16, 768], (Kind::Float, dev));
    match f_gelu_mlp(&xf, &fc3, &proj3, GeluApproximate::None) {
        Err(Error::Unsupported(why)) => println!("Kernels::Own without autocast: {why}"),
        other => panic!("expected Unsupported, got {other:?}"),
    }
}
