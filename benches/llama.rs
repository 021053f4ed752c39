//! Benchmark: a Llama-style training step (`examples/gpt/llama.rs`) captured by this crate, as
//! written (ATen's operators: the plain graph a tch user gets) and on the crate's fused layers
//! (RMSNorm with the residual add, rotary embeddings, SwiGLU, float32 weight gradients, the
//! cross-entropy, weight shadows), beside PyTorch's eager, `torch.cuda.graph`, `torch.compile`
//! and compile + graph of the same model and step (`benches/torch_llama.py`), same GPU, same run.
//! Rows: 6 × 384 (6 heads / 2 KV, SwiGLU 1024, block 256, batch 64, vocabulary 96) and
//! 12 × 768 (12 heads / 4 KV, SwiGLU 2048, block 1024, batch 12, vocabulary 32,000, untied).
//! bf16 autocast, clipping at 1.0, fused AdamW (betas 0.9 / 0.95, decay 0.1 on matrices);
//! random tokens. Median ms per iteration over blocks of 10 after 10 warmup iterations; memory:
//! the allocator's reserved bytes at peak.
//!
//! `cargo bench --bench llama -- [--iters N] [--rows small,base] [--no-torch] [--power]`

mod kernel_profile;
#[path = "../examples/gpt/lm.rs"]
mod lm;
#[path = "../examples/gpt/llama.rs"]
mod model;
mod power;
mod reference;
mod timing;

use std::fmt::Write as _;
use std::time::Duration;
use tch::{nn, Device, Kind, Tensor};
use tch_cuda_graphs::linear::WeightGrad;
use tch_cuda_graphs::optim::{decay_groups, Adam, AdamConfig, Optimizer};
use tch_cuda_graphs::{amp, empty_cache, memory_stats, reset_peak_stats, synchronize};
use tch_cuda_graphs::{Result, StepOptions, TrainStep};

const USAGE: &str = "\
usage: llama [--iters N] [--rows small,base] [--no-torch] [--power] [--expand-kv] [--swiglu-apart] [--rotary-apart] [--rounded-grads] [--logits-loss] [--timed-gemms [--gemm-file F]] [--profile]

