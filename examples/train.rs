//! The main example: a real epoch loop, graphed.
//!
//! An MLP learns to imitate a random "teacher" network from a data set held on the CPU whose
//! size is not a multiple of the batch size (a ragged last batch every epoch: a second graph).
//! Batches are fed through pinned memory; AdamW with weight decay off for biases (two parameter
//! groups); linear warmup + cosine schedule; evaluation on held-out data every epoch (an eval
//! step captured into the train step's pool, reading the training weights); a checkpoint at the
//! end of every epoch, and `--resume` from it; a progress bar with loss and learning rate.
//!
//! On a GPU it then trains the same run eagerly and prints eager vs graphed time per step and
//! the largest parameter difference between the two runs. On a CPU it runs the eager fallback.
//!
//! `cargo run --release --example train -- [--epochs N] [--precision fp32|bf16|fp16] [--resume]
//! [--checkpoint PATH]` (or `make run`). bf16 and fp16 run the step under CUDA autocast; fp16
//! adds the on-device GradScaler (its state goes into the checkpoint).

#[path = "common/cli.rs"]
mod cli;

use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use std::time::Instant;
use tch::{nn, nn::Module, Device, Kind, Tensor};
use tch_cuda_graphs::amp::{self, GradScaler};
use tch_cuda_graphs::feed::{self, DeviceMeter};
use tch_cuda_graphs::optim::{decay_groups, Adam, AdamConfig, Optimizer};
use tch_cuda_graphs::schedule::{LrScheduler, WarmupCosine};
use tch_cuda_graphs::{checkpoint, cuda_is_available, synchronize, StepOptions, TrainStep};

const IN: i64 = 64;
const HIDDEN: i64 = 256;
const OUT: i64 = 8;
const BATCH: i64 = 64;
const TRAIN: i64 = 10_000; // 156 batches of 64 and one of 16 per epoch
const HELD_OUT: i64 = 1_000;
const EVAL_BATCH: i64 = 250;

fn mlp(p: nn::Path) -> nn::Sequential {
    nn::seq()
        .add(nn::linear(&p / "l1", IN, HIDDEN, Default::default()))
        .add_fn(|x| x.relu())
        .add(nn::linear(&p / "l2", HIDDEN, HIDDEN, Default::default()))
        .add_fn(|x| x.relu())
        .add(nn::linear(&p / "l3", HIDDEN, OUT, Default::default()))
}

/// The data set: inputs and the teacher's outputs, on the CPU.
struct Data {
    x: Tensor,
    y: Tensor,
}

impl Data {
    fn new(n: i64, teacher: &nn::Sequential) -> Data {
        let _g = tch::no_grad_guard();
        let x = Tensor::randn([n, IN], (Kind::Float, Device::Cpu));
        let y = teacher.forward(&x).tanh();
        Data { x, y }
    }

    /// Batches of `order` (a permutation), the last one ragged; pinned when feeding a GPU.
    fn batches(&self, order: &Tensor, size: i64, pin: bool) -> Result<Vec<(Tensor, Tensor)>> {
        let n = order.size()[0];
        let mut out = Vec::new();
        for start in (0..n).step_by(size as usize) {
            let idx = order.narrow(0, start, size.min(n - start));
            let (x, y) = (self.x.index_select(0, &idx), self.y.index_select(0, &idx));
            out.push(if pin { (feed::pinned(&x)?, feed::pinned(&y)?) } else { (x, y) });
        }
        Ok(out)
    }
}

struct Args {
    epochs: usize,
    resume: bool,
    checkpoint: String,
    /// None: fp32; Some(BFloat16 | Half): autocast.
    precision: Option<Kind>,
}

const USAGE: &str = "\
usage: train [--epochs N] [--precision fp32|bf16|fp16] [--resume] [--checkpoint PATH]

Trains an MLP on a CPU-held data set with a captured step (eager on a machine without a GPU),
then, on a GPU, the same run eagerly for comparison.
  --epochs N          epochs to train (default 5)
  --precision P       fp32 (default), or bf16 / fp16 under CUDA autocast (fp16 with a GradScaler)
  --resume            continue from the checkpoint
  --checkpoint PATH   the checkpoint file (default target/train-example.safetensors)
  -h, --help          this text";

