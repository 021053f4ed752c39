//! Rotary embeddings, SwiGLU (alone and in its MLP) and the embedding on the CPU (ATen's compositions, what a machine without a GPU or
//! nvcc runs): against plain tch written from the formulas (Meta's complex product for the
//! interleaved layout, Hugging Face's `rotate_half` for the half-split one, `silu(gate) * up`),
//! positions with an offset, the gradient through both, the embedding equal to tch's
//! `nn::embedding` (rows and gradient, `padding_idx` included, and through a tied head), and the
//! typed errors.
use tch::{nn, nn::Module, Device, Kind, Tensor};
use tch_cuda_graphs::embedding::{embedding, EmbeddingConfig};
use tch_cuda_graphs::kernels::KernelPath;
use tch_cuda_graphs::linear::{linear, LinearConfig};
use tch_cuda_graphs::mlp::f_swiglu_mlp;
use tch_cuda_graphs::rotary::{Rotary, RotaryConfig, RotaryLayout};
use tch_cuda_graphs::swiglu::{f_swiglu, SwiGlu, SwiGluConfig};
use tch_cuda_graphs::Error;

fn max_diff(a: &Tensor, b: &Tensor) -> f64 {
    f64::try_from((a - b).abs().max()).unwrap()
}

/// The rotation written from the formulas, on x [B, T, H, D] at positions offset.., in f64.
fn reference(x: &Tensor, base: f64, offset: i64, layout: RotaryLayout) -> Tensor {
    let (t, d) = (x.size()[1], x.size()[3]);
    let x = x.to_kind(Kind::Double);
    let i = Tensor::arange(d / 2, (Kind::Double, Device::Cpu));
    let inv_freq = (i * (-2.0 * base.ln() / d as f64)).exp();
    let pos = Tensor::arange_start(offset, offset + t, (Kind::Double, Device::Cpu));
    let ang = pos.outer(&inv_freq).view([1, t, 1, d / 2]);
    let (c, s) = (ang.cos(), ang.sin());
    match layout {
        RotaryLayout::HalfSplit => {
            let (x0, x1) = (x.narrow(-1, 0, d / 2), x.narrow(-1, d / 2, d / 2));
            Tensor::cat(&[&x0 * &c - &x1 * &s, &x0 * &s + &x1 * &c], -1)
        }
        _ => {
            let pairs = x.unflatten(-1, [d / 2, 2]);
            let (x0, x1) = (pairs.select(-1, 0), pairs.select(-1, 1));
            Tensor::stack(&[&x0 * &c - &x1 * &s, &x0 * &s + &x1 * &c], -1).flatten(-2, -1)
        }
    }
}

#[test]
fn rotary_on_the_cpu_matches_the_formulas_in_both_layouts() {
    tch::manual_seed(0);
    let q = Tensor::randn([2, 12, 4, 16], (Kind::Float, Device::Cpu));
    let k = Tensor::randn([2, 12, 2, 16], (Kind::Float, Device::Cpu));
    for layout in [RotaryLayout::Interleaved, RotaryLayout::HalfSplit] {
        let rope = Rotary::new(16, 64, Device::Cpu, RotaryConfig { layout, ..Default::default() });
        for offset in [0, 5] {
            let (qr, kr) = rope.f_forward(&q, &k, offset).expect("rotary");
            let dq = max_diff(&qr.to_kind(Kind::Double), &reference(&q, 10_000.0, offset, layout));
            let dk = max_diff(&kr.to_kind(Kind::Double), &reference(&k, 10_000.0, offset, layout));
            println!("{layout:?}, offset {offset}: max |q - formula| {dq:e}, |k - formula| {dk:e}");
            assert!(dq < 1e-5 && dk < 1e-5, "{dq} {dk}");
            assert_eq!(rope.last_path(), Some(KernelPath::PyTorch));
        }
    }
}

#[test]
fn rotary_preserves_norms_and_its_gradient_is_the_inverse_rotation() {
    let rope = Rotary::new(8, 16, Device::Cpu, RotaryConfig::default());
    let q = Tensor::randn([1, 4, 2, 8], (Kind::Float, Device::Cpu)).set_requires_grad(true);
    let k = Tensor::randn([1, 4, 1, 8], (Kind::Float, Device::Cpu)).set_requires_grad(true);
    let (qr, kr) = rope.forward(&q, &k, 3);
    let norm_change = max_diff(&qr.square().sum(Kind::Float), &q.square().sum(Kind::Float));
    println!("|‖Rq‖² − ‖q‖²| = {norm_change:e}");
    assert!(norm_change < 1e-4);
    // d/dq of <Rq, w> is Rᵀw: rotating it forward again gives w back
    let w = Tensor::randn([1, 4, 2, 8], (Kind::Float, Device::Cpu));
    (&qr * &w).sum(Kind::Float).backward();
    let (back, _) = rope.forward(&q.grad(), &kr.detach(), 3);
    let err = max_diff(&back, &w);
    println!("R(Rᵀw) − w: {err:e}");
    assert!(err < 1e-5);
}

