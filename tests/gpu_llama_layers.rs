//! Rotary embeddings and SwiGLU on the crate's kernels against ATen's compositions on a GPU
//! (the bar, each figure printed): float32 within 1e-6 relative (the forward bit for bit
//! where both round the same operations), bf16 within one bf16 ulp of the float32 computation
//! on the same values rounded once; both rotary layouts, strided q and k (views of a fused
//! projection), a fused projection read whole (`f_forward_qkv`: q, k, v and the packed gradient
//! equal bit for bit to splitting it first, with no concatenation kernel), the projection and
//! the rotation in one node (`f_project_qkv`: equal bit for bit to the two calls, q, k and v
//! views of the projection), a device offset read
//! at replay (a captured decode step), and a captured step equal to the eager one bit for bit;
//! the SwiGLU MLP (`mlp::f_swiglu_mlp`, SwiGLU's backward in w2's GEMM) against a float32
//! reference, the layers apart and ATen's composition. Ignored without a GPU; fails loudly there.
mod common;

use common::{bf16_ulps, captured_minus_eager, cuda, kernels_of, output_and_grads, rel};
use tch::{nn, Kind, Tensor};
use tch_cuda_graphs::amp::Autocast;
use tch_cuda_graphs::kernels::{KernelPath, Kernels};
use tch_cuda_graphs::linear::{linear, Linear, LinearConfig, WeightGrad};
use tch_cuda_graphs::mlp::f_swiglu_mlp;
use tch_cuda_graphs::rotary::{Rotary, RotaryConfig, RotaryLayout};
use tch_cuda_graphs::swiglu::{SwiGlu, SwiGluConfig};
use tch_cuda_graphs::{capture_with_warmup, CaptureOptions, Error};

fn rotary_pair(rope: &Rotary, q: &Tensor, k: &Tensor, w: &Tensor, v: &Tensor) -> (Tensor, Tensor, Tensor, Tensor) {
    let (q, k) = (q.detach().set_requires_grad(true), k.detach().set_requires_grad(true));
    let (qr, kr) = rope.forward(&q, &k, 3);
    ((&qr.to_kind(Kind::Float) * w).sum(Kind::Float) + (&kr.to_kind(Kind::Float) * v).sum(Kind::Float)).backward();
    (qr, kr, q.grad(), k.grad())
}

#[test]
#[ignore = "needs a CUDA device"]
fn rotary_kernel_matches_the_composition() {
    let dev = cuda();
    tch::manual_seed(0);
    // q and k as views of one fused projection [B, T, H + 2 KV, D]: strided, last dim contiguous
    let (b, t, h, kv, d) = (4, 128, 12, 4, 64);
    let qkv = Tensor::randn([b, t, h + 2 * kv, d], (Kind::Float, dev));
    let (q, k) = (qkv.narrow(2, 0, h), qkv.narrow(2, h, kv));
    let (w, v) = (Tensor::randn([b, t, h, d], (Kind::Float, dev)), Tensor::randn([b, t, kv, d], (Kind::Float, dev)));
    for layout in [RotaryLayout::Interleaved, RotaryLayout::HalfSplit] {
        let own = Rotary::new(d, 1024, dev, RotaryConfig { layout, ..Default::default() });
        let aten = Rotary::new(d, 1024, dev, RotaryConfig { layout, kernels: Kernels::PyTorch, ..Default::default() });
        let (q1, k1, dq1, dk1) = rotary_pair(&own, &q, &k, &w, &v);
        assert_eq!(own.last_path(), Some(KernelPath::Own));
        let (q2, k2, dq2, dk2) = rotary_pair(&aten, &q, &k, &w, &v);
        assert_eq!(aten.last_path(), Some(KernelPath::PyTorch));
        let (fq, fk, bq, bk) = (rel(&q1, &q2), rel(&k1, &k2), rel(&dq1, &dq2), rel(&dk1, &dk2));
        println!("rotary {layout:?} fp32: forward q {fq:e}, k {fk:e}; backward q {bq:e}, k {bk:e} (relative)");
        assert!(fq == 0.0 && fk == 0.0, "the forward rounds as the composition does");
        assert!(bq <= 1e-6 && bk <= 1e-6);
        // bf16: against the float32 computation on the same bf16 values, rounded once
        let (qh, kh) = (q.to_kind(Kind::BFloat16), k.to_kind(Kind::BFloat16));
        let (q3, k3, dq3, _) = rotary_pair(&own, &qh, &kh, &w, &v);
        let (q4, k4, _, _) = rotary_pair(&aten, &qh.to_kind(Kind::Float), &kh.to_kind(Kind::Float), &w, &v);
        let (uq, uk) = (bf16_ulps(&q3, &q4.to_kind(Kind::BFloat16)), bf16_ulps(&k3, &k4.to_kind(Kind::BFloat16)));
        let equal =
            f64::try_from(q3.eq_tensor(&q4.to_kind(Kind::BFloat16)).to_kind(Kind::Float).mean(Kind::Float)).unwrap();
        println!(
            "rotary {layout:?} bf16: max {uq} ulp (q), {uk} ulp (k) from the fp32 result rounded; {:.4}% equal; grad dtype {:?}",
            equal * 100.0,
            dq3.kind()
        );
        assert!(uq <= 1.0 && uk <= 1.0);
    }
}