A Llama-style step captured by this crate (plain and fused) beside PyTorch's four modes.
  --iters N        timed iterations per row (default 200; a quarter for the base row)
  --rows NAME,...  small, base (default both)
  --no-torch       skip PyTorch's side (benches/torch_llama.py)
  --power          every mode timed at the state of a long run (3 s of steps, then 5 s timed,
                   instead of --iters) with the GPU's power draw and SM clock sampled through the
                   timed window (nvidia-smi), and a second table: watts, MHz, joules per step
  --expand-kv      this crate's rows with the key and value heads expanded to every query head
                   before attention, instead of SDPA's enable_gqa
  --swiglu-apart   the fused rows' MLPs as three layers (w13, SwiGLU, w2), instead of
                   mlp::f_swiglu_mlp with SwiGLU's backward in w2's GEMM
  --rotary-apart   the fused rows' wqkv and rotary embeddings as two calls (Linear::f_forward,
                   Rotary::f_forward_qkv), instead of Rotary::f_project_qkv (q and k rotated in
                   the projection's GEMM)
  --timed-gemms    the fused rows measured again with the GEMMs' algorithms timed
                   (gemm::GemmChoice::Timed), in two more columns; with --profile, both
                   profiled steps' GEMMs are timed
  --gemm-file F    with --timed-gemms: the choices read from F where it exists, written to F
                   after (gemm::f_read_file, gemm::f_write_file)
  --rounded-grads  the fused rows' weight gradients in bf16, then cast (WeightGrad::Rounded),
                   instead of float32 from the GEMM
  --logits-loss    the fused rows' head writing its logits and the fused cross-entropy over
                   them, instead of the head and loss in one call with the exponentials in the
                   head's GEMM (LinearCrossEntropyMethod::ExpInHead)
  --profile        only: kernel time of one replay of each row's step, as written and fused,
                   grouped by kernel family (10 replays under the crate's profiler)
  -h, --help       this text";

struct Args {
    iters: usize,
    rows: Vec<String>,
    torch: bool,
    power: bool,
    expand_kv: bool,
    swiglu_apart: bool,
    rotary_apart: bool,
    rounded_grads: bool,
    timed_gemms: bool,
    logits_loss: bool,
    gemm_file: Option<String>,
    profile: bool,
}

fn parse_args() -> std::result::Result<Option<Args>, lexopt::Error> {
    use lexopt::prelude::*;
    let mut a = Args {
        iters: 200,
        rows: vec!["small".into(), "base".into()],
        torch: true,
        power: false,
        expand_kv: false,
        swiglu_apart: false,
        rotary_apart: false,
        rounded_grads: false,
        timed_gemms: false,
        logits_loss: false,
        gemm_file: None,
        profile: false,
    };
    let mut parser = lexopt::Parser::from_env();
    while let Some(arg) = parser.next()? {
        match arg {
            Long("iters") => a.iters = parser.value()?.parse()?,
            Long("rows") => a.rows = reference::parse_rows(&parser.value()?.string()?, &["small", "base"])?,
            Long("no-torch") => a.torch = false,
            Long("power") => a.power = true,
            Long("expand-kv") => a.expand_kv = true,
            Long("swiglu-apart") => a.swiglu_apart = true,
            Long("rotary-apart") => a.rotary_apart = true,
            Long("rounded-grads") => a.rounded_grads = true,
            Long("timed-gemms") => a.timed_gemms = true,
            Long("logits-loss") => a.logits_loss = true,
            Long("gemm-file") => a.gemm_file = Some(parser.value()?.string()?),
            Long("profile") => a.profile = true,
            Long("bench") => {}
            Short('h') | Long("help") => return Ok(None),
            _ => return Err(arg.unexpected()),
        }
    }
    Ok(Some(a))
}

/// name, model shape, batch
fn rows() -> [(&'static str, model::Config, i64); 2] {
    [("small", model::Config::small(96), 64), ("base", model::Config::base(32000), 12)]
}

/// Builds the captured step of one row (its variables, optimizer, weight shadows when fused)
/// and hands it to `f` with 8 batches of random tokens `[8, batch, block + 1]`.
fn with_step<R>(
    device: Device,
    config: model::Config,
    batch: i64,
    f: impl FnOnce(&mut TrainStep<'_, Adam>, &Tensor) -> Result<R>,
) -> Result<R> {
    tch::manual_seed(0);
    let vs = nn::VarStore::new(device);
    let llama = model::Llama::new(&vs.root(), config);
    let cfg = AdamConfig::adamw().lr(3e-4).betas(0.9, 0.95).weight_decay(0.1);
    let opt = Adam::with_groups(decay_groups(&vs, cfg, cfg.weight_decay(0.0)))?;
    let options = StepOptions::default().autocast(Kind::BFloat16).weight_shadows(config.fused);
    let tokens = Tensor::zeros([batch, config.block], (Kind::Int64, device));
    let llama = &llama;
    let mut step = TrainStep::with_optimizer(opt, &[("x", &tokens), ("y", &tokens)], options, move |opt, inp| {
        opt.zero_grad()?;
        let loss = llama.loss(&inp[0], &inp[1])?;
        amp::backward(&loss)?;
        let _norm = opt.step_clipped(1.0)?; // clip_grad_norm_(1.0), then step
        Ok(vec![loss.detach()])
    })?;
    let data = Tensor::f_randint(config.vocab, [8, batch, config.block + 1], (Kind::Int64, device))?;
    f(&mut step, &data)
}

/// How `--power` times a mode, on both sides: this long a warmup, then this long timed.
const POWER_WARMUP: Duration = Duration::from_secs(3);
const POWER_TIMED: Duration = Duration::from_secs(5);

/// The captured step of one row: ms per iteration, MiB reserved at peak, and with a sampler
/// (`--power`) the draw and clock through its timed window, timed at a long run's state.
fn ours(
    device: Device,
    config: model::Config,
    batch: i64,
    iters: usize,
    sampler: Option<&power::Sampler>,
) -> Result<(f64, f64, Option<power::Reading>)> {
    synchronize(device)?;
    empty_cache()?;
    reset_peak_stats(device)?;
    let (ms, reading) = with_step(device, config, batch, |step, data| {
        let run = |i: usize| {
            let w = data.f_get((i % 8) as i64)?;
            step.run(&[&w.f_narrow(1, 0, config.block)?, &w.f_narrow(1, 1, config.block)?])?;
            Ok(())
        };
        match sampler {
            None => Ok((timing::median_ms(device, iters, run)?, None)),
            Some(s) => {
                let (ms, from, to) = timing::steady_ms(device, POWER_WARMUP, POWER_TIMED, run)?;
                Ok((ms, s.over(from, to)))
            }
        }
    })?;
    Ok((ms, memory_stats(device)?.reserved_peak as f64 / (1u64 << 20) as f64, reading))
}

/// Kernel time of one replay of a row's captured step, as written and fused, by family.
fn profile(device: Device, name: &str, config: model::Config, batch: i64) -> Result<String> {
    let mut times = Vec::new();
    for fused in [false, true] {
        let config = model::Config { fused, ..config };
        times.push(with_step(device, config, batch, |step, data| {
            let w = data.f_get(0)?;
            let (x, y) = (w.f_narrow(1, 0, config.block)?, w.f_narrow(1, 1, config.block)?);
            for _ in 0..10 {
                step.run(&[&x, &y])?; // warmup, capture, replays
            }
            kernel_profile::measure(device, 10, || step.replay().map(drop))
        })?);
    }
    let titled = [("graph", &times[0]), ("fused graph", &times[1])];
    Ok(format!(
        "{name}: kernel time of one replay, µs (10 replays profiled)\n\n{}",
        kernel_profile::report(&titled, 40)
    ))
}

/// The rows `args` names, each with its config as `args` sets it.
fn chosen_rows(args: &Args) -> Vec<(&'static str, model::Config, i64)> {
    let weight_grad = if args.rounded_grads { WeightGrad::Rounded } else { WeightGrad::Float32 };
    rows()
        .into_iter()
        .filter(|r| args.rows.iter().any(|n| n == r.0))
        .map(|(name, c, batch)| {
            let config = model::Config {
                expand_kv: args.expand_kv,
                swiglu_apart: args.swiglu_apart,
                rotary_apart: args.rotary_apart,
                weight_grad,
                exp_loss: !args.logits_loss,
                ..c
            };
            (name, config, batch)
        })
        .collect()
}

/// This crate's rows: the graph, the fused graph and (with --timed-gemms) the fused graph with
/// timed GEMMs, each printed as it is measured; with a sampler (`--power`), each mode's draw.
fn measure_ours<'a>(
    device: Device,
    args: &Args,
    rows: &[(&'a str, model::Config, i64)],
    sampler: Option<&power::Sampler>,
) -> (Vec<OursRow<'a>>, Vec<PowerLine>) {
    let mut out = Vec::new();
    let mut drawn = Vec::new();
    for &(name, config, batch) in rows {
        let iters = if name == "base" { args.iters / 4 } else { args.iters };
        let fused = model::Config { fused: true, ..config };
        let mut measure = |config, mode: &str| {
            let (ms, peak, reading) = ours(device, config, batch, iters, sampler).expect("the captured step");
            println!("  {name:<6} this crate, {mode:<24} {ms:8.3} ms/iter, {peak:6.0} MiB reserved at peak");
            if let Some(r) = reading {
                drawn.push((name.to_string(), format!("this crate, {mode}"), ms, r.watts, r.mhz));
            }
            (ms, peak)
        };
        let plain = measure(config, "graph");
        let fast = measure(fused, "fused graph");
        let timed = args.timed_gemms.then(|| {
            reference::with_timed_gemms(args.gemm_file.as_deref(), || measure(fused, "fused graph, timed GEMMs"))
                .expect("timed GEMMs")
        });
        out.push((name, plain, fast, timed));
    }
    (out, drawn)
}

/// PyTorch's rows (benches/torch_llama.py, same GPU, same run): row, mode, ms, MiB, and with
/// `--power` each mode's draw; its other lines printed.
fn measure_torch(args: &Args) -> (Vec<TorchRow>, Vec<PowerLine>) {
    println!("PyTorch (benches/torch_llama.py), same GPU, same run:");
    let extra = if args.power { vec!["--power".to_string()] } else { Vec::new() };
    let out = reference::run_rows_or_exit("llama", "benches/torch_llama.py", &args.rows, args.iters, &extra);
    let (mut torch, mut drawn) = (Vec::new(), Vec::new());
    let num = |s: &str| s.parse::<f64>().unwrap_or(f64::NAN);
    for line in out.lines() {
        let f: Vec<&str> = line.split(',').collect();
        match (f.first(), f.len()) {
            (Some(&"ROW"), 5 | 7) => {
                torch.push((f[1].into(), f[2].into(), num(f[3]), num(f[4])));
                if f.len() == 7 {
                    drawn.push((
                        f[1].into(),
                        format!("torch {}", f[2].replace('_', " + ")),
                        num(f[3]),
                        num(f[5]),
                        num(f[6]),
                    ));
                }
            }
            _ => println!("  torch: {line}"),
        }
    }
    (torch, drawn)
}

/// One mode of PyTorch's: row, mode, ms per iteration, MiB reserved at peak.
type TorchRow = (String, String, f64, f64);

/// One mode's draw at a long run's state (`--power`): row, mode, ms per iteration, W, SM MHz.
type PowerLine = (String, String, f64, f64, f64);

/// The `--power` table: each mode's time, mean draw and SM clock through its timed window, and
/// its energy per step (time × draw), the fused graph's row beside compile + graph's.
fn power_table(lines: &[PowerLine]) -> String {
    let mut s = String::from("| row | mode | ms per iteration | W (mean draw) | SM MHz (mean) | J per step |\n");
    s += "|---|---|---:|---:|---:|---:|\n";
    for (row, mode, ms, watts, mhz) in lines {
        let _ = writeln!(s, "| {row} | {mode} | {ms:.2} | {watts:.0} | {mhz:.0} | {:.2} |", ms * watts / 1e3);
    }
    for row in lines.iter().map(|l| &l.0).collect::<std::collections::BTreeSet<_>>() {
        let find = |mode: &str| lines.iter().find(|l| &l.0 == row && l.1 == mode);
        if let (Some(f), Some(c)) = (find("this crate, fused graph"), find("torch compile + graph")) {
            let _ = writeln!(
                s,
                "\n{row}: fused / compile + graph {:.3} in time, {:.3} in energy per step, {:.3} in mean draw",
                f.2 / c.2,
                f.2 * f.3 / (c.2 * c.3),
                f.3 / c.3
            );
        }
    }
    s
}

fn main() {
    let args = reference::args_or_exit("llama", parse_args(), USAGE);
    reference::require_cuda("llama");
    let device = Device::Cuda(0);
    let rows = chosen_rows(&args);
    if args.profile {
        for &(name, config, batch) in &rows {
            let run = || profile(device, name, config, batch).expect("the profile");
            let report = if args.timed_gemms {
                reference::with_timed_gemms(args.gemm_file.as_deref(), run).expect("timed GEMMs")
            } else {
                run()
            };
            println!("{report}");
        }
        return;
    }
    if args.torch {
        reference::require_torch("llama");
    }
    let sampler = args.power.then(|| {
        power::Sampler::start(0).unwrap_or_else(|why| {
            eprintln!("bench llama: --power cannot sample the GPU's draw: {why}");
            std::process::exit(1)
        })
    });
    let (ours_rows, mut drawn) = measure_ours(device, &args, &rows, sampler.as_ref());
    drop(sampler); // PyTorch's side samples its own windows
    let torch = if args.torch { measure_torch(&args) } else { (Vec::new(), Vec::new()) };
    println!("\n{}", table(&ours_rows, &torch.0));
    if args.power {
        drawn.extend(torch.1);
        println!(
            "At a long run's state ({} s of steps, then {} s timed), draw sampled by nvidia-smi:\n\n{}",
            POWER_WARMUP.as_secs(),
            POWER_TIMED.as_secs(),
            power_table(&drawn)
        );
    }
}

/// ms per iteration (MiB reserved at peak) per mode, and the fused graph over compile + graph.
/// A measured mode: ms per iteration, MiB reserved at peak.
type Figure = (f64, f64);

/// One row of this crate's: the graph, the fused graph, and the fused graph with timed GEMMs.
type OursRow<'a> = (&'a str, Figure, Figure, Option<Figure>);

fn table(ours: &[OursRow], torch: &[TorchRow]) -> String {
    let find = |row: &str, mode: &str| {
        torch.iter().find(|t| t.0 == row && t.1 == mode).map_or((f64::NAN, f64::NAN), |t| (t.2, t.3))
    };
    let timed = ours.iter().any(|r| r.3.is_some());
    let mut s = String::from(
        "| row | torch eager | torch graph | torch compile | torch compile + graph | **this crate, graph** | **this crate, fused graph** | fused / compile + graph |",
    );
    s += if timed { " fused, timed GEMMs | timed / compile + graph |\n" } else { "\n" };
    s += "|---|---:|---:|---:|---:|---:|---:|---:|";
    s += if timed { "---:|---:|\n" } else { "\n" };
    for (name, (g, gm), (f, fm), t) in ours {
        let cell = |(ms, mib): Figure| format!("{ms:.2} ({mib:.0})");
        let cg = find(name, "compile_graph");
        let _ = write!(
            s,
            "| {name} | {} | {} | {} | {} | **{}** | **{}** | {:.2} |",
            cell(find(name, "eager")),
            cell(find(name, "graph")),
            cell(find(name, "compile")),
            cell(cg),
            cell((*g, *gm)),
            cell((*f, *fm)),
            f / cg.0
        );
        match t {
            Some((tms, tm)) => {
                let _ = writeln!(s, " {} | {:.2} |", cell((*tms, *tm)), tms / cg.0);
            }
            None => s.push('\n'),
        }
    }
    s
}
