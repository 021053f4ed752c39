//! Mixed precision in captured steps: bf16 autocast (replay = eager, casts follow the weights),
//! the capture refused under a caching autocast, fp16 with the on-device GradScaler captured
//! (inf batches skipped, backoff and growth, replay = eager). Each needs a CUDA device
//! (`#[ignore]` by default) and fails loudly without one.

mod common;

use common::{cpu_batches, cuda, max_param_diff, on, twin_mlps};
use tch::{nn, nn::Module, Kind, Tensor};
use tch_cuda_graphs::amp::{Autocast, GradScaler, ScalerConfig};
use tch_cuda_graphs::optim::{Adam, AdamConfig, Optimizer};
use tch_cuda_graphs::{synchronize, CaptureOptions, CudaGraph, Error, StepOptions, TrainStep};

const D: i64 = 64;
const O: i64 = 8;

/// N captured bf16 steps equal N eager bf16 steps (the same autocast, cache off), and the
/// forward really runs in bf16.
#[test]
#[ignore = "needs a CUDA device"]
fn bf16_replays_equal_eager_bf16_steps() {
    let d = cuda();
    let batches = on(d, &cpu_batches(60, &[64; 100], D, O));
    let (vs_g, g, vs_e, e) = twin_mlps(d, D, 128, O);
    let make = |vs: &nn::VarStore, model: nn::Sequential, eager: bool| -> TrainStep<'static> {
        let mut opt = Adam::new(vs, AdamConfig::adamw().lr(1e-3)).unwrap();
        let x0 = Tensor::zeros([64, D], (Kind::Float, d));
        let y0 = Tensor::zeros([64, O], (Kind::Float, d));
        let options = StepOptions::default().autocast(Kind::BFloat16).eager(eager);
        TrainStep::new(&[("x", &x0), ("y", &y0)], options, move |inp| {
            opt.zero_grad()?;
            let out = model.forward(&inp[0]);
            if out.kind() != Kind::BFloat16 {
                return Err(Error::Misuse(format!("the forward ran in {:?}, not bf16", out.kind())));
            }
            let loss = out.f_mse_loss(&inp[1], tch::Reduction::Mean)?;
            tch_cuda_graphs::amp::backward(&loss)?; // outside autocast, as PyTorch
            opt.step()?;
            Ok(vec![loss.detach()])
        })
        .unwrap()
    };
    let (mut graphed, mut eager) = (make(&vs_g, g, false), make(&vs_e, e, true));
    for (x, y) in &batches {
        graphed.run(&[x, y]).unwrap();
        eager.run(&[x, y]).unwrap();
    }
    synchronize(d).unwrap();
    assert_eq!(graphed.graph_count(), 1);
    let diff = max_param_diff(&vs_g, &vs_e);
    println!("bf16 autocast: 100 steps (3 eager + 97 replays) vs 100 eager bf16 steps: max param diff {diff:e}");
    assert_eq!(diff, 0.0);
}

/// A bf16 forward captured with the cast cache off reads the weights as they are at replay.
#[test]
#[ignore = "needs a CUDA device"]
fn a_captured_bf16_forward_sees_updated_weights() {
    let d = cuda();
    tch::manual_seed(61);
    let vs = nn::VarStore::new(d);
    let lin = nn::linear(vs.root(), D, O, Default::default());
    let x = Tensor::randn([32, D], (Kind::Float, d));
    let mut g = CudaGraph::new().unwrap();
    let y = {
        let _bf16 = Autocast::new(Kind::BFloat16, false).unwrap();
        let _warm = lin.forward(&x); // cuBLAS and autocast state, outside the capture
        synchronize(d).unwrap();
        g.capture(CaptureOptions::default(), || Ok(lin.forward(&x))).unwrap()
    };
    assert_eq!(y.kind(), Kind::BFloat16);
    let mut w = lin.ws.shallow_clone();
    tch::no_grad(|| {
        let _ = w.f_mul_scalar_(-3.0).unwrap();
    });
    g.replay().unwrap();
    let want = {
        let _bf16 = Autocast::new(Kind::BFloat16, false).unwrap();
        lin.forward(&x)
    };
    let diff = f64::try_from((&y - &want).abs().max().to_kind(Kind::Float)).unwrap();
    println!("captured bf16 linear after the weights changed: max |replay - eager| = {diff:e}");
    assert_eq!(diff, 0.0);
    // with the cache on, the capture is refused: it would record stale casts
    let _cached = Autocast::new(Kind::BFloat16, true).unwrap();
    let mut h = CudaGraph::new().unwrap();
    assert!(matches!(h.capture(CaptureOptions::default(), || Ok(lin.forward(&x))), Err(Error::Misuse(_))));
}