/// q, k, v and the packed gradient of `qkv` for the loss sum(q · w) + sum(k · u) + sum(v · u),
/// read whole (`fused`) or split first and rotated as two tensors.
fn rotary_qkv(rope: &Rotary, qkv: &Tensor, (h, kv): (i64, i64), w: &Tensor, u: &Tensor, fused: bool) -> Vec<Tensor> {
    let qkv = qkv.detach().set_requires_grad(true);
    let (q, k, v) = if fused {
        rope.f_forward_qkv(&qkv, h, kv, 0).expect("qkv")
    } else {
        let parts = qkv.split_with_sizes([h, kv, kv], 2);
        let (q, k) = rope.forward(&parts[0], &parts[1], 0);
        (q, k, parts[2].shallow_clone())
    };
    let f = |t: &Tensor, m: &Tensor| (t.to_kind(Kind::Float) * m).sum(Kind::Float);
    (f(&q, w) + f(&k, u) + f(&v, u)).backward();
    vec![q.detach(), k.detach(), v.detach(), qkv.grad()]
}

#[test]
#[ignore = "needs a CUDA device"]
fn rotary_reads_a_fused_qkv_whole_and_writes_its_gradient_packed() {
    let dev = cuda();
    tch::manual_seed(4);
    let (b, t, h, kv, d) = (4, 256, 12, 4, 64);
    let (w, u) = (Tensor::randn([b, t, h, d], (Kind::Float, dev)), Tensor::randn([b, t, kv, d], (Kind::Float, dev)));
    for kind in [Kind::Float, Kind::BFloat16] {
        let qkv = Tensor::randn([b, t, h + 2 * kv, d], (Kind::Float, dev)).to_kind(kind);
        let rope = Rotary::new(d, 1024, dev, RotaryConfig::default());
        let ((fused, names), split) = (
            kernels_of(dev, || rotary_qkv(&rope, &qkv, (h, kv), &w, &u, true)),
            rotary_qkv(&rope, &qkv, (h, kv), &w, &u, false),
        );
        let equal: Vec<bool> = fused.iter().zip(&split).map(|(a, b)| a.equal(b)).collect();
        let cats = names.iter().filter(|n| n.contains("CatArray")).count();
        println!("{kind:?}: q, k, v, dqkv equal to split-then-rotate {equal:?}; {cats} concatenation kernels");
        assert!(equal.iter().all(|e| *e), "bit for bit as splitting first: {equal:?}");
        assert_eq!(cats, 0, "the packed gradient is written, not concatenated: {names:?}");
        assert_eq!(rope.last_path(), Some(KernelPath::Own));
    }
    // ATen's composition reads the same; a head count that does not add up is refused
    let qkv = Tensor::randn([2, 16, h + 2 * kv, d], (Kind::Float, dev));
    let aten = Rotary::new(d, 1024, dev, RotaryConfig { kernels: Kernels::PyTorch, ..Default::default() });
    let own = Rotary::new(d, 1024, dev, RotaryConfig::default());
    let (a, o) = (aten.f_forward_qkv(&qkv, h, kv, 0).expect("aten"), own.f_forward_qkv(&qkv, h, kv, 0).expect("own"));
    assert!(a.0.equal(&o.0) && a.1.equal(&o.1) && a.2.equal(&o.2), "the composition's q, k, v");
    match own.f_forward_qkv(&qkv, h, kv + 1, 0) {
        Err(Error::Misuse(why)) => println!("heads that do not add up: {why}"),
        other => panic!("expected Misuse, got {other:?}"),
    }
}

