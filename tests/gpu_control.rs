//! Conditional IF and WHILE nodes inside captures: device decisions at replay, the iteration
//! count and limit, an optimizer step skipped bit-identically, K training steps in one launch
//! equal to K single steps, and the failure paths.

mod common;

use common::{cuda, max_param_diff, mse, twin_mlps};
use std::panic::{catch_unwind, AssertUnwindSafe};
use tch::{Device, Kind, Tensor};
use tch_cuda_graphs::control::{capture_if, capture_unless, capture_while};
use tch_cuda_graphs::optim::{Adam, AdamConfig, Optimizer};
use tch_cuda_graphs::{empty_cache, memory_stats, synchronize, CaptureOptions, CudaGraph, Error};

fn value(t: &Tensor) -> f64 {
    f64::try_from(t.to_kind(Kind::Double).sum(Kind::Double)).unwrap()
}

#[test]
#[ignore = "needs a CUDA device"]
fn an_if_node_runs_its_body_only_when_the_device_condition_holds() {
    let d = cuda();
    let mut x = Tensor::zeros([16], (Kind::Float, d));
    let mut flag = Tensor::ones([], (Kind::Bool, d));
    let mut g = CudaGraph::new().unwrap();
    let y = g
        .capture(CaptureOptions::default(), || {
            capture_if(&flag, || {
                let _ = x.f_add_scalar_(1.0)?;
                Ok(())
            })?;
            Ok(x.f_mul_scalar(2.0)?)
        })
        .unwrap();
    let mut seen = Vec::new();
    for f in [true, false, true, true, false] {
        let _ = flag.fill_(i64::from(f));
        g.replay().unwrap();
        seen.push((value(&x) / 16.0, value(&y) / 16.0));
    }
    println!("IF node, flags 1 0 1 1 0: (x, y) per replay {seen:?}");
    assert_eq!(seen, vec![(1.0, 2.0), (1.0, 2.0), (2.0, 4.0), (3.0, 6.0), (3.0, 6.0)]);
}

/// `capture_unless` runs its body when the condition is zero; a graph holding a conditional
/// node, captured again, is updated in place or refused (CUDA's docs allow no change of a
/// conditional node's parameters; driver 580 updates it), and the graph that replays afterwards
/// does the right work either way.
#[test]
#[ignore = "needs a CUDA device"]
fn an_unless_node_runs_on_zero_and_graphs_with_conditionals_update_or_are_refused() {
    let d = cuda();
    let mut x = Tensor::zeros([16], (Kind::Float, d));
    let mut x2 = Tensor::zeros([16], (Kind::Float, d));
    let mut found = Tensor::zeros([], (Kind::Float, d));
    let capture = |g: &mut CudaGraph, t: &mut Tensor, found: &Tensor| {
        g.capture(CaptureOptions::default(), || {
            capture_unless(found, || {
                let _ = t.f_add_scalar_(1.0)?;
                Ok(())
            })
        })
        .unwrap()
    };
    let mut g = CudaGraph::new().unwrap();
    capture(&mut g, &mut x, &found);
    let mut seen = Vec::new();
    for f in [0.0, 1.0, 0.0, f64::NAN] {
        let _ = found.fill_(f);
        g.replay().unwrap();
        seen.push(value(&x) / 16.0);
    }
    println!("UNLESS node, found 0 1 0 NaN: x per replay {seen:?}");
    assert_eq!(seen, vec![1.0, 1.0, 2.0, 2.0], "runs on zero only (NaN is non-zero)");
    let mut next = CudaGraph::with_keep_graph(true).unwrap();
    capture(&mut next, &mut x2, &found);
    let updated = g.update_from(&mut next).unwrap();
    let _ = found.fill_(0.0);
    let target = if updated { &mut g } else { &mut next };
    target.replay().unwrap();
    let (a, b) = (value(&x) / 16.0, value(&x2) / 16.0);
    println!("a graph with a conditional node, captured again on other tensors: updated in place {updated}; after one replay x {a}, x2 {b}");
    assert_eq!((a, b), (2.0, 1.0), "the replayed graph works on the new capture's tensors");
}

