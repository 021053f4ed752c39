//! GPU tests of whole captured training steps: capturable optimizers (replay = eager), set_lr
//! between replays, TrainStep on the GPU, shared pools for train + eval, on-device clipping.
//! Each needs a CUDA device (`#[ignore]` by default) and fails loudly without one.

mod common;

use common::{batch, cuda, max_param_diff, mse, twin_mlps};
use tch::{nn, nn::Module, Device, Kind, Tensor};
use tch_cuda_graphs::optim::{Adam, AdamConfig, Optimizer, Sgd, SgdConfig};
use tch_cuda_graphs::{
    clip_grad_norm, empty_cache, memory_stats, pool_memory, synchronize, Error, StepOptions, TrainStep,
};

/// A TrainStep over `model` with `opt`, optionally clipping, graphed or eager.
fn step_for(
    model: nn::Sequential,
    mut opt: Box<dyn Optimizer + Send>,
    x: &Tensor,
    y: &Tensor,
    options: StepOptions,
    clip: Option<f64>,
) -> tch_cuda_graphs::Result<TrainStep<'static>> {
    TrainStep::new(&[("x", x), ("y", y)], options, move |inp| {
        opt.zero_grad()?;
        let loss = mse(&model, &inp[0], &inp[1]);
        loss.f_backward()?;
        let mut outs = vec![loss.detach()];
        if let Some(max) = clip {
            outs.push(clip_grad_norm(opt.params(), max, 2.0)?);
        }
        opt.step()?;
        Ok(outs)
    })
}

/// Trains twin MLPs 100 steps on the same batches: one replaying a captured step, one eager
/// with the same optimizer. Returns the max abs parameter difference.
fn replay_vs_eager(make: impl Fn(&nn::VarStore) -> Box<dyn Optimizer + Send>, clip: Option<f64>) -> f64 {
    let d = cuda();
    tch::manual_seed(7);
    let (vs_g, model_g, vs_e, model_e) = twin_mlps(d, 32, 64, 4);
    let batches: Vec<(Tensor, Tensor)> = (0..101).map(|_| batch(d, 64, 32, 4)).collect();
    let (x0, y0) = (&batches[0].0, &batches[0].1);
    let mut graphed = step_for(model_g, make(&vs_g), x0, y0, StepOptions::default().warmup(3), clip).unwrap();
    let mut eager = step_for(model_e, make(&vs_e), x0, y0, StepOptions::default().warmup(3).eager(true), clip).unwrap();
    assert!(graphed.is_graphed() && !eager.is_graphed());
    for (x, y) in &batches[1..] {
        let lg = graphed.run(&[x, y]).unwrap()[0].shallow_clone();
        let le = eager.run(&[x, y]).unwrap()[0].shallow_clone();
        assert!(f64::try_from(&lg).unwrap().is_finite());
        let _ = le;
    }
    synchronize(d).unwrap();
    max_param_diff(&vs_g, &vs_e)
}

#[test]
#[ignore = "needs a CUDA device"]
fn replayed_sgd_equals_eager_sgd_over_100_steps() {
    let diff = replay_vs_eager(
        |vs| Box::new(Sgd::new(vs, SgdConfig::default().lr(0.05).momentum(0.9).weight_decay(1e-4)).unwrap()),
        None,
    );
    println!("SGD (momentum 0.9): max |param_graph - param_eager| after 100 steps (3 eager + 97 graphed) = {diff:e}");
    assert!(diff <= 1e-6, "{diff}");
}

#[test]
#[ignore = "needs a CUDA device"]
fn replayed_adam_equals_eager_adam_over_100_steps() {
    let diff = replay_vs_eager(|vs| Box::new(Adam::new(vs, AdamConfig::default().lr(1e-3)).unwrap()), None);
    println!("Adam: max |param_graph - param_eager| after 100 steps (3 eager + 97 graphed) = {diff:e}");
    assert!(diff <= 1e-6, "{diff}");
}

