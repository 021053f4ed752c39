//! Gradient buckets on one GPU, in a group of one rank (NCCL's average over one rank is the
//! identity, bit for bit): the failure paths of `GradAllReduce`'s hooks and of a capture that
//! forked onto the buckets' side stream, and a graphed step against eager training.

mod common;

use common::{batch, free_port, max_param_diff, mse, twin_mlps};
use std::time::Duration;
use tch_cuda_graphs::dist::{GradAllReduce, ProcessGroup};
use tch_cuda_graphs::optim::{Optimizer, Sgd, SgdConfig};
use tch_cuda_graphs::{synchronize, CaptureOptions, CudaGraph, Error, StepOptions, TrainStep};

const D: i64 = 16;
const H: i64 = 64;
const O: i64 = 4;

fn group() -> ProcessGroup {
    let d = common::cuda();
    ProcessGroup::new_tcp("127.0.0.1", free_port(), 0, 1, d, Duration::from_secs(60)).expect("a group of one rank")
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
