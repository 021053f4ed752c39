//! nanoGPT's character GPT (`shakespeare_char`: 6 layers, 6 heads, 384 wide, block 256, batch
//! 64, dropout 0.2, 10.77 M parameters), or with `--arch llama` a Llama-style model of the same
//! size (6 × 384, 6 heads / 2 KV heads, rotary, SwiGLU 1024, RMSNorm, no biases, untied head,
//! 9.5 M; `llama.rs`), trained with the crate as a user would: the whole step
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
//! `cargo run --release --example gpt -- [--arch llama] [--fused] [--iters N] [--batch B] [--accum K] [--tiny]`
//!
//! `--ddp` under torchrun trains data-parallel: one process per GPU, the parameters broadcast
//! from rank 0, each rank drawing its own batches, the gradients averaged in buckets inside the
//! captured step (`GradAllReduce`); rank 0 evaluates, checkpoints, writes and samples:
//! `.venv/bin/python -m torch.distributed.run --nproc-per-node 2 --no-python target/release/examples/gpt --ddp`.
//! `--ddp --zero` shards AdamW's state instead (ZeRO-1, `ShardedAdam`): the checkpoint holds it
//! whole, gathered from every rank, so it resumes on any number of GPUs, with or without `--zero`.

mod arch;
#[path = "../common/cli.rs"]
mod cli;
mod data;
mod llama;
mod lm;
mod model;
mod sample;
mod step;
mod trajectory;

use anyhow::{bail, Context, Result};
use arch::Arch;
use indicatif::{ProgressBar, ProgressStyle};
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;
use std::time::Instant;
use tch::{nn, Device, Kind, Tensor};
use tch_cuda_graphs::dist::{broadcast_parameters, ProcessGroup};
use tch_cuda_graphs::feed::DeviceMeter;
use tch_cuda_graphs::transformer::Activation;
use tch_cuda_graphs::{checkpoint, cuda_is_available, synchronize};

/// Which model `--arch` chose.
#[derive(Clone, Copy, Debug, PartialEq)]
enum ArchName {
    Gpt,
    Llama,
}

struct Args {
    arch: ArchName,
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
    zero: bool,
    fused: bool,
    gelu_tanh: bool,
    dropout: Option<f64>,
    trajectory: Option<PathBuf>,
}

const USAGE: &str = "\
usage: gpt [--arch gpt|llama] [--iters N] [--batch B] [--accum K] [--eval-every N] [--eval-iters N] [--tiny] [--fp32]
           [--resume] [--stop-at N] [--sample CHARS] [--seed S] [--peak-tflops T] [--data-dir DIR]
           [--out DIR] [--ddp [--zero]] [--fused] [--gelu none|tanh] [--dropout P] [--trajectory DIR]

