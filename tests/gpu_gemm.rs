//! How the crate's GEMMs choose their algorithm (`gemm::GemmChoice`) on a GPU, each figure
//! printed: under `Timed`, the linear layer's forward and backward at GPT-2 small's MLP shapes
//! time each GEMM shape once (the count says so), agree with the heuristic's results within 1e-2
//! of the largest value, repeat bit for bit within the process, and replay captured equal to eager bit
//! for bit; a shape first met under a capture keeps the heuristic's first (nothing timed) and its
//! eager calls then run the captured algorithm (equal bit for bit); setting the choice forgets
//! the shapes; the choices written to a file and read back give the timed bits, a file for
//! another GPU is refused, and algorithms cuBLASLt refuses give way to the heuristic's. In its
//! own binary: the choice is the process's. A float32 weight gradient of 2^23 values or more runs
//! in the crate's CUTLASS GEMM whatever the choice. Ignored without a GPU; fails loudly there.
mod common;

use common::{captured_minus_eager, cuda, output_and_grads, rel};
use tch::{nn, Kind, Tensor};
use tch_cuda_graphs::amp::Autocast;
use tch_cuda_graphs::gemm::{self, GemmChoice};
use tch_cuda_graphs::kernels::Kernels;
use tch_cuda_graphs::linear::{linear, Linear, LinearConfig, WeightGrad};
use tch_cuda_graphs::{CaptureOptions, CudaGraph};

/// Puts the heuristic back however the test ends.
struct HeuristicAfter;
impl Drop for HeuristicAfter {
    fn drop(&mut self) {
        let _ = gemm::f_set_choice(GemmChoice::Heuristic);
    }
}

/// c_fc and c_proj of GPT-2 small's MLP on the crate's path, float32 weight gradients.
fn mlp(vs: &nn::VarStore) -> (Linear, Linear) {
    let cfg = LinearConfig { kernels: Kernels::Own, weight_grad: WeightGrad::Float32, ..Default::default() };
    (linear(vs.root() / "fc", 768, 3072, cfg), linear(vs.root() / "proj", 3072, 768, cfg))
}

/// The MLP (seeded), an input of 4,096 rows and the loss's weights, on the GPU.
fn mlp_case(seed: i64) -> (nn::VarStore, (Linear, Linear), Tensor, Tensor) {
    let dev = cuda();
    tch::manual_seed(seed);
    let vs = nn::VarStore::new(dev);
    let layers = mlp(&vs);
    let x = Tensor::randn([4096, 768], (Kind::Float, dev)).to_kind(Kind::BFloat16);
    let w = Tensor::randn([4096, 768], (Kind::Float, dev));
    (vs, layers, x, w)
}

/// proj(fc(x)) and the gradients of x and both weights and biases for the loss sum(y · w),
/// under bf16 autocast, concatenated flat (float32; y detached: nothing keeps the autograd graph).
fn step(x: &Tensor, (fc, proj): &(Linear, Linear), w: &Tensor) -> tch_cuda_graphs::Result<Tensor> {
    let x = x.detach().set_requires_grad(true);
    let y = {
        let _bf16 = Autocast::new(Kind::BFloat16, false)?;
        proj.f_forward(&fc.f_forward(&x)?)?
    };
    let loss = (y.to_kind(Kind::Float) * w).sum(Kind::Float);
    let inputs = [&x, &fc.ws, fc.bs.as_ref().unwrap(), &proj.ws, proj.bs.as_ref().unwrap()].map(|t| t.shallow_clone());
    let grads = tch_cuda_graphs::autograd::grad(&[loss], &inputs, None, false, false)?;
    Ok(output_and_grads(&y, &grads))
}