#[test]
#[ignore = "needs a CUDA device"]
fn replayed_adamw_equals_eager_adamw_over_100_steps() {
    let diff = replay_vs_eager(|vs| Box::new(Adam::new(vs, AdamConfig::adamw().lr(1e-3).amsgrad(true)).unwrap()), None);
    println!("AdamW (amsgrad): max |param_graph - param_eager| after 100 steps (3 eager + 97 graphed) = {diff:e}");
    assert!(diff <= 1e-6, "{diff}");
}

#[test]
#[ignore = "needs a CUDA device"]
fn clipping_inside_a_captured_step_equals_eager_clipping() {
    let diff = replay_vs_eager(|vs| Box::new(Adam::new(vs, AdamConfig::default().lr(1e-2)).unwrap()), Some(0.1));
    println!("Adam + clip_grad_norm(0.1): max |param_graph - param_eager| = {diff:e}");
    assert!(diff <= 1e-6, "{diff}");
}

#[test]
#[ignore = "needs a CUDA device"]
fn set_lr_between_replays_changes_the_captured_step() {
    let d = cuda();
    tch::manual_seed(8);
    let vs = nn::VarStore::new(d);
    let model = common::mlp(vs.root(), 8, 16, 1);
    let opt = Sgd::new(&vs, SgdConfig::default().lr(0.1)).unwrap();
    let mut lr = opt.lr_tensor().shallow_clone();
    let (x, y) = batch(d, 16, 8, 1);
    let mut step = step_for(model, Box::new(opt), &x, &y, StepOptions::default().warmup(1), None).unwrap();
    step.run(&[&x, &y]).unwrap(); // the eager warmup step
    step.run(&[&x, &y]).unwrap(); // capture + replay
    assert_eq!(step.graph_count(), 1);
    let snapshot = || -> Vec<Tensor> { vs.trainable_variables().iter().map(|t| t.detach().copy()).collect() };
    let _ = lr.fill_(0.0);
    let before = snapshot();
    step.run(&[&x, &y]).unwrap();
    for (b, a) in before.iter().zip(snapshot()) {
        assert!(b.equal(&a), "lr 0 in the captured step must leave parameters alone");
    }
    let _ = lr.fill_(0.1);
    step.run(&[&x, &y]).unwrap();
    assert!(before.iter().zip(snapshot()).any(|(b, a)| !b.equal(&a)), "lr 0.1 must move them");
}

#[test]
#[ignore = "needs a CUDA device"]
fn sgd_momentum_first_step_inside_capture_is_refused() {
    let d = cuda();
    let vs = nn::VarStore::new(d);
    let model = common::mlp(vs.root(), 4, 8, 1);
    let opt = Sgd::new(&vs, SgdConfig::default().momentum(0.9)).unwrap();
    let (x, y) = batch(d, 8, 4, 1);
    let mut step = step_for(model, Box::new(opt), &x, &y, StepOptions::default().warmup(0), None).unwrap();
    match step.run(&[&x, &y]).map(drop) {
        Err(Error::Misuse(msg)) => assert!(msg.contains("warm up"), "{msg}"),
        other => panic!("expected Misuse, got {other:?}"),
    }
    // the process can capture again
    let vs2 = nn::VarStore::new(d);
    let model2 = common::mlp(vs2.root(), 4, 8, 1);
    let opt2 = Sgd::new(&vs2, SgdConfig::default().momentum(0.9)).unwrap();
    let mut ok = step_for(model2, Box::new(opt2), &x, &y, StepOptions::default().warmup(1), None).unwrap();
    ok.run(&[&x, &y]).unwrap();
}