#[test]
fn rotary_refuses_bad_input_with_typed_errors() {
    assert!(matches!(Rotary::f_new(7, 16, Device::Cpu, RotaryConfig::default()), Err(Error::Misuse(_))));
    let rope = Rotary::new(8, 16, Device::Cpu, RotaryConfig::default());
    let q = Tensor::randn([1, 4, 2, 8], (Kind::Float, Device::Cpu));
    let cases = [
        ("positions past the table", rope.f_forward(&q, &q, 13)),
        ("a negative offset", rope.f_forward(&q, &q, -1)),
        ("integer q", rope.f_forward(&q.to_kind(Kind::Int64), &q.to_kind(Kind::Int64), 0)),
        ("q and k of two dtypes", rope.f_forward(&q, &q.to_kind(Kind::Double), 0)),
        ("another head dimension", rope.f_forward(&q.narrow(3, 0, 6), &q.narrow(3, 0, 6), 0)),
        ("three dimensions", rope.f_forward(&q.flatten(2, 3), &q.flatten(2, 3), 0)),
    ];
    for (what, got) in cases {
        println!("{what}: {:?}", got.as_ref().err());
        assert!(matches!(got, Err(Error::Misuse(_))), "{what}: {got:?}");
    }
    assert!(rope.f_forward(&q, &q, 12).is_ok(), "the last positions of the table");
}

#[test]
fn swiglu_on_the_cpu_is_silu_of_gate_times_up() {
    let h = Tensor::randn([3, 5, 16], (Kind::Float, Device::Cpu)).set_requires_grad(true);
    let module = SwiGlu::new(SwiGluConfig::default());
    let y = module.f_forward(&h).expect("swiglu");
    let parts = h.chunk(2, -1);
    let want = parts[0].silu() * &parts[1];
    assert_eq!(max_diff(&y, &want), 0.0);
    assert_eq!(module.last_path(), Some(KernelPath::PyTorch));
    y.sum(Kind::Float).backward();
    assert_eq!(h.grad().size(), [3, 5, 16]);
    let odd = f_swiglu(&Tensor::zeros([2, 7], (Kind::Float, Device::Cpu)), &SwiGluConfig::default());
    assert!(matches!(odd, Err(Error::Misuse(_))), "{odd:?}");
    let ints = f_swiglu(&Tensor::zeros([2, 8], (Kind::Int64, Device::Cpu)), &SwiGluConfig::default());
    assert!(matches!(ints, Err(Error::Misuse(_))), "{ints:?}");
}

/// The SwiGLU MLP on the CPU: ATen's linear, silu, mul and linear, the same bits as tch written
/// that way, with biases too; layers whose shapes do not chain are typed errors.
#[test]
fn swiglu_mlp_on_the_cpu_is_the_composition() {
    let vs = nn::VarStore::new(Device::Cpu);
    let cfg = LinearConfig::default();
    let (w13, w2) = (linear(vs.root() / "w13", 16, 2 * 24, cfg), linear(vs.root() / "w2", 24, 16, cfg));
    let x = Tensor::randn([3, 5, 16], (Kind::Float, Device::Cpu)).set_requires_grad(true);
    let y = f_swiglu_mlp(&x, &w13, &w2).expect("swiglu mlp");
    let parts = x.apply(&w13).chunk(2, -1);
    let want = (parts[0].silu() * &parts[1]).apply(&w2);
    assert_eq!(max_diff(&y, &want), 0.0);
    y.sum(Kind::Float).backward();
    assert_eq!(x.grad().size(), [3, 5, 16]);
    assert!(w13.ws.grad().defined() && w2.ws.grad().defined());
    let odd = linear(vs.root() / "odd", 16, 47, cfg);
    assert!(matches!(f_swiglu_mlp(&x, &odd, &w2), Err(Error::Misuse(_))), "w13's out must be even");
    assert!(matches!(f_swiglu_mlp(&x, &w13, &w13), Err(Error::Misuse(_))), "w2 must take half w13's out");
}

