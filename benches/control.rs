//! Benchmark: K training steps in one graph launch (a WHILE node over a device-resident dataset)
//! against one replay per step. Replays queued back to back already hide the launch, so K steps
//! per launch buy no GPU time by themselves: what they buy is the host. Per model (Adam, fp32,
//! batch from a device dataset of 64 batches, the batch index advanced inside the graph):
//! - GPU time per step: median over blocks of (block time / steps), the device synchronized
//!   around each block of 200 steps, for single replays and for K = 1, 10, 100 steps a launch;
//! - host time per step: the time the host spends in the launch calls (`replay()`), per step.
//!
//! Two more tables say where the WHILE node's cost lies and what the GradScaler's IF node costs:
//! - one WHILE iteration whose body is one small kernel, against the same kernel unrolled in a
//!   plain graph (µs per iteration);
//! - an fp16 step with the GradScaler skipping inf steps by the kernels' flag vs by an IF node
//!   (`skip_with_if_node`), µs per step on clean batches (the common case).
//!
//! `cargo bench --bench control -- [--blocks N]` (or `make bench-control`)

mod reference;

use std::time::Instant;
use tch::{nn, nn::Module, Device, Kind, Tensor};
use tch_cuda_graphs::amp::{Autocast, GradScaler};
use tch_cuda_graphs::control::capture_while;
use tch_cuda_graphs::optim::{Adam, AdamConfig, Optimizer};
use tch_cuda_graphs::{synchronize, CaptureOptions, CudaGraph, Result};

const DATASET: i64 = 64;
const STEPS_PER_BLOCK: usize = 200;