/// The command line: `None` when it asked for the usage.
fn parse_args() -> Result<Option<Args>, lexopt::Error> {
    use lexopt::prelude::*;
    let mut a =
        Args { epochs: 5, resume: false, checkpoint: "target/train-example.safetensors".into(), precision: None };
    let mut parser = lexopt::Parser::from_env();
    while let Some(arg) = parser.next()? {
        match arg {
            Long("epochs") => a.epochs = parser.value()?.parse()?,
            Long("resume") => a.resume = true,
            Long("checkpoint") => a.checkpoint = parser.value()?.string()?,
            Long("precision") => {
                a.precision = match parser.value()?.string()?.as_str() {
                    "fp32" => None,
                    "bf16" => Some(Kind::BFloat16),
                    "fp16" => Some(Kind::Half),
                    other => return Err(format!("--precision {other}: expected fp32, bf16 or fp16").into()),
                }
            }
            Short('h') | Long("help") => return Ok(None),
            _ => return Err(arg.unexpected()),
        }
    }
    Ok(Some(a))
}

/// What a run needs to know.
struct Run<'a> {
    device: Device,
    eager: bool,
    show: bool,
    args: &'a Args,
    train: &'a Data,
    held_out: &'a Data,
}

/// What the training step mutates, owned by the step and lent back between runs: the optimizer,
/// and fp16's loss scaler.
struct Trainer {
    opt: Adam,
    scaler: Option<GradScaler>,
}

