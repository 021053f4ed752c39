//! Weak-scaling benchmark (issue 10): the captured data-parallel step of the three benchmark
//! models (per-rank batch fixed, Adam), gradients averaged with `GradAllReduce` inside the
//! graph, on 1 and 2 GPUs; run under torchrun beside `benches/torch_ddp.py` (PyTorch's captured
//! step with a flat all-reduce after backward).
//!
//! `torchrun --nproc_per_node=N --no-python target/release/deps/ddp-*` (the GPU runner:
//! `bash .gpu/run bench ddp` under torchrun). Rank 0 prints `ROW,ours,<model>,<world>,<µs>`.
//! With one rank there is no all-reduce: the 1-GPU figure is the plain captured step. One
//! bucket by default (like the reference); `TCG_DDP_BUCKETS=1` uses 25 MiB buckets.

mod models;

use models::{batch, Model, ModelKind};
use std::time::{Duration, Instant};
use tch::{nn, Device, Tensor};
use tch_cuda_graphs::dist::{broadcast_parameters, GradAllReduce, ProcessGroup, DEFAULT_BUCKET_BYTES};
use tch_cuda_graphs::optim::{Adam, AdamConfig, Optimizer};
use tch_cuda_graphs::{synchronize, StepOptions, TrainStep};

const BLOCK: usize = 50;
const WARMUP: usize = 20;
const STEPS: usize = 1000;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    if std::env::args().any(|a| a == "--include-ignored" || a.starts_with("--test-threads")) {
        println!("bench ddp: run it under torchrun (see the file's docs)");
        return;
    }
    if std::env::var("RANK").is_err() {
        println!("bench ddp: no RANK: run it under torchrun --nproc_per_node=N --no-python");
        return;
    }
    let pg = ProcessGroup::from_env(Duration::from_secs(120)).expect("process group");
    let (rank, world, device) = (pg.rank(), pg.world_size(), pg.device());
    for kind in ModelKind::ALL {
        tch::manual_seed(0);
        let vs = nn::VarStore::new(device);
        let model = Model::new(kind, &vs);
        broadcast_parameters(&pg, &vs).expect("same model");
        let mut opt = Adam::new(&vs, AdamConfig::default().lr(1e-3)).expect("adam");
        // One bucket: like PyTorch's reference (one flat all-reduce after backward). Buckets of
        // DEFAULT_BUCKET_BYTES pay off once their all-reduce overlaps backward (not done yet).
        let bucket = if std::env::var("TCG_DDP_BUCKETS").is_ok() { DEFAULT_BUCKET_BYTES } else { usize::MAX };
        let mut reduce =
            if world > 1 { Some(GradAllReduce::new(&pg, opt.params(), bucket).expect("buckets")) } else { None };
        tch::manual_seed(1 + rank as i64);
        let batches: Vec<(Tensor, Tensor)> = (0..8).map(|_| batch(kind, device)).collect();
        let mut step =
            TrainStep::new(&[("x", &batches[0].0), ("y", &batches[0].1)], StepOptions::default(), move |inp| {
                opt.zero_grad()?;
                let loss = model.loss(&inp[0], &inp[1]);
                loss.f_backward()?;
                if let Some(r) = &mut reduce {
                    r.all_reduce()?;
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
        // the slowest rank is the step time
        let mut all = vec![0f64; world];
        all[rank] = us;
        let all_t = Tensor::from_slice(&all).to_device(device);
        pg.all_reduce(&all_t, tch_cuda_graphs::dist::ReduceOp::Sum).expect("all-reduce");
        let slowest =
            Vec::<f64>::try_from(all_t.to_device(Device::Cpu)).expect("values").into_iter().fold(0f64, f64::max);
        if rank == 0 {
            println!("ROW,ours,{},{world},{slowest:.2}", kind.name());
        }
        drop(step); // graphs holding NCCL work go before the group
    }
}