fn mlp(vs: &nn::VarStore, width: i64, layers: usize) -> nn::Sequential {
    let mut s = nn::seq();
    for l in 0..layers {
        s = s.add(nn::linear(vs.root() / format!("l{l}"), width, width, Default::default()));
        if l + 1 < layers {
            s = s.add_fn(|x| x.relu());
        }
    }
    s
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// A graph of `k` training steps (k = 0: one plain step, no WHILE node), each on batch i of the
/// dataset, i advanced modulo the dataset inside the graph.
fn capture_steps(
    device: Device,
    (width, layers, batch): (i64, usize, i64),
    k: i64,
) -> Result<(CudaGraph, nn::VarStore, Vec<Tensor>)> {
    tch::manual_seed(0);
    let vs = nn::VarStore::new(device);
    let model = mlp(&vs, width, layers);
    let mut opt = Adam::new(&vs, AdamConfig::default().lr(1e-4))?;
    let xs = Tensor::randn([DATASET, batch, width], (Kind::Float, device));
    let ys = Tensor::randn([DATASET, batch, width], (Kind::Float, device));
    let mut i = Tensor::zeros([1], (Kind::Int64, device));
    let always = Tensor::ones([], (Kind::Bool, device));
    let step = |i: &mut Tensor, opt: &mut Adam| -> Result<()> {
        let x = xs.f_index_select(0, i)?.f_squeeze_dim(0)?;
        let y = ys.f_index_select(0, i)?.f_squeeze_dim(0)?;
        opt.zero_grad()?;
        model.forward(&x).f_mse_loss(&y, tch::Reduction::Mean)?.f_backward()?;
        opt.step()?;
        let next = i.f_add_scalar(1)?.f_remainder(DATASET)?;
        i.f_copy_(&next)?;
        Ok(())
    };
    for _ in 0..3 {
        step(&mut i, &mut opt)?; // eager warmup: optimizer state, cuBLAS
    }
    synchronize(device)?;
    let mut g = CudaGraph::new()?;
    g.capture(CaptureOptions::default(), || {
        if k == 0 {
            step(&mut i, &mut opt)
        } else {
            let mut i2 = i.shallow_clone();
            capture_while(&always, k, || step(&mut i2, &mut opt)).map(drop)
        }
    })?;
    g.upload()?;
    Ok((g, vs, vec![xs, ys, i, always]))
}

/// (GPU µs per step, host µs per step) of replaying `g`, which runs `per_launch` steps.
fn time(device: Device, g: &mut CudaGraph, per_launch: usize, blocks: usize) -> (f64, f64) {
    let launches = STEPS_PER_BLOCK.div_ceil(per_launch).max(1);
    for _ in 0..launches.min(20) {
        g.replay().unwrap();
    }
    let (mut gpu, mut host) = (Vec::new(), Vec::new());
    for _ in 0..blocks {
        synchronize(device).unwrap();
        let t = Instant::now();
        let mut in_calls = 0f64;
        for _ in 0..launches {
            let c = Instant::now();
            g.replay().unwrap();
            in_calls += c.elapsed().as_secs_f64();
        }
        synchronize(device).unwrap();
        let steps = (launches * per_launch) as f64;
        gpu.push(t.elapsed().as_secs_f64() * 1e6 / steps);
        host.push(in_calls * 1e6 / steps);
    }
    (median(gpu), median(host))
}

/// µs per iteration of a WHILE node over a one-kernel body (`k` iterations per launch), and of
/// the same kernel unrolled `k` times in a plain graph.
fn while_iteration_cost(device: Device, k: i64, blocks: usize) -> Result<(f64, f64)> {
    let mut x = Tensor::zeros([256], (Kind::Float, device));
    let always = Tensor::ones([], (Kind::Bool, device));
    let mut looped = CudaGraph::new()?;
    looped.capture(CaptureOptions::default(), || {
        capture_while(&always, k, || {
            let _ = x.f_add_scalar_(1.0)?;
            Ok(())
        })
        .map(drop)
    })?;
    let mut unrolled = CudaGraph::new()?;
    unrolled.capture(CaptureOptions::default(), || {
        for _ in 0..k {
            let _ = x.f_add_scalar_(1.0)?;
        }
        Ok(())
    })?;
    looped.upload()?;
    unrolled.upload()?;
    let per = |g: &mut CudaGraph| time(device, g, k as usize, blocks).0;
    Ok((per(&mut looped), per(&mut unrolled)))
}

/// µs per captured fp16 step (3 x 256 MLP, b32, Adam, GradScaler), clean batches: the scaler
/// skipping by the kernels' flag, and by an IF node.
fn scaler_step(device: Device, if_node: bool, blocks: usize) -> Result<f64> {
    tch::manual_seed(0);
    let vs = nn::VarStore::new(device);
    let model = mlp(&vs, 256, 3);
    let mut opt = Adam::new(&vs, AdamConfig::default().lr(1e-4))?;
    let mut scaler = GradScaler::new(device)?.skip_with_if_node(if_node);
    let x = Tensor::randn([32, 256], (Kind::Float, device));
    let y = Tensor::randn([32, 256], (Kind::Float, device));
    let mut step = || -> Result<()> {
        opt.zero_grad()?;
        let loss = {
            let _fp16 = Autocast::new(Kind::Half, false)?;
            model.forward(&x).f_mse_loss(&y, tch::Reduction::Mean)?
        };
        scaler.backward(&loss)?;
        scaler.step(&mut opt)?;
        scaler.update()
    };
    for _ in 0..3 {
        step()?;
    }
    synchronize(device)?;
    let mut g = CudaGraph::new()?;
    g.capture(CaptureOptions::default(), &mut step)?;
    g.upload()?;
    Ok(time(device, &mut g, 1, blocks).0)
}

const USAGE: &str = "\
usage: control [--blocks N]

K training steps per graph launch (a WHILE node) against one replay per step, the cost of one
WHILE iteration, and the GradScaler's IF node against its flag.
  --blocks N   timed blocks of 200 steps per figure (default 20)
  -h, --help   this text";

/// The number of timed blocks; `None` when the command line asked for the usage.
fn parse_args() -> std::result::Result<Option<usize>, lexopt::Error> {
    use lexopt::prelude::*;
    let mut blocks = 20usize;
    let mut parser = lexopt::Parser::from_env();
    while let Some(arg) = parser.next()? {
        match arg {
            Long("blocks") => blocks = parser.value()?.parse()?,
            Short('h') | Long("help") => return Ok(None),
            Long("bench") => {} // cargo bench passes --bench
            _ => return Err(arg.unexpected()),
        }
    }
    Ok(Some(blocks.max(1)))
}

fn main() {
    let blocks = reference::args_or_exit("control", parse_args(), USAGE);
    reference::require_cuda("control");
    let device = Device::Cuda(0);
    println!("K training steps per launch (WHILE node) vs one replay per step; Adam, fp32; µs per step");
    println!("| model | single replays GPU | host | K=1 GPU | host | K=10 GPU | host | K=100 GPU | host |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (name, shape) in [("2 x 64, b32", (64, 2, 32)), ("3 x 256, b32", (256, 3, 32)), ("4 x 512, b64", (512, 4, 64))]
    {
        let mut cells = Vec::new();
        for k in [0i64, 1, 10, 100] {
            let (mut g, _vs, _keep) = capture_steps(device, shape, k).expect("capture");
            let (gpu, host) = time(device, &mut g, k.max(1) as usize, blocks);
            cells.push(format!("{gpu:.1} | {host:.2}"));
        }
        println!("| {name} | {} |", cells.join(" | "));
    }
    println!();
    println!("One WHILE iteration over a one-kernel body vs the kernel unrolled in a plain graph; µs per iteration");
    println!("| iterations per launch | WHILE | unrolled | WHILE cost per iteration |");
    println!("|---:|---:|---:|---:|");
    for k in [10i64, 100] {
        let (w, u) = while_iteration_cost(device, k, blocks).expect("while cost");
        println!("| {k} | {w:.2} | {u:.2} | {:.2} |", w - u);
    }
    println!();
    println!("fp16 step (3 x 256 MLP, b32, Adam, GradScaler), clean batches; µs per step");
    let flag = scaler_step(device, false, blocks).expect("scaler step");
    let node = scaler_step(device, true, blocks).expect("scaler step");
    println!("| skip by the kernels' flag | skip by an IF node | IF / flag |");
    println!("|---:|---:|---:|");
    println!("| {flag:.1} | {node:.1} | {:.3} |", node / flag);
}