#[test]
#[ignore = "needs a CUDA device"]
fn timed_gemms_agree_with_the_heuristic_and_replay_as_eager() {
    let _after = HeuristicAfter;
    let (_vs, layers, x, w) = mlp_case(5);

    gemm::f_set_choice(GemmChoice::Heuristic).expect("set");
    assert_eq!(gemm::f_choice().expect("choice"), GemmChoice::Heuristic);
    let heuristic = step(&x, &layers, &w).expect("heuristic step");
    let h_shapes = gemm::f_shapes().expect("shapes");
    println!("heuristic: {h_shapes:?}");
    assert!(h_shapes.chosen >= 6 && h_shapes.timed == 0, "six GEMMs chosen by the heuristic: {h_shapes:?}");

    gemm::f_set_choice(GemmChoice::Timed).expect("set");
    assert_eq!(gemm::f_shapes().expect("shapes").chosen, 0, "setting the choice forgets the shapes");
    let timed = step(&x, &layers, &w).expect("timed step");
    let shapes = gemm::f_shapes().expect("shapes");
    let again = step(&x, &layers, &w).expect("timed step again");
    let after = gemm::f_shapes().expect("shapes");
    let diff = rel(&timed, &heuristic);
    let repeat = f64::try_from((&again - &timed).abs().max()).unwrap();
    let captured = captured_minus_eager(|| step(&x, &layers, &w));
    println!("timed: {shapes:?} then {after:?}; timed vs heuristic {diff:.2e} (of the largest value); repeat {repeat:e}; captured - eager {captured:e}");
    assert!(shapes.timed >= 6 && shapes.timed == shapes.chosen, "every GEMM shape timed: {shapes:?}");
    assert_eq!(after, shapes, "a shape is timed once");
    assert!(diff < 1e-2, "timed GEMMs agree with the heuristic's within 1e-2: {diff:e}");
    assert_eq!(repeat, 0.0, "the timed choice repeats bit for bit");
    assert_eq!(captured, 0.0, "captured equals eager bit for bit under timed GEMMs");
}