#[test]
#[ignore = "needs a CUDA device"]
fn train_step_on_gpu_validates_inputs_and_keeps_its_memory_alive() {
    let d = cuda();
    tch::manual_seed(9);
    let (x, y) = batch(d, 32, 16, 2);
    let mut step = {
        let vs = nn::VarStore::new(d);
        let model = common::mlp(vs.root(), 16, 32, 2);
        let opt = Adam::new(&vs, AdamConfig::default().lr(1e-2)).unwrap();
        step_for(model, Box::new(opt), &x, &y, StepOptions::default(), None).unwrap()
        // vs dropped here: the step holds the parameters through the model and optimizer
    };
    assert!(step.is_graphed());
    let (x_keep, y_keep) = (x.copy(), y.copy());
    drop((x, y)); // the caller's handles of the static inputs go away too
    empty_cache().unwrap();
    let first = f64::try_from(&step.run(&[&x_keep, &y_keep]).unwrap()[0]).unwrap();
    let mut last = first;
    for _ in 0..300 {
        last = f64::try_from(&step.run(&[&x_keep, &y_keep]).unwrap()[0]).unwrap();
    }
    println!("graphed TrainStep loss {first:.4} -> {last:.4}");
    assert!(last < first * 0.5, "{first} -> {last}");
    let cpu_x = x_keep.to(Device::Cpu);
    step.run(&[&cpu_x, &y_keep]).unwrap(); // CPU batches are fed too
    let wrong = Tensor::zeros([32, 16], (Kind::Double, d));
    match step.run(&[&wrong, &y_keep]) {
        Err(Error::InputMismatch { name, got, .. }) => {
            assert_eq!(name, "x");
            assert!(got.contains("Double"), "{got}");
        }
        other => panic!("expected InputMismatch for a float64 batch, got {other:?}"),
    }
    let mixed = TrainStep::new(&[("a", &cpu_x), ("b", &y_keep)], StepOptions::default().warmup(0), |_| Ok(vec![]));
    assert!(matches!(mixed, Err(Error::Misuse(_))), "inputs on two devices");
}

#[test]
#[ignore = "needs a CUDA device"]
fn train_and_eval_steps_share_one_pool() {
    let d = cuda();
    let width = 1024;
    let build = |share: bool| -> (i64, TrainStep<'static>, TrainStep<'static>, Tensor) {
        synchronize(d).unwrap();
        empty_cache().unwrap();
        let before = memory_stats(d).unwrap().reserved;
        tch::manual_seed(10);
        let vs = nn::VarStore::new(d);
        let model = common::mlp(vs.root(), width, width, width);
        let eval_model = common::mlp(vs.root() / "eval", width, width, width);
        let opt = Adam::new(&vs, AdamConfig::default()).unwrap();
        let (x, y) = batch(d, 256, width, width);
        let mut train = step_for(model, Box::new(opt), &x, &y, StepOptions::default(), None).unwrap();
        let options = if share { StepOptions::default().pool(train.pool().unwrap()) } else { StepOptions::default() };
        let xe = x.shallow_clone();
        let mut eval = TrainStep::new(&[("x", &xe)], options.warmup(1), move |inp| {
            let _guard = tch::no_grad_guard();
            Ok(vec![eval_model.forward(&inp[0]).f_mean(Kind::Float)?])
        })
        .unwrap();
        for _ in 0..4 {
            train.run(&[&x, &y]).unwrap(); // 3 warmup steps, then capture + replay
        }
        for _ in 0..2 {
            eval.run(&[&x]).unwrap(); // 1 warmup step, then capture + replay
        }
        assert_eq!((train.graph_count(), eval.graph_count()), (1, 1));
        let reserved = memory_stats(d).unwrap().reserved - before;
        (reserved, train, eval, x)
    };
    let (separate, t1, e1, _) = build(false);
    drop((t1, e1));
    let (shared, mut train, mut eval, x) = build(true);
    let pool = train.pool().unwrap();
    println!(
        "train + eval steps: separate pools reserve {separate} bytes, one shared pool {shared} bytes (saved {}); shared pool holds {} bytes",
        separate - shared,
        pool_memory(d, pool).unwrap().reserved
    );
    assert!(shared < separate, "{shared} vs {separate}");
    // replay in capture order: train, then eval
    for _ in 0..5 {
        train.replay().unwrap();
        eval.run(&[&x]).unwrap();
    }
    assert!(f64::try_from(&eval.outputs()[0]).unwrap().is_finite());
}

