//! Real training loops without a GPU (CI, both shim builds): ragged and variable batch shapes
//! through the eager fallback, bucket padding, checkpoint and resume, parameter groups,
//! learning-rate handles and schedules (host and device-computed), device-side metrics.

mod common;

use common::{cpu_batches, max_param_diff, mlp, mse_step, plain_loop, schedule_twins, twin_mlps, ScheduleTwins};
use tch::{nn, Device, Kind, Tensor};
use tch_cuda_graphs::optim::{
    decay_groups, split_params, Adam, AdamConfig, Optimizer, ParamGroup, Sgd, SgdConfig, Split,
};
use tch_cuda_graphs::schedule::{LinearWarmup, Schedule, StepDecay, WarmupCosine};
use tch_cuda_graphs::{checkpoint, feed::DeviceMeter, Buckets, Error, StepOptions, TrainStep};

const D: i64 = 8;
const O: i64 = 2;

fn example(n: i64) -> (Tensor, Tensor) {
    (Tensor::zeros([n, D], (Kind::Float, Device::Cpu)), Tensor::zeros([n, O], (Kind::Float, Device::Cpu)))
}

#[test]
fn buckets_pad_to_the_next_length_with_a_mask() {
    let b = Buckets::new([64, 16, 32, 32]).unwrap();
    assert_eq!(b.lengths(), &[16, 32, 64]);
    assert_eq!(b.bucket_for(1).unwrap(), 16);
    assert_eq!(b.bucket_for(17).unwrap(), 32);
    assert!(matches!(b.bucket_for(65), Err(Error::Misuse(_))));
    // [batch 3, len 20, features 4], rows of lengths 20, 7, 1
    let x = Tensor::ones([3, 20, 4], (Kind::Float, Device::Cpu));
    let lengths = Tensor::from_slice(&[20i64, 7, 1]);
    let p = b.pad(&x, 1, -1.0, Some(&lengths)).unwrap();
    assert_eq!((p.len, p.bucket), (20, 32));
    assert_eq!(p.tensor.size(), [3, 32, 4]);
    assert_eq!(p.mask.size(), [3, 32]);
    assert_eq!(p.mask.kind(), Kind::Bool);
    let real: Vec<i64> = Vec::try_from(p.mask.sum_dim_intlist(1, false, Kind::Int64)).unwrap();
    assert_eq!(real, [20, 7, 1]);
    assert!(p.tensor.narrow(1, 0, 20).equal(&x), "the data is kept");
    assert_eq!(f64::try_from(p.tensor.narrow(1, 20, 12).mean(Kind::Double)).unwrap(), -1.0, "padding value");
    assert!(matches!(b.pad(&x, 0, 0.0, None), Err(Error::Misuse(_))), "never pads the batch dimension");
}

/// Every batch trains exactly once, whatever its shape: the eager fallback over ragged batches
/// equals a hand-written loop, and the shape bound evicts the least recently used shape.
#[test]
fn ragged_batches_each_train_once_and_shapes_are_bounded() {
    let sizes = [16, 16, 16, 5, 16, 16, 16, 5, 9, 16, 9, 5];
    let batches = cpu_batches(20, &sizes, D, O);
    let (vs_a, a, vs_b, b) = twin_mlps(Device::Cpu, D, 16, O);
    let mut opt_b = Adam::new(&vs_b, AdamConfig::default().lr(1e-2)).unwrap();
    let opt_a = Adam::new(&vs_a, AdamConfig::default().lr(1e-2)).unwrap();
    let (x0, y0) = example(16);
    let mut step =
        TrainStep::new(&[("x", &x0), ("y", &y0)], StepOptions::default().max_graphs(2), mse_step(a, opt_a)).unwrap();
    for (x, y) in &batches {
        step.run(&[x, y]).unwrap();
        assert!(step.shapes().len() <= 2, "at most max_graphs shapes are kept: {:?}", step.shapes());
    }
    plain_loop(&b, &mut opt_b, &batches, Device::Cpu);
    let diff = max_param_diff(&vs_a, &vs_b);
    println!("{} ragged batches through the eager TrainStep vs a plain loop: max param diff {diff:e}", sizes.len());
    assert_eq!(diff, 0.0);
    assert_eq!(step.runs(), sizes.len() as u64);
    let last: Vec<i64> = step.shapes().last().unwrap()[0].clone();
    assert_eq!(last, [5, D], "the most recent shape is last");
}