/// q, k and v of `wqkv`'s projection of x under bf16 autocast, and the gradients of x and of
/// `wqkv`'s parameters for the loss sum(q · w) + sum(k · u) + sum(v · u): in one node
/// (`f_project_qkv`) or as the linear layer and `f_forward_qkv`.
fn projected_qkv(
    rope: &Rotary,
    wqkv: &Linear,
    x: &Tensor,
    (h, kv): (i64, i64),
    w: &Tensor,
    u: &Tensor,
    one: bool,
) -> Vec<Tensor> {
    let x = x.detach().set_requires_grad(true);
    let (q, k, v) = {
        let _amp = Autocast::new(Kind::BFloat16, false).expect("autocast");
        if one {
            rope.f_project_qkv(wqkv, &x, h, kv, 5).expect("project")
        } else {
            let size = x.size();
            let qkv = wqkv.f_forward(&x).expect("wqkv").view([size[0], size[1], h + 2 * kv, -1]);
            rope.f_forward_qkv(&qkv, h, kv, 5).expect("qkv")
        }
    };
    let f = |t: &Tensor, m: &Tensor| (t.to_kind(Kind::Float) * m).sum(Kind::Float);
    (f(&q, w) + f(&k, u) + f(&v, u)).backward();
    let mut out = vec![q.detach(), k.detach(), v.detach(), x.grad(), wqkv.ws.grad().copy()];
    if let Some(b) = &wqkv.bs {
        out.push(b.grad().copy());
        let _ = b.grad().zero_();
    }
    let _ = wqkv.ws.grad().zero_();
    out
}