/// fp16 with the GradScaler, captured whole: an inf batch skips the update on the device
/// (parameters bit-identical), halves the scale; clean steps go on and the scale grows after
/// the interval; the graphed run equals the eager run bit for bit.
#[test]
#[ignore = "needs a CUDA device"]
fn fp16_with_the_device_scaler_captured_skips_inf_batches() {
    fp16_scaler_run(false);
}

/// The same run with the optimizer behind an IF node (`skip_with_if_node`): inf batches skip
/// the optimizer's kernels, and the result is still the eager run's, bit for bit.
#[test]
#[ignore = "needs a CUDA device"]
fn fp16_scaler_skipping_with_an_if_node_equals_eager() {
    fp16_scaler_run(true);
}

fn fp16_scaler_run(if_node: bool) {
    let d = cuda();
    let batches = on(d, &cpu_batches(62, &[64; 40], D, O));
    let poisoned = [20usize, 30];
    for &i in &poisoned {
        let _ = batches[i].0.get(0).get(0).fill_(f64::INFINITY);
    }
    let (vs_g, g, vs_e, e) = twin_mlps(d, D, 128, O);
    let config = ScalerConfig { growth_interval: 5, ..ScalerConfig::default() };
    let make =
        |vs: &nn::VarStore, model: nn::Sequential, eager: bool| -> (TrainStep<'static>, Tensor, Tensor, Tensor) {
            let mut opt = Adam::new(vs, AdamConfig::adamw().lr(1e-3)).unwrap();
            let mut scaler = GradScaler::with_config(d, config).unwrap().skip_with_if_node(if_node);
            let (scale, found, step0) = (
                scaler.scale_tensor().shallow_clone(),
                scaler.found_inf().shallow_clone(),
                opt.step_tensor(0).unwrap().shallow_clone(),
            );
            let x0 = Tensor::zeros([64, D], (Kind::Float, d));
            let y0 = Tensor::zeros([64, O], (Kind::Float, d));
            let options = StepOptions::default().autocast(Kind::Half).eager(eager).keep_graph(true);
            let step = TrainStep::new(&[("x", &x0), ("y", &y0)], options, move |inp| {
                opt.zero_grad()?;
                let loss = model.forward(&inp[0]).f_mse_loss(&inp[1], tch::Reduction::Mean)?;
                scaler.backward(&loss)?;
                scaler.step(&mut opt)?;
                scaler.update()?;
                Ok(vec![loss.detach()])
            })
            .unwrap();
            (step, scale, found, step0)
        };
    let (mut graphed, scale, found, count) = make(&vs_g, g, false);
    let (mut eager, _, _, _) = make(&vs_e, e, true);
    let value = |t: &Tensor| f64::try_from(t).unwrap();
    let mut log = Vec::new();
    for (i, (x, y)) in batches.iter().enumerate() {
        // detach before copying: a copy with autograd history would keep the parameters'
        // AccumulateGrad nodes (made on this stream) alive into the capture, which then fails
        let before: Vec<Tensor> = vs_g.trainable_variables().iter().map(|t| t.detach().copy()).collect();
        let (s0, c0) = (value(&scale), value(&count));
        graphed.run(&[x, y]).unwrap();
        eager.run(&[x, y]).unwrap();
        if poisoned.contains(&i) {
            assert_eq!(value(&found), 1.0, "step {i}: inf found");
            for (b, a) in before.iter().zip(vs_g.trainable_variables()) {
                assert!(b.equal(&a), "step {i}: a skipped update leaves parameters bit-identical");
            }
            assert_eq!(value(&count), c0, "step {i}: a skipped step does not count");
            assert_eq!(value(&scale), s0 / 2.0, "step {i}: backoff halves the scale");
            log.push(format!("step {i}: inf batch skipped, scale {s0} -> {}", value(&scale)));
        }
    }
    synchronize(d).unwrap();
    assert_eq!(graphed.graph_count(), 1);
    let kinds = graphed.graph_mut().unwrap().node_kinds().unwrap();
    log.push(format!("graph nodes: {} kernels, {} conditional", kinds.kernel, kinds.other));
    assert_eq!(kinds.other, usize::from(if_node), "the optimizer behind an IF node only when asked");
    // 40 steps, 2 skipped, growth every 5 clean steps: 65536 -> ... ends above the backoffs
    let final_scale = value(&scale);
    log.push(format!("final scale {final_scale} after 40 steps (2 skipped, growth interval 5)"));
    assert!(final_scale > 65536.0, "the scale grows after clean intervals: {final_scale}");
    let diff = max_param_diff(&vs_g, &vs_e);
    println!(
        "fp16 + GradScaler (skip with {}): {}; graphed vs eager max param diff {diff:e}",
        if if_node { "an IF node" } else { "the kernels' flag" },
        log.join("; ")
    );
    assert_eq!(diff, 0.0);
}