Trains nanoGPT's character GPT (or a Llama-style model) on the torch package's Python sources
with a captured step.
  --arch A           gpt (nanoGPT's, the default) or llama (RMSNorm, rotary, grouped-query
                     attention, SwiGLU, no biases, untied head; no dropout)
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
  --zero             (with --ddp) ZeRO-1: each rank holds and steps its shard of AdamW's state
                     (the gradients reduce-scattered, the parameters all-gathered in the step)
  --fused            the crate's fused layers: norms with the residual adds and dropouts folded
                     in (ATen's where they do not apply), linear layers whose weight (and bias)
                     gradients come out of the GEMM in float32, the fused cross-entropy, with
                     --arch llama the rotary and SwiGLU kernels and the head's exponentials in
                     its GEMM (LinearCrossEntropyMethod::ExpInHead); and bf16 weight shadows
  --gelu G           (--arch gpt) the MLP's GELU: none (the exact erf form, nanoGPT's; the
                     default) or tanh (GPT-2's original approximation; with --fused, computed in
                     the MLP's GEMM epilogues)
  --dropout P        the dropout probability (default 0.2; 0 with --trajectory)
  --trajectory DIR   (--arch gpt) the step-for-step comparison with PyTorch: write the initial weights and
                     --iters batches into DIR, train on them (no evaluation), write every step's
                     loss and gradient norm and the variables after steps 1, 10 and 100; then
                     `python benches/torch_gpt.py --trajectory DIR` trains PyTorch's same model
                     from them and compares
  -h, --help         this text";

impl Default for Args {
    fn default() -> Self {
        Args {
            arch: ArchName::Gpt,
            iters: 2000,
            batch: 64,
            accum: 1,
            eval_every: 250,
            eval_iters: 20,
            tiny: false,
            fp32: false,
            fused: false,
            gelu_tanh: false,
            resume: false,
            stop_at: None,
            sample: 500,
            seed: 1337,
            peak_tflops: 989.0,
            data_dir: data::default_source(),
            out: PathBuf::from("target/gpt"),
            ddp: false,
            zero: false,
            dropout: None,
            trajectory: None,
        }
    }
}

/// The value of `flag` among `choices` (name, value).
fn choice<T: Copy>(parser: &mut lexopt::Parser, flag: &str, choices: &[(&str, T)]) -> Result<T, lexopt::Error> {
    use lexopt::ValueExt;
    let given = parser.value()?.string()?;
    let names: Vec<&str> = choices.iter().map(|c| c.0).collect();
    let found = choices.iter().find(|c| c.0 == given).map(|c| c.1);
    found.ok_or_else(|| format!("--{flag}: no {given:?} ({})", names.join(", ")).into())
}

/// The command line: `None` when it asked for the usage.
fn parse_args() -> Result<Option<Args>, lexopt::Error> {
    use lexopt::prelude::*;
    let mut a = Args::default();
    let mut parser = lexopt::Parser::from_env();
    while let Some(arg) = parser.next()? {
        match arg {
            Long("arch") => {
                a.arch = choice(&mut parser, "arch", &[("gpt", ArchName::Gpt), ("llama", ArchName::Llama)])?
            }
            Long("iters") => a.iters = parser.value()?.parse()?,
            Long("batch") => a.batch = parser.value()?.parse()?,
            Long("accum") => a.accum = parser.value()?.parse()?,
            Long("eval-every") => a.eval_every = parser.value()?.parse()?,
            Long("eval-iters") => a.eval_iters = parser.value()?.parse()?,
            Long("tiny") => a.tiny = true,
            Long("fp32") => a.fp32 = true,
            Long("fused") => a.fused = true,
            Long("gelu") => a.gelu_tanh = choice(&mut parser, "gelu", &[("none", false), ("tanh", true)])?,
            Long("resume") => a.resume = true,
            Long("stop-at") => a.stop_at = Some(parser.value()?.parse()?),
            Long("sample") => a.sample = parser.value()?.parse()?,
            Long("seed") => a.seed = parser.value()?.parse()?,
            Long("peak-tflops") => a.peak_tflops = parser.value()?.parse()?,
            Long("data-dir") => a.data_dir = parser.value()?.into(),
            Long("out") => a.out = parser.value()?.into(),
            Long("ddp") => a.ddp = true,
            Long("zero") => a.zero = true,
            Long("dropout") => a.dropout = Some(parser.value()?.parse()?),
            Long("trajectory") => a.trajectory = Some(parser.value()?.into()),
            Short('h') | Long("help") => return Ok(None),
            _ => return Err(arg.unexpected()),
        }
    }
    check(&a)?;
    Ok(Some(a))
}

/// The combinations of settings the example refuses.
fn check(a: &Args) -> Result<(), lexopt::Error> {
    if a.batch < 1 || a.accum < 1 || a.iters < 1 || a.eval_every < 1 || a.eval_iters < 1 {
        return Err("--batch, --accum, --iters, --eval-every and --eval-iters must be at least 1".into());
    }
    if a.zero && !a.ddp {
        return Err("--zero shards the optimizer across the ranks of --ddp".into());
    }
    if a.dropout.is_some_and(|p| !(0.0..1.0).contains(&p)) {
        return Err("--dropout must be in [0, 1)".into());
    }
    if a.trajectory.is_some() && (a.ddp || a.accum != 1 || a.gelu_tanh) {
        return Err("--trajectory runs nanoGPT's model (exact GELU) on one device with one micro-batch per step".into());
    }
    if a.arch == ArchName::Llama && (a.trajectory.is_some() || a.dropout.is_some() || a.gelu_tanh) {
        return Err("--arch llama has no dropout, no GELU and no --trajectory".into());
    }
    Ok(())
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

/// What a run is: its process group (with `--ddp`), device, corpus on it, model and step settings.
struct Run {
    args: Args,
    pg: Option<ProcessGroup>,
    rank: usize,
    world: usize,
    /// This rank's seed (its batches and dropout masks).
    seed: i64,
    device: Device,
    corpus: data::Corpus,
    config: Arch,
    hyper: step::Hyper,
}

impl Run {
    /// The group torchrun describes (`--ddp`), the device, the corpus on it, the model's shape.
    fn new(args: Args) -> Result<Run> {
        // --ddp: this process's GPU; a seed of its own per rank, the weights rank 0's (broadcast)
        let pg = match args.ddp {
            true => {
                Some(ProcessGroup::from_env(Duration::from_secs(600)).context("--ddp needs torchrun's environment")?)
            }
            false => None,
        };
        let (rank, world) = pg.as_ref().map_or((0, 1), |pg| (pg.rank(), pg.world_size()));
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
        let config = match args.arch {
            ArchName::Gpt => {
                let c =
                    if tiny { model::Config::tiny(data::VOCAB) } else { model::Config::shakespeare_char(data::VOCAB) };
                let dropout = args.dropout.unwrap_or(if args.trajectory.is_some() { 0.0 } else { c.dropout });
                let activation = if args.gelu_tanh { Activation::GeluTanh } else { Activation::Gelu };
                Arch::Gpt(model::Config { fused: args.fused, dropout, activation, ..c })
            }
            ArchName::Llama => {
                let c = if tiny { llama::Config::tiny(data::VOCAB) } else { llama::Config::small(data::VOCAB) };
                Arch::Llama(llama::Config { fused: args.fused, ..c })
            }
        };
        let hyper = step::Hyper {
            batch: if tiny { args.batch.min(8) } else { args.batch },
            accum: args.accum,
            iters: args.iters,
            warmup: 100.min(args.iters / 10),
            autocast: (!args.fp32 && device != Device::Cpu).then_some(Kind::BFloat16),
            shadows: args.fused,
            eager: device == Device::Cpu,
            zero: args.zero,
            ..Default::default()
        };
        let seed = args.seed.wrapping_add(1_000_003 * rank as i64);
        Ok(Run { args, pg, rank, world, seed, device, corpus, config, hyper })
    }

    fn lead(&self) -> bool {
        self.rank == 0
    }

    /// Tokens of one iteration over every rank: the figures printed are for the whole group.
    fn tokens_per_iter(&self) -> f64 {
        (self.hyper.batch * self.config.block() * self.hyper.accum) as f64 * self.world as f64
    }

    /// The line that says what runs.
    fn describe(&self, params: i64) -> String {
        let (c, h, world) = (&self.config, &self.hyper, self.world);
        let mode = match (&self.pg, self.device) {
            (Some(_), _) => {
                let zero = if h.zero { " (ZeRO-1)" } else { "" };
                format!("data-parallel{zero} over {world} GPU{}: captured steps", if world == 1 { "" } else { "s" })
            }
            (None, Device::Cpu) => "No CUDA device: eager, tiny model".to_string(),
            (None, _) => "CUDA device: captured steps".to_string(),
        };
        format!(
            "{}{mode}: {}, {:.2} M parameters; {} train / {} validation tokens; \
             batch {} × {} micro-batches, {}{}",
            if self.pg.is_some() { format!("rank {}: ", self.rank) } else { String::new() },
            c.describe(),
            params as f64 / 1e6,
            self.corpus.train.size()[0],
            self.corpus.val.size()[0],
            h.batch,
            h.accum,
            if h.autocast.is_some() { "bf16 autocast" } else { "fp32" },
            if c.fused() { ", fused layers, weight shadows" } else { "" },
        )
    }

    /// The loss curve: rank 0 writes `OUT/loss.csv` (appending when resuming), the others a sink.
    fn csv(&self) -> Result<Box<dyn Write>> {
        if !self.lead() {
            return Ok(Box::new(std::io::sink()));
        }
        let resume = self.args.resume;
        let path = self.args.out.join("loss.csv");
        let mut f = std::fs::OpenOptions::new().create(true).append(resume).write(true).truncate(!resume).open(path)?;
        if !resume {
            writeln!(f, "iter,train_loss,val_loss,val_se")?;
        }
        Ok(Box::new(f))
    }
}

/// Time of the timed iterations (after the first 10 of a run, which hold the warmup and capture).
#[derive(Default)]
struct Timing {
    iters: u64,
    secs: f64,
}

fn main() -> Result<()> {
    let run = Run::new(cli::args_or_exit("gpt", USAGE, parse_args()))?;
    let (args, device) = (&run.args, run.device);
    if let Some(dir) = &args.trajectory {
        let Arch::Gpt(config) = run.config else { bail!("--trajectory trains the GPT") };
        let spec = trajectory::Spec { config, hyper: run.hyper, steps: args.iters as usize, seed: args.seed };
        let t = trajectory::run(dir, &spec, &run.corpus.train, Some(&run.corpus.val), device)?;
        println!("trajectory in {}: {t}", dir.display());
        return Ok(());
    }
    tch::manual_seed(args.seed);
    let vs = nn::VarStore::new(device);
    let model = run.config.build(&vs.root());
    if let Some(pg) = &run.pg {
        broadcast_parameters(pg, &vs)?;
        tch::manual_seed(run.seed); // each rank its own batches and dropout masks
    }
    let params = Arch::param_count(&vs);
    let mut steps = match &run.pg {
        Some(pg) => step::build_ddp(&vs, model.as_ref(), run.hyper, pg)?,
        None => step::build(&vs, model.as_ref(), run.hyper)?,
    };
    println!("{}", run.describe(params));
    let timing = train(&run, &vs, &mut steps, params)?;
    if device != Device::Cpu {
        synchronize(device)?;
    }
    if let Some(pg) = &run.pg {
        pg.barrier()?; // no rank leaves while another still reduces with it
        synchronize(device)?;
    }
    if run.lead() {
        report(&run, model.as_ref(), &timing, params)?;
    }
    Ok(())
}

/// The training loop from the start or the checkpoint (`--resume`): a progress bar with loss,
/// tokens/s and MFU, and every `--eval-every` iterations an evaluation, a row of the curve and a
/// checkpoint (rank 0), then a reseed from (seed, iteration) on every rank.
fn train(run: &Run, vs: &nn::VarStore, steps: &mut step::Steps<'_>, params: i64) -> Result<Timing> {
    let (args, (batch, block)) = (&run.args, (run.hyper.batch, run.config.block()));
    let ckpt = args.out.join("ckpt.safetensors");
    let first = if args.resume { resume(run, vs, steps, &ckpt)? } else { 0 };
    let mut csv = run.csv()?;
    let bar = if run.lead() { ProgressBar::new(args.iters) } else { ProgressBar::hidden() };
    bar.set_style(ProgressStyle::with_template("[{bar:30}] {pos}/{len} {msg}")?.progress_chars("#>."));
    bar.set_position(first);
    let flops_per_iter = run.config.flops_per_token(params) * run.tokens_per_iter();
    let (mut meter, mut timing, mut clock) = (DeviceMeter::new(), Timing::default(), Instant::now());
    for iter in first..args.iters {
        let (x, y) = data::batch(&run.corpus.train, batch * args.accum, block)?;
        let shape = [args.accum, batch, block];
        meter.add(&steps.train.run(&[&x.view(shape), &y.view(shape)])?[0])?;
        bar.inc(1);
        let done = iter + 1;
        if done % 10 == 0 || done == args.iters {
            let loss = meter.take()?.unwrap_or(f64::NAN); // one sync per 10 iterations
            let secs = clock.elapsed().as_secs_f64();
            if iter >= first + 10 {
                (timing.iters, timing.secs) = (timing.iters + 10, timing.secs + secs);
            }
            clock = Instant::now();
            let per_iter = secs / 10.0;
            let tokens = run.tokens_per_iter() / per_iter;
            let mfu = flops_per_iter / per_iter / (args.peak_tflops * 1e12) * 100.0;
            bar.set_message(format!("loss {loss:.4}, {:.2} ms/iter, {tokens:.0} tok/s, MFU {mfu:.1}%", per_iter * 1e3));
        }
        if done % args.eval_every == 0 || done == args.iters {
            if run.lead() {
                let (train_loss, _) = evaluate(&mut steps.eval, &run.corpus.train, batch, block, args.eval_iters)?;
                let (val_loss, val_se) = evaluate(&mut steps.eval, &run.corpus.val, batch, block, args.eval_iters)?;
                writeln!(csv, "{done},{train_loss:.5},{val_loss:.5},{val_se:.5}")?;
                bar.suspend(|| {
                    println!("iter {done}: train loss {train_loss:.4}, val loss {val_loss:.4} (± {val_se:.4})")
                });
            }
            write_checkpoint(run, vs, steps, &ckpt, done)?;
            clock = Instant::now();
            // What follows a checkpoint draws from (seed, iteration), on every rank, so a run
            // resumed from it gets the same batches and dropout masks as the run that went on.
            tch::manual_seed(run.seed.wrapping_add(done as i64));
        }
        if args.stop_at == Some(done) {
            bar.suspend(|| println!("stopped after iteration {done} (--stop-at)"));
            break;
        }
    }
    bar.finish_and_clear();
    Ok(timing)
}

/// Rank 0 writes the checkpoint: the model, the optimizer's state, the iteration and the
/// schedule's step. With `--zero` the optimizer's state is gathered from every rank first, so
/// every rank takes part.
fn write_checkpoint(
    run: &Run,
    vs: &nn::VarStore,
    steps: &step::Steps<'_>,
    path: &std::path::Path,
    done: u64,
) -> Result<()> {
    if !run.lead() && !run.hyper.zero {
        return Ok(());
    }
    let state = steps.train.state().state()?;
    if run.lead() {
        let it = Tensor::from(done as i64);
        let extra = [("iter", &it), ("schedule", &steps.schedule_step)];
        checkpoint::save_state(path, vs, &state, &extra)?;
    }
    Ok(())
}

/// Loads the checkpoint into the model, the optimizer and the schedule; the iteration it holds.
fn resume(run: &Run, vs: &nn::VarStore, steps: &mut step::Steps<'_>, ckpt: &std::path::Path) -> Result<u64> {
    let extra = checkpoint::load(ckpt, vs, steps.train.state_mut())
        .with_context(|| format!("resuming from {}", ckpt.display()))?;
    let first = extra["iter"].int64_value(&[]) as u64;
    steps.schedule_step.shallow_clone().copy_(&extra["schedule"]);
    // the random stream of every checkpointed iteration starts from (seed, iteration)
    tch::manual_seed(run.seed.wrapping_add(first as i64));
    println!("resumed from {} at iteration {first}", ckpt.display());
    Ok(first)
}

/// Rank 0's last words: the speed, and text sampled by a captured decode step on a GPU (static
/// shapes, a device-side position), eagerly on the CPU.
fn report(run: &Run, model: &dyn lm::LanguageModel, timing: &Timing, params: i64) -> Result<()> {
    let args = &run.args;
    if timing.iters > 0 {
        let per_iter = timing.secs / timing.iters as f64;
        let flops = run.config.flops_per_token(params) * run.tokens_per_iter();
        println!(
            "{:.2} ms/iter, {:.0} tokens/s, MFU {:.1}% (of {} TFLOP/s), over {} iterations after the first 10",
            per_iter * 1e3,
            run.tokens_per_iter() / per_iter,
            flops / per_iter / (args.peak_tflops * 1e12) * 100.0,
            args.peak_tflops,
            timing.iters
        );
    }
    let device = run.device;
    let tokens = sample::sample(model, device, 0, args.sample as i64, device != Device::Cpu)?;
    let text: String = tokens.into_iter().map(data::decode).collect();
    std::fs::write(args.out.join("sample.txt"), &text)?;
    let ckpt = args.out.join("ckpt.safetensors");
    println!("loss curve: {}; checkpoint: {}", args.out.join("loss.csv").display(), ckpt.display());
    println!("--- sampled ---\n{text}\n---");
    Ok(())
}
