//! Gradient buckets on one GPU, in a group of one rank (NCCL's average over one rank is the
//! identity, bit for bit): the failure paths of `GradAllReduce`'s hooks and of a capture that
//! forked onto the buckets' side stream, and a graphed step against eager training.

mod common;

use common::{batch, free_port, max_param_diff, mse, twin_mlps};
use std::time::Duration;
use tch_cuda_graphs::dist::{BucketConfig, BucketLayout, Collective, Compression, GradAllReduce, ProcessGroup, Wire};
use tch_cuda_graphs::optim::{Optimizer, Sgd, SgdConfig};
use tch_cuda_graphs::{synchronize, CaptureOptions, CudaGraph, Error, StepOptions, TrainStep};

const D: i64 = 16;
const H: i64 = 64;
const O: i64 = 4;

/// A group of one rank on a free port (another port when the one picked is taken before the
/// store binds it: a free port is only free until someone else takes it).
fn group() -> ProcessGroup {
    let d = common::cuda();
    let mut tries = 0;
    loop {
        match ProcessGroup::new_tcp("127.0.0.1", free_port(), 0, 1, d, Duration::from_secs(60)) {
            Ok(pg) => return pg,
            Err(e) if tries < 4 => {
                tries += 1;
                println!("a group of one rank, try {tries}: {e}");
            }
            Err(e) => panic!("a group of one rank: {e}"),
        }
    }
}

fn sgd(vs: &tch::nn::VarStore) -> Sgd {
    Sgd::new(vs, SgdConfig::default().lr(0.05).momentum(0.9)).expect("sgd")
}

/// The largest difference between the gradients of two VarStores (matched by name).
fn max_grad_diff(a: &tch::nn::VarStore, b: &tch::nn::VarStore) -> f64 {
    let vb = b.variables();
    a.variables()
        .iter()
        .map(|(name, t)| f64::try_from((t.grad() - vb[name].grad()).abs().max()).expect("scalar"))
        .fold(0.0, f64::max)
}

#[test]
#[ignore = "needs a CUDA device"]
fn a_second_backward_while_armed_is_refused_and_arm_starts_over() {
    let pg = group();
    let d = pg.device();
    let (vs, model, vs_ref, model_ref) = twin_mlps(d, D, H, O);
    let mut opt = sgd(&vs);
    let mut reduce = GradAllReduce::new(&pg, opt.params(), 4 << 10).expect("buckets");
    assert!(reduce.bucket_count() > 2, "several buckets, got {}", reduce.bucket_count());
    let (x, y) = batch(d, 32, D, O);
    reduce.arm().expect("arm");
    mse(&model, &x, &y).f_backward().expect("first backward");
    let second = mse(&model, &x, &y).f_backward();
    println!("a second backward while armed: {second:?}");
    assert!(second.is_err(), "a gradient arriving twice while armed must be refused");
    // a second GradAllReduce over the same parameters is refused too
    let again = GradAllReduce::new(&pg, opt.params(), 4 << 10);
    assert!(matches!(again, Err(Error::Misuse(_))), "{again:?}");
    // arm() forgets the broken round: the next step reduces like a plain backward
    opt.zero_grad().expect("zero");
    reduce.backward(&mse(&model, &x, &y)).expect("armed backward after the failure");
    mse(&model_ref, &x, &y).backward();
    synchronize(d).expect("sync");
    let diff = max_grad_diff(&vs, &vs_ref);
    println!("gradients after arm + backward + all_reduce vs a plain backward: max difference {diff:e}");
    assert_eq!(diff, 0.0);
}

