//! nanoGPT's character GPT (`shakespeare_char`: 6 layers, 6 heads, 384 wide, block 256, batch
//! 64, dropout 0.2, 10.77 M parameters) trained with the crate as a user would: the whole step
//! captured by `TrainStep` (bf16 autocast, gradient accumulation over `--accum` micro-batches
//! inside the graph, clipping and the warmup + cosine learning rate on the device, fused AdamW
//! with decay and no-decay groups on the crate's own kernels), an evaluation step sharing the
//! pool every `--eval-every` iterations, a checkpoint at each evaluation and `--resume`, a
//! progress bar with loss, tokens/s and MFU, the loss curve in `OUT/loss.csv`, and text sampled
//! at the end by a captured decode step (`sample.rs`).
//!
//! The corpus is real text that needs no internet: the Python sources of the torch package that
//! `scripts/setup.sh` installed (`.venv/torch`), read as characters (`--data-dir` for another
//! folder), prepared once into `target/gpt-data/` (a folder per source). On a machine without a GPU it trains a tiny
//! model eagerly (`--tiny` chooses it anywhere).
//!
//! `cargo run --release --example gpt -- [--iters N] [--batch B] [--accum K] [--tiny]`
//!
//! `--ddp` under torchrun trains data-parallel: one process per GPU, the parameters broadcast
//! from rank 0, each rank drawing its own batches, the gradients averaged in buckets inside the
//! captured step (`GradAllReduce`); rank 0 evaluates, checkpoints, writes and samples:
//! `.venv/bin/python -m torch.distributed.run --nproc-per-node 2 --no-python target/release/examples/gpt --ddp`

#[path = "../common/cli.rs"]
mod cli;
mod data;
mod model;
mod sample;
mod step;
mod trajectory;

use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;
use std::time::Instant;
use tch::{nn, Device, Kind, Tensor};
use tch_cuda_graphs::dist::{broadcast_parameters, ProcessGroup};
use tch_cuda_graphs::feed::DeviceMeter;
use tch_cuda_graphs::{checkpoint, cuda_is_available, synchronize};

struct Args {
    iters: u64,
    batch: i64,
    accum: i64,
    eval_every: u64,
    eval_iters: u64,
    tiny: bool,
    fp32: bool,
    resume: bool,
    stop_at: Option<u64>,
    sample: usize,
    seed: i64,
    peak_tflops: f64,
    data_dir: PathBuf,
    out: PathBuf,
    ddp: bool,
    fused: bool,
    dropout: Option<f64>,
    trajectory: Option<PathBuf>,
}

const USAGE: &str = "\
usage: gpt [--iters N] [--batch B] [--accum K] [--eval-every N] [--eval-iters N] [--tiny] [--fp32]
           [--resume] [--stop-at N] [--sample CHARS] [--seed S] [--peak-tflops T] [--data-dir DIR]
           [--out DIR] [--ddp] [--fused] [--dropout P] [--trajectory DIR]