#[test]
#[ignore = "needs a CUDA device"]
fn a_while_node_loops_until_its_condition_clears_and_stops_at_its_maximum() {
    let d = cuda();
    let mut x = Tensor::ones([8], (Kind::Float, d));
    let mut i = Tensor::zeros([], (Kind::Int64, d));
    let mut more = Tensor::ones([], (Kind::Bool, d));
    let mut limit = Tensor::full([], 7, (Kind::Int64, d));
    let mut more_w = more.shallow_clone(); // the body writes the condition
    let mut g = CudaGraph::new().unwrap();
    let lp = g
        .capture(CaptureOptions::default(), || {
            let _ = i.f_zero_()?;
            let _ = more.f_fill_(1)?;
            capture_while(&more, 100, || {
                let _ = x.f_mul_scalar_(2.0)?;
                let _ = i.f_add_scalar_(1)?;
                more_w.f_copy_(&i.f_lt_tensor(&limit)?)?;
                Ok(())
            })
        })
        .unwrap();
    for round in 1..=2 {
        g.replay().unwrap();
        let (n, hit) = (i64::try_from(lp.iterations()).unwrap(), i64::try_from(lp.hit_limit()).unwrap());
        println!("WHILE node, round {round}: {n} iterations, limit hit {hit}, x = {}", value(&x) / 8.0);
        assert_eq!((n, hit), (7, 0));
        assert_eq!(value(&x) / 8.0, 2f64.powi(7 * round));
    }
    // a condition that never clears: stopped at the maximum, and said so
    let _ = limit.fill_(1000);
    let _ = x.fill_(1.0);
    g.replay().unwrap();
    let (n, hit) = (i64::try_from(lp.iterations()).unwrap(), i64::try_from(lp.hit_limit()).unwrap());
    println!("WHILE node whose condition holds past 100: {n} iterations, limit hit {hit}");
    assert_eq!((n, hit), (100, 1));
    assert_eq!(value(&x) / 8.0, 2f64.powi(100));
}

/// The GradScaler case: an optimizer step behind an IF node. Skipped, parameters and optimizer
/// state are bit-identical to before; taken, they equal an eager step.
#[test]
#[ignore = "needs a CUDA device"]
fn an_optimizer_step_behind_an_if_node_is_skipped_bit_identically() {
    let d = cuda();
    tch::manual_seed(21);
    let (vs, model, vs_e, model_e) = twin_mlps(d, 16, 64, 4);
    let mut opt = Adam::new(&vs, AdamConfig::default().lr(1e-2)).unwrap();
    let mut opt_e = Adam::new(&vs_e, AdamConfig::default().lr(1e-2)).unwrap();
    let (mut x, mut y) = (Tensor::zeros([32, 16], (Kind::Float, d)), Tensor::zeros([32, 4], (Kind::Float, d)));
    let mut take = Tensor::ones([], (Kind::Bool, d));
    // one eager step first (optimizer state exists; nothing lazy in the capture)
    for (o, m) in [(&mut opt, &model), (&mut opt_e, &model_e)] {
        o.zero_grad().unwrap();
        mse(m, &x, &y).backward();
        o.step().unwrap();
    }
    let mut g = CudaGraph::new().unwrap();
    g.capture(CaptureOptions::default(), || {
        opt.zero_grad()?;
        mse(&model, &x, &y).f_backward()?;
        capture_if(&take, || opt.step())
    })
    .unwrap();
    let state = |o: &Adam| -> Vec<Tensor> { o.state().unwrap().into_iter().map(|(_, t)| t.copy()).collect() };
    for k in 0..6 {
        let (bx, by) = common::batch(d, 32, 16, 4);
        x.copy_(&bx);
        y.copy_(&by);
        let taken = k % 3 != 1;
        let _ = take.fill_(i64::from(taken));
        let before = state(&opt);
        g.replay().unwrap();
        if taken {
            opt_e.zero_grad().unwrap();
            mse(&model_e, &bx, &by).backward();
            opt_e.step().unwrap();
        } else {
            let after = state(&opt);
            let moved = before.iter().zip(&after).map(|(a, b)| value(&(a - b).abs())).fold(0.0, f64::max);
            println!("step {k} skipped: parameters and optimizer state moved by {moved:e}");
            assert_eq!(moved, 0.0);
        }
        synchronize(d).unwrap();
        let diff = max_param_diff(&vs, &vs_e);
        assert_eq!(diff, 0.0, "step {k} (taken: {taken}): {diff:e}");
    }
    println!("6 replays, steps 1 and 4 skipped: parameters equal to the eager twin that took the other steps");
}