#[test]
#[ignore = "needs a CUDA device"]
fn a_capture_that_fails_after_the_fork_leaves_the_buckets_and_the_process_usable() {
    let pg = group();
    let d = pg.device();
    let (vs, model, vs_ref, model_ref) = twin_mlps(d, D, H, O);
    let mut opt = sgd(&vs);
    let mut opt_ref = sgd(&vs_ref);
    let mut reduce = GradAllReduce::new(&pg, opt.params(), 4 << 10).expect("buckets");
    let (x, y) = batch(d, 32, D, O);
    // first steps eager (SGD's momentum buffers, NCCL's communicator), on both models
    let eager_step = |reduce: &mut GradAllReduce, opt: &mut Sgd| {
        opt.zero_grad().expect("zero");
        reduce.backward(&mse(&model, &x, &y)).expect("backward");
        opt.step().expect("step");
    };
    for _ in 0..3 {
        eager_step(&mut reduce, &mut opt);
        opt_ref.zero_grad().expect("zero");
        mse(&model_ref, &x, &y).backward();
        opt_ref.step().expect("step");
    }
    // a capture that forks onto the side stream (armed backward) and fails before the join
    let mut g = CudaGraph::new().expect("graph");
    let failed = g.capture(CaptureOptions::default().device(d), || {
        opt.zero_grad()?;
        reduce.arm()?;
        mse(&model, &x, &y).f_backward()?;
        Err::<(), _>(Error::Misuse("stop before the join".into()))
    });
    println!("capture failing after the fork: {failed:?}");
    assert!(failed.is_err() && !g.is_captured());
    // eager work goes on, on the buckets too
    eager_step(&mut reduce, &mut opt);
    opt_ref.zero_grad().expect("zero");
    mse(&model_ref, &x, &y).backward();
    opt_ref.step().expect("step");
    synchronize(d).expect("sync after the failed capture");
    // and a graphed step with the same buckets trains exactly like eager training
    let mut step = TrainStep::new(&[("x", &x), ("y", &y)], StepOptions::default(), move |inp| {
        opt.zero_grad()?;
        let loss = mse(&model, &inp[0], &inp[1]);
        reduce.backward(&loss)?;
        opt.step()?;
        Ok(vec![loss.detach()])
    })
    .expect("step");
    for _ in 0..20 {
        step.run(&[&x, &y]).expect("run");
        opt_ref.zero_grad().expect("zero");
        mse(&model_ref, &x, &y).backward();
        opt_ref.step().expect("step");
    }
    synchronize(d).expect("sync");
    assert_eq!(step.graph_count(), 1);
    let diff = max_param_diff(&vs, &vs_ref);
    println!("after a failed capture: 24 steps (20 graphed, buckets armed) vs eager: max |param diff| = {diff:e}");
    assert_eq!(diff, 0.0);
}