/// Trains (or resumes) one run; returns its VarStore and the seconds per training step (over the
/// epochs after the first, when there are several).
fn fit(run: &Run) -> Result<(nn::VarStore, f64)> {
    let device = run.device;
    tch::manual_seed(42);
    let vs = nn::VarStore::new(device);
    let model = mlp(vs.root() / "student");
    let cfg = AdamConfig::adamw().lr(2e-3).weight_decay(0.01);
    let opt = Adam::with_groups(decay_groups(&vs, cfg, cfg.weight_decay(0.0)))?;
    let steps_per_epoch = (TRAIN + BATCH - 1) / BATCH;
    let total = steps_per_epoch as u64 * run.args.epochs as u64;
    let mut schedule = LrScheduler::new(WarmupCosine { warmup: 100, total, min_factor: 0.05 }, opt.lr_handles());
    // fp16 needs loss scaling; the scaler lives on the device and in the captured step
    let scaler = match run.args.precision {
        Some(Kind::Half) => Some(GradScaler::new(device)?),
        _ => None,
    };
    let mut trainer = Trainer { opt, scaler };
    let first_epoch = if run.args.resume { resume(run, &vs, &mut trainer, &mut schedule)? } else { 0 };
    let (mut train, mut eval) = steps(run, &vs, &model, trainer)?;
    let pin = device != Device::Cpu;
    let held_out = run.held_out.batches(&Tensor::arange(HELD_OUT, (Kind::Int64, Device::Cpu)), EVAL_BATCH, pin)?;
    let bar = ProgressBar::new(steps_per_epoch as u64);
    bar.set_style(ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} {msg}")?.progress_chars("#>."));
    if !run.show {
        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    let (mut seconds, mut steps) = (0.0, 0);
    for epoch in first_epoch..run.args.epochs {
        let (epoch_seconds, epoch_steps) = train_epoch(run, epoch, &mut train, &mut schedule, &bar)?;
        // The first epoch pays the one-time costs (CUDA and cuBLAS start-up, the eager warmup
        // steps, the capture): time per step is taken over the epochs after it.
        if epoch > first_epoch || run.args.epochs - first_epoch == 1 {
            seconds += epoch_seconds;
            steps += epoch_steps;
        }
        // evaluation on the held-out set, on the training weights
        let mut eval_loss = DeviceMeter::new();
        for (x, y) in &held_out {
            eval_loss.add(&eval.run(&[x, y])?[0])?;
        }
        let eval_loss = eval_loss.take()?.unwrap_or(f64::NAN);
        if run.show {
            let graphs = train.graph_count() + eval.graph_count();
            let line = format!(
                "epoch {}: eval loss {eval_loss:.5}; {graphs} graphs ({} train shapes, 1 eval)",
                epoch + 1,
                train.shapes().len()
            );
            bar.suspend(|| println!("{line}"));
        }
        save(run, &vs, train.state(), epoch, &schedule)?;
    }
    bar.finish_and_clear();
    Ok((vs, seconds / steps.max(1) as f64))
}

/// Loads the run's checkpoint into the variables, the trainer and the schedule; the epoch to go
/// on from.
fn resume(
    run: &Run,
    vs: &nn::VarStore,
    trainer: &mut Trainer,
    schedule: &mut LrScheduler<WarmupCosine>,
) -> Result<usize> {
    let extra = checkpoint::load(&run.args.checkpoint, vs, &mut trainer.opt)
        .with_context(|| format!("resuming from {}", run.args.checkpoint))?;
    if let Some(s) = &mut trainer.scaler {
        s.load_state(&extra)?;
    }
    let first_epoch = extra["epoch"].int64_value(&[]) as usize;
    schedule.set_steps(extra["scheduled"].int64_value(&[]) as u64);
    if run.show {
        println!("resumed from {} after epoch {first_epoch}", run.args.checkpoint);
    }
    Ok(first_epoch)
}

/// The training step (it borrows the model and owns the trainer, lent back for checkpoints),
/// with an epoch's two batch shapes declared, and the evaluation step in its pool.
fn steps<'a>(
    run: &Run,
    vs: &nn::VarStore,
    model: &'a nn::Sequential,
    trainer: Trainer,
) -> Result<(TrainStep<'a, Trainer>, TrainStep<'a>)> {
    let device = run.device;
    let mut options = StepOptions::default().eager(run.eager);
    if let Some(dtype) = run.args.precision {
        options = options.autocast(dtype);
    }
    let (x0, y0) =
        (Tensor::zeros([BATCH, IN], (Kind::Float, device)), Tensor::zeros([BATCH, OUT], (Kind::Float, device)));
    let mut train = TrainStep::with_state(trainer, &[("x", &x0), ("y", &y0)], options, |t, inp| {
        t.opt.zero_grad()?;
        let loss = model.forward(&inp[0]).f_mse_loss(&inp[1], tch::Reduction::Mean)?;
        match &mut t.scaler {
            Some(scaler) => {
                scaler.backward(&loss)?; // scaled, autocast suspended
                scaler.step(&mut t.opt)?;
                scaler.update()?;
            }
            None => {
                amp::backward(&loss)?; // autocast (if any) suspended, as PyTorch runs backward
                t.opt.step()?;
            }
        }
        Ok(vec![loss.detach()])
    })?;
    train.watch_vars(vs)?;
    // an epoch's two shapes are known: full batches and the ragged last one (captured together;
    // the last batch then replays from its first epoch on)
    let sizes: Vec<i64> = [BATCH, TRAIN % BATCH].into_iter().filter(|&n| n > 0).collect();
    train.declare_batch_sizes(&sizes)?;
    let xe = Tensor::zeros([EVAL_BATCH, IN], (Kind::Float, device));
    let eval_options = match train.pool() {
        Some(pool) => options.pool(pool).warmup(1),
        None => options,
    };
    let eval = TrainStep::new(&[("x", &xe), ("y", &xe.narrow(1, 0, OUT))], eval_options, move |inp| {
        let _no_grad = tch::no_grad_guard();
        Ok(vec![model.forward(&inp[0]).f_mse_loss(&inp[1], tch::Reduction::Mean)?])
    })?;
    Ok((train, eval))
}

/// One epoch of training steps, in this epoch's order; its seconds (the device synchronized at
/// both ends) and steps.
fn train_epoch(
    run: &Run,
    epoch: usize,
    train: &mut TrainStep<'_, Trainer>,
    schedule: &mut LrScheduler<WarmupCosine>,
    bar: &ProgressBar,
) -> Result<(f64, usize)> {
    let (device, pin) = (run.device, run.device != Device::Cpu);
    tch::manual_seed(1000 + epoch as i64); // the same order for every run of this epoch
    let order = Tensor::randperm(TRAIN, (Kind::Int64, Device::Cpu));
    let batches = run.train.batches(&order, BATCH, pin)?;
    bar.reset();
    bar.set_prefix(format!("epoch {}/{}", epoch + 1, run.args.epochs));
    let mut meter = DeviceMeter::new();
    if pin {
        synchronize(device)?;
    }
    let start = Instant::now();
    for (i, (x, y)) in batches.iter().enumerate() {
        let lr = schedule.step()?;
        meter.add(&train.run(&[x, y])?[0])?;
        if i % 25 == 24 {
            let loss = meter.take()?.unwrap_or(f64::NAN); // one sync every 25 steps
            bar.set_message(format!("loss {loss:.5} lr {lr:.2e}"));
        }
        bar.inc(1);
    }
    if pin {
        synchronize(device)?;
    }
    Ok((start.elapsed().as_secs_f64(), batches.len()))
}