#[test]
#[ignore = "needs a CUDA device"]
fn rotary_projects_qkv_in_one_node_as_the_two_calls_do() {
    let dev = cuda();
    tch::manual_seed(6);
    // the 124 M model's attention at 4 sequences of 1024
    let (b, t, c, h, kv, d) = (4, 1024, 768, 12, 4, 64);
    let (w, u) = (Tensor::randn([b, t, h, d], (Kind::Float, dev)), Tensor::randn([b, t, kv, d], (Kind::Float, dev)));
    let x = Tensor::randn([b, t, c], (Kind::Float, dev));
    for (layout, bias) in
        [(RotaryLayout::Interleaved, false), (RotaryLayout::HalfSplit, false), (RotaryLayout::Interleaved, true)]
    {
        let vs = nn::VarStore::new(dev);
        let cfg = LinearConfig { bias, ws_init: nn::Init::Randn { mean: 0.0, stdev: 0.05 }, ..Default::default() };
        let wqkv = linear(vs.root() / "wqkv", c, (h + 2 * kv) * d, cfg);
        let rope = Rotary::new(d, 2048, dev, RotaryConfig { layout, ..Default::default() });
        let (one, names) = kernels_of(dev, || projected_qkv(&rope, &wqkv, &x, (h, kv), &w, &u, true));
        assert_eq!(rope.last_path(), Some(KernelPath::Own));
        // interleaved pairs without a bias: the rotation in the GEMM's epilogue, the kernel only
        // in the backward; else the kernel both ways
        let rotary_kernels = names.iter().filter(|n| n.starts_with("tcg_rotary")).count();
        let in_gemm = layout == RotaryLayout::Interleaved && !bias;
        assert_eq!(rotary_kernels, if in_gemm { 1 } else { 2 }, "{names:?}");
        let two = projected_qkv(&rope, &wqkv, &x, (h, kv), &w, &u, false);
        let equal: Vec<bool> = one.iter().zip(&two).map(|(a, b)| a.equal(b)).collect();
        let most = one.iter().zip(&two).map(|(a, b)| rel(a, b)).fold(0.0, f64::max);
        println!(
            "{layout:?}, bias {bias}: rotated in the GEMM's epilogue {in_gemm}, largest relative difference {most:e}"
        );
        // q, k and v are views of the projection: k and v start where q's and k's heads end
        let (q, k, v) = (&one[0], &one[1], &one[2]);
        let step = |a: &Tensor, b: &Tensor| (b.data_ptr() as usize - a.data_ptr() as usize) / 2;
        let views = (step(q, k), step(k, v), q.stride());
        println!(
            "{layout:?}, bias {bias}: q, k, v, dx, dW{} equal to the two calls {equal:?}; k and v at {} and {} values on, q's strides {:?}",
            if bias { ", db" } else { "" },
            views.0,
            views.1,
            views.2
        );
        assert!(equal.iter().all(|e| *e), "bit for bit as the two calls: {equal:?}");
        assert_eq!(views, ((h * d) as usize, (kv * d) as usize, vec![t * (h + 2 * kv) * d, (h + 2 * kv) * d, d, 1]));
    }
    // a weight whose rows are not heads + 2 kv_heads heads, and an input that is not [b, t, c]
    let vs = nn::VarStore::new(dev);
    let wqkv = linear(vs.root() / "wqkv", c, (h + 2 * kv) * d + 2, LinearConfig { bias: false, ..Default::default() });
    let rope = Rotary::new(d, 1024, dev, RotaryConfig::default());
    match rope.f_project_qkv(&wqkv, &x, h, kv, 0) {
        Err(Error::Misuse(why)) => println!("rows that are not whole heads: {why}"),
        other => panic!("expected Misuse, got {other:?}"),
    }
    assert!(matches!(rope.f_project_qkv(&wqkv, &x.view([b * t, c]), h, kv, 0), Err(Error::Misuse(_))));
}

#[test]
#[ignore = "needs a CUDA device"]
fn rotary_at_a_device_offset_moves_on_in_a_captured_step() {
    let dev = cuda();
    let rope = Rotary::new(64, 32, dev, RotaryConfig::default());
    let (q, k) = (Tensor::randn([2, 1, 4, 64], (Kind::Float, dev)), Tensor::randn([2, 1, 2, 64], (Kind::Float, dev)));
    let pos = Tensor::zeros([], (Kind::Int64, dev));
    let (out_q, out_k) = (q.zeros_like(), k.zeros_like());
    let (mut graph, ()) = capture_with_warmup(1, CaptureOptions::default(), || {
        let (a, b) = rope.f_forward_at(&q, &k, &pos)?;
        out_q.shallow_clone().f_copy_(&a)?;
        out_k.shallow_clone().f_copy_(&b)?;
        Ok(())
    })
    .expect("capture");
    for p in [0i64, 7, 31] {
        let _ = pos.shallow_clone().fill_(p);
        graph.replay().expect("replay");
        let (want_q, want_k) = rope.forward(&q, &k, p);
        let d = rel(&out_q, &want_q).max(rel(&out_k, &want_k));
        println!("captured decode step at position {p}: max relative difference from eager {d:e}");
        assert_eq!(d, 0.0);
    }
    let _ = pos.shallow_clone().fill_(32); // past the table: NaN, no device assert
    graph.replay().expect("replay");
    assert!(bool::try_from(out_q.isnan().all()).unwrap());
    // the typed errors the kernel path gives too
    let bf = q.to_kind(Kind::BFloat16);
    assert!(matches!(rope.f_forward(&q, &k, 32), Err(Error::Misuse(_))));
    assert!(matches!(rope.f_forward(&bf, &k, 0), Err(Error::Misuse(_))));
    assert!(matches!(rope.f_forward_at(&q, &k, &pos.to_kind(Kind::Int)), Err(Error::Misuse(_))));
}

