//! Tests that run without a GPU (CI): error paths, option and id handling, the optimizers'
//! numerics against tch's own optimizers on CPU, gradient clipping, TrainStep's eager
//! fallback, input validation and stale-storage checks, and the error type. CI runs them twice:
//! against the CUDA build of the shim and the no-CUDA build (`TCH_CUDA_GRAPHS_NO_CUDA=1`).

mod common;

use common::{batch, max_param_rel_diff, mse, twin_mlps};
use std::error::Error as _;
use tch::{nn, nn::OptimizerConfig, Device, Kind, Tensor};
use tch_cuda_graphs::kernels::{own_kernels_available, own_kernels_built, KernelPath, Kernels};
use tch_cuda_graphs::optim::{Adam, AdamConfig, Optimizer, Sgd, SgdConfig};
use tch_cuda_graphs::{
    built_with_cuda, capture_with_warmup, clip_grad_norm, cuda_is_available, empty_cache, graph_pool_handle,
    memory_stats, pool_memory, reset_peak_stats, synchronize, CaptureLock, CaptureMode, CaptureOptions, CudaGraph,
    Error, MemPool, PoolId, StepOptions, Stream, TensorWatch, TrainStep,
};

/// The shim was built the way the build asked: without CUDA when `TCH_CUDA_GRAPHS_NO_CUDA=1`
/// was set at build time (or libtorch has no CUDA), with CUDA otherwise.
#[test]
fn the_shim_is_built_with_or_without_cuda_as_asked() {
    let forced_off = option_env!("TCH_CUDA_GRAPHS_NO_CUDA").is_some_and(|v| !v.is_empty() && v != "0");
    let libtorch_has_cuda = env!("TCG_LIBTORCH_HAS_CUDA") == "1"; // set by build.rs
    let expected = libtorch_has_cuda && !forced_off;
    println!(
        "libtorch has CUDA: {libtorch_has_cuda}, TCH_CUDA_GRAPHS_NO_CUDA at build: {:?}, shim built with CUDA: {}",
        option_env!("TCH_CUDA_GRAPHS_NO_CUDA"),
        built_with_cuda()
    );
    assert_eq!(built_with_cuda(), expected);
    if !built_with_cuda() {
        assert!(!cuda_is_available(), "a no-CUDA build reports no device");
    }
}

/// The GEMMs' algorithm choice round-trips, and setting it forgets every shape's choice; it runs
/// in any build (nothing timed without a GEMM on a GPU).
#[test]
fn the_gemm_choice_round_trips_and_forgets_the_shapes() {
    use tch_cuda_graphs::gemm::{self, GemmChoice, GemmShapes};
    assert_eq!(GemmChoice::default(), GemmChoice::Heuristic);
    for choice in [GemmChoice::Timed, GemmChoice::Heuristic] {
        gemm::f_set_choice(choice).expect("set");
        let (now, shapes) = (gemm::f_choice().expect("choice"), gemm::f_shapes().expect("shapes"));
        println!("{choice:?}: {now:?}, {shapes:?}");
        assert_eq!(now, choice);
        assert_eq!(shapes, GemmShapes { chosen: 0, timed: 0, from_file: 0 }, "no shape's choice kept after a set");
    }
}

