//! The embedding's own backward (`embedding::Embedding`) on a GPU, each figure printed: at the
//! Llama-style model's shape (12,288 tokens into 32,000 × 768, float32) and at a 96-row vocabulary
//! (many repeats per row), the rows equal ATen's bit for bit; the gradient within 4e-6 (of the largest value) of a
//! float64 sum and of ATen's, the same bit for bit on every run (no atomics), `padding_idx`'s row
//! zero; a bfloat16 table's gradient within one rounding of the float64 sum; a captured forward
//! and backward equal to eager; one crate kernel and none of ATen's scatter kernels (at the small
//! vocabulary, which the kernel scans, no sort either); and the
//! choice of path (`Kernels::Own` refuses a CPU table); a head tied to the table
//! (`Embedding::f_attend`) whose weight gradient the embedding's backward adds its rows into:
//! equal bit for bit to the head on `ws` (`linear::f_apply`) with autograd's add, the add gone,
//! captured equal to eager. Ignored without a GPU; fails loudly there.
mod common;

use common::{captured_minus_eager, cuda, kernels_of, rel};
use tch::{nn, Device, Kind, Tensor};
use tch_cuda_graphs::amp::Autocast;
use tch_cuda_graphs::embedding::{embedding, Embedding, EmbeddingConfig};
use tch_cuda_graphs::kernels::{KernelPath, Kernels};
use tch_cuda_graphs::linear::{self, LinearConfig, WeightGrad};
use tch_cuda_graphs::Error;

/// The rows and the table's gradient for the loss sum(rows · w).
fn run(e: &Embedding, idx: &Tensor, w: &Tensor) -> (Tensor, Tensor) {
    let ws = e.ws.shallow_clone();
    let y = e.f_forward(idx).expect("forward");
    let g =
        tch_cuda_graphs::autograd::grad(&[(&y.to_kind(Kind::Float) * w).sum(Kind::Float)], &[ws], None, false, false)
            .expect("backward");
    (y.detach(), g[0].as_ref().expect("a gradient").shallow_clone())
}

/// The gradient summed in float64: index_add of w's rows.
fn reference(vocab: i64, idx: &Tensor, w: &Tensor, padding_idx: i64) -> Tensor {
    let dim = w.size()[w.dim() - 1];
    let mut g = Tensor::zeros([vocab, dim], (Kind::Double, w.device()));
    g = g.index_add(0, &idx.reshape([-1]), &w.to_kind(Kind::Double).reshape([-1, dim]));
    if padding_idx >= 0 {
        let _ = g.get(padding_idx).fill_(0.0);
    }
    g
}

fn table(vs: &nn::VarStore, vocab: i64, dim: i64, padding_idx: i64, kernels: Kernels) -> Embedding {
    embedding(vs.root(), vocab, dim, EmbeddingConfig { padding_idx, kernels, ..Default::default() })
}