fn swiglu_grad(module: &SwiGlu, h: &Tensor, w: &Tensor) -> (Tensor, Tensor) {
    let h = h.detach().set_requires_grad(true);
    let y = module.f_forward(&h).expect("swiglu");
    (&y.to_kind(Kind::Float) * w).sum(Kind::Float).backward();
    (y, h.grad())
}

#[test]
#[ignore = "needs a CUDA device"]
fn swiglu_kernels_match_the_composition() {
    let dev = cuda();
    tch::manual_seed(1);
    let (rows, f) = (12 * 1024, 2048);
    let h = Tensor::randn([rows, 2 * f], (Kind::Float, dev)) * 3.0;
    let w = Tensor::randn([rows, f], (Kind::Float, dev));
    let own = SwiGlu::new(SwiGluConfig::default());
    let aten = SwiGlu::new(SwiGluConfig { kernels: Kernels::PyTorch });
    let (y1, g1) = swiglu_grad(&own, &h, &w);
    assert_eq!(own.last_path(), Some(KernelPath::Own));
    let (y2, g2) = swiglu_grad(&aten, &h, &w);
    let (fy, fg) = (rel(&y1, &y2), rel(&g1, &g2));
    println!("swiglu fp32: forward {fy:e}, backward {fg:e} (relative to ATen's silu and mul)");
    assert!(fy <= 1e-6 && fg <= 1e-6);
    let hb = h.to_kind(Kind::BFloat16);
    let (y3, g3) = swiglu_grad(&own, &hb, &w);
    let (y4, _) = swiglu_grad(&aten, &hb.to_kind(Kind::Float), &w);
    let u = bf16_ulps(&y3, &y4.to_kind(Kind::BFloat16));
    let (y5, g5) = swiglu_grad(&aten, &hb, &w); // ATen in bf16, as autocast runs it
    println!(
        "swiglu bf16: max {u} ulp from the fp32 result rounded; ATen's bf16 composition: {} ulp; grads {:?} vs {:?}",
        bf16_ulps(&y5, &y4.to_kind(Kind::BFloat16)),
        g3.kind(),
        g5.kind()
    );
    assert!(u <= 1.0);
}

/// Bias-free `w13` (C → 2F) and `w2` (F → C) with float32 weight gradients, as the Llama example's.
fn swiglu_layers(vs: &nn::VarStore, c: i64, f: i64, kernels: Kernels) -> (Linear, Linear) {
    let cfg = LinearConfig { bias: false, weight_grad: WeightGrad::Float32, kernels, ..Default::default() };
    (linear(vs.root() / "w13", c, 2 * f, cfg), linear(vs.root() / "w2", f, c, cfg))
}

/// y and the gradients of x, w13 and w2 for the loss sum(y · w) under `dtype` autocast, through
/// `f_swiglu_mlp` (`fused`) or the layers apart (`Linear`, `SwiGlu`, `Linear` of the same
/// kernels).
fn swiglu_mlp_run(x: &Tensor, w13: &Linear, w2: &Linear, w: &Tensor, dtype: Kind, fused: bool) -> Vec<Tensor> {
    let x = x.detach().set_requires_grad(true);
    let y = {
        let _amp = Autocast::new(dtype, false).expect("autocast");
        if fused {
            f_swiglu_mlp(&x, w13, w2).expect("swiglu mlp")
        } else {
            let act = SwiGlu::new(SwiGluConfig { kernels: w13.config().kernels });
            w2.f_forward(&act.f_forward(&w13.f_forward(&x).expect("w13")).expect("swiglu")).expect("w2")
        }
    };
    (&y.to_kind(Kind::Float) * w).sum(Kind::Float).backward();
    let out = vec![y, x.grad(), w13.ws.grad().copy(), w2.ws.grad().copy()];
    for p in [&w13.ws, &w2.ws] {
        let _ = p.grad().zero_();
    }
    out
}

fn bf16(t: &Tensor) -> Tensor {
    t.to_kind(Kind::BFloat16).to_kind(Kind::Float)
}