/// A file of GEMM choices that is missing, or is not such a file, is refused with
/// `Error::GemmFile` (the I/O error kept as its source), in any build.
#[test]
fn a_missing_or_foreign_gemm_choices_file_is_refused() {
    use tch_cuda_graphs::gemm;
    let dir = std::env::temp_dir().join(format!("tcg-gemm-file-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let missing = gemm::f_read_file(dir.join("missing.csv"));
    println!("missing: {missing:?}");
    match missing {
        Err(Error::GemmFile { source: Some(e), .. }) => assert_eq!(e.kind(), std::io::ErrorKind::NotFound),
        other => panic!("a missing file is GemmFile with the I/O error: {other:?}"),
    }
    let foreign = dir.join("foreign.csv");
    std::fs::write(&foreign, "Validator,PT_VERSION,2.11.0\n").expect("write");
    let refused = gemm::f_read_file(&foreign);
    println!("foreign: {refused:?}");
    assert!(matches!(refused, Err(Error::GemmFile { source: None, .. })), "not a file of choices: {refused:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Without CUDA every GPU entry point says NoCuda with a message; with CUDA they work. Either
/// way the test asserts what it sees (it runs in CI without a GPU and on the GPU machine).
#[test]
fn gpu_entry_points_report_no_cuda_without_a_device() {
    let results: Vec<(&str, Result<(), Error>)> = vec![
        ("CudaGraph::new", CudaGraph::new().map(drop)),
        ("graph_pool_handle", graph_pool_handle().map(drop)),
        ("MemPool::new", MemPool::new().map(drop)),
        ("MemPool::on", MemPool::on(Device::Cuda(0)).map(drop)),
        ("MemPool::hold", graph_pool_handle().and_then(|p| MemPool::hold(Device::Cuda(0), p)).map(drop)),
        ("pool_blocks", tch_cuda_graphs::memory::pool_blocks(Device::Cuda(0), PoolId::PRIVATE).map(drop)),
        ("empty_host_cache", tch_cuda_graphs::memory::empty_host_cache()),
        ("Stream::current", Stream::current(Device::Cuda(0)).map(drop)),
        ("memory_stats", memory_stats(Device::Cuda(0)).map(drop)),
        ("reset_peak_stats", reset_peak_stats(Device::Cuda(0))),
        ("pool_memory", pool_memory(Device::Cuda(0), PoolId::PRIVATE).map(drop)),
        ("empty_cache", empty_cache()),
        ("synchronize", synchronize(Device::Cuda(0))),
        ("capture_with_warmup", capture_with_warmup(1, CaptureOptions::default(), || Ok(())).map(drop)),
        (
            "CudaGraph::capture",
            // A graph cannot even be made without CUDA; with CUDA this captures one kernel.
            CudaGraph::new().and_then(|mut g| {
                g.capture(CaptureOptions::default(), || Ok(Tensor::f_zeros([1], (Kind::Float, Device::Cuda(0)))?))
                    .map(drop)
            }),
        ),
    ];
    for (what, r) in results {
        if cuda_is_available() {
            assert!(r.is_ok(), "{what} failed with a CUDA device: {r:?}");
        } else {
            match r {
                Err(Error::NoCuda(msg)) => assert!(!msg.is_empty(), "{what}: empty NoCuda message"),
                other => panic!("{what}: expected Error::NoCuda without a GPU, got {other:?}"),
            }
        }
    }
}

/// A pool hold names a pool on a CUDA device: PRIVATE (no pool) and the CPU are refused, as
/// Misuse, or NoCuda where there is no device at all.
#[test]
fn a_pool_hold_needs_a_pool_on_a_cuda_device() {
    for (what, r) in [
        ("PRIVATE", MemPool::hold(Device::Cuda(0), PoolId::PRIVATE)),
        ("the CPU", MemPool::hold(Device::Cpu, PoolId::from_raw(0, 7).unwrap())),
        ("MemPool::on(Cpu)", MemPool::on(Device::Cpu)),
    ] {
        assert!(matches!(r, Err(Error::Misuse(_)) | Err(Error::NoCuda(_))), "{what}: {r:?}");
    }
}

#[test]
fn cpu_device_is_not_a_capture_device() {
    let r = capture_with_warmup(0, CaptureOptions::default().device(Device::Cpu), || Ok(()));
    assert!(matches!(r, Err(Error::Misuse(_)) | Err(Error::NoCuda(_))), "{r:?}");
    let r = Stream::current(Device::Cpu);
    assert!(matches!(r, Err(Error::Misuse(_)) | Err(Error::NoCuda(_))), "{r:?}");
}

#[test]
fn capture_mode_names_round_trip() {
    for m in [CaptureMode::Global, CaptureMode::ThreadLocal, CaptureMode::Relaxed] {
        assert_eq!(CaptureMode::from_name(m.name()).unwrap(), m);
    }
    assert_eq!(CaptureMode::default(), CaptureMode::Global);
    assert_eq!(CaptureMode::Global as i32, 0);
    assert_eq!(CaptureMode::ThreadLocal as i32, 1);
    assert_eq!(CaptureMode::Relaxed as i32, 2);
    assert!(matches!(CaptureMode::from_name("strict"), Err(Error::Misuse(_))));
}

#[test]
fn pool_ids_are_validated() {
    assert!(PoolId::PRIVATE.is_private());
    assert_eq!(PoolId::default(), PoolId::PRIVATE);
    let p = PoolId::from_raw(0, 42).unwrap();
    assert_eq!(p.to_raw(), (0, 42));
    assert!(!p.is_private());
    assert_eq!(PoolId::from_raw(7, 0).unwrap().to_raw(), (7, 0));
    match PoolId::from_raw(1, 2) {
        Err(Error::Misuse(msg)) => assert!(msg.contains("(1, 2)"), "{msg}"),
        other => panic!("expected Misuse, got {other:?}"),
    }
}

#[test]
fn capture_options_builder_sets_what_it_says() {
    let d = CaptureOptions::default();
    assert_eq!(d.get_pool(), PoolId::PRIVATE);
    assert_eq!(d.get_mode(), CaptureMode::Global);
    assert_eq!(d.get_device(), None);
    let pool = PoolId::from_raw(0, 9).unwrap();
    let o = d.pool(pool).mode(CaptureMode::Relaxed).device(Device::Cuda(1));
    assert_eq!(o.get_pool(), pool);
    assert_eq!(o.get_mode(), CaptureMode::Relaxed);
    assert_eq!(o.get_device(), Some(Device::Cuda(1)));
    assert_eq!(StepOptions::default().get_warmup(), 3);
    assert_eq!(StepOptions::default().warmup(1).get_warmup(), 1);
}

#[test]
fn optimizer_configs_are_validated() {
    let vs = nn::VarStore::new(Device::Cpu);
    let _ = nn::linear(vs.root(), 2, 2, Default::default());
    assert!(matches!(Sgd::new(&vs, SgdConfig::default().nesterov(true)), Err(Error::Misuse(_))));
    assert!(matches!(Sgd::new(&vs, SgdConfig::default().lr(-1.0)), Err(Error::Misuse(_))));
    assert!(matches!(Adam::new(&vs, AdamConfig::default().betas(1.5, 0.9)), Err(Error::Misuse(_))));
    assert!(matches!(Adam::new(&vs, AdamConfig::default().eps(f64::NAN)), Err(Error::Misuse(_))));
    let empty = nn::VarStore::new(Device::Cpu);
    assert!(matches!(Adam::new(&empty, AdamConfig::default()), Err(Error::Misuse(_))));
}

/// Copies the gradients of `from`'s variables into those of `to` (matched by name; `to`'s
/// gradients must exist), so that twin optimizers are compared on the same gradients.
fn copy_grads(from: &nn::VarStore, to: &nn::VarStore) {
    let grads = from.variables();
    for (name, p) in to.variables() {
        p.grad().copy_(&grads[&name].grad());
    }
}

/// Trains twin MLPs for `steps` steps: one with this crate's optimizer, one with tch's. Both
/// optimizers get the same gradients, bit for bit (the first model's, copied into the second's):
/// the comparison is of the optimizers alone. Two backward passes could round differently when
/// other tests load the CPU at the same time (libtorch's CPU GEMM picks its threads at run time),
/// and momentum would grow that into a false failure.
fn compare_with_tch(
    ours: impl Fn(&nn::VarStore) -> Box<dyn Optimizer>,
    theirs: impl Fn(&nn::VarStore) -> nn::Optimizer,
    steps: usize,
) -> f64 {
    tch::manual_seed(0);
    let (vs_a, a, vs_b, b) = twin_mlps(Device::Cpu, 16, 32, 4);
    let mut opt_a = ours(&vs_a);
    let mut opt_b = theirs(&vs_b);
    for _ in 0..steps {
        let (x, y) = batch(Device::Cpu, 64, 16, 4);
        opt_a.zero_grad().unwrap();
        mse(&a, &x, &y).backward();
        opt_a.step().unwrap();
        opt_b.zero_grad();
        mse(&b, &x, &y).backward(); // makes b's gradients; their values are a's:
        copy_grads(&vs_a, &vs_b);
        opt_b.step();
    }
    max_param_rel_diff(&vs_a, &vs_b)
}

#[test]
fn sgd_matches_tch_sgd_on_cpu() {
    let cases = [(0.0, 0.0, 0.0, false), (0.9, 0.0, 0.0, false), (0.9, 0.1, 1e-4, false), (0.9, 0.0, 1e-4, true)];
    for (momentum, dampening, wd, nesterov) in cases {
        let rel = compare_with_tch(
            |vs| {
                let cfg = SgdConfig::default()
                    .lr(0.05)
                    .momentum(momentum)
                    .dampening(dampening)
                    .weight_decay(wd)
                    .nesterov(nesterov);
                Box::new(Sgd::new(vs, cfg).unwrap())
            },
            |vs| nn::Sgd { momentum, dampening, wd, nesterov }.build(vs, 0.05).unwrap(),
            100,
        );
        println!("sgd momentum={momentum} dampening={dampening} wd={wd} nesterov={nesterov}: max rel diff {rel:.3e}");
        assert!(
            rel <= 1e-5,
            "SGD (momentum {momentum}, dampening {dampening}, wd {wd}, nesterov {nesterov}) differs from tch by {rel}"
        );
    }
}

#[test]
fn adam_matches_tch_adam_on_cpu() {
    for (wd, amsgrad) in [(0.0, false), (1e-2, false), (0.0, true)] {
        let rel = compare_with_tch(
            |vs| Box::new(Adam::new(vs, AdamConfig::default().lr(1e-3).weight_decay(wd).amsgrad(amsgrad)).unwrap()),
            |vs| nn::Adam { beta1: 0.9, beta2: 0.999, wd, eps: 1e-8, amsgrad }.build(vs, 1e-3).unwrap(),
            100,
        );
        println!("adam wd={wd} amsgrad={amsgrad}: max rel diff {rel:.3e}");
        assert!(rel <= 1e-5, "Adam (wd {wd}, amsgrad {amsgrad}) differs from tch by {rel}");
    }
}

#[test]
fn adamw_matches_tch_adamw_on_cpu() {
    for (wd, amsgrad) in [(1e-2, false), (0.1, true)] {
        let rel = compare_with_tch(
            |vs| Box::new(Adam::new(vs, AdamConfig::adamw().lr(1e-3).weight_decay(wd).amsgrad(amsgrad)).unwrap()),
            |vs| nn::AdamW { beta1: 0.9, beta2: 0.999, wd, eps: 1e-8, amsgrad }.build(vs, 1e-3).unwrap(),
            100,
        );
        println!("adamw wd={wd} amsgrad={amsgrad}: max rel diff {rel:.3e}");
        assert!(rel <= 1e-5, "AdamW (wd {wd}, amsgrad {amsgrad}) differs from tch by {rel}");
    }
}

#[test]
fn set_lr_changes_the_update() {
    tch::manual_seed(1);
    let vs = nn::VarStore::new(Device::Cpu);
    let model = common::mlp(vs.root(), 4, 8, 1);
    let mut opt = Adam::new(&vs, AdamConfig::default().lr(1e-2)).unwrap();
    let (x, y) = batch(Device::Cpu, 8, 4, 1);
    let before: Vec<Tensor> = vs.trainable_variables().iter().map(|t| t.detach().copy()).collect();
    opt.set_lr(0.0).unwrap();
    assert_eq!(opt.lr(), 0.0);
    assert_eq!(f64::try_from(opt.lr_tensor()).unwrap(), 0.0);
    opt.zero_grad().unwrap();
    mse(&model, &x, &y).backward();
    opt.step().unwrap();
    for (b, a) in before.iter().zip(vs.trainable_variables()) {
        assert!(b.equal(&a), "lr 0 must leave the parameters unchanged");
    }
    opt.set_lr(1e-2).unwrap();
    opt.zero_grad().unwrap();
    mse(&model, &x, &y).backward();
    opt.step().unwrap();
    let moved = before.iter().zip(vs.trainable_variables()).any(|(b, a)| !b.equal(&a));
    assert!(moved, "lr 1e-2 must move the parameters");
    assert!(matches!(opt.set_lr(-1.0), Err(Error::Misuse(_))));
}

/// A boxed optimizer (chosen at run time) trains exactly as the optimizer inside the box.
#[test]
fn a_boxed_optimizer_is_the_optimizer_inside() {
    let (vs_a, a, vs_b, b) = twin_mlps(Device::Cpu, 4, 8, 1);
    let mut plain = Sgd::new(&vs_a, SgdConfig::default().lr(0.1).momentum(0.9)).unwrap();
    let mut boxed: Box<dyn Optimizer + Send> =
        Box::new(Sgd::new(&vs_b, SgdConfig::default().lr(0.1).momentum(0.9)).unwrap());
    assert_eq!(boxed.params().len(), plain.params().len());
    let (x, y) = batch(Device::Cpu, 8, 4, 1);
    for _ in 0..5 {
        plain.zero_grad().unwrap();
        mse(&a, &x, &y).backward();
        plain.step().unwrap();
        boxed.zero_grad().unwrap();
        mse(&b, &x, &y).backward();
        copy_grads(&vs_a, &vs_b); // the same gradients, bit for bit
        boxed.step().unwrap();
    }
    boxed.set_lr(0.05).unwrap();
    assert_eq!(boxed.lr(), 0.05);
    let diff = max_param_rel_diff(&vs_b, &vs_a);
    println!("boxed vs plain SGD after 5 steps: max relative difference {diff:e}");
    assert_eq!(diff, 0.0);
}

/// Stepping the parameters in parts (each once) is one step, bit for bit, for both optimizers;
/// an index out of range is Misuse and changes nothing.
#[test]
fn stepping_parameters_in_parts_equals_one_step() {
    for adam in [false, true] {
        let (vs_a, a, vs_b, b) = twin_mlps(Device::Cpu, 4, 8, 1);
        let make = |vs: &nn::VarStore| -> Box<dyn Optimizer + Send> {
            if adam {
                Box::new(Adam::new(vs, AdamConfig::adamw().lr(1e-2).weight_decay(0.1)).unwrap())
            } else {
                Box::new(Sgd::new(vs, SgdConfig::default().lr(0.1).momentum(0.9)).unwrap())
            }
        };
        let (mut whole, mut parts) = (make(&vs_a), make(&vs_b));
        let n = parts.params().len();
        assert!(n >= 4, "an MLP of several tensors");
        let (x, y) = batch(Device::Cpu, 8, 4, 1);
        for step in 0..4 {
            whole.zero_grad().unwrap();
            mse(&a, &x, &y).backward();
            whole.step().unwrap();
            parts.zero_grad().unwrap();
            mse(&b, &x, &y).backward();
            copy_grads(&vs_a, &vs_b); // the same gradients, bit for bit
                                      // the last parameters first (as gradient buckets come), in uneven parts
            let order: Vec<usize> = (0..n).rev().collect();
            for part in order.chunks(1 + step % 3) {
                parts.step_only(part).unwrap();
            }
        }
        let diff = max_param_rel_diff(&vs_b, &vs_a);
        println!("{}: 4 steps in parts vs whole: max relative difference {diff:e}", if adam { "AdamW" } else { "SGD" });
        assert_eq!(diff, 0.0);
        let before = common::max_param_diff(&vs_b, &vs_a);
        let err = parts.step_only(&[0, n]).unwrap_err();
        assert!(matches!(err, Error::Misuse(_)), "{err}");
        assert_eq!(common::max_param_diff(&vs_b, &vs_a), before, "a refused step_only changed nothing");
    }
}

#[test]
fn zero_grad_sets_grads_to_none() {
    let vs = nn::VarStore::new(Device::Cpu);
    let model = common::mlp(vs.root(), 4, 8, 1);
    let mut opt = Sgd::new(&vs, SgdConfig::default()).unwrap();
    let (x, y) = batch(Device::Cpu, 8, 4, 1);
    mse(&model, &x, &y).backward();
    assert!(vs.trainable_variables().iter().all(|p| p.grad().defined()));
    opt.zero_grad().unwrap();
    assert!(vs.trainable_variables().iter().all(|p| !p.grad().defined()));
}

#[test]
fn clip_grad_norm_matches_a_manual_computation() {
    tch::manual_seed(2);
    let vs = nn::VarStore::new(Device::Cpu);
    let model = common::mlp(vs.root(), 4, 8, 2);
    let (x, y) = batch(Device::Cpu, 16, 4, 2);
    let loss = mse(&model, &x, &y) * 100.0;
    loss.backward();
    let params = vs.trainable_variables();
    let grads: Vec<Tensor> = params.iter().map(|p| p.grad().copy()).collect();
    let expected_norm = grads
        .iter()
        .map(|g| g.pow_tensor_scalar(2).sum(Kind::Double))
        .fold(Tensor::zeros([], (Kind::Double, Device::Cpu)), |a, b| a + b)
        .sqrt();
    let expected_norm = f64::try_from(expected_norm).unwrap();
    let max_norm = expected_norm / 4.0;
    let total = clip_grad_norm(&params, max_norm, 2.0).unwrap();
    let total = f64::try_from(total).unwrap();
    assert!((total - expected_norm).abs() <= 1e-5 * expected_norm, "{total} vs {expected_norm}");
    let scale = max_norm / (expected_norm + 1e-6);
    for (p, g) in params.iter().zip(&grads) {
        let want = g * scale;
        let rel = f64::try_from((p.grad() - &want).abs().max()).unwrap() / f64::try_from(want.abs().max()).unwrap();
        assert!(rel < 1e-5, "clipped grad off by {rel}");
    }
    // A norm under the limit leaves the grads alone.
    let before: Vec<Tensor> = params.iter().map(|p| p.grad().copy()).collect();
    let _ = clip_grad_norm(&params, 1e9, 2.0).unwrap();
    for (p, b) in params.iter().zip(&before) {
        assert!(p.grad().allclose(b, 1e-7, 0.0, false));
    }
    assert!(matches!(clip_grad_norm(&params, -1.0, 2.0), Err(Error::Misuse(_))));
}

/// `step_clipped` (the clip folded into Adam's update; on the CPU ATen's kernel reads clipped
/// copies) equals `clip_grad_norm` then `step` bit for bit, leaves the gradients as backward
/// wrote them, and refuses a bad `max_norm`; SGD's default clips in place and steps.
#[test]
fn step_clipped_equals_clip_then_step() {
    use tch_cuda_graphs::optim::{Adam, AdamConfig, Sgd, SgdConfig};
    tch::manual_seed(2);
    let (vs_a, model_a, vs_b, model_b) = common::twin_mlps(Device::Cpu, 4, 8, 2);
    let (x, y) = batch(Device::Cpu, 16, 4, 2);
    let config = AdamConfig::adamw().lr(1e-2);
    let mut a = Adam::new(&vs_a, config).unwrap();
    let mut b = Adam::new(&vs_b, config).unwrap();
    for step in 0..6 {
        let scale = if step % 2 == 0 { 100.0 } else { 1e-3 }; // the clip on, then off
        a.zero_grad().unwrap();
        b.zero_grad().unwrap();
        (mse(&model_a, &x, &y) * scale).backward();
        (mse(&model_b, &x, &y) * scale).backward();
        let grads: Vec<Tensor> = vs_b.trainable_variables().iter().map(|p| p.grad().copy()).collect();
        let norm_a = clip_grad_norm(&vs_a.trainable_variables(), 0.5, 2.0).unwrap();
        a.step().unwrap();
        let norm_b = b.step_clipped(0.5).unwrap();
        assert!(norm_a.equal(&norm_b), "step {step}: norms {norm_a:?} {norm_b:?}");
        for (p, g) in vs_b.trainable_variables().iter().zip(&grads) {
            assert!(p.grad().equal(g), "step {step}: the gradient left as backward wrote it");
        }
        for (pa, pb) in vs_a.trainable_variables().iter().zip(vs_b.trainable_variables()) {
            assert!(pa.equal(&pb), "step {step}: parameters bit for bit");
        }
    }
    assert!(matches!(b.step_clipped(-1.0), Err(Error::Misuse(_))));
    let mut sgd = Sgd::new(&vs_b, SgdConfig::default().lr(0.1)).unwrap();
    let before: Vec<Tensor> = vs_b.trainable_variables().iter().map(|p| p.grad().copy()).collect();
    let norm = f64::try_from(sgd.step_clipped(1e-3).unwrap()).unwrap();
    let clipped = f64::try_from(vs_b.trainable_variables()[0].grad().norm()).unwrap();
    let was = f64::try_from(before[0].norm()).unwrap();
    println!("sgd: norm {norm:e}; first gradient {was:e} -> {clipped:e}");
    assert!(clipped < was, "SGD's default clips in place");
}

/// A TrainStep over an MLP with Adam on `device`, returning the step and its VarStore.
fn mlp_step(device: Device, options: StepOptions) -> (TrainStep<'static>, nn::VarStore, Tensor, Tensor) {
    tch::manual_seed(3);
    let vs = nn::VarStore::new(device);
    let model = common::mlp(vs.root(), 8, 16, 2);
    let mut opt = Adam::new(&vs, AdamConfig::default().lr(1e-2)).unwrap();
    let (x, y) = batch(device, 32, 8, 2);
    let step = TrainStep::new(&[("x", &x), ("y", &y)], options, move |inp| {
        opt.zero_grad()?;
        let loss = mse(&model, &inp[0], &inp[1]);
        loss.f_backward()?;
        opt.step()?;
        Ok(vec![loss.detach()])
    })
    .unwrap();
    (step, vs, x, y)
}

#[test]
fn train_step_falls_back_to_eager_on_cpu_and_trains() {
    let (mut step, _vs, x, y) = mlp_step(Device::Cpu, StepOptions::default().warmup(2));
    assert!(!step.is_graphed(), "CPU inputs must give the eager fallback");
    assert_eq!(step.runs(), 0, "nothing runs before the first batch");
    let first = f64::try_from(&step.run(&[&x, &y]).unwrap()[0]).unwrap();
    assert_eq!(step.outputs().len(), 1);
    let mut last = first;
    for _ in 0..200 {
        last = f64::try_from(&step.run(&[&x, &y]).unwrap()[0]).unwrap();
    }
    assert_eq!(step.runs(), 201);
    assert!(last < first * 0.5, "loss must go down: {first} -> {last}");
}

#[test]
fn train_step_eager_equals_a_hand_written_loop() {
    // The same initial weights (copied: `new` trains nothing) and data: TrainStep's eager path
    // against a plain loop. (No re-seeding: other tests draw from the global RNG in parallel.)
    let (mut step, vs_step, x, y) = mlp_step(Device::Cpu, StepOptions::default().warmup(3));
    let mut vs = nn::VarStore::new(Device::Cpu);
    let model = common::mlp(vs.root(), 8, 16, 2);
    vs.copy(&vs_step).unwrap();
    let mut opt = Adam::new(&vs, AdamConfig::default().lr(1e-2)).unwrap();
    for _ in 0..10 {
        opt.zero_grad().unwrap();
        mse(&model, &x, &y).backward();
        opt.step().unwrap();
    }
    for _ in 0..10 {
        step.run(&[&x, &y]).unwrap();
    }
    let d = common::max_param_diff(&vs_step, &vs);
    assert_eq!(d, 0.0, "eager TrainStep must equal the loop exactly");
}

#[test]
fn train_step_checks_every_input_before_copying() {
    let (mut step, _vs, x, _y) = mlp_step(Device::Cpu, StepOptions::default().warmup(0));
    let x_before = step.inputs()[0].copy();
    let good_x = Tensor::randn([32, 8], (Kind::Float, Device::Cpu));
    // The first input is fine, the second has the wrong rank: nothing may be copied. (Another
    // size of the same rank is a new batch shape, which is fine.)
    let bad_y = Tensor::randn([32], (Kind::Float, Device::Cpu));
    match step.run(&[&good_x, &bad_y]) {
        Err(Error::InputMismatch { name, index, expected, got }) => {
            assert_eq!(name, "y");
            assert_eq!(index, 1);
            assert!(expected.contains("rank 2"), "{expected}");
            assert!(got.contains("[32]"), "{got}");
        }
        other => panic!("expected InputMismatch, got {other:?}"),
    }
    assert!(step.inputs()[0].equal(&x_before), "a rejected batch must not be half-written");
    let bad_kind = Tensor::randn([32, 2], (Kind::Double, Device::Cpu));
    match step.run(&[&x, &bad_kind]) {
        Err(Error::InputMismatch { name, got, .. }) => {
            assert_eq!(name, "y");
            assert!(got.contains("Double"), "{got}");
        }
        other => panic!("expected InputMismatch for dtype, got {other:?}"),
    }
    assert!(matches!(step.run(&[&x]), Err(Error::Misuse(_))));
    assert_eq!(step.runs(), 0);
    let err = step.run(&[&good_x, &bad_y]).unwrap_err().to_string();
    assert!(err.contains("`y`") && err.contains("[32]") && err.contains("rank 2"), "{err}");
}

/// Adam keeps one step count per parameter, as PyTorch does: a parameter that first gets a
/// gradient at step 11 gets the bias correction of a first step. Compared with tch's Adam
/// (libtorch's C++ torch::optim::Adam, per-parameter state) on a model whose second head joins
/// the loss late. A shared counter fails this by a wide margin (about 3x the first update).
#[test]
fn adam_counts_steps_per_parameter_like_pytorch() {
    for adamw in [false, true] {
        tch::manual_seed(4);
        let head = |p: nn::Path| nn::linear(p, 8, 2, Default::default());
        let vs_a = nn::VarStore::new(Device::Cpu);
        let (a1, a2) = (head(vs_a.root() / "h1"), head(vs_a.root() / "h2"));
        let mut vs_b = nn::VarStore::new(Device::Cpu);
        let (b1, b2) = (head(vs_b.root() / "h1"), head(vs_b.root() / "h2"));
        vs_b.copy(&vs_a).unwrap();
        let mut ours = if adamw {
            Adam::new(&vs_a, AdamConfig::adamw().lr(1e-2)).unwrap()
        } else {
            Adam::new(&vs_a, AdamConfig::default().lr(1e-2)).unwrap()
        };
        let mut theirs = if adamw {
            nn::AdamW { wd: 1e-2, ..Default::default() }.build(&vs_b, 1e-2).unwrap()
        } else {
            nn::Adam::default().build(&vs_b, 1e-2).unwrap()
        };
        use tch::nn::Module;
        for step in 0..30 {
            let (x, y) = batch(Device::Cpu, 16, 8, 2);
            let late = step >= 10; // the second head joins the loss at step 11
            ours.zero_grad().unwrap();
            let mut out = a1.forward(&x);
            if late {
                out += a2.forward(&x);
            }
            out.mse_loss(&y, tch::Reduction::Mean).backward();
            ours.step().unwrap();
            theirs.zero_grad();
            let mut out = b1.forward(&x);
            if late {
                out += b2.forward(&x);
            }
            out.mse_loss(&y, tch::Reduction::Mean).backward();
            theirs.step();
            if step == 10 {
                let counts: Vec<f64> = (0..4).map(|i| f64::try_from(ours.step_tensor(i).unwrap()).unwrap()).collect();
                println!("adamw={adamw}: step counts after the late head's first update: {counts:?}");
            }
        }
        let rel = max_param_rel_diff(&vs_a, &vs_b);
        println!("adamw={adamw}: a head joining at step 11, 30 steps: max rel diff vs tch {rel:.3e}");
        assert!(rel <= 1e-5, "adamw={adamw}: late parameter differs from tch's Adam by {rel}");
    }
}

/// A TrainStep notices a static input or a watched parameter whose storage was replaced, and
/// runs nothing (the eager fallback checks the same as the graphed step).
#[test]
fn train_step_refuses_to_run_on_replaced_storage() {
    // a parameter: set_kind replaces every variable's storage
    let (mut step, mut vs, x, y) = mlp_step(Device::Cpu, StepOptions::default().warmup(1));
    step.watch_vars(&vs).unwrap();
    step.run(&[&x, &y]).unwrap();
    vs.set_kind(Kind::Double);
    match step.run(&[&x, &y]) {
        Err(Error::StaleGraph { what, detail }) => {
            println!("after set_kind: {what}: {detail}");
            assert!(what.starts_with("parameter `"), "{what}");
            assert!(detail.contains("dtype"), "{detail}");
        }
        other => panic!("expected StaleGraph after set_kind, got {other:?}"),
    }
    assert!(matches!(step.replay(), Err(Error::StaleGraph { .. })), "replay checks too");
    assert_eq!(step.runs(), 1, "nothing ran on the stale step");

    // a static input: set_data on the step's own input tensor
    let (mut step, _vs, x, y) = mlp_step(Device::Cpu, StepOptions::default().warmup(1));
    let mut input = step.inputs()[0].shallow_clone();
    input.set_data(&Tensor::zeros([32, 8], (Kind::Float, Device::Cpu)));
    match step.run(&[&x, &y]) {
        Err(Error::StaleGraph { what, detail }) => {
            println!("after set_data: {what}: {detail}");
            assert_eq!(what, "static input `x`");
            assert!(detail.contains("storage"), "{detail}");
        }
        other => panic!("expected StaleGraph after set_data, got {other:?}"),
    }

    // a resize in place of a watched tensor
    let (mut step, _vs, x, y) = mlp_step(Device::Cpu, StepOptions::default().warmup(1));
    let mut extra = Tensor::zeros([4], (Kind::Float, Device::Cpu));
    step.watch([("extra", &extra)]).unwrap();
    step.run(&[&x, &y]).unwrap();
    let _ = extra.resize_([1 << 16]);
    match step.run(&[&x, &y]) {
        Err(Error::StaleGraph { what, .. }) => assert_eq!(what, "tensor `extra`"),
        other => panic!("expected StaleGraph after a resize, got {other:?}"),
    }
}

/// The eager fallback's recapture only accepts the new storage (there is no graph), and the
/// step runs again; a watch refreshed after a change passes until the next change.
#[test]
fn recapture_on_the_eager_fallback_accepts_the_new_storage() {
    let (mut step, vs, x, y) = mlp_step(Device::Cpu, StepOptions::default().warmup(1));
    step.watch_vars(&vs).unwrap();
    step.run(&[&x, &y]).unwrap();
    let mut p = vs.trainable_variables().remove(0);
    let copy = p.copy();
    tch::no_grad(|| p.set_data(&copy));
    assert!(matches!(step.run(&[&x, &y]), Err(Error::StaleGraph { .. })));
    let r = step.recapture().unwrap();
    assert_eq!((r.updated, r.replaced), (0, 0), "nothing to capture on the CPU");
    step.run(&[&x, &y]).expect("runs on the new storage");
    let again = p.copy();
    tch::no_grad(|| p.set_data(&again));
    assert!(matches!(step.run(&[&x, &y]), Err(Error::StaleGraph { .. })), "the refreshed watch sees the next change");
}

#[test]
fn tensor_watch_sees_storage_dtype_and_shape_changes_only() {
    let a = Tensor::zeros([8], (Kind::Float, Device::Cpu));
    let mut b = Tensor::zeros([2, 3], (Kind::Float, Device::Cpu));
    let mut w = TensorWatch::new().unwrap();
    w.add(["a".into(), "b".into()], [&a, &b]).unwrap();
    assert_eq!(w.len(), 2);
    // writing data in place is what a training step does: not a change
    let _ = b.fill_(3.0);
    let _ = a.shallow_clone().f_add_scalar_(1.0).unwrap();
    w.check().unwrap();
    b.set_data(&Tensor::zeros([2, 3], (Kind::Float, Device::Cpu)));
    match w.check() {
        Err(Error::StaleGraph { what, .. }) => assert_eq!(what, "b"),
        other => panic!("expected StaleGraph naming b, got {other:?}"),
    }
    assert!(matches!(w.add(["only one name".into()], [&a, &b]), Err(Error::Misuse(_))));
}

/// A user's own error travels through the step closure and comes back as its source.
#[test]
fn a_users_error_comes_back_through_the_closure() {
    #[derive(Debug)]
    struct OutOfData(usize);
    impl std::fmt::Display for OutOfData {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "out of data after {} batches", self.0)
        }
    }
    impl std::error::Error for OutOfData {}
    let x = Tensor::zeros([2], (Kind::Float, Device::Cpu));
    let mut calls = 0;
    let mut step = TrainStep::new(&[("x", &x)], StepOptions::default().warmup(1), move |_| {
        calls += 1;
        if calls > 1 {
            return Err(Error::user(OutOfData(calls)));
        }
        Ok(vec![])
    })
    .unwrap();
    step.run(&[&x]).unwrap();
    let err = step.run(&[&x]).unwrap_err();
    match &err {
        Error::User(inner) => assert_eq!(inner.downcast_ref::<OutOfData>().map(|e| e.0), Some(2)),
        other => panic!("expected Error::User, got {other:?}"),
    }
    let source = err.source().expect("User keeps its source");
    assert_eq!(source.to_string(), "out of data after 2 batches");
}

/// tch's errors convert with `?` and stay reachable as the source.
#[test]
fn tch_errors_keep_their_source() {
    let a = Tensor::zeros([2, 3], (Kind::Float, Device::Cpu));
    let b = Tensor::zeros([4, 5], (Kind::Float, Device::Cpu));
    let r: Result<Tensor, Error> = (|| Ok(a.f_matmul(&b)?))();
    let err = r.unwrap_err();
    assert!(matches!(err, Error::Torch(_)), "{err:?}");
    let source = err.source().expect("Torch keeps the TchError");
    assert!(source.downcast_ref::<tch::TchError>().is_some());
    println!("{err}: {source}");
}

/// The capture lock is per device, refuses to nest on one thread, and is released on drop.
#[test]
fn the_capture_lock_refuses_to_nest_and_releases_on_drop() {
    let held = CaptureLock::acquire(Device::Cuda(0)).unwrap();
    assert!(matches!(CaptureLock::acquire(Device::Cuda(0)), Err(Error::Misuse(_))), "nested");
    let other = CaptureLock::acquire(Device::Cuda(1)).unwrap(); // another device is free
                                                                // another thread waits until this one lets go
    let (tx, rx) = std::sync::mpsc::channel();
    let waiter = std::thread::spawn(move || {
        let _l = CaptureLock::acquire(Device::Cuda(0)).unwrap();
        tx.send(()).unwrap();
    });
    assert!(rx.recv_timeout(std::time::Duration::from_millis(200)).is_err(), "must wait while held");
    drop(held);
    rx.recv_timeout(std::time::Duration::from_secs(10)).expect("acquired once released");
    waiter.join().unwrap();
    drop(other);
    let again = CaptureLock::acquire(Device::Cuda(0)).unwrap();
    drop(again);
    assert!(matches!(CaptureLock::acquire(Device::Cpu), Err(Error::Misuse(_))));
}

/// Outside a capture of this crate nothing is retained: the object is dropped at once.
#[test]
fn retain_in_capture_keeps_nothing_outside_a_capture() {
    let dropped = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    struct Flag(std::sync::Arc<std::sync::atomic::AtomicBool>);
    impl Drop for Flag {
        fn drop(&mut self) {
            self.0.store(true, std::sync::atomic::Ordering::SeqCst);
        }
    }
    assert!(!tch_cuda_graphs::retain_in_capture(Device::Cpu, Flag(dropped.clone())));
    assert!(dropped.swap(false, std::sync::atomic::Ordering::SeqCst), "dropped at once (CPU device)");
    assert!(!tch_cuda_graphs::retain_in_capture(Device::Cuda(0), Flag(dropped.clone())));
    assert!(dropped.load(std::sync::atomic::Ordering::SeqCst), "dropped at once (no capture under way)");
}

/// The own optimizer kernels are built into every CUDA build (so CI proves that nvcc builds
/// them), never into a no-CUDA one. On the CPU the optimizers run ATen's kernels: `Own` is
/// refused with `Unsupported`, and the last step says which kernels ran.
#[test]
fn own_optimizer_kernels_are_built_with_cuda_and_refused_on_the_cpu() {
    let opted_out = option_env!("TCH_CUDA_GRAPHS_NO_OWN_KERNELS").is_some_and(|v| !v.is_empty() && v != "0");
    println!("own kernels built: {}, shim with CUDA: {}", own_kernels_built(), built_with_cuda());
    assert_eq!(own_kernels_built(), built_with_cuda() && !opted_out);
    let p = Tensor::ones([4], (Kind::Float, Device::Cpu)).set_requires_grad(true);
    let mut opt = Adam::from_params(vec![p.shallow_clone()], AdamConfig::default()).unwrap();
    assert_eq!(opt.kernels(), Kernels::Auto);
    let err = opt.set_kernels(Kernels::Own).unwrap_err();
    println!("Kernels::Own on the CPU: {err}");
    assert!(matches!(err, Error::Unsupported(_)), "{err:?}");
    assert_eq!(opt.kernels(), Kernels::Auto, "a refused choice changes nothing");
    assert_eq!(opt.last_path(), None);
    (&p * 2.0).sum(Kind::Float).backward();
    opt.step().unwrap();
    assert_eq!(opt.last_path(), Some(KernelPath::PyTorch));
    opt.set_kernels(Kernels::PyTorch).unwrap();
    assert_eq!(opt.kernels(), Kernels::PyTorch);
    assert!(matches!(own_kernels_available(Device::Cpu), Err(Error::Unsupported(_))));
    if !cuda_is_available() {
        let err = own_kernels_available(Device::Cuda(0)).unwrap_err();
        assert!(matches!(err, Error::NoCuda(_)), "{err:?}");
    }
}

/// autograd::grad against tch's backward on the CPU: explicit output gradients, retain_graph,
/// unused inputs (None with allow_unused, an error without), .grad untouched, argument checks.
#[test]
fn autograd_grad_matches_backward_on_the_cpu() {
    use tch_cuda_graphs::autograd::grad;
    tch::manual_seed(7);
    let w = Tensor::randn([5, 3], (Kind::Float, Device::Cpu)).set_requires_grad(true);
    let x = Tensor::randn([4, 5], (Kind::Float, Device::Cpu)).set_requires_grad(true);
    let unused = Tensor::randn([2], (Kind::Float, Device::Cpu)).set_requires_grad(true);
    let y = x.matmul(&w).tanh();
    let gy = Tensor::randn([4, 3], (Kind::Float, Device::Cpu));
    let g = grad(
        &[y.shallow_clone()],
        &[w.shallow_clone(), x.shallow_clone(), unused.shallow_clone()],
        Some(&[gy.shallow_clone()]),
        true,
        true,
    )
    .expect("grad");
    assert!(g[2].is_none(), "an unused input gets None with allow_unused");
    assert!(!w.grad().defined() && !x.grad().defined(), ".grad untouched");
    // the same through backward (the graph was retained)
    (&y * &gy).sum(Kind::Float).backward(); // d/dy of sum(y * gy) is gy, exactly
    let (dw, dx) = (
        f64::try_from((g[0].as_ref().unwrap() - w.grad()).abs().max()).unwrap(),
        f64::try_from((g[1].as_ref().unwrap() - x.grad()).abs().max()).unwrap(),
    );
    println!("autograd::grad vs backward on the CPU: dW {dw:e}, dX {dx:e}");
    assert_eq!((dw, dx), (0.0, 0.0));
    let y2 = x.matmul(&w).sum(Kind::Float);
    let e = grad(&[y2.shallow_clone()], &[unused.shallow_clone()], None, false, false)
        .expect_err("unused without allow_unused");
    assert!(matches!(e, Error::Libtorch(_)), "{e:?}");
    let e = grad(&[y2], &[w.shallow_clone()], Some(&[]), false, false).expect_err("grad_outputs count");
    assert!(matches!(e, Error::Misuse(_)), "{e:?}");
}

/// make_graphed_callables needs CUDA tensors on a CUDA device: NoCuda without one, Misuse for CPU
/// tensors or no callable where there is one.
#[test]
fn graphed_callables_need_a_cuda_device_and_cuda_tensors() {
    use tch_cuda_graphs::{make_graphed_callables, Callable, GraphedOptions};
    let x = Tensor::ones([2, 2], (Kind::Float, Device::Cpu));
    let r =
        make_graphed_callables(vec![Callable::new(vec![x], |xs| Ok(vec![xs[0].relu()]))], GraphedOptions::default());
    match r {
        Err(Error::NoCuda(msg)) => assert!(!cuda_is_available() && !msg.is_empty()),
        Err(Error::Misuse(msg)) => assert!(cuda_is_available() && msg.contains("not CUDA"), "{msg}"),
        other => panic!("expected NoCuda or Misuse, got {other:?}"),
    }
    let none = make_graphed_callables(Vec::new(), GraphedOptions::default());
    assert!(matches!(none, Err(Error::Misuse(_))), "{none:?}");
    // an undefined sample is an error (NoCuda first without a device), never a panic
    let undefined = make_graphed_callables(
        vec![Callable::new(vec![Tensor::new()], |xs| Ok(xs.iter().map(Tensor::shallow_clone).collect()))],
        GraphedOptions::default(),
    );
    assert!(matches!(undefined, Err(Error::Misuse(_) | Error::NoCuda(_))), "{undefined:?}");
}

/// Conditional nodes exist only inside a capture of this crate: on the CPU (and outside any
/// capture) they are refused with Misuse, before anything is recorded.
#[test]
fn conditional_nodes_outside_a_capture_are_misuse() {
    use tch_cuda_graphs::control::{capture_if, capture_unless, capture_while};
    let cond = Tensor::ones([], (Kind::Bool, Device::Cpu));
    let ran = std::cell::Cell::new(false);
    let e = capture_if(&cond, || {
        ran.set(true);
        Ok(())
    })
    .expect_err("no capture");
    assert!(matches!(e, Error::Misuse(_)), "{e:?}");
    let e = capture_while(&cond, 3, || {
        ran.set(true);
        Ok(())
    })
    .expect_err("no capture");
    assert!(matches!(e, Error::Misuse(_)), "{e:?}");
    let e = capture_unless(&cond, || {
        ran.set(true);
        Ok(())
    })
    .expect_err("no capture");
    assert!(matches!(e, Error::Misuse(_)), "{e:?}");
    assert!(!ran.get(), "the body is not run when refused");
    let e = capture_if(&Tensor::new(), || Ok(())).expect_err("an undefined condition");
    assert!(matches!(e, Error::Misuse(_)), "{e:?}");
}

/// The profiler's summary: unions of intervals per stream, NCCL vs compute, their overlap.
#[test]
fn profile_summary_counts_unions_and_overlap() {
    use tch_cuda_graphs::profiler::{Event, EventKind, Summary};
    let ev = |name: &str, kind, stream, s: u64, e: u64| Event {
        name: name.into(),
        kind,
        device: 0,
        stream,
        start_ns: s * 1000,
        end_ns: e * 1000,
    };
    let events = vec![
        ev("gemm", EventKind::Kernel, 7, 0, 10),
        ev("gemm", EventKind::Kernel, 7, 5, 12), // overlaps the first on its stream: 0..12
        ev("ncclDevKernel_AllReduce", EventKind::Kernel, 9, 8, 20), // 8..12 hidden, 12..20 exposed
        ev("Memcpy DtoD", EventKind::Memcpy, 7, 25, 30),
        ev("aten::mm", EventKind::CpuOp, -1, 0, 100), // not a GPU event
    ];
    let s = Summary::of(&events);
    println!("{s:?}");
    assert_eq!(s.kernels, 3);
    assert_eq!((s.span_us, s.busy_us), (30.0, 25.0));
    assert_eq!((s.nccl_us, s.compute_us, s.overlap_us, s.exposed_nccl_us()), (12.0, 17.0, 4.0, 8.0));
    assert_eq!(s.streams.len(), 2);
    assert_eq!((s.streams[0].stream, s.streams[0].kernels, s.streams[0].busy_us), (7, 2, 17.0));
    assert_eq!((s.streams[1].stream, s.streams[1].nccl_kernels, s.streams[1].busy_us), (9, 1, 12.0));
    assert_eq!(Summary::of(&[]), Summary::default());
}

/// The profiler on the CPU: it records this thread's ops, writes a Chrome trace, refuses a
/// second profiler while one runs, and a dropped one frees the slot.
#[test]
fn the_profiler_records_cpu_ops_and_writes_a_chrome_trace() {
    use tch_cuda_graphs::profiler::{EventKind, Profiler};
    let prof = Profiler::start().unwrap();
    let e = Profiler::start().expect_err("one at a time");
    assert!(matches!(e, Error::Misuse(_)), "{e:?}");
    let a = Tensor::ones([64, 64], (Kind::Float, Device::Cpu));
    let _ = a.mm(&a);
    let profile = prof.stop().unwrap();
    let mm = profile.events().iter().filter(|e| e.kind == EventKind::CpuOp && e.name == "aten::mm").count();
    println!("{} events, {mm} aten::mm", profile.events().len());
    assert!(mm >= 1, "the mm is in the profile");
    let path = std::env::temp_dir().join(format!("tcg-profile-{}.json", std::process::id()));
    profile.save_chrome_trace(&path).unwrap();
    let json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let _ = std::fs::remove_file(&path);
    let names: Vec<&str> = json["traceEvents"].as_array().unwrap().iter().filter_map(|e| e["name"].as_str()).collect();
    assert!(names.contains(&"aten::mm"), "the Chrome trace holds the op");
    drop(Profiler::start().unwrap()); // dropped without stop: stopped and discarded
    Profiler::start().unwrap().stop().unwrap();
}

/// Without the fused kernels (a CPU tensor, or a build without CUDA) the norm layers run ATen's
/// operators: a LayerNorm equals tch's `nn::layer_norm`, the residual form equals the add
/// followed by it, an RMSNorm its formula, and `Kernels::Own` is refused.
#[test]
fn norm_layers_run_aten_without_the_fused_kernels() {
    use tch::nn::Module;
    use tch_cuda_graphs::norm::{layer_norm, rms_norm, NormConfig};

    tch::manual_seed(3);
    let vs = nn::VarStore::new(Device::Cpu);
    let ours = layer_norm(vs.root() / "ours", vec![16], NormConfig::default());
    let theirs = nn::layer_norm(vs.root() / "theirs", vec![16], Default::default());
    let x = Tensor::randn([4, 5, 16], (Kind::Float, Device::Cpu));
    let y = ours.f_forward(&x).expect("forward");
    assert_eq!(ours.last_path(), Some(KernelPath::PyTorch));
    assert!(y.equal(&theirs.forward(&x)), "a LayerNorm equals nn::layer_norm");
    let branch = Tensor::randn([4, 5, 16], (Kind::Float, Device::Cpu));
    let (sum, y2) = ours.f_forward_residual(&x, &branch, 0.3, false).expect("residual");
    assert!(sum.equal(&(&x + &branch)), "no dropout outside training");
    assert!(y2.equal(&theirs.forward(&(&x + &branch))));
    let (dropped, _) = ours.f_forward_residual(&x, &branch, 0.5, true).expect("residual with dropout");
    // x + 0 where dropped, x + 2 · branch where kept
    let dropped_share = f64::try_from((&dropped - &x).abs().lt(1e-7).to_kind(Kind::Float).mean(Kind::Float)).unwrap();
    assert!(dropped_share > 0.2 && dropped_share < 0.8, "dropout applied in training ({dropped_share})");
    let rms = rms_norm(vs.root() / "rms", vec![16], NormConfig::default());
    assert!(rms.bs.is_none());
    let expected = &x * (x.square().mean_dim(-1, true, Kind::Float) + 1e-5).rsqrt();
    let diff = f64::try_from((rms.f_forward(&x).expect("rms") - expected).abs().max()).unwrap();
    println!("RMSNorm against its formula: max difference {diff:e}");
    assert!(diff < 1e-6);
    let own = layer_norm(vs.root() / "own", vec![16], NormConfig { kernels: Kernels::Own, ..Default::default() });
    assert!(matches!(own.f_forward(&x), Err(Error::Unsupported(_))), "Own without the fused kernels is refused");
}

/// Without CUDA parameters weight shadows take nothing, and `shadow::linear` is `Tensor::linear`.
#[test]
fn weight_shadows_take_no_cpu_parameter() {
    use tch_cuda_graphs::shadow::{self, WeightShadows};
    let vs = nn::VarStore::new(Device::Cpu);
    let lin = nn::linear(vs.root() / "fc", 8, 4, Default::default());
    let shadows = WeightShadows::new(&vs.trainable_variables(), Kind::BFloat16).expect("register");
    assert!(shadows.is_empty());
    let x = Tensor::randn([3, 8], (Kind::Float, Device::Cpu));
    let y = shadow::linear(&x, &lin.ws, lin.bs.as_ref()).expect("linear");
    assert!(y.equal(&x.linear(&lin.ws, lin.bs.as_ref())));
    assert!(matches!(WeightShadows::new(&vs.trainable_variables(), Kind::Float), Err(Error::Misuse(_))));
}

/// Without CUDA the linear layer runs `at::linear`: its output and gradients equal
/// `Tensor::linear`'s, `Kernels::Own` is refused, and a weight that does not fit is a misuse.
#[test]
fn the_linear_layer_runs_aten_on_the_cpu() {
    use tch_cuda_graphs::linear::{linear, LinearConfig, WeightGrad};

    tch::manual_seed(5);
    let vs = nn::VarStore::new(Device::Cpu);
    let ours = linear(vs.root() / "fc", 8, 4, LinearConfig { weight_grad: WeightGrad::Float32, ..Default::default() });
    let x = Tensor::randn([2, 3, 8], (Kind::Float, Device::Cpu));
    let y = ours.f_forward(&x).expect("forward");
    assert_eq!(ours.last_path(), Some(KernelPath::PyTorch));
    let expected = x.linear(&ours.ws, ours.bs.as_ref());
    assert!(y.equal(&expected), "equal to Tensor::linear");
    y.sum(Kind::Float).backward();
    let bias_grad = ours.bs.as_ref().unwrap().grad();
    assert!(bias_grad.equal(&Tensor::full([4], 6.0, (Kind::Float, Device::Cpu))), "the bias gradient sums 6 rows");
    let column_sums = x.view([6, 8]).sum_dim_intlist(0, false, Kind::Float).unsqueeze(0).expand([4, 8], false);
    let diff = f64::try_from((ours.ws.grad() - column_sums).abs().max()).unwrap();
    println!("weight gradient against the input's column sums: max difference {diff:e}");
    assert!(diff < 1e-5, "the weight gradient of a sum is the input's column sums");
    let own = linear(vs.root() / "own", 8, 4, LinearConfig { kernels: Kernels::Own, ..Default::default() });
    assert!(matches!(own.f_forward(&x), Err(Error::Unsupported(_))), "Own without CUDA is refused");
    let wide = Tensor::randn([2, 9], (Kind::Float, Device::Cpu));
    assert!(matches!(ours.f_forward(&wide), Err(Error::Misuse(_))), "a misfit input is a misuse");
}

/// Without CUDA a split linear layer is `at::linear` then `split`: the same pieces and gradients
/// as `Tensor::linear(..).split(..)`; a count of pieces that does not divide the output, or is
/// out of range, is a misuse.
#[test]
fn the_split_linear_layer_runs_aten_on_the_cpu() {
    use tch_cuda_graphs::linear::{linear, LinearConfig};

    tch::manual_seed(8);
    let vs = nn::VarStore::new(Device::Cpu);
    let ours = linear(vs.root() / "qkv", 8, 12, LinearConfig::default());
    let x = Tensor::randn([2, 3, 8], (Kind::Float, Device::Cpu));
    let pieces = ours.f_forward_split(&x, 3).expect("split");
    assert_eq!(ours.last_path(), Some(KernelPath::PyTorch));
    let expected = x.linear(&ours.ws, ours.bs.as_ref()).split(4, -1);
    assert_eq!(pieces.len(), 3);
    assert!(pieces.iter().zip(&expected).all(|(a, b)| a.equal(b)), "the same pieces");
    // the second piece unused: its part of the gradients is zero
    let seed = Tensor::randn([2, 3, 4], (Kind::Float, Device::Cpu));
    let loss = (&pieces[0] * &seed).sum(Kind::Float) + (&pieces[2] * 2.0).sum(Kind::Float);
    loss.backward();
    let (dw, db) = (ours.ws.grad(), ours.bs.as_ref().unwrap().grad());
    let x2 = x.view([6, 8]);
    let dy = Tensor::cat(
        &[
            seed.view([6, 4]),
            Tensor::zeros([6, 4], (Kind::Float, Device::Cpu)),
            Tensor::full([6, 4], 2.0, (Kind::Float, Device::Cpu)),
        ],
        1,
    );
    let (dw_ref, db_ref) = (dy.tr().matmul(&x2), dy.sum_dim_intlist(0, false, Kind::Float));
    let diff =
        f64::try_from((&dw - &dw_ref).abs().max()).unwrap().max(f64::try_from((&db - &db_ref).abs().max()).unwrap());
    println!("split: weight and bias gradients against dyᵀ·x and dy's column sums: max difference {diff:e}");
    assert!(diff < 1e-5, "the gradients of the packed output");
    assert!(matches!(ours.f_forward_split(&x, 5), Err(Error::Misuse(_))), "5 pieces of 12");
    assert!(matches!(ours.f_forward_split(&x, 0), Err(Error::Misuse(_))), "no pieces");
    assert!(matches!(ours.f_forward_split(&x, 12), Err(Error::Misuse(_))), "more than 8 pieces");
}

/// Without CUDA the cross-entropy is ATen's: equal to tch's `cross_entropy_loss`, gradient
/// included; `Kernels::Own` is refused; mismatched targets are a misuse.
#[test]
fn cross_entropy_runs_aten_on_the_cpu() {
    use common::cross_entropy_ran;
    use tch_cuda_graphs::loss::CrossEntropyConfig;

    tch::manual_seed(6);
    let logits = Tensor::randn([12, 9], (Kind::Float, Device::Cpu)).set_requires_grad(true);
    let targets = Tensor::randint(9, [12], (Kind::Int64, Device::Cpu));
    let (loss, ran) = cross_entropy_ran(&logits, &targets, &CrossEntropyConfig::default()).expect("loss");
    assert!(!ran);
    let expected = logits.cross_entropy_loss::<Tensor>(&targets, None, tch::Reduction::Mean, -100, 0.0);
    assert!(loss.equal(&expected), "equal to cross_entropy_loss");
    let own = CrossEntropyConfig { kernels: Kernels::Own, ..Default::default() };
    assert!(matches!(cross_entropy_ran(&logits, &targets, &own), Err(Error::Unsupported(_))));
    let wrong = Tensor::randint(9, [11], (Kind::Int64, Device::Cpu));
    assert!(matches!(cross_entropy_ran(&logits, &wrong, &own), Err(Error::Misuse(_))));
}

/// The crate's layers are tch layers: `nn::Module` (`x.apply(&layer)`, `nn::seq()`) gives what
/// the fallible `f_forward` gives, and the crate's errors travel through `tch::TchError` and
/// back unchanged.
#[test]
fn the_crates_layers_are_tch_modules() {
    use tch::nn::Module;
    use tch_cuda_graphs::linear::{linear, LinearConfig};
    use tch_cuda_graphs::norm::{layer_norm, NormConfig};
    let vs = nn::VarStore::new(Device::Cpu);
    let fc = linear(vs.root() / "fc", 8, 16, LinearConfig::default());
    let ln = layer_norm(vs.root() / "ln", vec![16], NormConfig::default());
    let x = Tensor::randn([4, 8], (Kind::Float, Device::Cpu));
    let direct = ln.f_forward(&fc.f_forward(&x).unwrap()).unwrap();
    assert!(x.apply(&fc).apply(&ln).equal(&direct), "Module::forward is f_forward");
    let fc2 = linear(vs.root() / "fc2", 8, 16, LinearConfig::default());
    let net = nn::seq().add(fc2).add_fn(|t| t.relu());
    assert_eq!(net.forward(&x).size(), [4, 16]);
    // a wrong width: a typed error from f_forward, through TchError and back
    let fallible =
        || -> Result<Tensor, tch::TchError> { Ok(ln.f_forward(&Tensor::zeros([2, 3], (Kind::Float, Device::Cpu)))?) };
    let e = fallible().expect_err("a [2, 3] input to a LayerNorm over 16");
    println!("through TchError: {e}");
    let back: Error = e.into();
    println!("back: {back:?}");
    assert!(matches!(back, Error::Torch(_) | Error::Misuse(_)), "{back:?}");
}

/// A step's closure may borrow the model, and its state (the optimizer) is handed back between
/// runs: the same model is evaluated through a plain reference, and the optimizer read and
/// changed, while the step lives. A closure that fails leaves both usable, and the step runs on.
#[test]
fn a_step_borrows_the_model_and_hands_back_its_state() {
    use tch::nn::Module;
    let vs = nn::VarStore::new(Device::Cpu);
    let model = nn::linear(vs.root() / "l", 4, 1, Default::default());
    let opt = Adam::new(&vs, AdamConfig::default().lr(1e-2)).unwrap();
    let x = Tensor::ones([8, 4], (Kind::Float, Device::Cpu));
    let fail = std::cell::Cell::new(false);
    let mut step = TrainStep::with_state(opt, &[("x", &x)], StepOptions::default(), |opt, inp| {
        opt.zero_grad()?;
        let loss = model.forward(&inp[0]).f_square()?.f_mean(None)?;
        loss.f_backward()?;
        if fail.get() {
            return Err(Error::Misuse("the user's closure failed".into()));
        }
        opt.step()?;
        Ok(vec![loss.detach()])
    })
    .unwrap();
    let before = model.forward(&x);
    step.run(&[&x]).unwrap();
    assert!(!model.forward(&x).equal(&before), "the step trained the borrowed model");
    fail.set(true);
    assert!(matches!(step.run(&[&x]), Err(Error::Misuse(_))), "the closure's error comes back");
    fail.set(false);
    step.state_mut().set_lr(1e-3).unwrap();
    assert_eq!(step.state().lr(), 1e-3);
    let loss = f64::try_from(&step.run(&[&x]).unwrap()[0]).unwrap();
    println!("after a failed call the step runs on: loss {loss:.5}");
    let opt = step.into_state();
    assert_eq!(opt.lr(), 1e-3);
    let _ = model.forward(&x); // the model outlives the step
}

/// A transformer layer as a tch `ModuleT`, and as a stack threading one residual stream: the
/// stream's result equals the layers applied one by one (each add then done by ATen), and a
/// wrong width is a typed error that names the dimension.
#[test]
fn transformer_layers_thread_one_residual_stream() {
    use tch::nn::ModuleT;
    use tch_cuda_graphs::transformer::{ResidualStream, TransformerConfig, TransformerLayer};
    tch::manual_seed(4);
    let vs = nn::VarStore::new(Device::Cpu);
    let cfg = TransformerConfig { heads: 2, ..Default::default() };
    let layers: Vec<TransformerLayer> = (0..2).map(|l| TransformerLayer::new(vs.root() / "h" / l, 16, cfg)).collect();
    let x = Tensor::randn([2, 5, 16], (Kind::Float, Device::Cpu));
    let mut stream = ResidualStream::new(x.shallow_clone());
    for l in &layers {
        l.f_forward_t(&mut stream, false).unwrap();
    }
    let threaded = stream.f_into_tensor().unwrap();
    let one_by_one = layers.iter().fold(x.shallow_clone(), |h, l| l.forward_t(&h, false));
    let diff = f64::try_from((&threaded - &one_by_one).abs().max()).unwrap();
    println!("threaded stream against layer by layer: max |difference| = {diff:e}");
    assert!(diff < 1e-5, "the same function");
    let names: Vec<String> = vs.variables().into_keys().filter(|n| n.starts_with("h.0.")).collect();
    assert!(
        names.iter().any(|n| n == "h.0.attn.c_attn.weight") && names.iter().any(|n| n == "h.0.mlp.c_proj.bias"),
        "{names:?}"
    );
    let mut wrong = ResidualStream::new(Tensor::zeros([2, 5, 12], (Kind::Float, Device::Cpu)));
    let e = layers[0].f_forward_t(&mut wrong, false).expect_err("a width of 12 into a layer of 16");
    println!("{e}");
    assert!(matches!(e, Error::Misuse(_)));
}

/// The stream's start on ATen's path (`LayerNorm::f_forward_dropout`, the first norm of a
/// `ResidualStream`): without dropout x is the input and the input's gradient is the norm's plus
/// the stream's; `with_dropout` draws the start's dropout (kept values scaled, the rate near p)
/// and without training is `new`.
#[test]
fn the_stream_start_takes_its_dropout_in_the_first_norm() {
    use tch_cuda_graphs::norm::{layer_norm, NormConfig};
    use tch_cuda_graphs::transformer::ResidualStream;
    tch::manual_seed(6);
    let vs = nn::VarStore::new(Device::Cpu);
    let ln = layer_norm(vs.root() / "ln", vec![16], NormConfig::default());
    let e = Tensor::randn([64, 16], (Kind::Float, Device::Cpu)).set_requires_grad(true);
    let (x, y) = ln.f_forward_dropout(&e, 0.0, true).unwrap();
    let dx = Tensor::randn([64, 16], (Kind::Float, Device::Cpu));
    ((&x * &dx).sum(Kind::Float) + y.sum(Kind::Float)).backward();
    let e2 = e.detach().set_requires_grad(true);
    e2.apply(&ln).sum(Kind::Float).backward();
    let diff = f64::try_from((e.grad() - (e2.grad() + &dx)).abs().max()).unwrap();
    println!(
        "start without dropout: x equal to the input {}; d input against the norm's plus the stream's: {diff:e}",
        x.equal(&e)
    );
    assert!(x.equal(&e) && diff < 1e-6);

    let mut stream = ResidualStream::with_dropout(e.detach(), 0.5, true);
    let _h = stream.f_norm(&ln).unwrap();
    let x = stream.f_into_tensor().unwrap();
    let kept = x.ne(0.0);
    let rate = 1.0 - f64::try_from(kept.to_kind(Kind::Float).mean(Kind::Float)).unwrap();
    let kept_error = f64::try_from((&x - e.detach() * 2.0 * kept.to_kind(Kind::Float)).abs().max()).unwrap();
    println!("with_dropout(0.5): dropped {rate:.3}, max |kept - 2 input| = {kept_error:e}");
    assert!((rate - 0.5).abs() < 0.1 && kept_error == 0.0);
    let eval = ResidualStream::with_dropout(e.detach(), 0.5, false).f_into_tensor().unwrap();
    assert!(eval.equal(&e.detach()), "no dropout outside training");
}

/// Position embeddings at the stream's start on ATen's path (`ResidualStream::with_positions`,
/// `LayerNorm::f_forward_dropout_biased`): the first norm's x and y and the positions' gradient
/// (summed over the batch) equal `tokens + positions` then the norm, bit for bit; where no norm
/// follows, the stream is `tokens + positions`; positions not the tokens' trailing dimensions are
/// `Error::Misuse`.
#[test]
fn the_stream_start_takes_position_embeddings() {
    use tch_cuda_graphs::norm::{layer_norm, NormConfig};
    use tch_cuda_graphs::transformer::ResidualStream;
    tch::manual_seed(8);
    let vs = nn::VarStore::new(Device::Cpu);
    let ln = layer_norm(vs.root() / "ln", vec![16], NormConfig::default());
    let tok0 = Tensor::randn([3, 8, 16], (Kind::Float, Device::Cpu));
    let pos0 = Tensor::randn([8, 16], (Kind::Float, Device::Cpu));
    let run = |folded: bool| {
        let (tok, pos) = (tok0.detach().set_requires_grad(true), pos0.detach().set_requires_grad(true));
        let mut stream = if folded {
            ResidualStream::with_positions(tok.shallow_clone(), pos.shallow_clone(), 0.0, true)
        } else {
            ResidualStream::with_dropout(&tok + &pos, 0.0, true)
        };
        let h = stream.f_norm(&ln).unwrap();
        let x = stream.f_into_tensor().unwrap();
        ((&x * 0.5).sum(Kind::Float) + h.sum(Kind::Float)).backward();
        (x, h, tok.grad(), pos.grad())
    };
    let (x1, h1, dt1, dp1) = run(true);
    let (x2, h2, dt2, dp2) = run(false);
    let same = [x1.equal(&x2), h1.equal(&h2), dt1.equal(&dt2), dp1.equal(&dp2)];
    println!("with_positions against tokens + positions: x, y, d tokens, d positions equal {same:?}");
    assert!(same.iter().all(|&e| e));
    let settled =
        ResidualStream::with_positions(tok0.shallow_clone(), pos0.shallow_clone(), 0.0, true).f_into_tensor().unwrap();
    assert!(settled.equal(&(&tok0 + &pos0)), "no norm: tokens + positions");
    let wrong = Tensor::zeros([9, 16], (Kind::Float, Device::Cpu));
    let e = ln.f_forward_dropout_biased(&tok0, Some(&wrong), 0.0, true).unwrap_err();
    println!("positions [9, 16] for tokens [3, 8, 16]: {e}");
    assert!(matches!(e, Error::Misuse(_)));
}

/// A step is given weight shadows once, in the autocast dtype, before its first run, and only
/// when it asks for them (`weight_shadows(true)` under autocast): each other case is a misuse.
#[test]
fn a_step_takes_weight_shadows_only_as_asked() {
    use tch_cuda_graphs::shadow::WeightShadows;
    use tch_cuda_graphs::{StepOptions, TrainStep};
    let vs = nn::VarStore::new(Device::Cpu);
    let lin = nn::linear(vs.root() / "fc", 8, 4, Default::default());
    let x = Tensor::randn([3, 8], (Kind::Float, Device::Cpu));
    let body = |inp: &[Tensor]| Ok(vec![inp[0].apply(&lin).sum(Kind::Float)]);
    let set = |k| WeightShadows::new(&vs.trainable_variables(), k).expect("shadows");
    let mut plain = TrainStep::new(&[("x", &x)], StepOptions::default(), body).expect("step");
    assert!(matches!(plain.set_weight_shadows(set(Kind::BFloat16)), Err(Error::Misuse(_))), "not asked for");
    let asked = StepOptions::default().autocast(Kind::BFloat16).weight_shadows(true);
    let mut step = TrainStep::new(&[("x", &x)], asked, body).expect("step");
    assert!(matches!(step.set_weight_shadows(set(Kind::Half)), Err(Error::Misuse(_))), "another dtype");
    assert_eq!(step.set_weight_shadows(set(Kind::BFloat16)).expect("the autocast dtype"), 0, "no CUDA parameter");
    assert!(matches!(step.set_weight_shadows(set(Kind::BFloat16)), Err(Error::Misuse(_))), "once");
    assert!(step.weight_shadows().is_some());
    step.run(&[&x]).expect("on the CPU the shadows have nothing to do");
    let mut late = TrainStep::new(&[("x", &x)], asked, body).expect("step");
    late.run(&[&x]).expect("a CPU step without shadows runs: autocast does not touch it");
    assert!(matches!(late.set_weight_shadows(set(Kind::BFloat16)), Err(Error::Misuse(_))), "after the first run");
}

/// GELU with the bias folded in, on the CPU (ATen's composition): `gelu(x + bias)` in both forms,
/// its gradients those of the composition; and a transformer layer whose biases go into the
/// norms and the GELU (`Kernels::Auto`) computes what the layer with each bias in its linear
/// layer computes (`Kernels::PyTorch`), up to rounding, with either GELU; the MLP with GELU (tanh)
/// in its GEMMs' epilogues is ATen's composition there.
#[test]
fn bias_gelu_and_deferred_biases_on_the_cpu() {
    use tch::nn::ModuleT;
    use tch_cuda_graphs::gelu::{f_bias_gelu, GeluApproximate, GeluConfig};
    use tch_cuda_graphs::kernels::Kernels;
    use tch_cuda_graphs::linear::{linear, LinearConfig};
    use tch_cuda_graphs::mlp::f_gelu_tanh_mlp;
    use tch_cuda_graphs::transformer::{Activation, TransformerConfig, TransformerLayer};
    tch::manual_seed(5);
    let x = Tensor::randn([6, 16], (Kind::Float, Device::Cpu)).set_requires_grad(true);
    let bias = Tensor::randn([16], (Kind::Float, Device::Cpu)).set_requires_grad(true);
    for (approximate, name) in [(GeluApproximate::None, "none"), (GeluApproximate::Tanh, "tanh")] {
        let y = f_bias_gelu(&x, Some(&bias), &GeluConfig { approximate, ..Default::default() }).unwrap();
        let want = (&x + &bias).gelu(name);
        assert!(y.equal(&want), "gelu({name}) of x + bias");
    }
    let wrong = Tensor::zeros([15], (Kind::Float, Device::Cpu));
    assert!(matches!(f_bias_gelu(&x, Some(&wrong), &GeluConfig::default()), Err(Error::Misuse(_))));

    // the MLP with GELU (tanh) in its GEMMs' epilogues: on the CPU, ATen's composition
    let vs = nn::VarStore::new(Device::Cpu);
    let fc = linear(vs.root() / "fc", 16, 32, LinearConfig::default());
    let proj = linear(vs.root() / "proj", 32, 16, LinearConfig::default());
    let y = f_gelu_tanh_mlp(&x, &fc, &proj).unwrap();
    let want = x.linear(&fc.ws, fc.bs.as_ref()).gelu("tanh").linear(&proj.ws, proj.bs.as_ref());
    assert!(y.equal(&want), "linear, gelu(tanh), linear");
    assert!(matches!(f_gelu_tanh_mlp(&x, &proj, &fc), Err(Error::Misuse(_))));

    let layer = |kernels, activation| {
        tch::manual_seed(7);
        let vs = nn::VarStore::new(Device::Cpu);
        let cfg = TransformerConfig { heads: 2, kernels, activation, ..Default::default() };
        let l = TransformerLayer::new(vs.root(), 16, cfg);
        tch::no_grad(|| {
            for (_, t) in vs.variables() {
                t.shallow_clone().copy_(&(Tensor::randn_like(&t) * 0.2));
            }
        });
        (vs, l)
    };
    for activation in [Activation::Gelu, Activation::GeluTanh] {
        let (vs_a, deferred) = layer(Kernels::Auto, activation);
        let (mut vs_b, plain) = layer(Kernels::PyTorch, activation);
        vs_b.copy(&vs_a).unwrap();
        let h = Tensor::randn([2, 5, 16], (Kind::Float, Device::Cpu));
        let (ya, yb) = (deferred.forward_t(&h, false), plain.forward_t(&h, false));
        ya.sum(Kind::Float).backward();
        yb.sum(Kind::Float).backward();
        let diff = f64::try_from((&ya - &yb).abs().max()).unwrap();
        let grad_diff = ["mlp.c_fc.bias", "mlp.c_proj.bias", "attn.c_proj.bias"]
            .iter()
            .map(|n| {
                let (a, b) = (&vs_a.variables()[*n], &vs_b.variables()[*n]);
                f64::try_from((a.grad() - b.grad()).abs().max()).unwrap()
            })
            .fold(0f64, f64::max);
        println!(
            "{activation:?}: deferred biases against biases in the linear layers: output {diff:e}, bias gradients {grad_diff:e}"
        );
        assert!(diff < 1e-5 && grad_diff < 1e-5);
    }
}

/// The chunked head + loss on the CPU is ATen's `linear` and `cross_entropy_loss`, bit for bit, and
/// so is the exponentials-in-the-head method (`Kernels::Own` refuses it there); shapes that do not
/// match and a negative chunk size are misuses.
#[test]
fn linear_cross_entropy_on_the_cpu_is_the_composition() {
    use tch_cuda_graphs::loss::{f_linear_cross_entropy, LinearCrossEntropyConfig, LinearCrossEntropyMethod};
    tch::manual_seed(9);
    let h = Tensor::randn([3, 5, 16], (Kind::Float, Device::Cpu)).set_requires_grad(true);
    let head = Tensor::randn([40, 16], (Kind::Float, Device::Cpu)).set_requires_grad(true);
    let targets = Tensor::randint(40, [3, 5], (Kind::Int64, Device::Cpu));
    let config = LinearCrossEntropyConfig { chunk_rows: 4, ..Default::default() };
    let loss = f_linear_cross_entropy(&h, &head, &targets, &config).unwrap();
    let want = h.linear::<Tensor>(&head, None).view([-1, 40]).cross_entropy_loss::<Tensor>(
        &targets.view([-1]),
        None,
        tch::Reduction::Mean,
        -100,
        0.0,
    );
    assert!(loss.equal(&want), "linear and cross_entropy_loss");
    // the exponentials-in-the-head method is a GPU path: here the same composition
    let exp = LinearCrossEntropyConfig { method: LinearCrossEntropyMethod::ExpInHead, ..config };
    assert!(f_linear_cross_entropy(&h, &head, &targets, &exp).unwrap().equal(&want), "ExpInHead on the CPU");
    let own = LinearCrossEntropyConfig { kernels: tch_cuda_graphs::kernels::Kernels::Own, ..exp };
    assert!(matches!(f_linear_cross_entropy(&h, &head, &targets, &own), Err(Error::Unsupported(_))));
    loss.backward();
    assert_eq!(h.grad().size(), [3, 5, 16]);
    let short = Tensor::zeros([14], (Kind::Int64, Device::Cpu));
    assert!(matches!(f_linear_cross_entropy(&h, &head, &short, &config), Err(Error::Misuse(_))));
    let negative = LinearCrossEntropyConfig { chunk_rows: -1, ..Default::default() };
    assert!(matches!(f_linear_cross_entropy(&h, &head, &targets, &negative), Err(Error::Misuse(_))));
}
