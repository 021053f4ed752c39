//! Benchmark: nanoGPT's training step (`examples/gpt`: the same model and step code) captured by
//! this crate, beside PyTorch's eager, `torch.cuda.graph`, `torch.compile` and `torch.compile` +
//! graph of the same model and step (`benches/torch_gpt.py`) on the same GPU in the same run.
//! Rows: the character GPT (6 × 384, block 256) at batch 64 and 8, and GPT-2 small's shape (12 ×
//! 768, block 1024, vocabulary 50,304) at batch 12; then batch 64 and GPT-2's shape again with
//! GELU's tanh approximation (`_tanh`: PyTorch's `approximate="tanh"`, the crate's fused step
//! computing it in the MLP's GEMM epilogues). bf16 autocast, clipping at 1.0, fused
//! AdamW; random tokens. Median ms per iteration over blocks of 10 iterations after 10 warmup
//! iterations; tokens/s and MFU (nanoGPT's FLOP estimate, of `--peak-tflops`). Memory: the
//! allocator's reserved bytes at peak (this crate: captured, and the same step eager).
//!
//! `cargo bench --bench gpt -- [--iters N] [--rows NAME,...] [--no-torch] [--peak-tflops T]`
//! (or `make bench-gpt`); `--profile` for the step's kernels by family, `--floors` for the fused
//! norm beside a copy of its bytes (`floors.rs`).

mod floors;
mod kernel_profile;
#[path = "../examples/gpt/lm.rs"]
mod lm;
#[path = "../examples/gpt/model.rs"]
mod model;
mod reference;
#[path = "../examples/gpt/step.rs"]
mod step;
mod timing;

use std::fmt::Write as _;
use tch::{nn, Device, Kind, Tensor};
use tch_cuda_graphs::transformer::Activation;
use tch_cuda_graphs::{empty_cache, memory_stats, reset_peak_stats, synchronize, Result};

/// name, model shape, batch
fn rows() -> Vec<(&'static str, model::Config, i64)> {
    vec![
        ("char_b64", model::Config::shakespeare_char(96), 64),
        ("char_b8", model::Config::shakespeare_char(96), 8),
        ("gpt2_small_b12", model::Config::gpt2_small(50304), 12),
        ("char_b64_tanh", tanh(model::Config::shakespeare_char(96)), 64),
        ("gpt2_small_b12_tanh", tanh(model::Config::gpt2_small(50304)), 12),
    ]
}

/// The same model with GELU's tanh approximation (with `fused`, in the MLP's GEMM epilogues).
fn tanh(c: model::Config) -> model::Config {
    model::Config { activation: Activation::GeluTanh, ..c }
}

const USAGE: &str = "\
usage: gpt [--iters N] [--rows NAME,...] [--no-torch] [--peak-tflops T] [--chunked-loss] [--timed-gemms [--gemm-file F]] [--profile [--fused] [--top N]] [--floors [--peak-tbps T]]

nanoGPT's training step captured by this crate (with ATen's norms, and with the crate's fused
norms and weight shadows: `--fused` in examples/gpt), beside PyTorch's eager, graph, compile and compile + graph
modes of the same step.
  --iters N          timed iterations per row (default 200; a quarter for GPT-2 small's shape)
  --rows NAME,...    char_b64, char_b8, gpt2_small_b12, and the first and last with GELU's
                     tanh form, char_b64_tanh, gpt2_small_b12_tanh (default all)
  --no-torch         skip PyTorch's side (benches/torch_gpt.py)
  --peak-tflops T    the GPU's dense bf16 peak for MFU (default 989, an H100/H200 SXM)
  --chunked-loss     the fused steps run the head and the loss in chunks of rows
                     (loss::f_linear_cross_entropy: the logits never all in memory)
  --timed-gemms      the fused steps measured again with the GEMMs' algorithms timed
                     (gemm::GemmChoice::Timed), in two more columns; with --profile, the
                     profiled step's GEMMs are timed
  --gemm-file F      with --timed-gemms: the choices read from F where it exists, written to F
                     after (gemm::f_read_file, gemm::f_write_file)
  --profile          only: 10 replays of the first row's captured step under the crate's
                     profiler, kernel time per replay grouped by kernel family
  --fused            with --profile: the step with the crate's fused norms and weight shadows
  --top N            with --profile: list the N kernels that take longest (default 12)
  --floors           only: the fused norm's forward and backward at each row's shape beside a
                     copy of the bytes they must move (TB/s, and the share of --peak-tbps)
  --peak-tbps T      the GPU's memory bandwidth for --floors (default 4.8, an H200's HBM3e)
  -h, --help         this text";