/// 100 steps, save, load into fresh objects, 100 more equals 200 straight (eager: exactly).
#[test]
fn resuming_from_a_checkpoint_equals_training_straight_through() {
    let dir = std::env::temp_dir().join(format!("tcg-ckpt-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let batches = cpu_batches(21, &[16; 200], D, O);
    for sgd in [false, true] {
        let make = |seed: i64| -> (nn::VarStore, Box<dyn Optimizer + Send>, nn::Sequential) {
            tch::manual_seed(seed);
            let vs = nn::VarStore::new(Device::Cpu);
            let model = mlp(vs.root(), D, 16, O);
            let opt: Box<dyn Optimizer + Send> = if sgd {
                Box::new(Sgd::new(&vs, SgdConfig::default().lr(0.05).momentum(0.9)).unwrap())
            } else {
                Box::new(Adam::new(&vs, AdamConfig::adamw().lr(1e-2).amsgrad(true)).unwrap())
            };
            (vs, opt, model)
        };
        let path = dir.join(format!("sgd-{sgd}.safetensors"));
        // the same initial weights, copied (other tests draw from the global RNG in parallel)
        let (vs_s, mut opt_s, model_s) = make(1);
        let (mut vs_a, mut opt_a, model_a) = make(1);
        vs_a.copy(&vs_s).unwrap();
        // straight
        plain_loop_dyn(&model_s, opt_s.as_mut(), &batches);
        // 100, save
        plain_loop_dyn(&model_a, opt_a.as_mut(), &batches[..100]);
        let step_no = Tensor::from(100i64);
        checkpoint::save(&path, &vs_a, opt_a.as_ref(), &[("step", &step_no)]).unwrap();
        // fresh objects (other initial weights), load, 100 more
        let (vs_b, mut opt_b, model_b) = make(2);
        let extra = checkpoint::load(&path, &vs_b, opt_b.as_mut()).unwrap();
        assert_eq!(extra["step"].int64_value(&[]), 100);
        plain_loop_dyn(&model_b, opt_b.as_mut(), &batches[100..]);
        let diff = max_param_diff(&vs_s, &vs_b);
        println!(
            "{}: 100 + save/load + 100 vs 200 straight (eager, CPU): max param diff {diff:e}",
            if sgd { "SGD" } else { "AdamW" }
        );
        assert_eq!(diff, 0.0);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

fn plain_loop_dyn(model: &nn::Sequential, opt: &mut dyn Optimizer, batches: &[(Tensor, Tensor)]) {
    for (x, y) in batches {
        opt.zero_grad().unwrap();
        common::mse(model, x, y).backward();
        opt.step().unwrap();
    }
}

/// A checkpoint of another model, or a corrupt file, is a clear error and changes nothing;
/// loading into a step that already ran writes in place (the step then continues from it).
#[test]
fn a_checkpoint_that_does_not_fit_changes_nothing() {
    let dir = std::env::temp_dir().join(format!("tcg-ckpt-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    tch::manual_seed(3);
    let vs = nn::VarStore::new(Device::Cpu);
    let model = mlp(vs.root(), D, 16, O);
    let mut opt = Adam::new(&vs, AdamConfig::default()).unwrap();
    let good = dir.join("good.safetensors");
    checkpoint::save(&good, &vs, &opt, &[]).unwrap();
    let snapshot = |vs: &nn::VarStore, opt: &Adam| -> Vec<Tensor> {
        let mut v: Vec<Tensor> = vs.trainable_variables().iter().map(|t| t.copy()).collect();
        v.extend(opt.state().unwrap().into_iter().map(|(_, t)| t.copy()));
        v
    };
    let same = |a: &[Tensor], b: &[Tensor]| a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.equal(y));
    let before = snapshot(&vs, &opt);
    // another model: a wider hidden layer
    let other_vs = nn::VarStore::new(Device::Cpu);
    let _other = mlp(other_vs.root(), D, 32, O);
    let other_opt = Adam::new(&other_vs, AdamConfig::default()).unwrap();
    let other = dir.join("other.safetensors");
    checkpoint::save(&other, &other_vs, &other_opt, &[]).unwrap();
    match checkpoint::load(&other, &vs, &mut opt) {
        Err(Error::Checkpoint(msg)) => println!("another model: {msg}"),
        r => panic!("expected Error::Checkpoint, got {:?}", r.map(|_| ())),
    }
    assert!(same(&before, &snapshot(&vs, &opt)), "a failed load changed something");
    // another optimizer layout: SGD state into Adam
    let sgd = Sgd::new(&vs, SgdConfig::default().momentum(0.9)).unwrap();
    let sgd_path = dir.join("sgd.safetensors");
    checkpoint::save(&sgd_path, &vs, &sgd, &[]).unwrap();
    assert!(matches!(checkpoint::load(&sgd_path, &vs, &mut opt), Err(Error::Checkpoint(_))));
    assert!(same(&before, &snapshot(&vs, &opt)));
    // a hyper-parameter out of range (beta1 = 2): refused before anything is written
    let mut state: std::collections::HashMap<String, Tensor> = opt.state().unwrap().into_iter().collect();
    state.insert("group.0.beta1".into(), Tensor::from(2.0f64));
    match opt.load_state(&state) {
        Err(Error::Checkpoint(msg)) => println!("beta1 = 2: {msg}"),
        r => panic!("expected Error::Checkpoint, got {r:?}"),
    }
    assert!(same(&before, &snapshot(&vs, &opt)));
    // a corrupt file
    let corrupt = dir.join("corrupt.safetensors");
    let mut bytes = std::fs::read(&good).unwrap();
    bytes.truncate(bytes.len() / 2);
    std::fs::write(&corrupt, &bytes).unwrap();
    match checkpoint::load(&corrupt, &vs, &mut opt) {
        Err(e @ Error::CheckpointFile { .. }) => println!("corrupt file: {e} ({:?})", std::error::Error::source(&e)),
        r => panic!("expected Error::CheckpointFile, got {:?}", r.map(|_| ())),
    }
    assert!(matches!(
        checkpoint::load(dir.join("missing.safetensors"), &vs, &mut opt),
        Err(Error::CheckpointFile { .. })
    ));
    assert!(same(&before, &snapshot(&vs, &opt)));
    // in place: train, then load the first checkpoint back into the same objects
    let batches = cpu_batches(4, &[16; 5], D, O);
    plain_loop(&model, &mut opt, &batches, Device::Cpu);
    assert!(!same(&before, &snapshot(&vs, &opt)));
    let ptrs: Vec<usize> = vs.trainable_variables().iter().map(|t| t.data_ptr() as usize).collect();
    checkpoint::load(&good, &vs, &mut opt).unwrap();
    assert!(same(&before, &snapshot(&vs, &opt)), "loading restores everything");
    let after: Vec<usize> = vs.trainable_variables().iter().map(|t| t.data_ptr() as usize).collect();
    assert_eq!(ptrs, after, "loading writes in place");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Groups: two groups in one optimizer equal two optimizers on the two halves; weight decay
/// off for biases by a rule; each group's rate is its own.
#[test]
fn parameter_groups_have_their_own_hyper_parameters() {
    let batches = cpu_batches(5, &[16; 30], D, O);
    let (vs_a, a, vs_b, b) = twin_mlps(Device::Cpu, D, 16, O);
    let cfg = AdamConfig::adamw().lr(1e-2);
    let groups = decay_groups(&vs_a, cfg.weight_decay(0.1), cfg.weight_decay(0.0).lr(3e-2));
    let names = |g: &ParamGroup<AdamConfig>| g.params.iter().map(|p| p.0.clone()).collect::<Vec<_>>();
    assert!(groups[0].params.iter().all(|(n, t)| n.ends_with("weight") && t.dim() == 2), "{:?}", names(&groups[0]));
    assert!(groups[1].params.iter().all(|(n, t)| n.ends_with("bias") && t.dim() == 1), "{:?}", names(&groups[1]));
    let mut grouped = Adam::with_groups(groups).unwrap();
    assert_eq!(grouped.group_count(), 2);
    assert_eq!(grouped.lr_handles().iter().map(|h| h.get()).collect::<Vec<_>>(), [1e-2, 3e-2]);
    let Split { matching: no_decay_b, rest: decay_b } = split_params(&vs_b, |_, t| t.dim() <= 1);
    let take = |p: Vec<(String, Tensor)>| p.into_iter().map(|(_, t)| t).collect::<Vec<_>>();
    let mut first = Adam::from_params(take(decay_b), cfg.weight_decay(0.1)).unwrap();
    let mut second = Adam::from_params(take(no_decay_b), cfg.weight_decay(0.0).lr(3e-2)).unwrap();
    for (x, y) in &batches {
        grouped.zero_grad().unwrap();
        common::mse(&a, x, y).backward();
        grouped.step().unwrap();
        first.zero_grad().unwrap();
        second.zero_grad().unwrap();
        common::mse(&b, x, y).backward();
        first.step().unwrap();
        second.step().unwrap();
    }
    let diff = max_param_diff(&vs_a, &vs_b);
    println!("two groups in one Adam vs two Adams: max param diff {diff:e}");
    assert_eq!(diff, 0.0);
    // tch's own groups (Path::set_group) become optimizer groups
    let vs = nn::VarStore::new(Device::Cpu);
    let _l1 = nn::linear(vs.root().set_group(0) / "a", 4, 4, Default::default());
    let _l2 = nn::linear(vs.root().set_group(1) / "b", 4, 4, Default::default());
    let opt = Sgd::new(&vs, SgdConfig::default()).unwrap();
    assert_eq!(opt.group_count(), 2);
    assert!(matches!(opt.lr_handles()[0].set(-1.0), Err(Error::Misuse(_))));
}

/// A learning-rate handle still reaches the optimizer after it moved into a step.
#[test]
fn lr_handles_reach_an_optimizer_inside_a_step() {
    let (vs, model, _, _) = twin_mlps(Device::Cpu, D, 16, O);
    let opt = Adam::new(&vs, AdamConfig::default().lr(1e-2)).unwrap();
    let lr = opt.lr_handles().remove(0);
    let (x, y) = example(16);
    let mut step = TrainStep::new(&[("x", &x), ("y", &y)], StepOptions::default(), mse_step(model, opt)).unwrap();
    let batches = cpu_batches(6, &[16; 2], D, O);
    let snapshot = || -> Vec<Tensor> { vs.trainable_variables().iter().map(|t| t.copy()).collect() };
    lr.set(0.0).unwrap();
    let before = snapshot();
    step.run(&[&batches[0].0, &batches[0].1]).unwrap();
    assert!(before.iter().zip(snapshot()).all(|(a, b)| a.equal(&b)), "lr 0 set through the handle");
    lr.set(1e-2).unwrap();
    step.run(&[&batches[1].0, &batches[1].1]).unwrap();
    assert!(before.iter().zip(snapshot()).any(|(a, b)| !a.equal(&b)));
    assert_eq!(lr.clone().get(), 1e-2);
}

#[test]
fn schedules_give_the_factors_they_promise() {
    let s = WarmupCosine { warmup: 10, total: 110, min_factor: 0.1 };
    assert_eq!(s.factor(1), 0.1);
    assert_eq!(s.factor(10), 1.0);
    assert!((s.factor(60) - 0.55).abs() < 1e-12, "halfway through the cosine: {}", s.factor(60));
    assert!((s.factor(110) - 0.1).abs() < 1e-12);
    assert!((s.factor(500) - 0.1).abs() < 1e-12);
    assert_eq!(LinearWarmup { warmup: 4 }.factor(2), 0.5);
    assert_eq!(LinearWarmup { warmup: 4 }.factor(9), 1.0);
    let d = StepDecay { step_size: 10, gamma: 0.5 };
    assert_eq!((d.factor(1), d.factor(10), d.factor(11), d.factor(25)), (1.0, 1.0, 0.5, 0.25));
    // the tensor form computes the same numbers
    for t in [1u64, 5, 10, 11, 37, 60, 109, 110, 111, 400] {
        let tt = Tensor::from(t as f64);
        for (name, host, dev) in [
            ("warmup-cosine", s.factor(t), s.factor_tensor(&tt).unwrap()),
            ("step decay", d.factor(t), d.factor_tensor(&tt).unwrap()),
            (
                "linear warmup",
                LinearWarmup { warmup: 4 }.factor(t),
                LinearWarmup { warmup: 4 }.factor_tensor(&tt).unwrap(),
            ),
        ] {
            let dev = f64::try_from(dev).unwrap();
            assert!((host - dev).abs() <= 1e-15 * host.abs().max(1.0), "{name} at {t}: host {host} vs tensor {dev}");
        }
    }
}

/// Declaring shapes on the eager fallback checks them (count and ranks against the static
/// inputs, at most max_graphs) and changes nothing else: training equals a plain loop.
#[test]
fn declared_shapes_are_checked_and_change_nothing_on_the_cpu() {
    let batches = cpu_batches(8, &[16, 16, 9, 16, 9], D, O);
    let (vs_a, a, vs_b, b) = twin_mlps(Device::Cpu, D, 32, O);
    let opt_a = Adam::new(&vs_a, AdamConfig::default()).unwrap();
    let mut opt_b = Adam::new(&vs_b, AdamConfig::default()).unwrap();
    let (x0, y0) = (&batches[0].0, &batches[0].1);
    let mut step =
        TrainStep::new(&[("x", x0), ("y", y0)], StepOptions::default().max_graphs(3), mse_step(a, opt_a)).unwrap();
    for bad in [vec![vec![16, D]], vec![vec![16, D], vec![16]], vec![vec![16, D], vec![-1, O]]] {
        let r = step.declare_shapes(std::slice::from_ref(&bad));
        assert!(matches!(r, Err(tch_cuda_graphs::Error::Misuse(_))), "{bad:?}: {r:?}");
    }
    let r = step.declare_batch_sizes(&[1, 2, 3, 4]);
    assert!(matches!(r, Err(tch_cuda_graphs::Error::Misuse(_))), "more than max_graphs: {r:?}");
    step.declare_batch_sizes(&[16, 9]).unwrap();
    for (x, y) in &batches {
        step.run(&[x, y]).unwrap();
    }
    plain_loop(&b, &mut opt_b, &batches, Device::Cpu);
    assert_eq!(max_param_diff(&vs_a, &vs_b), 0.0);
}

/// A schedule's tensor form fails with Err, not a panic, where its ops fail (they take no tch
/// `Scalar`, whose failure panics in tch 0.24: under an invalidated capture every op fails).
/// Here the ops fail because the step count is an undefined tensor.
#[test]
fn a_schedules_tensor_form_fails_without_panicking() {
    let bad = Tensor::new(); // undefined: every op on it fails
    let schedules: [(&str, &dyn Schedule); 3] = [
        ("warmup-cosine", &WarmupCosine { warmup: 10, total: 110, min_factor: 0.1 }),
        ("step decay", &StepDecay { step_size: 10, gamma: 0.5 }),
        ("linear warmup", &LinearWarmup { warmup: 4 }),
    ];
    for (name, s) in schedules {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| s.factor_tensor(&bad)));
        match r {
            Ok(Err(tch_cuda_graphs::Error::Torch(e))) => println!("{name}: Err({e})"),
            Ok(other) => panic!("{name}: expected Err(Torch), got {other:?}"),
            Err(_) => panic!("{name}: panicked"),
        }
    }
}

/// The same schedule from the host and computed by tensors inside the step give the same
/// training (on the CPU here; the GPU test does it captured).
#[test]
fn a_device_schedule_equals_the_host_schedule() {
    let batches = cpu_batches(7, &[16; 40], D, O);
    let schedule = WarmupCosine { warmup: 5, total: 40, min_factor: 0.05 };
    let ScheduleTwins { mut host, mut step_h, vs_h, mut step_d, vs_d, lr_d, .. } =
        schedule_twins(Device::Cpu, schedule, 1e-2, (D, 16, O, 16));
    let mut worst_lr = 0f64;
    for (x, y) in &batches {
        let lr = host.step().unwrap();
        step_h.run(&[x, y]).unwrap();
        step_d.run(&[x, y]).unwrap();
        let lr_dev = f64::try_from(lr_d.tensor()).unwrap();
        worst_lr = worst_lr.max((lr as f32 as f64 - lr_dev).abs());
    }
    let diff = max_param_diff(&vs_h, &vs_d);
    println!("device vs host schedule, 40 steps (CPU): max |lr diff| {worst_lr:e}, max param diff {diff:e}");
    assert_eq!(worst_lr, 0.0);
    assert_eq!(diff, 0.0);
}

#[test]
fn a_device_meter_averages_without_reading_each_value() {
    let mut m = DeviceMeter::new();
    assert_eq!(m.take().unwrap(), None);
    for v in [1.0f32, 2.0, 6.0] {
        m.add(&Tensor::from(v)).unwrap();
    }
    assert_eq!(m.count(), 3);
    assert_eq!(m.take().unwrap(), Some(3.0));
    assert_eq!(m.count(), 0);
    m.add(&Tensor::from_slice(&[4.0f32])).unwrap();
    assert_eq!(m.take().unwrap(), Some(4.0));
}