/// Gradients as views into the buckets (`views(true)`): each `.grad` keeps its storage across
/// zero_grad, the optimizer, a checkpoint save and load, and graphed replays; 20 graphed Adam
/// steps equal the packed layout (`views(false)`) and eager training without buckets bit for
/// bit. bf16 compression: the gradients come back as their bf16 roundings (average over one
/// rank), and a compressed bucket set over non-float32 parameters is refused.
#[test]
#[ignore = "needs a CUDA device"]
fn gradients_as_bucket_views_stay_views_and_train_like_the_packed_layout() {
    use std::sync::{Arc, Mutex};
    use tch::Kind;
    use tch_cuda_graphs::checkpoint;
    use tch_cuda_graphs::optim::{Adam, AdamConfig};
    let (pg_v, pg_p) = (group(), group());
    let d = pg_v.device();
    let (vs_v, model_v, vs_e, model_e) = twin_mlps(d, D, H, O);
    let mut vs_p = tch::nn::VarStore::new(d);
    let model_p = common::mlp(vs_p.root(), D, H, O);
    vs_p.copy(&vs_v).expect("copy weights");
    let adam = |vs: &tch::nn::VarStore| Adam::new(vs, AdamConfig::adamw().lr(1e-3)).expect("adam");
    let opt_v = Arc::new(Mutex::new(adam(&vs_v)));
    let mut opt_p = adam(&vs_p);
    let mut opt_e = adam(&vs_e);
    let params: Vec<tch::Tensor> = opt_v.lock().unwrap().params().iter().map(tch::Tensor::shallow_clone).collect();
    let config = BucketConfig { bucket_bytes: 4 << 10, ..Default::default() };
    let views_config = BucketConfig { layout: BucketLayout::Views(Wire::default()), ..config };
    let mut reduce_v = GradAllReduce::with_config(&pg_v, &params, views_config).expect("views");
    let mut reduce_p = GradAllReduce::with_config(&pg_p, opt_p.params(), config).expect("packed");
    let ptrs = |ps: &[tch::Tensor]| -> Vec<usize> { ps.iter().map(|p| p.grad().data_ptr() as usize).collect() };
    let views = ptrs(&params);
    assert!(params.iter().all(|p| p.grad().defined()), "each parameter's grad is a view from the start");
    assert!(views.iter().all(|&a| a % 16 == 0), "views start 16-byte aligned");
    let (x, y) = batch(d, 32, D, O);
    let ov = opt_v.clone();
    let mut step_v = TrainStep::new(&[("x", &x), ("y", &y)], StepOptions::default(), move |inp| {
        let mut opt = ov.lock().unwrap();
        opt.zero_grad()?;
        let loss = mse(&model_v, &inp[0], &inp[1]);
        reduce_v.backward(&loss)?;
        opt.step()?;
        Ok(vec![loss.detach()])
    })
    .expect("step");
    let mut step_p = TrainStep::new(&[("x", &x), ("y", &y)], StepOptions::default(), move |inp| {
        opt_p.zero_grad()?;
        let loss = mse(&model_p, &inp[0], &inp[1]);
        reduce_p.backward(&loss)?;
        opt_p.step()?;
        Ok(vec![loss.detach()])
    })
    .expect("step");
    let ckpt = std::env::temp_dir().join(format!("tcg-views-{}.safetensors", std::process::id()));
    for i in 0..20 {
        let (xb, yb) = batch(d, 32, D, O);
        step_v.run(&[&xb, &yb]).expect("run views");
        step_p.run(&[&xb, &yb]).expect("run packed");
        opt_e.zero_grad().expect("zero");
        mse(&model_e, &xb, &yb).backward();
        opt_e.step().expect("step");
        if i == 10 {
            synchronize(d).expect("sync");
            checkpoint::save(&ckpt, &vs_v, &*opt_v.lock().unwrap(), &[]).expect("save");
            checkpoint::load(&ckpt, &vs_v, &mut *opt_v.lock().unwrap()).expect("load");
            let _ = std::fs::remove_file(&ckpt);
        }
    }
    synchronize(d).expect("sync");
    assert_eq!((step_v.graph_count(), step_p.graph_count()), (1, 1));
    assert_eq!(ptrs(&params), views, "the grads are still the bucket views after 20 graphed steps and a load");
    let (packed, eager) = (max_param_diff(&vs_v, &vs_p), max_param_diff(&vs_v, &vs_e));
    println!(
        "20 graphed Adam steps, {} gradients as bucket views (checkpoint save + load at step 10): max |param diff| vs \
         packed buckets {packed:e}, vs eager without buckets {eager:e}",
        params.len()
    );
    assert_eq!((packed, eager), (0.0, 0.0));

    // bf16 compression: one backward, the grads are the bf16 roundings of the plain grads
    let pg_c = group();
    let (vs_c, model_c, vs_r, model_r) = twin_mlps(d, D, H, O);
    let opt_c = sgd(&vs_c);
    let bf16 = Wire { compression: Compression::BFloat16, ..Default::default() };
    let bf16_config = BucketConfig { layout: BucketLayout::Packed(bf16), ..config };
    let mut reduce_c = GradAllReduce::with_config(&pg_c, opt_c.params(), bf16_config).expect("compressed");
    reduce_c.backward(&mse(&model_c, &x, &y)).expect("backward");
    mse(&model_r, &x, &y).backward();
    let vr = vs_r.variables();
    let diff = vs_c
        .variables()
        .iter()
        .map(|(n, t)| {
            let want = vr[n].grad().to_kind(Kind::BFloat16).to_kind(Kind::Float);
            f64::try_from((t.grad() - want).abs().max()).expect("scalar")
        })
        .fold(0.0, f64::max);
    println!("bf16-compressed all-reduce over one rank: max |grad - bf16(plain grad)| = {diff:e}");
    assert_eq!(diff, 0.0);
    let vs_h = tch::nn::VarStore::new(d);
    let _m = common::mlp(vs_h.root(), D, H, O);
    let mut vs_h = vs_h;
    vs_h.half();
    let half = GradAllReduce::with_config(&pg_c, &vs_h.trainable_variables(), bf16_config);
    assert!(matches!(half, Err(Error::Misuse(_))), "{half:?}");
}