struct Args {
    chunked_loss: bool,
    timed_gemms: bool,
    gemm_file: Option<String>,
    profile: bool,
    floors: bool,
    peak_tbps: f64,
    fused: bool,
    top: usize,
    iters: usize,
    rows: Vec<String>,
    torch: bool,
    peak_tflops: f64,
}

/// The command line: `None` when it asked for the usage.
fn parse_args() -> std::result::Result<Option<Args>, lexopt::Error> {
    use lexopt::prelude::*;
    let all: Vec<&str> = rows().iter().map(|r| r.0).collect();
    let rows = all.iter().map(|r| r.to_string()).collect();
    let mut a = Args {
        chunked_loss: false,
        timed_gemms: false,
        gemm_file: None,
        profile: false,
        floors: false,
        peak_tbps: 4.8,
        fused: false,
        top: 12,
        iters: 200,
        rows,
        torch: true,
        peak_tflops: 989.0,
    };
    let mut parser = lexopt::Parser::from_env();
    while let Some(arg) = parser.next()? {
        match arg {
            Long("iters") => a.iters = parser.value()?.parse()?,
            Long("rows") => a.rows = reference::parse_rows(&parser.value()?.string()?, &all)?,
            Long("no-torch") => a.torch = false,
            Long("peak-tflops") => a.peak_tflops = parser.value()?.parse()?,
            Long("profile") => a.profile = true,
            Long("floors") => a.floors = true,
            Long("peak-tbps") => a.peak_tbps = parser.value()?.parse()?,
            Long("fused") => a.fused = true,
            Long("top") => a.top = parser.value()?.parse()?,
            Long("chunked-loss") => a.chunked_loss = true,
            Long("timed-gemms") => a.timed_gemms = true,
            Long("gemm-file") => a.gemm_file = Some(parser.value()?.string()?),
            Short('h') | Long("help") => return Ok(None),
            Long("bench") => {} // cargo bench passes --bench
            _ => return Err(arg.unexpected()),
        }
    }
    a.iters = a.iters.max(20);
    Ok(Some(a))
}

/// This crate's step of one row, captured (or eager): ms per iteration, MiB reserved at peak,
/// parameters.
fn ours(device: Device, config: model::Config, batch: i64, iters: usize, eager: bool) -> Result<(f64, f64, i64)> {
    // the fused step: fused norms and weight shadows
    let shadows = config.fused;
    synchronize(device)?;
    empty_cache()?;
    reset_peak_stats(device)?;
    tch::manual_seed(0);
    let vs = nn::VarStore::new(device);
    let gpt = model::Gpt::new(&vs.root(), config);
    let params = model::Gpt::param_count(&vs);
    let hyper = step::Hyper { batch, eager, shadows, ..Default::default() };
    let mut steps = step::build(&vs, &gpt, hyper)?;
    let data = Tensor::f_randint(config.vocab, [8, 1, batch, config.block + 1], (Kind::Int64, device))?;
    let ms = timing::median_ms(device, iters, |i| {
        let w = data.f_get((i % 8) as i64)?;
        let (x, y) = (w.f_narrow(2, 0, config.block)?, w.f_narrow(2, 1, config.block)?);
        steps.train.run(&[&x, &y])?;
        Ok(())
    })?;
    let peak = memory_stats(device)?.reserved_peak as f64 / (1u64 << 20) as f64;
    Ok((ms, peak, params))
}