Trains nanoGPT's character GPT on the torch package's Python sources with a captured step.
  --iters N          optimizer steps (default 2000; the cosine schedule ends there)
  --batch B          sequences per micro-batch (default 64)
  --accum K          micro-batches per step, accumulated inside the captured step (default 1)
  --eval-every N     iterations between evaluations and checkpoints (default 250)
  --eval-iters N     validation batches per evaluation (default 20)
  --tiny             a 2-layer, 32-wide model with block 32 (the default without a GPU)
  --fp32             no bf16 autocast
  --resume           continue from OUT/ckpt.safetensors (with the batches and dropout masks the
                     run would have drawn)
  --stop-at N        stop after iteration N, as an interrupted run would
  --sample CHARS     characters to sample at the end (default 500)
  --seed S           the random seed (default 1337)
  --peak-tflops T    the GPU's dense bf16 peak for MFU (default 989, an H100/H200 SXM)
  --data-dir DIR     the folder of .py files (default .venv/torch)
  --out DIR          loss.csv, the checkpoint and sample.txt (default target/gpt)
  --ddp              data-parallel under torchrun, one GPU per process (batch is per GPU)
  --fused            LayerNorms with the residual adds and dropouts folded in, on the crate's
                     fused kernels (ATen's where they do not apply), linear layers whose bias
                     gradients come out of the weight-gradient GEMM, in float32 with the weight
                     gradients, and bf16 weight shadows
  --dropout P        the dropout probability (default 0.2; 0 with --trajectory)
  --trajectory DIR   the step-for-step comparison with PyTorch: write the initial weights and
                     --iters batches into DIR, train on them (no evaluation), write every step's
                     loss and gradient norm and the variables after steps 1, 10 and 100; then
                     `python benches/torch_gpt.py --trajectory DIR` trains PyTorch's same model
                     from them and compares
  -h, --help         this text";

/// The command line: `None` when it asked for the usage.
fn parse_args() -> Result<Option<Args>, lexopt::Error> {
    use lexopt::prelude::*;
    let mut a = Args {
        iters: 2000,
        batch: 64,
        accum: 1,
        eval_every: 250,
        eval_iters: 20,
        tiny: false,
        fp32: false,
        fused: false,
        resume: false,
        stop_at: None,
        sample: 500,
        seed: 1337,
        peak_tflops: 989.0,
        data_dir: data::default_source(),
        out: PathBuf::from("target/gpt"),
        ddp: false,
        dropout: None,
        trajectory: None,
    };
    let mut parser = lexopt::Parser::from_env();
    while let Some(arg) = parser.next()? {
        match arg {
            Long("iters") => a.iters = parser.value()?.parse()?,
            Long("batch") => a.batch = parser.value()?.parse()?,
            Long("accum") => a.accum = parser.value()?.parse()?,
            Long("eval-every") => a.eval_every = parser.value()?.parse()?,
            Long("eval-iters") => a.eval_iters = parser.value()?.parse()?,
            Long("tiny") => a.tiny = true,
            Long("fp32") => a.fp32 = true,
            Long("fused") => a.fused = true,
            Long("resume") => a.resume = true,
            Long("stop-at") => a.stop_at = Some(parser.value()?.parse()?),
            Long("sample") => a.sample = parser.value()?.parse()?,
            Long("seed") => a.seed = parser.value()?.parse()?,
            Long("peak-tflops") => a.peak_tflops = parser.value()?.parse()?,
            Long("data-dir") => a.data_dir = parser.value()?.into(),
            Long("out") => a.out = parser.value()?.into(),
            Long("ddp") => a.ddp = true,
            Long("dropout") => a.dropout = Some(parser.value()?.parse()?),
            Long("trajectory") => a.trajectory = Some(parser.value()?.into()),
            Short('h') | Long("help") => return Ok(None),
            _ => return Err(arg.unexpected()),
        }
    }
    if a.batch < 1 || a.accum < 1 || a.iters < 1 || a.eval_every < 1 || a.eval_iters < 1 {
        return Err("--batch, --accum, --iters, --eval-every and --eval-iters must be at least 1".into());
    }
    if a.dropout.is_some_and(|p| !(0.0..1.0).contains(&p)) {
        return Err("--dropout must be in [0, 1)".into());
    }
    if a.trajectory.is_some() && (a.ddp || a.accum != 1) {
        return Err("--trajectory runs on one device with one micro-batch per step".into());
    }
    Ok(Some(a))
}

/// Mean loss over `n` random batches of `split`, with the evaluation step, and the standard
/// error of that mean (the evaluation's own noise).
fn evaluate(
    eval: &mut tch_cuda_graphs::TrainStep<'_>,
    split: &Tensor,
    batch: i64,
    block: i64,
    n: u64,
) -> Result<(f64, f64)> {
    let mut losses = Vec::new();
    for _ in 0..n {
        let (x, y) = data::batch(split, batch, block)?;
        losses.push(eval.run(&[&x, &y])?[0].f_detach_copy()?); // a replay overwrites its output
    }
    let losses = Tensor::f_stack(&losses, 0)?.f_to_kind(Kind::Double)?;
    let mean = f64::try_from(losses.f_mean(None)?)?;
    let se = if n > 1 { f64::try_from(losses.f_std(true)?)? / (n as f64).sqrt() } else { f64::NAN };
    Ok((mean, se))
}

fn main() -> Result<()> {
    let args = cli::args_or_exit("gpt", USAGE, parse_args());
    // --ddp: the group torchrun describes, this process's GPU; a seed of its own per rank (its
    // batches and dropout masks), the weights rank 0's (broadcast below)
    let pg = if args.ddp {
        Some(ProcessGroup::from_env(Duration::from_secs(600)).context("--ddp needs torchrun's environment")?)
    } else {
        None
    };
    let (rank, world) = pg.as_ref().map_or((0, 1), |pg| (pg.rank(), pg.world_size()));
    let lead = rank == 0;
    let seed = args.seed.wrapping_add(1_000_003 * rank as i64);
    let device = match &pg {
        Some(pg) => pg.device(),
        None if cuda_is_available() => Device::Cuda(0),
        None => Device::Cpu,
    };
    let tiny = args.tiny || device == Device::Cpu;
    std::fs::create_dir_all(&args.out)?;
    let corpus = data::Corpus::prepare(&args.data_dir, &data::cache_dir(&args.data_dir))
        .with_context(|| format!("preparing the corpus from {}", args.data_dir.display()))?;
    let corpus = data::to_device(&corpus, device)?;
    let config = if tiny { model::Config::tiny(data::VOCAB) } else { model::Config::shakespeare_char(data::VOCAB) };
    let dropout = args.dropout.unwrap_or(if args.trajectory.is_some() { 0.0 } else { config.dropout });
    let config = model::Config { fused: args.fused, dropout, ..config };
    let (batch, block) = (if tiny { args.batch.min(8) } else { args.batch }, config.block);
    let hyper = step::Hyper {
        batch,
        accum: args.accum,
        iters: args.iters,
        warmup: 100.min(args.iters / 10),
        autocast: (!args.fp32 && device != Device::Cpu).then_some(Kind::BFloat16),
        shadows: args.fused,
        eager: device == Device::Cpu,
        ..Default::default()
    };
    if let Some(dir) = &args.trajectory {
        let spec = trajectory::Spec { config, hyper, steps: args.iters as usize, seed: args.seed };
        let t = trajectory::run(dir, &spec, &corpus.train, Some(&corpus.val), device)?;
        println!("trajectory in {}: {t}", dir.display());
        return Ok(());
    }

    tch::manual_seed(args.seed);
    let vs = nn::VarStore::new(device);
    let gpt = model::Gpt::new(&vs.root(), config);
    if let Some(pg) = &pg {
        broadcast_parameters(pg, &vs)?;
        tch::manual_seed(seed); // each rank its own batches and dropout masks
    }
    let params = model::Gpt::param_count(&vs);
    // every rank's tokens: the figures below are for the whole group
    let tokens_per_iter = (batch * block * args.accum) as f64 * world as f64;
    let flops_per_iter = config.flops_per_token(params) * tokens_per_iter;
    let mut steps = match &pg {
        Some(pg) => step::build_ddp(&vs, &gpt, hyper, pg)?,
        None => step::build(&vs, &gpt, hyper)?,
    };
    let mode = match (&pg, device) {
        (Some(_), _) => format!("data-parallel over {world} GPU{}: captured steps", if world == 1 { "" } else { "s" }),
        (None, Device::Cpu) => "No CUDA device: eager, tiny model".to_string(),
        (None, _) => "CUDA device: captured steps".to_string(),
    };
    println!(
        "{}{mode}: GPT {} layers × {} wide, {} heads, block {block}, {:.2} M parameters; {} train / {} validation tokens; \
         batch {batch} × {} micro-batches, {}{}",
        if pg.is_some() { format!("rank {rank}: ") } else { String::new() },
        config.layers,
        config.embd,
        config.heads,
        params as f64 / 1e6,
        corpus.train.size()[0],
        corpus.val.size()[0],
        args.accum,
        if hyper.autocast.is_some() { "bf16 autocast" } else { "fp32" },
        if config.fused { ", fused norms and linear layers, weight shadows" } else { "" },
    );

    let ckpt = args.out.join("ckpt.safetensors");
    let mut first = 0u64;
    if args.resume {
        let extra = checkpoint::load(&ckpt, &vs, steps.train.state_mut())
            .with_context(|| format!("resuming from {}", ckpt.display()))?;
        first = extra["iter"].int64_value(&[]) as u64;
        steps.schedule_step.shallow_clone().copy_(&extra["schedule"]);
        // the random stream of every checkpointed iteration starts from (seed, iteration)
        tch::manual_seed(seed.wrapping_add(first as i64));
        println!("resumed from {} at iteration {first}", ckpt.display());
    }
    // rank 0 writes the curve (the others write to a sink)
    let mut csv: Box<dyn Write> = if lead {
        Box::new(
            std::fs::OpenOptions::new()
                .create(true)
                .append(args.resume)
                .write(true)
                .truncate(!args.resume)
                .open(args.out.join("loss.csv"))?,
        )
    } else {
        Box::new(std::io::sink())
    };
    if !args.resume {
        writeln!(csv, "iter,train_loss,val_loss,val_se")?;
    }

    let bar = if lead { ProgressBar::new(args.iters) } else { ProgressBar::hidden() };
    bar.set_style(ProgressStyle::with_template("[{bar:30}] {pos}/{len} {msg}")?.progress_chars("#>."));
    bar.set_position(first);
    let mut meter = DeviceMeter::new();
    let mut timed = (0u64, 0f64);
    let mut clock = Instant::now();
    for iter in first..args.iters {
        let (x, y) = data::batch(&corpus.train, batch * args.accum, block)?;
        let shape = [args.accum, batch, block];
        meter.add(&steps.train.run(&[&x.view(shape), &y.view(shape)])?[0])?;
        bar.inc(1);
        let done = iter + 1;
        if done % 10 == 0 || done == args.iters {
            let loss = meter.take()?.unwrap_or(f64::NAN); // one sync per 10 iterations
            let secs = clock.elapsed().as_secs_f64();
            if iter >= first + 10 {
                timed = (timed.0 + 10, timed.1 + secs); // the first 10 hold the warmup and capture
            }
            clock = Instant::now();
            let per_iter = secs / 10.0;
            let tokens = tokens_per_iter / per_iter;
            let mfu = flops_per_iter / per_iter / (args.peak_tflops * 1e12) * 100.0;
            bar.set_message(format!("loss {loss:.4}, {:.2} ms/iter, {tokens:.0} tok/s, MFU {mfu:.1}%", per_iter * 1e3));
        }
        if (done % args.eval_every == 0 || done == args.iters) && lead {
            let (train_loss, _) = evaluate(&mut steps.eval, &corpus.train, batch, block, args.eval_iters)?;
            let (val_loss, val_se) = evaluate(&mut steps.eval, &corpus.val, batch, block, args.eval_iters)?;
            writeln!(csv, "{done},{train_loss:.5},{val_loss:.5},{val_se:.5}")?;
            bar.suspend(|| println!("iter {done}: train loss {train_loss:.4}, val loss {val_loss:.4} (± {val_se:.4})"));
            let it = Tensor::from(done as i64);
            let extra = [("iter", &it), ("schedule", &steps.schedule_step)];
            checkpoint::save(&ckpt, &vs, steps.train.state(), &extra)?;
            // What follows a checkpoint draws from (seed, iteration), so a run resumed from it
            // gets the same batches and dropout masks as the run that went on.
            clock = Instant::now();
        }
        if done % args.eval_every == 0 || done == args.iters {
            tch::manual_seed(seed.wrapping_add(done as i64)); // on every rank
        }
        if args.stop_at == Some(done) {
            bar.suspend(|| println!("stopped after iteration {done} (--stop-at)"));
            break;
        }
    }
    if device != Device::Cpu {
        synchronize(device)?;
    }
    bar.finish_and_clear();
    if let Some(pg) = &pg {
        pg.barrier()?; // no rank leaves while another still reduces with it
        synchronize(device)?;
    }
    if !lead {
        return Ok(());
    }
    if timed.0 > 0 {
        let per_iter = timed.1 / timed.0 as f64;
        println!(
            "{:.2} ms/iter, {:.0} tokens/s, MFU {:.1}% (of {} TFLOP/s), over {} iterations after the first 10",
            per_iter * 1e3,
            tokens_per_iter / per_iter,
            flops_per_iter / per_iter / (args.peak_tflops * 1e12) * 100.0,
            args.peak_tflops,
            timed.0
        );
    }
    // a captured decode step on a GPU (static shapes, a device-side position), eager on the CPU
    let tokens = sample::sample(&gpt, device, 0, args.sample as i64, device != Device::Cpu)?;
    let text: String = tokens.into_iter().map(data::decode).collect();
    std::fs::write(args.out.join("sample.txt"), &text)?;
    println!("loss curve: {}; checkpoint: {}", args.out.join("loss.csv").display(), ckpt.display());
    println!("--- sampled ---\n{text}\n---");
    Ok(())
}