/// The timed choices written to a file and read back (after the choice forgot them) run the same
/// algorithms: the step equals the timed one bit for bit with nothing timed; a file for another
/// GPU is refused and changes nothing; an algorithm cuBLASLt refuses gives way to the process's
/// choice (here the heuristic's: equal to its step bit for bit).
#[test]
#[ignore = "needs a CUDA device"]
fn gemm_choices_written_to_a_file_are_read_back() {
    let _after = HeuristicAfter;
    let (_vs, layers, x, w) = mlp_case(7);
    let dir = std::env::temp_dir().join(format!("tcg-gemm-choices-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let file = dir.join("choices.csv");

    gemm::f_set_choice(GemmChoice::Heuristic).expect("set");
    let heuristic = step(&x, &layers, &w).expect("heuristic step");
    gemm::f_set_choice(GemmChoice::Timed).expect("set");
    let timed = step(&x, &layers, &w).expect("timed step");
    let timed_shapes = gemm::f_shapes().expect("shapes");
    let written = gemm::f_write_file(&file).expect("write");
    let text = std::fs::read_to_string(&file).expect("read");
    println!("timed {timed_shapes:?}; {written} written:\n{text}");
    assert_eq!(written, timed_shapes.chosen, "every shape met is written");

    gemm::f_set_choice(GemmChoice::Heuristic).expect("set (forgets)");
    let read = gemm::f_read_file(&file).expect("read back");
    let from_file = step(&x, &layers, &w).expect("step from the file");
    let shapes = gemm::f_shapes().expect("shapes");
    let diff = f64::try_from((&from_file - &timed).abs().max()).unwrap();
    let captured = captured_minus_eager(|| step(&x, &layers, &w));
    println!("read {read}: {shapes:?}; from the file - timed {diff:e}; captured - eager {captured:e}");
    assert_eq!(read, written);
    assert_eq!((shapes.from_file, shapes.timed), (written, 0), "every shape from the file, nothing timed: {shapes:?}");
    assert_eq!(diff, 0.0, "the file's algorithms give the timed step's bits");
    assert_eq!(captured, 0.0, "captured equals eager bit for bit with the file's algorithms");

    let other = dir.join("other_gpu.csv");
    let device_line = text.lines().find(|l| l.starts_with("Validator,device,")).expect("a device validator");
    std::fs::write(&other, text.replace(device_line, "Validator,device,Some Other GPU")).expect("write");
    let refused = gemm::f_read_file(&other);
    println!("another GPU's file: {refused:?}");
    assert!(
        matches!(&refused, Err(tch_cuda_graphs::Error::GemmFile { source: None, reason, .. }) if reason.contains("Some Other GPU")),
        "a file for another GPU is refused: {refused:?}"
    );
    assert_eq!(gemm::f_shapes().expect("shapes"), shapes, "a refused file changes nothing");

    let broken = dir.join("broken_algorithms.csv");
    let broken_text: String = text
        .lines()
        .map(|l| match l.strip_prefix("Gemm,") {
            Some(rest) => {
                let f: Vec<&str> = rest.split(',').collect();
                format!("Gemm,{},{},{}\n", f[0], ["ffffffffffffffff"; 8].join(" "), f[2])
            }
            None => format!("{l}\n"),
        })
        .collect();
    std::fs::write(&broken, broken_text).expect("write");
    gemm::f_set_choice(GemmChoice::Heuristic).expect("set (forgets)");
    assert_eq!(gemm::f_read_file(&broken).expect("a well-formed file"), written);
    let fallback = step(&x, &layers, &w).expect("step after refused algorithms");
    let fb_shapes = gemm::f_shapes().expect("shapes");
    let fb_diff = f64::try_from((&fallback - &heuristic).abs().max()).unwrap();
    println!("refused algorithms: {fb_shapes:?}; step - heuristic step {fb_diff:e}");
    assert_eq!(fb_shapes.from_file, 0, "cuBLASLt refused every broken algorithm: {fb_shapes:?}");
    assert_eq!(fb_diff, 0.0, "the shapes chose as the heuristic does: its bits");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
#[ignore = "needs a CUDA device"]
fn a_shape_first_met_under_capture_keeps_the_heuristics_choice() {
    let dev = cuda();
    let _after = HeuristicAfter;
    tch::manual_seed(6);
    let vs = nn::VarStore::new(dev);
    let fc = linear(vs.root() / "fc", 512, 1024, LinearConfig { kernels: Kernels::Own, ..Default::default() });
    let x = Tensor::randn([1000, 512], (Kind::Float, dev)).to_kind(Kind::BFloat16);
    let forward_of = |x: &Tensor| -> tch_cuda_graphs::Result<Tensor> {
        let _bf16 = Autocast::new(Kind::BFloat16, false)?;
        tch::no_grad(|| fc.f_forward(x))
    };
    let forward = || forward_of(&x);
    // cuBLASLt's handle and workspace made eagerly, by another shape
    let _ = forward_of(&Tensor::randn([64, 512], (Kind::Float, dev))).expect("warm-up");
    gemm::f_set_choice(GemmChoice::Timed).expect("set");
    let mut graph = CudaGraph::new().expect("graph");
    let out = graph.capture(CaptureOptions::default(), forward).expect("capture");
    let shapes = gemm::f_shapes().expect("shapes");
    graph.replay().expect("replay");
    let eager = forward().expect("eager");
    let diff = f64::try_from((&out - &eager).abs().max()).unwrap();
    println!(
        "after a capture: {shapes:?}, then eager {:?}; replay - eager {diff:e}",
        gemm::f_shapes().expect("shapes")
    );
    assert!(shapes.chosen == 1 && shapes.timed == 0, "the heuristic's first, nothing timed under capture: {shapes:?}");
    assert_eq!(gemm::f_shapes().expect("shapes"), shapes, "the eager call keeps the captured choice");
    assert_eq!(diff, 0.0, "eager runs the captured algorithm: equal bit for bit");
}

/// What one float32 weight gradient of a bias-free `inp -> out` layer on the crate's path gave,
/// over `rows` random bf16 rows with the loss sum(y · w): its distance from a float64 product
/// (max |a - b| / max |b|), the kernels it ran, and its captured run's distance from its eager one.
struct WgradRun {
    rel: f64,
    kernels: Vec<String>,
    captured_minus_eager: f64,
}

fn float32_wgrad(seed: i64, rows: i64, inp: i64, out: i64) -> WgradRun {
    let dev = cuda();
    tch::manual_seed(seed);
    let vs = nn::VarStore::new(dev);
    let cfg =
        LinearConfig { bias: false, kernels: Kernels::Own, weight_grad: WeightGrad::Float32, ..Default::default() };
    let layer = linear(vs.root() / "layer", inp, out, cfg);
    let x = Tensor::randn([rows, inp], (Kind::Float, dev)).to_kind(Kind::BFloat16);
    let w = Tensor::randn([rows, out], (Kind::Float, dev));
    let dw = || -> tch_cuda_graphs::Result<Tensor> {
        let y = {
            let _bf16 = Autocast::new(Kind::BFloat16, false)?;
            layer.f_forward(&x)?
        };
        let loss = (y.to_kind(Kind::Float) * &w).sum(Kind::Float);
        let g = tch_cuda_graphs::autograd::grad(&[loss], &[layer.ws.shallow_clone()], None, false, false)?;
        Ok(g[0].as_ref().expect("used").shallow_clone())
    };
    let (got, kernels) = common::kernels_of(dev, || dw().expect("the step"));
    assert_eq!(got.kind(), Kind::Float);
    // the loss's gradient reaches the GEMM as w rounded to bf16
    let expected = w.to_kind(Kind::BFloat16).to_kind(Kind::Double).tr().matmul(&x.to_kind(Kind::Double));
    WgradRun { rel: rel(&got, &expected), kernels, captured_minus_eager: captured_minus_eager(dw) }
}

/// A float32 weight gradient of few output tiles over many rows (the small Llama's attention
/// output projection: [384, 384] over 16,384 rows) is summed in slices of the rows, then the
/// slices summed by the own kernel (`tcg_wgrad_slices_sum`): within 1e-5 of a float64 product,
/// and captured equal to eager bit for bit.
#[test]
#[ignore = "needs a CUDA device"]
fn a_small_float32_weight_gradient_over_many_rows_is_summed_in_slices() {
    let run = float32_wgrad(6, 16384, 384, 384);
    let sums = run.kernels.iter().filter(|n| n.contains("tcg_wgrad_slices_sum")).count();
    let (r, d) = (run.rel, run.captured_minus_eager);
    println!("float32 dw [384, 384] over 16384 rows: {r:e} from float64; {sums} slice sums; captured against eager: max |difference| {d:e}; kernels {:?}", run.kernels);
    assert!(r <= 1e-5, "within 1e-5 of float64: {r:e}");
    assert_eq!(sums, 1, "summed in slices: {:?}", run.kernels);
    assert_eq!(d, 0.0);
}

/// A float32 weight gradient of at least 2^23 values (a vocabulary's head) runs in the crate's
/// CUTLASS GEMM (`wgrad_gemm.cu`), one just under that size in cuBLASLt's: both within 1e-5 of a
/// float64 product, captured equal to eager bit for bit.
#[test]
#[ignore = "needs a CUDA device"]
fn a_large_float32_weight_gradient_runs_in_cutlass() {
    // on an sm_90 GPU with CUTLASS built: elsewhere the kernel count below fails
    for (out, cutlass) in [(8192i64, 1usize), (8184, 0)] {
        let run = float32_wgrad(7, 2048, 1024, out);
        let ran = run.kernels.iter().filter(|n| n.contains("cutlass")).count();
        let (r, d) = (run.rel, run.captured_minus_eager);
        println!("float32 dw [{out}, 1024] over 2048 rows: {r:e} from float64; {ran} CUTLASS GEMMs; captured against eager: max |difference| {d:e}");
        assert!(r <= 1e-5, "within 1e-5 of float64: {r:e}");
        assert_eq!(ran, cutlass, "CUTLASS's GEMM for 2^23 values and more: {:?}", run.kernels);
        assert_eq!(d, 0.0);
    }
}