/// The same computation in float32 on the bf16 operands, rounded where the fused step rounds:
/// [gate | up] and SwiGLU's output (the GEMMs' bf16 outputs), [dgate | dup]; SwiGLU's backward
/// applied to w2's float32 product, as its GEMM's epilogue does.
fn swiglu_mlp_reference(x: &Tensor, w13: &Linear, w2: &Linear, w: &Tensor) -> Vec<Tensor> {
    let (xb, a, b) = (bf16(x), bf16(&w13.ws), bf16(&w2.ws));
    let ab = bf16(&xb.matmul(&a.tr()));
    let parts = ab.chunk(2, -1);
    let (g, u) = (&parts[0], &parts[1]);
    let h = bf16(&(g.silu() * u));
    let y = h.matmul(&b.tr());
    let dy = bf16(w);
    let dh = dy.matmul(&b);
    let sig = g.sigmoid();
    let dg = &dh * u * &sig * (g * (1.0 - &sig) + 1.0);
    let du = &dh * g * &sig;
    let dab = bf16(&Tensor::cat(&[dg, du], -1));
    vec![y, dab.matmul(&a), dab.tr().matmul(&xb), dy.tr().matmul(&h)]
}

/// The Llama 124 M row's MLP (768 → 2 × 2048 → 768) on 8192 tokens: through `f_swiglu_mlp`,
/// w13's up half's GEMM applies SwiGLU's forward and w2's input-gradient GEMM its backward
/// (CUTLASS's, named by their namespace) and no SwiGLU kernel runs; y equals the layers apart's
/// bit for bit (w13's GEMM and the SwiGLU kernel), and y and every gradient are within 1e-2 of the
/// float32 reference (the layers apart and ATen's composition printed beside); float16
/// (CUTLASS's GEMMs are bf16 only) runs the GEMMs and SwiGLU's kernels instead; a captured step
/// equals eager bit for bit; typed errors, and `Kernels::Auto` falling back to ATen's composition
/// without autocast.
#[test]
#[ignore = "needs a CUDA device"]
fn swiglu_mlp_applies_swiglus_backward_in_w2s_gemm() {
    let dev = cuda(); // and an sm_90 GPU with CUTLASS built: elsewhere the kernel count below fails
    tch::manual_seed(3);
    let (rows, c, f) = (8192, 768, 2048);
    let x = Tensor::randn([rows, c], (Kind::Float, dev));
    let w = Tensor::randn([rows, c], (Kind::Float, dev));
    let (own, aten) = (nn::VarStore::new(dev), nn::VarStore::new(dev));
    let (w13, w2) = swiglu_layers(&own, c, f, Kernels::Own);
    let (a13, a2) = swiglu_layers(&aten, c, f, Kernels::PyTorch);
    tch::no_grad(|| {
        for (a, b) in aten.trainable_variables().iter().zip(own.trainable_variables()) {
            a.shallow_clone().copy_(&b);
        }
    });
    let (fused, kernels) = kernels_of(dev, || swiglu_mlp_run(&x, &w13, &w2, &w, Kind::BFloat16, true));
    let count = |key: &str| kernels.iter().filter(|k| k.contains(key)).count();
    println!(
        "fused: {} kernels; SwiGLU forward {}, SwiGLU backward {}, the GEMMs with SwiGLU in their epilogues {}",
        kernels.len(),
        count("tcg_swiglu_fwd"),
        count("tcg_swiglu_bwd"),
        count("swiglu_gemm")
    );
    assert_eq!((count("tcg_swiglu_fwd"), count("tcg_swiglu_bwd"), count("swiglu_gemm")), (0, 0, 2));
    let apart = swiglu_mlp_run(&x, &w13, &w2, &w, Kind::BFloat16, false);
    let composed = swiglu_mlp_run(&x, &a13, &a2, &w, Kind::BFloat16, true);
    let refs = tch::no_grad(|| swiglu_mlp_reference(&x, &w13, &w2, &w));
    for (i, name) in ["y", "dx", "dW13", "dW2"].iter().enumerate() {
        let (r, r_apart, r_aten) = (rel(&fused[i], &refs[i]), rel(&apart[i], &refs[i]), rel(&composed[i], &refs[i]));
        let to_apart = rel(&fused[i], &apart[i]);
        println!(
            "{name} ({:?}): {r:e} from the float32 reference (the layers apart: {r_apart:e}, ATen's composition: {r_aten:e}); {to_apart:e} from the layers apart",
            fused[i].kind()
        );
        assert!(r <= 1e-2 && to_apart <= 1e-2, "{name}: {r:e} from the reference, {to_apart:e} from the layers apart");
    }
    assert!(fused[0].equal(&apart[0]), "the forward is the layers' own, bit for bit");

    // float16: w13's GEMM and SwiGLU's forward kernel; w2's GEMM writes the gradient, SwiGLU's
    // backward kernel applies it
    let (half, kernels) = kernels_of(dev, || swiglu_mlp_run(&x, &w13, &w2, &w, Kind::Half, true));
    let bwd = kernels.iter().filter(|k| k.contains("tcg_swiglu_bwd")).count();
    let fwd = kernels.iter().filter(|k| k.contains("tcg_swiglu_fwd")).count();
    let gemm = kernels.iter().filter(|k| k.contains("swiglu_gemm")).count();
    let half_apart = swiglu_mlp_run(&x, &w13, &w2, &w, Kind::Half, false);
    let d = half.iter().zip(&half_apart).map(|(a, b)| rel(a, b)).fold(0.0, f64::max);
    println!("float16: SwiGLU kernels {fwd} + {bwd}, CUTLASS's GEMMs {gemm}; {d:e} from the layers apart");
    assert!((fwd, bwd, gemm) == (1, 1, 0) && d == 0.0, "float16 runs the layers' own kernels");

    // captured equals eager, bit for bit
    let vs = nn::VarStore::new(dev);
    let (c13, c2) = swiglu_layers(&vs, c, f, Kernels::Own);
    let params = vs.trainable_variables();
    let x0 = x.narrow(0, 0, 2048);
    let step = || -> tch_cuda_graphs::Result<Tensor> {
        let x = x0.detach().set_requires_grad(true);
        let y = {
            let _bf16 = Autocast::new(Kind::BFloat16, false)?;
            f_swiglu_mlp(&x, &c13, &c2)?
        };
        let loss = y.to_kind(Kind::Float).square().sum(Kind::Float);
        let mut inputs = vec![x.shallow_clone()];
        inputs.extend(params.iter().map(|p| p.shallow_clone()));
        let g = tch_cuda_graphs::autograd::grad(&[loss], &inputs, None, false, false)?;
        Ok(output_and_grads(&y, &g))
    };
    let d = captured_minus_eager(step);
    println!("captured SwiGLU MLP forward and backward against eager: max |difference| {d:e}");
    assert_eq!(d, 0.0);

    // bad input: typed errors; float32 without autocast: Own refuses, Auto runs ATen's composition
    let xf = Tensor::randn([16, c], (Kind::Float, dev));
    match f_swiglu_mlp(&xf, &c13, &c2) {
        Err(Error::Unsupported(why)) => println!("Kernels::Own without autocast: {why}"),
        other => panic!("expected Unsupported, got {other:?}"),
    }
    let auto_vs = nn::VarStore::new(dev);
    let (u13, u2) = swiglu_layers(&auto_vs, c, f, Kernels::Auto);
    let y = f_swiglu_mlp(&xf, &u13, &u2).expect("auto");
    let parts = xf.linear::<Tensor>(&u13.ws, None).chunk(2, -1);
    let y_ref = (parts[0].silu() * &parts[1]).linear::<Tensor>(&u2.ws, None);
    assert!(y.equal(&y_ref), "Kernels::Auto falls back to ATen's composition");
    assert!(matches!(f_swiglu_mlp(&xf, &u2, &u13), Err(Error::Misuse(_))), "w13 must take x's width");
    assert!(matches!(f_swiglu_mlp(&xf, &u13, &u13), Err(Error::Misuse(_))), "w2 must take half w13's out");
}