/// `backward_and_step` refuses parameters its optimizer does not hold before any work, and
/// otherwise trains like backward + step, bit for bit, graphed and eager. (Bucket options
/// that do not combine cannot be written: `BucketLayout::Grouped` takes no `Wire`; the shim's
/// own check of raw options is tested on the CPU, `src/dist/data_parallel.rs`.)
#[test]
#[ignore = "needs a CUDA device"]
fn a_foreign_optimizer_refused_and_a_step_per_bucket() {
    let pg = group();
    let d = pg.device();
    let (vs, model, vs_ref, model_ref) = twin_mlps(d, D, H, O);
    let opt = sgd(&vs);
    let base = BucketConfig { bucket_bytes: 4 << 10, layout: BucketLayout::Grouped, ..Default::default() };
    // an optimizer over other parameters: refused before backward runs
    let other = tch::nn::VarStore::new(d);
    let _w = other.root().randn("w", &[4], 0.0, 1.0);
    let mut other_opt = sgd(&other);
    let mut reduce = GradAllReduce::with_config(&pg, opt.params(), base).expect("grouped buckets");
    let (x, y) = batch(d, 32, D, O);
    let r = reduce.backward_and_step(&mse(&model, &x, &y), &mut other_opt);
    assert!(matches!(r, Err(Error::Misuse(_))), "{r:?}");
    assert!(vs.trainable_variables().iter().all(|p| !p.grad().defined()), "no backward ran");
    // graphed steps per bucket against eager backward + step without buckets
    let mut opt_ref = sgd(&vs_ref);
    let mut opt = opt;
    let (x0, y0) = (x.zeros_like(), y.zeros_like());
    let mut step = TrainStep::new(&[("x", &x0), ("y", &y0)], StepOptions::default(), move |inp| {
        opt.zero_grad()?;
        let loss = mse(&model, &inp[0], &inp[1]);
        reduce.backward_and_step(&loss, &mut opt)?;
        Ok(vec![loss.detach()])
    })
    .expect("step");
    for _ in 0..12 {
        let (xb, yb) = batch(d, 32, D, O);
        step.run(&[&xb, &yb]).expect("run");
        opt_ref.zero_grad().expect("zero");
        mse(&model_ref, &xb, &yb).backward();
        opt_ref.step().expect("step");
    }
    synchronize(d).expect("sync");
    let diff = max_param_diff(&vs, &vs_ref);
    println!("12 graphed steps, grouped buckets, a step per bucket, vs eager without buckets: max difference {diff:e}");
    assert_eq!(step.graph_count(), 1);
    assert_eq!(diff, 0.0);
}

/// Every bucket layout (each its own reduction strategy in the shim) over one rank, where the
/// average is the identity: packed, views, grouped and reduce-scatter + all-gather give the
/// gradients of a plain backward bit for bit, bf16 compression within bf16's rounding.
#[test]
#[ignore = "needs a CUDA device"]
fn every_layout_reduces_like_a_plain_backward_over_one_rank() {
    let pg = group();
    let d = pg.device();
    let rs = Wire { collective: Collective::ReduceScatterAllGather, ..Default::default() };
    let bf16 = Wire { compression: Compression::BFloat16, ..Default::default() };
    let layouts = [
        ("packed", BucketLayout::default(), 0.0),
        ("views", BucketLayout::Views(Wire::default()), 0.0),
        ("grouped", BucketLayout::Grouped, 0.0),
        ("packed, reduce-scatter + all-gather", BucketLayout::Packed(rs), 0.0),
        ("views, reduce-scatter + all-gather", BucketLayout::Views(rs), 0.0),
        ("packed, bf16", BucketLayout::Packed(bf16), 1.0 / 128.0),
    ];
    for (name, layout, tolerance) in layouts {
        let config = BucketConfig { bucket_bytes: 4 << 10, layout, ..Default::default() };
        let (vs, model, vs_ref, model_ref) = twin_mlps(d, D, H, O);
        let mut opt = sgd(&vs);
        let mut reduce = GradAllReduce::with_config(&pg, opt.params(), config).expect("buckets");
        let (x, y) = batch(d, 32, D, O);
        for step in 0..3 {
            // a fresh backward each step (the crate's zero_grad), reduced in buckets
            opt.zero_grad().expect("zero");
            reduce.backward(&mse(&model, &x, &y)).expect("armed backward");
            vs_ref.variables().values().for_each(|t| {
                let mut g = t.grad();
                if g.defined() {
                    let _ = g.zero_();
                }
            });
            mse(&model_ref, &x, &y).backward();
            synchronize(d).expect("sync");
            let (diff, scale) = (max_grad_diff(&vs, &vs_ref), max_grad(&vs_ref));
            println!(
                "{name}, step {step}: {} buckets, max gradient difference {diff:e} (largest gradient {scale:e})",
                reduce.bucket_count()
            );
            assert!(
                diff <= tolerance * scale,
                "{name}: gradients differ by {diff:e} (allowed {:e})",
                tolerance * scale
            );
        }
    }
}

/// The largest gradient magnitude of a VarStore.
fn max_grad(vs: &tch::nn::VarStore) -> f64 {
    vs.variables().values().map(|t| f64::try_from(t.grad().abs().max()).expect("scalar")).fold(0.0, f64::max)
}