/// A graphed step whose parameters were converted after capture (set_kind replaces their
/// storage) refuses to replay instead of training freed memory; so does one whose static input
/// was replaced. The check costs nanoseconds per tensor (figure printed).
#[test]
#[ignore = "needs a CUDA device"]
fn a_graphed_step_refuses_to_run_on_replaced_storage() {
    let d = cuda();
    tch::manual_seed(11);
    let mut vs = nn::VarStore::new(d);
    let model = common::mlp(vs.root(), 16, 32, 2);
    let opt = Adam::new(&vs, AdamConfig::default().lr(1e-2)).unwrap();
    let (x, y) = batch(d, 32, 16, 2);
    let mut step = step_for(model, Box::new(opt), &x, &y, StepOptions::default(), None).unwrap();
    assert!(step.is_graphed());
    step.watch_vars(&vs).unwrap();
    step.run(&[&x, &y]).unwrap();
    // cost of the check: run() = check + copies + replay; time the check alone through a watch
    let mut w = tch_cuda_graphs::TensorWatch::new().unwrap();
    let vars: Vec<Tensor> = vs.trainable_variables();
    w.add((0..vars.len()).map(|i| format!("p{i}")), &vars).unwrap();
    let n = 100_000;
    let t = std::time::Instant::now();
    for _ in 0..n {
        w.check().unwrap();
    }
    let per = t.elapsed().as_nanos() as f64 / n as f64;
    println!(
        "storage check of {} tensors: {per:.0} ns per step ({:.1} ns per tensor)",
        vars.len(),
        per / vars.len() as f64
    );
    vs.set_kind(Kind::Double);
    match step.run(&[&x, &y]) {
        Err(Error::StaleGraph { what, detail }) => println!("graphed step after set_kind: {what}: {detail}"),
        other => panic!("expected StaleGraph, got {other:?}"),
    }
    // a replaced static input
    let vs2 = nn::VarStore::new(d);
    let model2 = common::mlp(vs2.root(), 16, 32, 2);
    let opt2 = Adam::new(&vs2, AdamConfig::default().lr(1e-2)).unwrap();
    let mut step2 = step_for(model2, Box::new(opt2), &x, &y, StepOptions::default(), None).unwrap();
    step2.watch_vars(&vs2).unwrap();
    let mut input = step2.inputs()[1].shallow_clone();
    input.set_data(&Tensor::zeros([32, 2], (Kind::Float, d)));
    assert!(matches!(step2.run(&[&x, &y]), Err(Error::StaleGraph { .. })));
}

