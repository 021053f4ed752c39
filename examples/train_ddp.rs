//! The training example, data parallel: every rank trains the same MLP on its own shard of the
//! data set (held on the CPU, fed through pinned memory), with a captured step whose gradients
//! are averaged across ranks inside the graph (flat buckets, one NCCL all-reduce each, started
//! by gradient hooks while backward goes on).
//! Parameters start equal (rank 0's, checked across ranks), stay bitwise equal, and rank 0
//! writes a checkpoint every epoch.
//!
//! ```sh
//! NCCL_NVLS_ENABLE=0 .venv/bin/torchrun --nproc_per_node=2 --no-python target/release/examples/train_ddp -- [--epochs N]
//! # several nodes: on each, the same command with
//! #   --nnodes=N --node_rank=I --rdzv_backend=c10d --rdzv_endpoint=HOST:PORT
//! ```

#[path = "common/cli.rs"]
mod cli;

use anyhow::{ensure, Context, Result};
use std::time::{Duration, Instant};
use tch::{nn, nn::Module, Device, Kind, Tensor};
use tch_cuda_graphs::dist::{
    broadcast_parameters, BucketConfig, BucketLayout, GradAllReduce, ProcessGroup, ReduceOp, Wire, DEFAULT_BUCKET_BYTES,
};
use tch_cuda_graphs::feed::{self, DeviceMeter};
use tch_cuda_graphs::optim::{decay_groups, Adam, AdamConfig, Optimizer};
use tch_cuda_graphs::schedule::{LrScheduler, WarmupCosine};
use tch_cuda_graphs::{checkpoint, synchronize, StepOptions, TrainStep};

const IN: i64 = 64;
const HIDDEN: i64 = 256;
const OUT: i64 = 8;
const BATCH: i64 = 64; // per rank
const TRAIN: i64 = 20_000;

fn mlp(p: nn::Path) -> nn::Sequential {
    nn::seq()
        .add(nn::linear(&p / "l1", IN, HIDDEN, Default::default()))
        .add_fn(|x| x.relu())
        .add(nn::linear(&p / "l2", HIDDEN, HIDDEN, Default::default()))
        .add_fn(|x| x.relu())
        .add(nn::linear(&p / "l3", HIDDEN, OUT, Default::default()))
}

fn flat(vs: &nn::VarStore) -> Tensor {
    let mut v: Vec<(String, Tensor)> = vs.variables().into_iter().collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    Tensor::cat(&v.iter().map(|(_, t)| t.detach().view([-1])).collect::<Vec<_>>(), 0)
}

const USAGE: &str = "\
usage: torchrun --nproc_per_node=N --no-python train_ddp -- [--epochs N] [--views | --grouped] [--step-per-bucket]

Trains an MLP data parallel: every rank its shard, gradients averaged inside the captured step.
  --epochs N   epochs to train (default 3)
  --views      gradients as views into the buckets (BucketLayout::Views)
  --grouped    no bucket buffers: one grouped NCCL all-reduce per bucket (BucketLayout::Grouped)
  --step-per-bucket  each bucket's parameters updated once it is averaged
               (GradAllReduce::backward_and_step)
  -h, --help   this text";

/// What the command line asks for.
struct Args {
    epochs: usize,
    views: bool,
    grouped: bool,
    step_per_bucket: bool,
}

/// The command line's settings; `None` when it asked for the usage.
fn parse_args() -> Result<Option<Args>, lexopt::Error> {
    use lexopt::prelude::*;
    let mut args = Args { epochs: 3, views: false, grouped: false, step_per_bucket: false };
    // torchrun may pass the `--` that separates its own arguments on to the program
    let mut parser = lexopt::Parser::from_iter(std::env::args_os().filter(|a| a != "--"));
    while let Some(arg) = parser.next()? {
        match arg {
            Long("epochs") => args.epochs = parser.value()?.parse()?,
            Long("views") => args.views = true,
            Long("grouped") => args.grouped = true,
            Long("step-per-bucket") => args.step_per_bucket = true,
            Short('h') | Long("help") => return Ok(None),
            _ => return Err(arg.unexpected()),
        }
    }
    Ok(Some(args))
}