/// Saves the variables, the optimizer, the scaler, the epoch done and the schedule's position.
fn save(
    run: &Run,
    vs: &nn::VarStore,
    trainer: &Trainer,
    epoch: usize,
    schedule: &LrScheduler<WarmupCosine>,
) -> Result<()> {
    let (epoch_no, scheduled) = (Tensor::from((epoch + 1) as i64), Tensor::from(schedule.steps() as i64));
    let scaler_state = trainer.scaler.as_ref().map(|s| s.state()).unwrap_or_default();
    let mut extra: Vec<(&str, &Tensor)> = vec![("epoch", &epoch_no), ("scheduled", &scheduled)];
    extra.extend(scaler_state.iter().map(|(n, t)| (n.as_str(), t)));
    checkpoint::save(&run.args.checkpoint, vs, &trainer.opt, &extra)?;
    Ok(())
}

fn max_param_diff(a: &nn::VarStore, b: &nn::VarStore) -> Result<f64> {
    let (va, vb) = (a.variables(), b.variables());
    let mut worst = 0f64;
    for (name, ta) in &va {
        worst = worst.max(f64::try_from((ta - &vb[name]).abs().max())?);
    }
    Ok(worst)
}

fn main() -> Result<()> {
    let args = cli::args_or_exit("train", USAGE, parse_args());
    let device = if cuda_is_available() { Device::Cuda(0) } else { Device::Cpu };
    tch::manual_seed(0);
    let teacher_vs = nn::VarStore::new(Device::Cpu);
    let teacher = mlp(teacher_vs.root() / "teacher");
    let (train_data, held_out) = (Data::new(TRAIN, &teacher), Data::new(HELD_OUT, &teacher));
    if let Some(dir) = std::path::Path::new(&args.checkpoint).parent() {
        std::fs::create_dir_all(dir)?;
    }
    let graphed = device != Device::Cpu;
    println!(
        "{}: a {IN}-{HIDDEN}-{HIDDEN}-{OUT} MLP imitating a random teacher; {TRAIN} samples on the CPU, batch {BATCH} \
         (ragged last batch), {} epochs, {}, AdamW (no decay on biases), warmup + cosine",
        if graphed { "CUDA device: graphed training steps" } else { "No CUDA device: the eager fallback" },
        args.epochs,
        match args.precision {
            None => "fp32",
            Some(Kind::BFloat16) => "bf16 autocast",
            Some(_) => "fp16 autocast + GradScaler",
        }
    );
    let run = Run { device, eager: false, show: true, args: &args, train: &train_data, held_out: &held_out };
    let (vs, per_step) = fit(&run)?;
    println!("checkpoint: {} (continue with --resume)", args.checkpoint);
    if graphed && !args.resume {
        println!("Same run, eager (the same optimizer and schedule, no graph):");
        let (vs_eager, per_step_eager) = fit(&Run { eager: true, show: false, ..run })?;
        println!("eager:   {:8.1} µs/step (epochs 2..{})", per_step_eager * 1e6, args.epochs);
        println!("graphed: {:8.1} µs/step (CPU-fed through pinned memory; epochs 2..{})", per_step * 1e6, args.epochs);
        println!("speedup: {:8.2}x", per_step_eager / per_step);
        println!(
            "max |param_graphed - param_eager| after {} epochs: {:e}",
            args.epochs,
            max_param_diff(&vs, &vs_eager)?
        );
    } else {
        println!("{:.1} µs/step", per_step * 1e6);
    }
    Ok(())
}