#[test]
fn the_embedding_on_the_cpu_is_tchs_with_padding_idx() {
    tch::manual_seed(0);
    let vs = nn::VarStore::new(Device::Cpu);
    let config = EmbeddingConfig { padding_idx: 3, ..Default::default() };
    let ours = embedding(vs.root() / "ours", 10, 8, config);
    let theirs = nn::embedding(vs.root() / "tch", 10, 8, nn::EmbeddingConfig { padding_idx: 3, ..Default::default() });
    tch::no_grad(|| theirs.ws.shallow_clone().copy_(&ours.ws));
    let idx = Tensor::from_slice(&[1i64, 3, 3, 7, 1, 0, 9, 1]).view([2, 4]);
    let (a, b) = (ours.forward(&idx), theirs.forward(&idx));
    let w = Tensor::randn([2, 4, 8], (Kind::Float, Device::Cpu));
    (&a * &w).sum(Kind::Float).backward();
    (&b * &w).sum(Kind::Float).backward();
    let (ga, gb) = (ours.ws.grad(), theirs.ws.grad());
    println!(
        "rows {:e}, gradient {:e}, padding row {:e}",
        max_diff(&a, &b),
        max_diff(&ga, &gb),
        f64::try_from(ga.get(3).abs().max()).unwrap()
    );
    assert!(a.equal(&b) && ga.equal(&gb), "the same rows and gradient as tch's embedding");
    assert_eq!(f64::try_from(ga.get(3).abs().max()).unwrap(), 0.0, "padding_idx gets no gradient");
    assert_eq!(ours.last_path(), Some(KernelPath::PyTorch));
    // typed errors: float indices, a padding_idx past the table
    match ours.f_forward(&idx.to_kind(Kind::Float)) {
        Err(Error::Misuse(why)) => println!("float indices: {why}"),
        other => panic!("expected Misuse, got {other:?}"),
    }
    let past = embedding(vs.root() / "past", 10, 8, EmbeddingConfig { padding_idx: 10, ..Default::default() });
    assert!(matches!(past.f_forward(&idx), Err(Error::Misuse(_))), "padding_idx past the table");

    // the tied head: the rows, then x · wsᵀ, as tch's embedding and linear compute them
    let h = Tensor::randn([2, 4, 8], (Kind::Float, Device::Cpu));
    for _ in 0..2 {
        ours.ws.shallow_clone().zero_grad();
        theirs.ws.shallow_clone().zero_grad();
        let x = (ours.forward(&idx) * &h).tanh();
        let y = ours.attend(&x, &LinearConfig::default());
        let want = (theirs.forward(&idx) * &h).tanh().linear::<Tensor>(&theirs.ws, None);
        y.sum(Kind::Float).backward();
        want.sum(Kind::Float).backward();
        println!(
            "tied head: logits {:e}, gradient {:e}",
            max_diff(&y, &want),
            max_diff(&ours.ws.grad(), &theirs.ws.grad())
        );
        assert!(y.equal(&want) && ours.ws.grad().equal(&theirs.ws.grad()), "the tied head is tch's linear on ws");
    }
}

#[test]
fn rotary_from_a_fused_qkv_on_the_cpu_is_split_then_rotate() {
    tch::manual_seed(1);
    let rope = Rotary::new(16, 64, Device::Cpu, RotaryConfig::default());
    let qkv = Tensor::randn([2, 12, 4 + 2 * 2, 16], (Kind::Float, Device::Cpu));
    let (q, k, v) = rope.f_forward_qkv(&qkv, 4, 2, 3).expect("qkv");
    let (q2, k2) = rope.forward(&qkv.narrow(2, 0, 4), &qkv.narrow(2, 4, 2), 3);
    println!("q {:e}, k {:e}, v {:e}", max_diff(&q, &q2), max_diff(&k, &k2), max_diff(&v, &qkv.narrow(2, 6, 2)));
    assert!(q.equal(&q2) && k.equal(&k2) && v.equal(&qkv.narrow(2, 6, 2)));
    assert!(matches!(rope.f_forward_qkv(&qkv, 4, 1, 0), Err(Error::Misuse(_))), "heads that do not add up");
}

#[test]
fn the_projection_with_rotary_on_the_cpu_is_the_linear_layer_then_rotate() {
    tch::manual_seed(2);
    let vs = nn::VarStore::new(Device::Cpu);
    let wqkv = linear(vs.root() / "wqkv", 32, (4 + 2 * 2) * 16, LinearConfig { bias: false, ..Default::default() });
    let rope = Rotary::new(16, 64, Device::Cpu, RotaryConfig::default());
    let x = Tensor::randn([2, 12, 32], (Kind::Float, Device::Cpu));
    let (q, k, v) = rope.f_project_qkv(&wqkv, &x, 4, 2, 3).expect("project");
    let (q2, k2, v2) = rope.f_forward_qkv(&wqkv.forward(&x).view([2, 12, 8, 16]), 4, 2, 3).expect("qkv");
    println!("q {:e}, k {:e}, v {:e}", max_diff(&q, &q2), max_diff(&k, &k2), max_diff(&v, &v2));
    assert!(q.equal(&q2) && k.equal(&k2) && v.equal(&v2));
    assert!(matches!(rope.f_project_qkv(&wqkv, &x, 4, 1, 0), Err(Error::Misuse(_))), "heads that do not add up");
    assert!(matches!(rope.f_project_qkv(&wqkv, &x.view([24, 32]), 4, 2, 0), Err(Error::Misuse(_))), "x not [b, t, c]");
}