#[test]
#[ignore = "needs a CUDA device"]
fn the_embedding_backward_matches_aten_and_float64_and_repeats() {
    let dev = cuda();
    for (vocab, dim, shape, padding_idx) in [(32000i64, 768i64, [12i64, 1024i64], -1i64), (96, 384, [64, 256], 5)] {
        tch::manual_seed(11);
        let vs = nn::VarStore::new(dev);
        let ours = table(&vs, vocab, dim, padding_idx, Kernels::Own);
        let vs_aten = nn::VarStore::new(dev);
        let aten = table(&vs_aten, vocab, dim, padding_idx, Kernels::PyTorch);
        tch::no_grad(|| aten.ws.shallow_clone().copy_(&ours.ws));
        let idx = Tensor::randint(vocab, shape, (Kind::Int64, dev));
        let w = Tensor::randn([shape[0], shape[1], dim], (Kind::Float, dev));
        let ((ya, ga), (yb, gb)) = (run(&ours, &idx, &w), run(&aten, &idx, &w));
        let (_, again) = run(&ours, &idx, &w);
        let want = reference(vocab, &idx, &w, padding_idx);
        let (vs_f64, vs_aten_rel) = (rel(&ga.to_kind(Kind::Double), &want), rel(&ga, &gb));
        let aten_f64 = rel(&gb.to_kind(Kind::Double), &want);
        let repeat = f64::try_from((&again - &ga).abs().max()).unwrap();
        println!(
            "vocab {vocab} x {dim}, {shape:?} tokens: rows equal {}; gradient vs float64 {vs_f64:.2e} (ATen's {aten_f64:.2e}), vs ATen {vs_aten_rel:.2e}; repeat {repeat:e}",
            ya.equal(&yb)
        );
        assert_eq!(ours.last_path(), Some(KernelPath::Own));
        assert!(ya.equal(&yb), "the rows are ATen's, bit for bit");
        assert!(vs_f64 < 4e-6 && vs_aten_rel < 4e-6, "within 4e-6 of float64 and of ATen: {vs_f64:e} {vs_aten_rel:e}");
        assert_eq!(repeat, 0.0, "deterministic: the same gradient every run");
        if padding_idx >= 0 {
            assert_eq!(f64::try_from(ga.get(padding_idx).abs().max()).unwrap(), 0.0, "padding_idx's row is zero");
        }
        // at the 96-row vocabulary the kernel scans the ids: no sort
        let (_, names) = kernels_of(dev, || run(&ours, &idx, &w));
        let kernel = if vocab <= 1024 { "tcg_embedding_scan" } else { "tcg_embedding_bwd" };
        let ours_ran = names.iter().filter(|n| n.starts_with(kernel)).count();
        let sorts = names.iter().filter(|n| n.to_lowercase().contains("sort")).count();
        let scatter =
            names.iter().filter(|n| n.contains("sum_and_scatter") || n.contains("compute_grad_weight")).count();
        println!("kernels: {} in all, {ours_ran} {kernel}, {sorts} sorting, {scatter} of ATen's scatter", names.len());
        assert!(ours_ran == 1 && scatter == 0, "one crate kernel, none of ATen's scatter: {names:?}");
        assert!(vocab > 1024 || sorts == 0, "no sort at a small vocabulary: {names:?}");
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn a_bf16_table_and_a_captured_step_and_the_choice_of_path() {
    let dev = cuda();
    tch::manual_seed(12);
    let vs = nn::VarStore::new(dev);
    let ours = table(&vs, 1000, 256, -1, Kernels::Own);
    tch::no_grad(|| ours.ws.shallow_clone().set_data(&ours.ws.to_kind(Kind::BFloat16)));
    let idx = Tensor::randint(1000, [8, 512], (Kind::Int64, dev));
    let w = Tensor::randn([8, 512, 256], (Kind::Float, dev));
    let (_, g) = run(&ours, &idx, &w);
    // the float64 sum of the bf16-rounded output gradients, rounded once
    let want = reference(1000, &idx, &w.to_kind(Kind::BFloat16), -1).to_kind(Kind::BFloat16).to_kind(Kind::Double);
    let ulps = common::bf16_ulps(&g.to_kind(Kind::Float), &want.to_kind(Kind::Float));
    println!("bf16 table: gradient within {ulps} bf16 ulps of the float64 sum");
    assert_eq!(g.kind(), Kind::BFloat16);
    assert!(ulps <= 1.0, "within one bf16 rounding of the float64 sum: {ulps}");

    let d = captured_minus_eager(|| {
        let (y, g) = run(&ours, &idx, &w);
        Ok(Tensor::cat(&[y.to_kind(Kind::Float).reshape([-1]), g.to_kind(Kind::Float).reshape([-1])], 0))
    });
    println!("captured forward and backward against eager: max |difference| {d:e}");
    assert_eq!(d, 0.0);

    let cpu_vs = nn::VarStore::new(Device::Cpu);
    let cpu = table(&cpu_vs, 10, 8, -1, Kernels::Own);
    match cpu.f_forward(&Tensor::from_slice(&[1i64, 2])) {
        Err(Error::Unsupported(why)) => println!("Kernels::Own on a CPU table: {why}"),
        other => panic!("expected Unsupported, got {other:?}"),
    }
    let auto = table(&cpu_vs, 10, 8, -1, Kernels::Auto);
    let _ = auto.f_forward(&Tensor::from_slice(&[1i64, 2])).expect("auto");
    assert_eq!(auto.last_path(), Some(KernelPath::PyTorch), "Kernels::Auto falls back to ATen on a CPU");
}

/// The table's gradient through a tied head: rows → · body → the head (`f_attend`, or
/// `linear::f_apply` on `ws` when not `tied`) → sum(logits · v), under bf16 autocast for a
/// float32 table.
fn tied_grad(e: &Embedding, idx: &Tensor, body: &Tensor, v: &Tensor, tied: bool) -> tch_cuda_graphs::Result<Tensor> {
    let ws = e.ws.shallow_clone();
    let h = e.f_forward(idx)?.f_mul(body)?;
    let config = LinearConfig { weight_grad: WeightGrad::Float32, kernels: Kernels::Own, ..Default::default() };
    let logits = {
        let _autocast = (e.ws.kind() == Kind::Float).then(|| Autocast::new(Kind::BFloat16, false)).transpose()?;
        if tied {
            e.f_attend(&h, &config)?
        } else {
            linear::f_apply(&h, &e.ws, None, &config)?
        }
    };
    let loss = (logits.to_kind(Kind::Float) * v).sum(Kind::Float);
    let g = tch_cuda_graphs::autograd::grad(&[loss], &[ws], None, false, false)?;
    Ok(g[0].as_ref().expect("a gradient").shallow_clone())
}

#[test]
#[ignore = "needs a CUDA device"]
fn a_tied_head_gets_the_embeddings_rows_added_in_place() {
    let dev = cuda();
    // sorted ids (a large vocabulary, with padding_idx), scanned ids (65 rows), a bf16 table
    for (vocab, dim, shape, padding_idx, kind) in [
        (50304i64, 128i64, [4i64, 512i64], 7i64, Kind::Float),
        (65, 128, [8, 256], -1, Kind::Float),
        (4096, 64, [4, 256], -1, Kind::BFloat16),
    ] {
        tch::manual_seed(13);
        let vs = nn::VarStore::new(dev);
        let e = table(&vs, vocab, dim, padding_idx, Kernels::Own);
        if kind != Kind::Float {
            tch::no_grad(|| e.ws.shallow_clone().set_data(&e.ws.to_kind(kind)));
        }
        let idx = Tensor::randint(vocab, shape, (Kind::Int64, dev));
        if padding_idx >= 0 {
            let _ = idx.get(0).get(0).fill_(padding_idx);
        }
        let body = Tensor::randn([shape[0], shape[1], dim], (kind, dev));
        let v = Tensor::randn([shape[0], shape[1], vocab], (Kind::Float, dev));
        // the first head to attend makes the table keep its ties from the next forward on
        let _ = tied_grad(&e, &idx, &body, &v, true).expect("first");
        let (tied, names) = kernels_of(dev, || tied_grad(&e, &idx, &body, &v, true).expect("tied"));
        let (plain, plain_names) = kernels_of(dev, || tied_grad(&e, &idx, &body, &v, false).expect("plain"));
        let adds = |names: &[String]| names.iter().filter(|n| n.contains("CUDAFunctor_add")).count();
        let d = f64::try_from((&tied - &plain).abs().max()).unwrap();
        let pad = if padding_idx >= 0 { rel(&tied.get(padding_idx), &plain.get(padding_idx)) } else { 0.0 };
        println!(
            "vocab {vocab} x {dim} {kind:?}, {shape:?} tokens: tied against autograd's add max |difference| {d:e}; \
             adds {} against {}; kernels {} against {}",
            adds(&names),
            adds(&plain_names),
            names.len(),
            plain_names.len()
        );
        assert_eq!(tied.kind(), kind);
        assert_eq!(d, 0.0, "the tied gradient is autograd's sum, bit for bit");
        assert_eq!(pad, 0.0, "padding_idx's row is the head's gradient alone");
        assert!(adds(&names) == 0 && adds(&plain_names) == 1, "the add is gone: {names:?}");
        assert_eq!(names.len() + 1, plain_names.len(), "one kernel fewer");

        let d = captured_minus_eager(|| tied_grad(&e, &idx, &body, &v, true));
        println!("captured against eager: max |difference| {d:e}");
        assert_eq!(d, 0.0);
    }
    // a head that takes a tie after the table's backward ran (no forward since) still gets its
    // gradient to the table; a forward without grad leaves no tie
    let vs = nn::VarStore::new(dev);
    let e = table(&vs, 300, 64, -1, Kernels::Own);
    let idx = Tensor::randint(300, [2, 64], (Kind::Int64, dev));
    let body = Tensor::randn([2, 64, 64], (Kind::Float, dev));
    let v = Tensor::randn([2, 64, 300], (Kind::Float, dev));
    let _ = tied_grad(&e, &idx, &body, &v, true).expect("first");
    let h = e.f_forward(&idx).expect("forward").f_mul(&body).expect("mul");
    let _ = tch_cuda_graphs::autograd::grad(&[h.sum(Kind::Float)], &[e.ws.shallow_clone()], None, false, false)
        .expect("the table's backward");
    let config = LinearConfig { weight_grad: WeightGrad::Float32, kernels: Kernels::Own, ..Default::default() };
    let x = Tensor::randn([2, 64, 64], (Kind::Float, dev));
    let head = |tied: bool| {
        let _autocast = Autocast::new(Kind::BFloat16, false).expect("autocast");
        let y = if tied { e.f_attend(&x, &config) } else { linear::f_apply(&x, &e.ws, None, &config) };
        let loss = (y.expect("head").to_kind(Kind::Float) * &v).sum(Kind::Float);
        tch_cuda_graphs::autograd::grad(&[loss], &[e.ws.shallow_clone()], None, false, false).expect("grad")[0]
            .as_ref()
            .expect("a gradient")
            .shallow_clone()
    };
    let (late, plain) = (head(true), head(false));
    let d = f64::try_from((&late - &plain).abs().max()).unwrap();
    println!("a head on a tie whose table's backward ran: max |difference| {d:e} from the head on ws");
    assert_eq!(d, 0.0);
}