fn main() {
    let args = reference::args_or_exit("gpt", parse_args(), USAGE);
    reference::require_cuda("gpt");
    if args.floors {
        let named = rows()
            .into_iter()
            .filter(|r| args.rows.iter().any(|n| n == r.0) && !r.0.ends_with("_tanh"))
            .map(|(name, c, batch)| {
                Ok((name.to_owned(), floors::norm(Device::Cuda(0), batch * c.block, c.embd, c.dropout)?))
            })
            .collect::<Result<Vec<_>>>()
            .expect("the floors");
        println!("{}", floors::report(&named, args.peak_tbps));
        return;
    }
    if args.profile {
        let row = rows().into_iter().find(|r| args.rows.iter().any(|n| n == r.0)).expect("a row");
        let (name, config, batch) = row;
        let config = model::Config { chunked_loss: args.chunked_loss, ..config };
        let run = || profile(Device::Cuda(0), (name, config, batch), &args).expect("the profile");
        if args.timed_gemms {
            reference::with_timed_gemms(args.gemm_file.as_deref(), run).expect("timed GEMMs");
        } else {
            run();
        }
        return;
    }
    if args.torch {
        reference::require_torch("gpt");
    }
    let ours = measure_ours(Device::Cuda(0), &args);
    let torch = if args.torch { measure_torch(&args) } else { Torch::default() };
    let (table, memory) = tables(&args, ours, &torch);
    println!("\nms per iteration (median), same GPU, same run; MFU of {} TFLOP/s\n", args.peak_tflops);
    println!("{table}");
    println!("MiB reserved at peak (the allocator's), the whole step\n");
    println!("{memory}");
}

/// One row measured on the crate's side.
struct OursRow {
    name: &'static str,
    config: model::Config,
    batch: i64,
    /// ms per iteration: the step as written, fused.
    ms: (f64, f64),
    /// ms per iteration of the fused step with its GEMMs' algorithms timed (`--timed-gemms`).
    timed_ms: Option<f64>,
    /// MiB reserved at peak by the captured step as written.
    peak: f64,
    /// With the eager steps measured (char_b64 only): eager, fused graph, fused eager peaks.
    eager_peak: Option<(f64, f64, f64)>,
    params: i64,
}

/// The crate's captured steps (as written and fused) of every row asked for, and their peaks.
fn measure_ours(device: Device, args: &Args) -> Vec<OursRow> {
    let mut rows_out = Vec::new();
    for (name, config, batch) in rows().into_iter().filter(|r| args.rows.iter().any(|n| n == r.0)) {
        let iters = if name.starts_with("gpt2") { args.iters / 4 } else { args.iters };
        let (ms, peak, params) = ours(device, config, batch, iters, false).expect("the captured step");
        println!("  {name:<16} this crate, graph {ms:8.3} ms/iter, {peak:6.0} MiB reserved at peak");
        let fused = model::Config { fused: true, chunked_loss: args.chunked_loss, ..config };
        let (fms, fpeak, _) = ours(device, fused, batch, iters, false).expect("the fused captured step");
        println!("  {name:<16} this crate, fused graph {fms:8.3} ms/iter, {fpeak:6.0} MiB reserved at peak");
        let timed_ms = args.timed_gemms.then(|| {
            let measure = || ours(device, fused, batch, iters, false).expect("the fused step, timed GEMMs");
            let (tms, tpeak, _) = reference::with_timed_gemms(args.gemm_file.as_deref(), measure).expect("timed GEMMs");
            println!(
                "  {name:<16} this crate, fused graph, timed GEMMs {tms:8.3} ms/iter, {tpeak:6.0} MiB reserved at peak"
            );
            tms
        });
        let eager_peak = if name == "char_b64" {
            let (ems, epeak, _) = ours(device, config, batch, 20, true).expect("the eager step");
            println!("  {name:<16} this crate, eager {ems:8.3} ms/iter, {epeak:6.0} MiB reserved at peak");
            let (_, fepeak, _) = ours(device, fused, batch, 20, true).expect("the fused eager step");
            Some((epeak, fpeak, fepeak))
        } else {
            None
        };
        rows_out.push(OursRow { name, config, batch, ms: (ms, fms), timed_ms, peak, eager_peak, params });
    }
    rows_out
}

/// PyTorch's figures: (row, mode, ms per iteration) and (row, mode, MiB at peak).
#[derive(Default)]
struct Torch {
    ms: Vec<(String, String, f64)>,
    mem: Vec<(String, String, f64)>,
}

impl Torch {
    fn find(v: &[(String, String, f64)], row: &str, mode: &str) -> f64 {
        v.iter().find(|(r, m, _)| r == row && m == mode).map_or(f64::NAN, |t| t.2)
    }
}