/// Twin MLPs 16 → 64 → 4 with Adam, and a dataset of `n` batches of `batch` on the device; each
/// twin has taken one eager step on batch 0 (optimizer state and gradients exist).
struct Twins {
    vs: tch::nn::VarStore,
    model: tch::nn::Sequential,
    opt: Adam,
    vs_e: tch::nn::VarStore,
    model_e: tch::nn::Sequential,
    opt_e: Adam,
    xs: Tensor,
    ys: Tensor,
}

fn stepped_twins(seed: i64, n: i64, batch: i64) -> Twins {
    let d = cuda();
    tch::manual_seed(seed);
    let (vs, model, vs_e, model_e) = twin_mlps(d, 16, 64, 4);
    let xs = Tensor::randn([n, batch, 16], (Kind::Float, d));
    let ys = Tensor::randn([n, batch, 4], (Kind::Float, d));
    let mut opt = Adam::new(&vs, AdamConfig::default().lr(1e-3)).unwrap();
    let mut opt_e = Adam::new(&vs_e, AdamConfig::default().lr(1e-3)).unwrap();
    for (o, m) in [(&mut opt, &model), (&mut opt_e, &model_e)] {
        o.zero_grad().unwrap();
        mse(m, &xs.get(0), &ys.get(0)).backward();
        o.step().unwrap();
    }
    Twins { vs, model, opt, vs_e, model_e, opt_e, xs, ys }
}

/// A WHILE loop's state on the device: the batch index `i`, the condition `more`, and a second
/// handle of `more` for the body to write (the node borrows the first).
fn loop_state(d: Device) -> (Tensor, Tensor, Tensor) {
    let i = Tensor::zeros([1], (Kind::Int64, d));
    let more = Tensor::ones([], (Kind::Bool, d));
    let more_w = more.shallow_clone();
    (i, more, more_w)
}

/// K training steps in one launch: a WHILE node whose body takes batch i of a device-resident
/// dataset, trains on it and moves on, stopping early when the loss falls below a bound.
#[test]
#[ignore = "needs a CUDA device"]
fn k_training_steps_in_one_launch_equal_k_single_steps() {
    let d = cuda();
    let k = 10i64;
    let Twins { vs, model, mut opt, vs_e, model_e, mut opt_e, xs, ys } = stepped_twins(22, k, 32);
    let (mut i, mut more, mut more_w) = loop_state(d);
    let bound = Tensor::full([], -1.0, (Kind::Float, d)); // loss never below: all K steps
    let mut last_loss = Tensor::zeros([], (Kind::Float, d));
    let mut g = CudaGraph::new().unwrap();
    let lp = g
        .capture(CaptureOptions::default(), || {
            let _ = i.f_zero_()?;
            let _ = more.f_fill_(1)?;
            capture_while(&more, k, || {
                let x = xs.f_index_select(0, &i)?.f_squeeze_dim(0)?;
                let y = ys.f_index_select(0, &i)?.f_squeeze_dim(0)?;
                opt.zero_grad()?;
                let loss = mse(&model, &x, &y);
                loss.f_backward()?;
                opt.step()?;
                last_loss.f_copy_(&loss.detach())?;
                let _ = i.f_add_scalar_(1)?;
                more_w.f_copy_(&i.f_lt(k)?.f_squeeze()?.f_logical_and(&loss.f_gt_tensor(&bound)?)?)?;
                Ok(())
            })
        })
        .unwrap();
    g.replay().unwrap();
    for b in 0..k {
        opt_e.zero_grad().unwrap();
        mse(&model_e, &xs.get(b), &ys.get(b)).backward();
        opt_e.step().unwrap();
    }
    synchronize(d).unwrap();
    let n = i64::try_from(lp.iterations()).unwrap();
    let diff = max_param_diff(&vs, &vs_e);
    println!("{n} training steps in one launch vs {k} eager steps: max parameter difference {diff:e}");
    assert_eq!((n, diff), (k, 0.0));
    assert!(value(&last_loss).is_finite());
}