/// The same out-of-memory error is Error::OutOfMemory on every path that runs a step's closure:
/// a graphed step's eager warmup, its capture, the eager fallback on a GPU, and
/// run_on_capture_stream. After each, memory is back where it was and the step trains on.
#[test]
#[ignore = "needs a CUDA device"]
fn an_out_of_memory_is_typed_the_same_on_every_path() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let d = cuda();
    let huge = move || Tensor::f_empty([1i64 << 40], (Kind::Float, d)); // 4 TiB
    let expect_oom = |what: &str, r: tch_cuda_graphs::Result<()>| match r {
        Err(Error::OutOfMemory { source }) => println!("{what}: OutOfMemory (source: {source})"),
        other => panic!("{what}: expected OutOfMemory, got {other:?}"),
    };
    for (what, options) in [
        ("graphed step, eager warmup", StepOptions::default().warmup(2)),
        ("graphed step, capture", StepOptions::default().warmup(0)),
        ("eager fallback on the GPU", StepOptions::default().eager(true)),
    ] {
        tch::manual_seed(11);
        let vs = nn::VarStore::new(d);
        let model = common::mlp(vs.root(), 16, 32, 4);
        let opt = Adam::new(&vs, AdamConfig::default()).unwrap();
        let (x, y) = batch(d, 8, 16, 4);
        let oom = Arc::new(AtomicBool::new(true));
        let flag = Arc::clone(&oom);
        let mut train = common::mse_step(model, opt);
        let mut step = TrainStep::new(&[("x", &x), ("y", &y)], options, move |inp| {
            if flag.load(Ordering::Relaxed) {
                drop(huge()?); // first, so that nothing else of the step has run
            }
            train(inp)
        })
        .unwrap();
        synchronize(d).unwrap();
        let before = memory_stats(d).unwrap();
        expect_oom(what, step.run(&[&x, &y]).map(drop));
        synchronize(d).unwrap();
        let after = memory_stats(d).unwrap();
        assert_eq!(after.allocated, before.allocated, "{what}: allocated memory is back");
        assert_eq!(after.ooms, before.ooms + 1, "{what}");
        oom.store(false, Ordering::Relaxed);
        for _ in 0..4 {
            let out = step.run(&[&x, &y]).unwrap();
            assert!(f64::try_from(&out[0]).unwrap().is_finite(), "{what}: the step trains on");
        }
    }
    let r = tch_cuda_graphs::run_on_capture_stream(d, || huge().map(drop).map_err(Error::from));
    expect_oom("run_on_capture_stream", r);
}

/// Parameters whose storage was replaced (`set_data` with the same values): the step says
/// StaleGraph, `recapture()` captures it again on the new storage (updating the executable in
/// place), and training goes on equal to an eager twin whose parameters were replaced alike.
#[test]
#[ignore = "needs a CUDA device"]
fn recapture_after_replaced_parameters_updates_in_place_and_trains_like_eager() {
    let d = cuda();
    tch::manual_seed(12);
    let (vs, model, vs_e, model_e) = twin_mlps(d, 16, 64, 2);
    let opt = Adam::new(&vs, AdamConfig::default().lr(1e-2)).unwrap();
    let mut opt_e = Adam::new(&vs_e, AdamConfig::default().lr(1e-2)).unwrap();
    let batches: Vec<(Tensor, Tensor)> = (0..30).map(|_| batch(d, 32, 16, 2)).collect();
    let (x0, y0) = &batches[0];
    let mut step = step_for(model, Box::new(opt), x0, y0, StepOptions::default(), None).unwrap();
    step.watch_vars(&vs).unwrap();
    let eager = |opt: &mut Adam, x: &Tensor, y: &Tensor| {
        opt.zero_grad().unwrap();
        mse(&model_e, x, y).backward();
        opt.step().unwrap();
    };
    for (x, y) in &batches[..10] {
        step.run(&[x, y]).unwrap();
        eager(&mut opt_e, x, y);
    }
    assert_eq!(step.graph_count(), 1);
    // replace every parameter's storage (same values) on both sides
    for vars in [vs.trainable_variables(), vs_e.trainable_variables()] {
        for mut p in vars {
            let copy = p.copy();
            tch::no_grad(|| p.set_data(&copy));
        }
    }
    let (x, y) = &batches[10];
    assert!(matches!(step.run(&[x, y]), Err(Error::StaleGraph { .. })), "the step sees the new storage");
    let captures = step.captures();
    let r = step.recapture().expect("recapture");
    println!("recapture: {r:?}, captures {captures} -> {}", step.captures());
    assert_eq!((r.updated, r.replaced), (1, 0), "the same step on other addresses updates in place");
    for (x, y) in &batches[10..] {
        step.run(&[x, y]).unwrap();
        eager(&mut opt_e, x, y);
    }
    synchronize(d).unwrap();
    let diff = max_param_diff(&vs, &vs_e);
    println!(
        "30 steps, parameters replaced after 10 and the step recaptured: max parameter difference vs eager {diff:e}"
    );
    assert_eq!(diff, 0.0);
}

