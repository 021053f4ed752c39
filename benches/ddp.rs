//! Weak-scaling benchmark (issue 10): the captured data-parallel step of the three benchmark
//! models (per-rank batch fixed, Adam), gradients averaged with `GradAllReduce` inside the
//! graph, on 1 and 2 GPUs; run under torchrun beside `benches/torch_ddp.py` (PyTorch's captured
//! step with a flat all-reduce after backward).
//!
//! `torchrun --nproc_per_node=N --no-python target/release/deps/ddp-*` (the GPU runner:
//! `bash .gpu/run bench ddp` under torchrun). Rank 0 prints `ROW,<variant>,<model>,<world>,<µs>`
//! (the slowest rank's median). With one rank there is no all-reduce: the 1-GPU figure is the
//! plain captured step. Variants on several ranks: `ours` (one bucket, all-reduced after
//! backward, like the reference) and `ours_overlap_<KiB>` (buckets of that size, each
//! all-reduced as soon as backward has produced its gradients; sizes from `TCG_DDP_OVERLAP_KIB`,
//! comma-separated, default 4096,12300,25600). `TCG_DDP_MODELS` (comma-separated names)
//! limits the models.

mod models;

use models::{batch, Model, ModelKind};
use std::time::{Duration, Instant};
use tch::{nn, Device, Tensor};
use tch_cuda_graphs::dist::{broadcast_parameters, GradAllReduce, ProcessGroup, ReduceOp};
use tch_cuda_graphs::optim::{Adam, AdamConfig, Optimizer};
use tch_cuda_graphs::{synchronize, StepOptions, TrainStep};

const BLOCK: usize = 50;
const WARMUP: usize = 20;
const STEPS: usize = 1000;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// How the gradients are averaged: one bucket after backward, or overlapped buckets.
#[derive(Clone, Copy)]
enum Variant {
    After,
    Overlap(usize),
}

impl Variant {
    fn name(self) -> String {
        match self {
            Variant::After => "ours".into(),
            Variant::Overlap(bytes) => format!("ours_overlap_{}", bytes >> 10),
        }
    }
}

/// The slowest rank's median µs per captured step of `kind` with `variant`.
fn measure(pg: &ProcessGroup, kind: ModelKind, variant: Variant) -> f64 {
    let (rank, world, device) = (pg.rank(), pg.world_size(), pg.device());
    tch::manual_seed(0);
    let vs = nn::VarStore::new(device);
    let model = Model::new(kind, &vs);
    broadcast_parameters(pg, &vs).expect("same model");
    let mut opt = Adam::new(&vs, AdamConfig::default().lr(1e-3)).expect("adam");
    let (bucket, overlap) = match variant {
        Variant::After => (usize::MAX, false),
        Variant::Overlap(bytes) => (bytes, true),
    };
    let mut reduce =
        if world > 1 { Some(GradAllReduce::new(pg, opt.params(), bucket).expect("buckets")) } else { None };
    tch::manual_seed(1 + rank as i64);
    let batches: Vec<(Tensor, Tensor)> = (0..8).map(|_| batch(kind, device)).collect();
    let mut step = TrainStep::new(&[("x", &batches[0].0), ("y", &batches[0].1)], StepOptions::default(), move |inp| {
        opt.zero_grad()?;
        let loss = model.loss(&inp[0], &inp[1]);
        match &mut reduce {
            Some(r) if overlap => r.backward(&loss)?,
            Some(r) => {
                loss.f_backward()?;
                r.all_reduce()?;
            }
            None => loss.f_backward()?,
        }
        opt.step()?;
        Ok(vec![loss.detach()])
    })
    .expect("step");
    let mut run = |i: usize| {
        let (x, y) = &batches[i % 8];
        step.run(&[x, y]).expect("run");
    };
    for i in 0..WARMUP {
        run(i);
    }
    let mut per = Vec::new();
    let mut i = 0;
    for _ in 0..STEPS / BLOCK {
        synchronize(device).expect("sync");
        let t = Instant::now();
        for _ in 0..BLOCK {
            run(i);
            i += 1;
        }
        synchronize(device).expect("sync");
        per.push(t.elapsed().as_secs_f64() * 1e6 / BLOCK as f64);
    }
    let us = median(per);
    let mut all = vec![0f64; world];
    all[rank] = us;
    let all_t = Tensor::from_slice(&all).to_device(device);
    pg.all_reduce(&all_t, ReduceOp::Sum).expect("all-reduce");
    Vec::<f64>::try_from(all_t.to_device(Device::Cpu)).expect("values").into_iter().fold(0f64, f64::max)
}

const USAGE: &str = "\
usage: torchrun --nproc_per_node=N --no-python ddp

Weak scaling of the captured data-parallel step, 1 to N GPUs; rank 0 prints
ROW,<variant>,<model>,<world>,<us>. Environment:
  TCG_DDP_OVERLAP_KIB   bucket sizes of the overlapped variants (default 4096,12300,25600)
  TCG_DDP_MODELS        the models to run (comma-separated; default all)
  -h, --help            this text";

/// Whether to run: false when the command line asked for the usage or this binary was started
/// as a test (cargo test --benches, the GPU runner).
fn parse_args() -> Result<bool, lexopt::Error> {
    use lexopt::prelude::*;
    // torchrun may pass the `--` that separates its own arguments on to the program
    let mut parser = lexopt::Parser::from_iter(std::env::args_os().filter(|a| a != "--"));
    while let Some(arg) = parser.next()? {
        match arg {
            Short('h') | Long("help") => {
                println!("{USAGE}");
                return Ok(false);
            }
            Long("bench") => {} // cargo bench passes --bench
            Long("include-ignored") | Long("nocapture") => {
                println!("bench ddp: run it under torchrun (see the file's docs)");
                return Ok(false);
            }
            Long("test-threads") => {
                let _ = parser.value()?;
                println!("bench ddp: run it under torchrun (see the file's docs)");
                return Ok(false);
            }
            _ => return Err(arg.unexpected()),
        }
    }
    Ok(true)
}

fn main() {
    match parse_args() {
        Ok(true) => {}
        Ok(false) => return,
        Err(e) => {
            eprintln!("bench ddp: {e}\n{USAGE}");
            std::process::exit(2);
        }
    }
    if std::env::var("RANK").is_err() {
        println!("bench ddp: no RANK: run it under torchrun --nproc_per_node=N --no-python");
        return;
    }
    let pg = ProcessGroup::from_env(Duration::from_secs(120)).expect("process group");
    let kib = std::env::var("TCG_DDP_OVERLAP_KIB").unwrap_or_else(|_| "4096,12300,25600".into());
    let mut variants = vec![Variant::After];
    if pg.world_size() > 1 {
        variants
            .extend(kib.split(',').filter_map(|k| k.trim().parse::<usize>().ok()).map(|k| Variant::Overlap(k << 10)));
    }
    let only = std::env::var("TCG_DDP_MODELS").unwrap_or_default();
    for kind in ModelKind::ALL.into_iter().filter(|k| only.is_empty() || only.split(',').any(|m| m == k.name())) {
        for &v in &variants {
            let us = measure(&pg, kind, v);
            if pg.rank() == 0 {
                println!("ROW,{},{},{},{us:.2}", v.name(), kind.name(), pg.world_size());
            }
        }
    }
}