/// benches/torch_gpt.py on the same rows, same GPU, same run.
fn measure_torch(args: &Args) -> Torch {
    println!("PyTorch (benches/torch_gpt.py), same GPU, same run:");
    let out = reference::run_rows_or_exit("gpt", "benches/torch_gpt.py", &args.rows, args.iters, &[]);
    let mut torch = Torch::default();
    for line in out.lines() {
        let f: Vec<&str> = line.split(',').collect();
        match (f.first(), f.len(), f.get(3).and_then(|v| v.parse::<f64>().ok())) {
            (Some(&"ROW"), 4, Some(v)) => torch.ms.push((f[1].into(), f[2].into(), v)),
            (Some(&"MEM"), 4, Some(v)) => torch.mem.push((f[1].into(), f[2].into(), v)),
            _ => println!("  torch: {line}"),
        }
    }
    torch
}

/// The speed table and the memory table.
fn tables(args: &Args, ours: Vec<OursRow>, torch: &Torch) -> (String, String) {
    let mut table = String::from(
        "| row | params | tokens/iter | this crate: graph | **fused graph** | tok/s | MFU | torch eager | torch graph | torch compile | compile + graph | graph / torch graph | fused / compile + graph |",
    );
    table += if args.timed_gemms { " fused, timed GEMMs | timed / compile + graph |\n" } else { "\n" };
    table += "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|";
    table += if args.timed_gemms { "---:|---:|\n" } else { "\n" };
    let mut memory = String::from(
        "| row | this crate: graph | eager | graph / eager | fused graph | fused eager | fused graph / eager | torch eager | torch graph | graph / eager | torch compile + graph |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for OursRow { name, config, batch, ms: (ms, fms), timed_ms, peak, eager_peak, params } in ours {
        let tokens = batch * config.block;
        let mfu = config.flops_per_token(params) * tokens as f64 / (fms * 1e-3) / (args.peak_tflops * 1e12) * 100.0;
        let t = |m: &str| Torch::find(&torch.ms, name, m);
        let _ = write!(
            table,
            "| {name} | {:.2} M | {tokens} | {ms:.2} | **{fms:.2}** | {:.0} | {mfu:.1}% | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} |",
            params as f64 / 1e6,
            tokens as f64 / (fms * 1e-3),
            t("eager"),
            t("graph"),
            t("compile"),
            t("compile_graph"),
            ms / t("graph"),
            fms / t("compile_graph"),
        );
        match timed_ms {
            Some(tms) => {
                let _ = writeln!(table, " {tms:.2} | {:.2} |", tms / t("compile_graph"));
            }
            None => table.push('\n'),
        }
        if let Some((e, fpeak, fe)) = eager_peak {
            let tm = |m: &str| Torch::find(&torch.mem, name, m);
            let _ = writeln!(
                memory,
                "| {name} | {peak:.0} | {e:.0} | {:.2} | {fpeak:.0} | {fe:.0} | {:.2} | {:.0} | {:.0} | {:.2} | {:.0} |",
                peak / e,
                fpeak / fe,
                tm("eager"),
                tm("graph"),
                tm("graph") / tm("eager"),
                tm("compile_graph"),
            );
        }
    }
    (table, memory)
}

/// Kernel time of one replay of the captured step, grouped by family (10 replays profiled).
fn profile(device: Device, (name, config, batch): (&str, model::Config, i64), args: &Args) -> Result<()> {
    let fused = args.fused;
    let config = model::Config { fused, ..config };
    tch::manual_seed(0);
    let vs = nn::VarStore::new(device);
    let gpt = model::Gpt::new(&vs.root(), config);
    let hyper = step::Hyper { batch, shadows: fused, ..Default::default() };
    let mut steps = step::build(&vs, &gpt, hyper)?;
    let data = Tensor::f_randint(config.vocab, [1, batch, config.block + 1], (Kind::Int64, device))?;
    let (x, y) = (data.f_narrow(2, 0, config.block)?, data.f_narrow(2, 1, config.block)?);
    for _ in 0..10 {
        steps.train.run(&[&x, &y])?; // warmup, capture, replays
    }
    let what = if fused { "fused " } else { "" };
    let times = kernel_profile::measure(device, 10, || steps.train.replay().map(drop))?;
    println!("{name}: kernel time of one replay of the {what}captured step, by family (10 replays profiled)\n");
    println!("{}", kernel_profile::report(&[(name, &times)], args.top));
    println!("GPU busy {:.0} µs of a {:.0} µs span per replay", times.busy_us, times.span_us);
    Ok(())
}