/// An AdamW step over `model` that fails during a capture while `fail` is set (after its whole
/// step was recorded).
fn failing_step<'a>(
    vs: &nn::VarStore,
    model: &'a nn::Sequential,
    (x0, y0): (&Tensor, &Tensor),
    options: StepOptions,
    fail: Option<&'a std::cell::Cell<bool>>,
) -> TrainStep<'a, Adam> {
    let opt = Adam::new(vs, AdamConfig::adamw().lr(1e-2)).unwrap();
    TrainStep::with_state(opt, &[("x", x0), ("y", y0)], options, move |opt, inp| {
        opt.zero_grad()?;
        let loss = mse(model, &inp[0], &inp[1]);
        loss.f_backward()?;
        opt.step()?;
        if fail.is_some_and(|f| f.get()) && tch_cuda_graphs::is_current_stream_capturing()? {
            return Err(Error::Misuse("the user's step failed".into()));
        }
        Ok(vec![loss.detach()])
    })
    .unwrap()
}

/// A closure that fails during the capture (after its whole step was recorded) fails the run
/// with its own error and leaves the borrowed model and the step's optimizer as they were: the
/// model evaluates eagerly, nothing trained, the next run captures and trains, and after 20
/// steps the parameters equal an eager twin's (trained on the same batches without the failed
/// run) bit for bit.
#[test]
#[ignore = "needs a CUDA device"]
fn a_closure_failing_during_capture_leaves_model_and_optimizer_usable() {
    use std::cell::Cell;
    let d = cuda();
    tch::manual_seed(12);
    let (vs_g, model_g, vs_e, model_e) = twin_mlps(d, 32, 64, 4);
    let batches: Vec<(Tensor, Tensor)> = (0..20).map(|_| batch(d, 64, 32, 4)).collect();
    let (x0, y0) = (&batches[0].0, &batches[0].1);
    let fail_in_capture = Cell::new(true);
    let options = StepOptions::default().warmup(2);
    let mut graphed = failing_step(&vs_g, &model_g, (x0, y0), options, Some(&fail_in_capture));
    let mut eager = failing_step(&vs_e, &model_e, (x0, y0), options.eager(true), None);
    for (x, y) in &batches[..2] {
        graphed.run(&[x, y]).expect("warmup");
        eager.run(&[x, y]).expect("eager");
    }
    let before: Vec<Tensor> = graphed.state().params().iter().map(|p| p.detach().copy()).collect();
    let (x, y) = &batches[2];
    match graphed.run(&[x, y]) {
        Err(Error::Misuse(m)) => println!("the capture's run failed with the closure's error: {m}"),
        other => panic!("expected the closure's error, got {other:?}"),
    }
    assert_eq!(graphed.graph_count(), 0, "no graph kept from the failed capture");
    let moved = before.iter().zip(graphed.state().params()).any(|(b, p)| !b.equal(p));
    assert!(!moved, "the failed capture changed no parameter");
    let eval = tch::no_grad(|| mse(&model_g, x, y));
    assert!(f64::try_from(&eval).unwrap().is_finite(), "the model evaluates eagerly after the failure");
    fail_in_capture.set(false);
    for (x, y) in &batches[2..] {
        graphed.run(&[x, y]).expect("captured and replayed after the failure");
        eager.run(&[x, y]).expect("eager");
    }
    assert_eq!(graphed.graph_count(), 1, "captured on the next run");
    synchronize(d).unwrap();
    let diff = max_param_diff(&vs_g, &vs_e);
    println!("after 20 steps (one failed capture between): max |graphed - eager| = {diff:e}");
    assert_eq!(diff, 0.0, "the step trains as its eager twin after a failed capture");
}