/// Failures: outside a capture, a CPU condition, an error and a panic inside a body. Each is a
/// clear error (the panic resumes), the enclosing capture is torn down, memory is back, and the
/// process captures again.
#[test]
#[ignore = "needs a CUDA device"]
fn conditional_failures_leave_the_process_usable() {
    let d = cuda();
    let flag = Tensor::ones([], (Kind::Bool, d));
    let e = capture_if(&flag, || Ok(())).expect_err("outside a capture");
    println!("outside a capture: {e}");
    assert!(matches!(e, Error::Misuse(_)), "{e:?}");
    let mut x = Tensor::zeros([16], (Kind::Float, d));
    let _ = x.f_add_scalar_(1.0).unwrap();
    synchronize(d).unwrap();
    empty_cache().unwrap();
    let start = memory_stats(d).unwrap();
    {
        let mut g = CudaGraph::new().unwrap();
        let cpu = Tensor::ones([], (Kind::Bool, Device::Cpu));
        let e = g.capture(CaptureOptions::default(), || capture_if(&cpu, || Ok(()))).expect_err("a CPU condition");
        println!("a CPU condition: {e}");
        assert!(matches!(e, Error::Misuse(_)), "{e:?}");
        let e = g
            .capture(CaptureOptions::default(), || {
                capture_if(&flag, || {
                    let _ = x.f_add_scalar_(1.0)?;
                    Err(Error::user(std::io::Error::other("the body failed")))
                })
            })
            .expect_err("an error in the body");
        println!("an error in the body: {e}");
        assert!(matches!(e, Error::User(_)), "{e:?}");
        let panicked = catch_unwind(AssertUnwindSafe(|| {
            g.capture(CaptureOptions::default(), || capture_while(&flag, 3, || panic!("the body panicked")))
        }));
        assert!(panicked.is_err(), "the panic resumes");
        assert!(!g.is_captured());
    }
    synchronize(d).unwrap();
    empty_cache().unwrap();
    let end = memory_stats(d).unwrap();
    println!("allocated {} -> {}, reserved {} -> {}", start.allocated, end.allocated, start.reserved, end.reserved);
    assert_eq!((end.allocated, end.reserved), (start.allocated, start.reserved), "memory back where it was");
    let mut g = CudaGraph::new().unwrap();
    g.capture(CaptureOptions::default(), || {
        capture_if(&flag, || {
            let _ = x.f_add_scalar_(1.0)?;
            Ok(())
        })
    })
    .unwrap();
    g.replay().unwrap();
    assert_eq!(value(&x) / 16.0, 2.0, "captures and replays after the failures");
}

/// Gradient accumulation as a loop in one graph: a WHILE node runs M micro-batches (forward and
/// backward, the gradients accumulating in place), then the optimizer steps once. Equal to M
/// eager backwards and one step, bit for bit; and a loop stopped early by a device flag (a
/// NaN-guard style stop after 2 micro-batches) reports how far it got.
#[test]
#[ignore = "needs a CUDA device"]
fn gradient_accumulation_as_a_loop_in_one_graph_equals_eager_accumulation() {
    let d = cuda();
    let m = 4i64;
    let Twins { vs, model, mut opt, vs_e, model_e, mut opt_e, xs, ys } = stepped_twins(23, m, 8);
    let (mut i, mut more, mut more_w) = loop_state(d);
    let mut stop_after = Tensor::full([], m, (Kind::Int64, d));
    let mut g = CudaGraph::new().unwrap();
    let lp = g
        .capture(CaptureOptions::default(), || {
            opt.zero_grad_in_place()?;
            let _ = i.f_zero_()?;
            let _ = more.f_fill_(1)?;
            let lp = capture_while(&more, m, || {
                let x = xs.f_index_select(0, &i)?.f_squeeze_dim(0)?;
                let y = ys.f_index_select(0, &i)?.f_squeeze_dim(0)?;
                mse(&model, &x, &y).f_backward()?;
                let _ = i.f_add_scalar_(1)?;
                more_w.f_copy_(&i.f_lt_tensor(&stop_after)?.f_squeeze()?)?;
                Ok(())
            })?;
            opt.step()?;
            Ok(lp)
        })
        .unwrap();
    for (round, micro) in [(0, m), (1, 2)] {
        let _ = stop_after.fill_(micro);
        g.replay().unwrap();
        opt_e.zero_grad_in_place().unwrap();
        for b in 0..micro {
            mse(&model_e, &xs.get(b), &ys.get(b)).backward();
        }
        opt_e.step().unwrap();
        synchronize(d).unwrap();
        let n = i64::try_from(lp.iterations()).unwrap();
        let diff = max_param_diff(&vs, &vs_e);
        println!("round {round}: {n} micro-batches accumulated in one launch, then a step: max parameter difference vs eager {diff:e}");
        assert_eq!((n, diff), (micro, 0.0));
    }
}