fn main() -> Result<()> {
    let args = cli::args_or_exit("train_ddp", USAGE, parse_args());
    let epochs = args.epochs;
    let pg = ProcessGroup::from_env(Duration::from_secs(120)).context("run me with torchrun")?;
    let (rank, world, device) = (pg.rank(), pg.world_size(), pg.device());
    let (x, y) = data_set();
    tch::manual_seed(1 + rank as i64); // initial weights differ per rank: the broadcast makes them rank 0's
    let vs = nn::VarStore::new(device);
    let model = mlp(vs.root() / "student");
    broadcast_parameters(&pg, &vs)?;
    let per_rank = TRAIN / world as i64;
    let steps_per_epoch = (per_rank + BATCH - 1) / BATCH;
    let (mut step, mut schedule) = ddp_step(&pg, &vs, &model, &args, steps_per_epoch as u64)?;
    let mut seconds = 0.0;
    let mut timed = 0usize;
    for epoch in 0..epochs {
        let batches = shard(&x, &y, epoch, rank, per_rank)?;
        let mut meter = DeviceMeter::new();
        synchronize(device)?;
        let start = Instant::now();
        for (bx, by) in &batches {
            schedule.step()?;
            meter.add(&step.run(&[bx, by])?[0])?;
        }
        // a bounded wait: if a rank died, its NCCL peers would spin forever in the graph
        pg.wait_device(Duration::from_secs(60))?;
        if epoch > 0 || epochs == 1 {
            seconds += start.elapsed().as_secs_f64();
            timed += batches.len();
        }
        // the mean loss over all ranks
        let loss = Tensor::from(meter.take()?.unwrap_or(f64::NAN) as f32).to_device(device);
        pg.all_reduce(&loss, ReduceOp::Avg)?;
        if rank == 0 {
            println!("epoch {}: mean training loss over {world} ranks {:.5}", epoch + 1, f64::try_from(&loss)?);
            let epoch_no = Tensor::from((epoch + 1) as i64);
            std::fs::create_dir_all("target")?;
            checkpoint::save("target/train-ddp.safetensors", &vs, step.state(), &[("epoch", &epoch_no)])?;
        }
    }
    // the parameters are bitwise equal on every rank
    let mine = flat(&vs);
    let theirs = mine.copy();
    pg.broadcast(&theirs, 0)?;
    let cross = f64::try_from((&mine - &theirs).abs().max())?;
    println!(
        "rank {rank}: {:.1} µs/step (epochs 2..{epochs}), {} graphs; max |param - rank 0's| = {cross:e}",
        seconds / timed.max(1) as f64 * 1e6,
        step.graph_count()
    );
    ensure!(cross == 0.0, "ranks diverged");
    // Dropping in any order is fine: the graphs hold the group, which shuts down after them.
    Ok(())
}

/// The data set, the same on every rank (the same seed): inputs and a teacher's outputs.
fn data_set() -> (Tensor, Tensor) {
    tch::manual_seed(0);
    let teacher_vs = nn::VarStore::new(Device::Cpu);
    let teacher = mlp(teacher_vs.root() / "teacher");
    let x = Tensor::randn([TRAIN, IN], (Kind::Float, Device::Cpu));
    let y = tch::no_grad(|| teacher.forward(&x).tanh());
    (x, y)
}

/// This rank's shard of epoch `epoch` (the same permutation on every rank), in pinned batches.
fn shard(x: &Tensor, y: &Tensor, epoch: usize, rank: usize, per_rank: i64) -> Result<Vec<(Tensor, Tensor)>> {
    tch::manual_seed(1000 + epoch as i64);
    let order = Tensor::randperm(TRAIN, (Kind::Int64, Device::Cpu));
    let mine = order.narrow(0, rank as i64 * per_rank, per_rank);
    let mut batches = Vec::new();
    for start in (0..per_rank).step_by(BATCH as usize) {
        let idx = mine.narrow(0, start, BATCH.min(per_rank - start));
        batches.push((feed::pinned(&x.index_select(0, &idx))?, feed::pinned(&y.index_select(0, &idx))?));
    }
    Ok(batches)
}

/// The data-parallel training step over `model` (the optimizer is its state: lent back to rank 0
/// for its checkpoints) and its learning-rate schedule.
fn ddp_step<'a>(
    pg: &ProcessGroup,
    vs: &nn::VarStore,
    model: &'a nn::Sequential,
    args: &Args,
    steps_per_epoch: u64,
) -> Result<(TrainStep<'a, Adam>, LrScheduler<WarmupCosine>)> {
    let device = pg.device();
    let cfg = AdamConfig::adamw().lr(2e-3).weight_decay(0.01);
    let opt = Adam::with_groups(decay_groups(vs, cfg, cfg.weight_decay(0.0)))?;
    let layout = match (args.views, args.grouped) {
        (true, _) => BucketLayout::Views(Wire::default()),
        (_, true) => BucketLayout::Grouped,
        _ => BucketLayout::default(),
    };
    let config = BucketConfig { bucket_bytes: DEFAULT_BUCKET_BYTES, layout, ..Default::default() };
    let mut reduce = GradAllReduce::with_config(pg, opt.params(), config)?;
    let total = steps_per_epoch * args.epochs as u64;
    let schedule = LrScheduler::new(WarmupCosine { warmup: 50, total, min_factor: 0.05 }, opt.lr_handles());
    let step_per_bucket = args.step_per_bucket;
    let (x0, y0) =
        (Tensor::zeros([BATCH, IN], (Kind::Float, device)), Tensor::zeros([BATCH, OUT], (Kind::Float, device)));
    let mut step = TrainStep::with_state(opt, &[("x", &x0), ("y", &y0)], StepOptions::default(), move |opt, inp| {
        opt.zero_grad()?;
        let loss = model.forward(&inp[0]).f_mse_loss(&inp[1], tch::Reduction::Mean)?;
        if step_per_bucket {
            // each bucket's parameters updated as soon as it is averaged
            reduce.backward_and_step(&loss, opt)?;
        } else {
            reduce.arm()?; // each bucket's all-reduce starts as soon as its gradients are ready
            tch_cuda_graphs::amp::backward(&loss)?;
            reduce.all_reduce()?; // waits for the buckets (on the device): averaged across ranks
            opt.step()?;
        }
        Ok(vec![loss.detach()])
    })?;
    step.watch_vars(vs)?;
    Ok((step, schedule))
}
