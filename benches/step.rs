//! Benchmark: one training step of three models with three optimizers, in three modes (tch
//! eager with tch's optimizer, tch eager with this crate's fused optimizer, this crate's
//! captured step replayed), side by side with PyTorch (`torch_reference.py`: eager, and
//! `torch.cuda.graph` with capturable / fused optimizers) on the same GPU in the same run.
//!
//! `cargo bench --bench step -- [--out DIR] [--steps N] [--no-torch]` (or `make bench`)
//! Prints its tables, the headline one last, and writes DIR/results.json, DIR/results.csv,
//! DIR/table.md and DIR/chart.svg (the headline table drawn by `benches/plot.py`, standard
//! library only). DIR defaults to target/bench. PyTorch's side runs under the venv's Python
//! (`scripts/setup.sh`; `TCG_PYTHON` overrides); without torch there the benchmark says so and
//! exits 1 before measuring anything, unless `--no-torch` is given.
//!
//! `--profile-small` captures only the small MLP's Adam step (kept graph), prints its node
//! counts and replays it 3 times, for `ncu` (`benches/torch_profile_small.py` is PyTorch's
//! counterpart); with `--feed` it also times replay alone against the fed `run()`.
//!
//! The optimizer alone (`opt_own`, `opt_torch`: this crate's kernels and PyTorch's fused ones,
//! each `step()` captured alone and replayed, grads preset), a device-to-device copy moving the
//! same bytes (`copy_same_bytes`), and the optimizer's cost inside the whole step (`step_inplace_*`:
//! the captured step with grads zeroed in place, with each optimizer's kernels and without an
//! optimizer) get their own table.
//!
//! Method: each figure is the median over blocks of 50 steps of (block time / 50), at least
//! 1,000 steps in all, after 20 warmup steps, with the device synchronized before and after
//! each block. Inputs rotate over 8 pre-made batches. fp32, TF32 off on both sides.

mod models;
mod reference;
mod timing;

use models::{batch, Model, ModelKind};
use std::fmt::Write as _;
use std::time::Instant;
use tch::{nn, nn::OptimizerConfig, Device, Tensor};
use tch_cuda_graphs::kernels::Kernels;
use tch_cuda_graphs::optim::{Adam, AdamConfig, Optimizer, Sgd, SgdConfig};
use tch_cuda_graphs::{capture_with_warmup, feed, pool_memory, synchronize, CaptureOptions, StepOptions, TrainStep};
use timing::{median, time_steps, WARMUP};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Opt {
    Sgd,
    Adam,
    AdamW,
}

impl Opt {
    const ALL: [Opt; 3] = [Opt::Sgd, Opt::Adam, Opt::AdamW];
    fn name(self) -> &'static str {
        match self {
            Opt::Sgd => "sgd",
            Opt::Adam => "adam",
            Opt::AdamW => "adamw",
        }
    }
    fn ours(self, vs: &nn::VarStore) -> Box<dyn Optimizer + Send> {
        match self {
            Opt::Sgd => Box::new(Sgd::new(vs, SgdConfig::default().lr(1e-3).momentum(0.9)).unwrap()),
            Opt::Adam => Box::new(Adam::new(vs, AdamConfig::default().lr(1e-3)).unwrap()),
            Opt::AdamW => Box::new(Adam::new(vs, AdamConfig::adamw().lr(1e-3)).unwrap()),
        }
    }
    fn tch(self, vs: &nn::VarStore) -> nn::Optimizer {
        match self {
            Opt::Sgd => nn::Sgd { momentum: 0.9, ..Default::default() }.build(vs, 1e-3).unwrap(),
            Opt::Adam => nn::Adam::default().build(vs, 1e-3).unwrap(),
            Opt::AdamW => nn::AdamW::default().build(vs, 1e-3).unwrap(),
        }
    }
}

#[derive(serde::Serialize)]
struct Row {
    model: String,
    opt: String,
    mode: String,
    #[serde(rename = "us_per_step")]
    us: f64,
}

struct Args {
    out: String,
    steps: usize,
    torch: bool,
    compile: bool,
    profile_small: bool,
    feed: bool,
    torch_kernels: bool,
    optimizer_only: bool,
    update: bool,
    as_test: bool,
}

const USAGE: &str = "\
usage: step [--out DIR] [--steps N] [--no-torch] [--no-compile] [--optimizer-only]
            [--profile-small [--feed] [--torch-kernels]] [--update]

One training step of three models and optimizers, eager and captured, beside PyTorch.
  --out DIR          where results.json, results.csv, table.md and chart.svg go (default target/bench)
  --steps N          timed steps per row, at least 100 (default 1000)
  --no-torch         skip PyTorch's side
  --no-compile       skip torch.compile's rows
  --optimizer-only   only the optimizer rows (alone, copy, in the step), no PyTorch side
  --profile-small    only the small MLP's Adam step, for ncu (--feed: also time run() against replay;
                     --torch-kernels: on PyTorch's fused optimizer kernels instead of the crate's)
  --update           only instantiate vs update: each model's Adam step captured (kept graph),
                     cudaGraphInstantiate of it against CudaGraph::update_from of a second capture
  -h, --help         this text";

/// The command line: `None` when it asked for the usage.
fn parse_args() -> Result<Option<Args>, lexopt::Error> {
    use lexopt::prelude::*;
    let mut a = Args {
        out: "target/bench".into(),
        steps: 1000,
        torch: true,
        compile: true,
        profile_small: false,
        feed: false,
        torch_kernels: false,
        optimizer_only: false,
        update: false,
        as_test: false,
    };
    let mut parser = lexopt::Parser::from_env();
    while let Some(arg) = parser.next()? {
        match arg {
            Long("out") => a.out = parser.value()?.string()?,
            Long("steps") => a.steps = parser.value()?.parse()?,
            Long("no-torch") => a.torch = false,
            Long("no-compile") => a.compile = false,
            Long("profile-small") => a.profile_small = true,
            Long("feed") => a.feed = true,
            Long("torch-kernels") => a.torch_kernels = true,
            Long("optimizer-only") => a.optimizer_only = true,
            Long("update") => a.update = true,
            Long("bench") => {} // cargo bench passes --bench
            Short('h') | Long("help") => return Ok(None),
            // started as a test binary (`cargo test --benches`)
            Long("include-ignored") | Long("nocapture") => a.as_test = true,
            Long("test-threads") => {
                let _ = parser.value()?;
                a.as_test = true;
            }
            _ => return Err(arg.unexpected()),
        }
    }
    a.steps = a.steps.max(100);
    Ok(Some(a))
}

/// How a benchmarked step runs.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Precision {
    Fp32,
    /// bf16 autocast, backward outside the autocast region (`amp::backward`), as PyTorch
    Bf16,
    /// bf16 autocast with backward left inside the autocast region
    Bf16BackwardInAutocast,
}

/// Which kernels the step's optimizer runs, whether it runs at all, and how grads are zeroed.
#[derive(Clone, Copy, Default)]
struct StepVariant {
    kernels: Kernels,
    no_optimizer: bool,
    zero_in_place: bool,
}

/// A captured training step of `kind` with `opt` (its `variant`): 3 eager warmup steps on
/// `first`, then the capture and one replay.
fn graphed_step(
    kind: ModelKind,
    opt: Opt,
    device: Device,
    first: &(Tensor, Tensor),
    keep_graph: bool,
    precision: Precision,
    variant: StepVariant,
) -> TrainStep<'static> {
    tch::manual_seed(0);
    let vs = nn::VarStore::new(device);
    let model = Model::new(kind, &vs);
    let mut o = opt.ours(&vs);
    o.set_kernels(variant.kernels).unwrap();
    let mut options = StepOptions::default().keep_graph(keep_graph);
    if precision != Precision::Fp32 {
        options = options.autocast(tch::Kind::BFloat16);
    }
    let mut step = TrainStep::new(&[("x", &first.0), ("y", &first.1)], options, move |inp| {
        if variant.zero_in_place {
            o.zero_grad_in_place()?;
        } else {
            o.zero_grad()?;
        }
        let loss = model.loss(&inp[0], &inp[1]);
        match precision {
            Precision::Bf16 => tch_cuda_graphs::amp::backward(&loss)?,
            _ => loss.f_backward()?,
        }
        if !variant.no_optimizer {
            o.step()?;
        }
        Ok(vec![loss.detach()])
    })
    .unwrap();
    // the eager warmup steps, then the capture (and its first replay)
    for _ in 0..=options.get_warmup() {
        step.run(&[&first.0, &first.1]).unwrap();
    }
    step
}

#[derive(serde::Serialize)]
struct Extra {
    model: &'static str,
    opt: &'static str,
    capture_ms: f64,
    replay_host_us: f64,
    #[serde(rename = "pool_reserved_bytes")]
    pool_bytes: i64,
}

/// Prints a measured row and keeps it.
fn push_row(rows: &mut Vec<Row>, kind: ModelKind, opt: Opt, mode: &str, us: f64) {
    println!("  {:<12} {:<6} {:<22} {:>9.1} µs", kind.name(), opt.name(), mode, us);
    rows.push(Row { model: kind.name().into(), opt: opt.name().into(), mode: mode.into(), us });
}

/// What every mode of one model and optimizer shares.
#[derive(Clone, Copy)]
struct Case<'a> {
    kind: ModelKind,
    opt: Opt,
    device: Device,
    steps: usize,
    batches: &'a [(Tensor, Tensor)],
}

fn bench_one(kind: ModelKind, opt: Opt, device: Device, steps: usize, rows: &mut Vec<Row>) -> Extra {
    let batches: Vec<(Tensor, Tensor)> = (0..8).map(|_| batch(kind, device)).collect();
    let case = Case { kind, opt, device, steps, batches: &batches };
    bench_eager(&case, rows);
    // the captured step
    synchronize(device).unwrap();
    let t = Instant::now();
    let mut step = graphed_step(kind, opt, device, &batches[0], false, Precision::Fp32, StepVariant::default());
    synchronize(device).unwrap();
    let capture_ms = t.elapsed().as_secs_f64() * 1e3;
    let graph = step.graph_mut().expect("graphed on a GPU");
    graph.upload().unwrap();
    let pool_bytes = pool_memory(device, graph.pool().unwrap()).unwrap().reserved;
    let us = time_steps(device, steps, |i| {
        let (x, y) = &batches[i % batches.len()];
        step.run(&[x, y]).unwrap();
    });
    push_row(rows, kind, opt, "graph", us);
    bench_graph_variants(&case, rows);
    // the same captured step fed from the CPU: pinned batches, and pageable ones
    if kind != ModelKind::Transformer {
        let to_cpu = |t: &Tensor| t.to(Device::Cpu);
        let pageable: Vec<(Tensor, Tensor)> = batches.iter().map(|(x, y)| (to_cpu(x), to_cpu(y))).collect();
        let pinned: Vec<(Tensor, Tensor)> =
            pageable.iter().map(|(x, y)| (feed::pinned(x).unwrap(), feed::pinned(y).unwrap())).collect();
        for (mode, set) in [("graph_cpu_pinned", &pinned), ("graph_cpu_pageable", &pageable)] {
            let us = time_steps(device, steps, |i| {
                let (x, y) = &set[i % set.len()];
                step.run(&[x, y]).unwrap();
            });
            push_row(rows, kind, opt, mode, us);
        }
    }
    // host cost of one replay() call (launch only)
    // (device idle before each call, so the launch queue never blocks the call)
    let graph = step.graph_mut().unwrap();
    let mut host = Vec::new();
    for _ in 0..200 {
        synchronize(device).unwrap();
        let t = Instant::now();
        graph.replay().unwrap();
        host.push(t.elapsed().as_secs_f64() * 1e6);
    }
    synchronize(device).unwrap();
    Extra { model: kind.name(), opt: opt.name(), capture_ms, replay_host_us: median(host), pool_bytes }
}

/// tch eager with tch's optimizer, then with this crate's fused one.
fn bench_eager(case: &Case, rows: &mut Vec<Row>) {
    let Case { kind, opt, device, steps, batches } = *case;
    {
        tch::manual_seed(0);
        let vs = nn::VarStore::new(device);
        let model = Model::new(kind, &vs);
        let mut o = opt.tch(&vs);
        let us = time_steps(device, steps, |i| {
            let (x, y) = &batches[i % batches.len()];
            o.zero_grad();
            model.loss(x, y).backward();
            o.step();
        });
        push_row(rows, kind, opt, "tch_eager", us);
    }
    tch::manual_seed(0);
    let vs = nn::VarStore::new(device);
    let model = Model::new(kind, &vs);
    let mut o = opt.ours(&vs);
    let us = time_steps(device, steps, |i| {
        let (x, y) = &batches[i % batches.len()];
        o.zero_grad().unwrap();
        model.loss(x, y).backward();
        o.step().unwrap();
    });
    push_row(rows, kind, opt, "tch_eager_fused", us);
}

/// The captured step on PyTorch's fused optimizer kernels (what the crate ran before it had its
/// own), and under bf16 autocast (cast cache off), backward outside autocast as in PyTorch and,
/// for comparison, left inside the autocast region.
fn bench_graph_variants(case: &Case, rows: &mut Vec<Row>) {
    let Case { kind, opt, device, steps, batches } = *case;
    let torch_kernels = StepVariant { kernels: Kernels::PyTorch, ..Default::default() };
    for (mode, precision, variant) in [
        ("graph_torch_kernels", Precision::Fp32, torch_kernels),
        ("graph_bf16", Precision::Bf16, StepVariant::default()),
        ("graph_bf16_bwd_in_autocast", Precision::Bf16BackwardInAutocast, StepVariant::default()),
    ] {
        let mut step = graphed_step(kind, opt, device, &batches[0], false, precision, variant);
        let us = time_steps(device, steps, |i| {
            let (x, y) = &batches[i % batches.len()];
            step.run(&[x, y]).unwrap();
        });
        push_row(rows, kind, opt, mode, us);
    }
}

/// Bytes one optimizer step moves per fp32 parameter element: Adam reads p, g, m, v and writes
/// p, m, v; SGD with momentum reads p, g, buf and writes p, buf.
fn bytes_per_element(opt: Opt) -> f64 {
    match opt {
        Opt::Sgd => 20.0,
        Opt::Adam | Opt::AdamW => 28.0,
    }
}

/// The optimizer alone (this crate's kernels, PyTorch's), a copy moving the same bytes, and the
/// optimizer's cost inside the captured step (grads zeroed in place, with and without it).
fn bench_optimizer(kind: ModelKind, opt: Opt, device: Device, steps: usize, rows: &mut Vec<Row>) {
    let mut push = |mode: &str, us: f64| push_row(rows, kind, opt, mode, us);
    tch::manual_seed(0);
    let vs = nn::VarStore::new(device);
    let model = Model::new(kind, &vs);
    let (x, y) = batch(kind, device);
    model.loss(&x, &y).backward();
    let numel: i64 = vs.trainable_variables().iter().map(Tensor::numel).sum::<usize>() as i64;
    for (mode, kernels) in [("opt_own", Kernels::Own), ("opt_torch", Kernels::PyTorch)] {
        let mut o = opt.ours(&vs);
        o.set_kernels(kernels).unwrap();
        let (mut graph, ()) = capture_with_warmup(3, CaptureOptions::default(), || o.step()).unwrap();
        let us = time_steps(device, steps, |_| graph.replay().unwrap());
        push(mode, us);
        drop(graph);
    }
    // a copy that reads and writes as many bytes as the step moves
    let floats = (numel as f64 * bytes_per_element(opt) / 8.0).round() as i64;
    let src = Tensor::ones([floats], (tch::Kind::Float, device));
    let dst = Tensor::zeros([floats], (tch::Kind::Float, device));
    let (mut graph, ()) = capture_with_warmup(3, CaptureOptions::default(), || {
        dst.shallow_clone().f_copy_(&src)?;
        Ok(())
    })
    .unwrap();
    push("copy_same_bytes", time_steps(device, steps, |_| graph.replay().unwrap()));
    drop(graph);
    let batches: Vec<(Tensor, Tensor)> = (0..8).map(|_| batch(kind, device)).collect();
    for (mode, kernels, no_optimizer) in [
        ("step_inplace_own", Kernels::Own, false),
        ("step_inplace_torch", Kernels::PyTorch, false),
        ("step_inplace_no_opt", Kernels::PyTorch, true),
    ] {
        let variant = StepVariant { kernels, no_optimizer, zero_in_place: true };
        let mut step = graphed_step(kind, opt, device, &batches[0], false, Precision::Fp32, variant);
        let us = time_steps(device, steps, |i| {
            let (x, y) = &batches[i % batches.len()];
            step.run(&[x, y]).unwrap();
        });
        push(mode, us);
    }
}

fn run_torch(steps: usize, compile: bool, rows: &mut Vec<Row>) -> Result<(), String> {
    let mut args = vec!["benches/torch_reference.py".to_owned(), "--steps".into(), steps.to_string()];
    if !compile {
        args.push("--no-compile".into());
    }
    let out = reference::run(&args[0], &args[1..])?;
    for line in out.lines() {
        let f: Vec<&str> = line.split(',').collect();
        if f.len() == 5 && f[0] == "ROW" {
            let us: f64 = f[4].parse().map_err(|e| format!("bad row {line}: {e}"))?;
            println!("  {:<12} {:<6} {:<22} {:>9.1} µs/step", f[1], f[2], f[3], us);
            rows.push(Row { model: f[1].into(), opt: f[2].into(), mode: f[3].into(), us });
        } else if !line.is_empty() {
            println!("  torch: {line}");
        }
    }
    Ok(())
}

/// Instantiating a captured step against updating an executable from a second capture of it
/// (`CudaGraph::update_from`), per model, Adam: median over 5 of each, µs, host time (both are
/// host calls; the device is synchronized before each).
fn bench_update(device: Device) {
    println!("instantiate vs update_from (median of 5, µs), Adam step, kept graphs:");
    println!("| model | nodes | cudaGraphInstantiate | update_from | ratio |");
    println!("|---|---:|---:|---:|---:|");
    for kind in ModelKind::ALL {
        tch::manual_seed(0);
        let vs = nn::VarStore::new(device);
        let model = Model::new(kind, &vs);
        let mut opt = Opt::Adam.ours(&vs);
        let (x, y) = batch(kind, device);
        let options = CaptureOptions::default().keep_graph(true);
        let mut capture = || {
            capture_with_warmup(1, options, || {
                opt.zero_grad()?;
                let loss = model.loss(&x, &y);
                loss.f_backward()?;
                opt.step()?;
                Ok(loss.detach())
            })
            .unwrap()
            .0
        };
        let (mut inst, mut upd, mut nodes) = (Vec::new(), Vec::new(), 0);
        for _ in 0..5 {
            let mut first = capture();
            nodes = first.node_count().unwrap();
            synchronize(device).unwrap();
            let t = Instant::now();
            first.instantiate().unwrap();
            inst.push(t.elapsed().as_secs_f64() * 1e6);
            let mut second = capture();
            synchronize(device).unwrap();
            let t = Instant::now();
            let updated = first.update_from(&mut second).unwrap();
            upd.push(t.elapsed().as_secs_f64() * 1e6);
            assert!(updated, "{}: a second capture of the same step must update", kind.name());
            first.replay().unwrap();
        }
        let (i, u) = (median(inst), median(upd));
        println!("| {} | {nodes} | {i:.1} | {u:.1} | {:.1}× |", kind.name(), i / u);
    }
}

/// For `ncu`: captures the small MLP's Adam step into a kept graph, prints its node counts,
/// and replays it 3 times (ncu times each kernel of the replays).
fn profile_small(feed: bool, torch_kernels: bool) {
    let device = Device::Cuda(0);
    let kind = ModelKind::SmallMlp;
    let kernels = if torch_kernels { Kernels::PyTorch } else { Kernels::Own };
    let variant = StepVariant { kernels, ..Default::default() };
    let mut step = graphed_step(kind, Opt::Adam, device, &batch(kind, device), true, Precision::Fp32, variant);
    let g = step.graph_mut().unwrap();
    println!("small MLP + Adam graph: {} nodes, {:?}", g.node_count().unwrap(), g.node_kinds().unwrap());
    for _ in 0..3 {
        step.replay().unwrap();
    }
    synchronize(device).unwrap();
    if feed {
        let batches: Vec<(Tensor, Tensor)> = (0..8).map(|_| batch(kind, device)).collect();
        let replay = time_steps(device, 1000, |_| {
            step.replay().unwrap();
        });
        let run = time_steps(device, 1000, |i| {
            let (x, y) = &batches[i % 8];
            step.run(&[x, y]).unwrap();
        });
        let mut host = Vec::new();
        for i in 0..200 {
            synchronize(device).unwrap();
            let (x, y) = &batches[i % 8];
            let t = Instant::now();
            step.run(&[x, y]).unwrap();
            host.push(t.elapsed().as_secs_f64() * 1e6);
        }
        println!("ours: replay only {replay:.1} µs/step, run (check + 2 copies + replay) {run:.1} µs/step, host time of run() {:.1} µs", median(host));
    }
}

fn find(rows: &[Row], model: &str, opt: &str, mode: &str) -> Option<f64> {
    rows.iter().find(|r| r.model == model && r.opt == opt && r.mode == mode).map(|r| r.us)
}

/// The fastest of `modes` for this model and optimizer (NaN if none was measured).
fn best(rows: &[Row], model: &str, opt: &str, modes: &[&str]) -> f64 {
    modes.iter().filter_map(|mode| find(rows, model, opt, mode)).fold(f64::NAN, f64::min)
}

fn main() {
    let args = reference::args_or_exit("step", parse_args(), USAGE);
    if args.as_test {
        println!("bench step: started as a test binary; run it with `cargo bench --bench step` (or directly).");
        return;
    }
    reference::require_cuda("step");
    if args.profile_small {
        profile_small(args.feed, args.torch_kernels);
        return;
    }
    let device = Device::Cuda(0);
    if args.update {
        bench_update(device);
        return;
    }
    if args.torch && !args.optimizer_only {
        reference::require_torch("step");
    }
    std::fs::create_dir_all(&args.out).expect("create the output directory");
    println!("benchmark: median µs per training step, {} steps per mode after {WARMUP} warmup steps", args.steps);
    let (rows, extras) = measure(&args, device);
    let mut table = summary_table(&rows);
    for part in [optimizer_table(&rows), fed_table(&rows), amp_table(&rows)] {
        println!("{part}");
        table.push('\n');
        table.push_str(&part);
    }
    write_outputs(&args, &rows, &extras, table);
}

/// Every row: this crate's modes per model and optimizer, the optimizer alone, then PyTorch's.
fn measure(args: &Args, device: Device) -> (Vec<Row>, Vec<Extra>) {
    let mut rows = Vec::new();
    let mut extras = Vec::new();
    for kind in ModelKind::ALL {
        for opt in Opt::ALL {
            if args.optimizer_only {
                continue;
            }
            let e = bench_one(kind, opt, device, args.steps, &mut rows);
            println!(
                "  {:<12} {:<6} capture {:.1} ms (warmup 3 + capture + instantiate), replay() host {:.1} µs, pool {:.1} MiB",
                kind.name(),
                opt.name(),
                e.capture_ms,
                e.replay_host_us,
                e.pool_bytes as f64 / (1 << 20) as f64
            );
            extras.push(e);
        }
    }
    println!("the optimizer alone, and its cost inside the step:");
    for kind in ModelKind::ALL {
        for opt in Opt::ALL {
            bench_optimizer(kind, opt, device, args.steps, &mut rows);
        }
    }
    if args.torch && !args.optimizer_only {
        println!("PyTorch reference (benches/torch_reference.py), same GPU, same run:");
        if let Err(e) = run_torch(args.steps, args.compile, &mut rows) {
            eprintln!("bench step: PyTorch's side failed: {e}");
            std::process::exit(1);
        }
    }
    (rows, extras)
}

/// The summary with ratios, printed.
fn summary_table(rows: &[Row]) -> String {
    let mut table = String::new();
    let _ = writeln!(
        table,
        "| model | opt | tch eager | tch eager + fused | **graph (this crate)** | graph, PyTorch's optimizer kernels | torch eager | torch graph best | eager/graph | graph/torch best |"
    );
    let _ = writeln!(table, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for kind in ModelKind::ALL {
        for opt in Opt::ALL {
            let (m, o) = (kind.name(), opt.name());
            let f = |mode: &str| find(rows, m, o, mode).unwrap_or(f64::NAN);
            let (g, te, tf, gt, pe) =
                (f("graph"), f("tch_eager"), f("tch_eager_fused"), f("graph_torch_kernels"), f("torch_eager"));
            let pg = best(rows, m, o, &["torch_graph", "torch_graph_capturable", "torch_graph_fused"]);
            let _ = writeln!(
                table,
                "| {m} | {o} | {te:.1} | {tf:.1} | **{g:.1}** | {gt:.1} | {pe:.1} | {pg:.1} | {:.2}x | {:.2} |",
                te / g,
                g / pg
            );
        }
    }
    println!("\nµs per step (lower is better); eager/graph = tch eager with tch's optimizer over this crate's graph; graph/torch best = this crate's graph over PyTorch's fastest graphed variant (≤ 1.0 meets the target)\n");
    println!("{table}");
    table
}

/// The optimizer alone and inside the step: this crate's kernels against PyTorch's fused ones
/// (targets: small MLP alone ≤ 5 µs; cost inside the step ≤ 1.15x a copy of its bytes).
fn optimizer_table(rows: &[Row]) -> String {
    let mut alone = String::from(
        "| model | opt | params | **alone, own** | alone, PyTorch | own GB/s | PyTorch GB/s | copy same bytes | **in step, own** | in step, PyTorch | in-step own / copy |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for kind in ModelKind::ALL {
        let numel: i64 = {
            let vs = nn::VarStore::new(Device::Cpu);
            let _m = Model::new(kind, &vs);
            vs.trainable_variables().iter().map(Tensor::numel).sum::<usize>() as i64
        };
        for opt in Opt::ALL {
            let (m, o) = (kind.name(), opt.name());
            let f = |mode: &str| find(rows, m, o, mode).unwrap_or(f64::NAN);
            let (own, torch, copy) = (f("opt_own"), f("opt_torch"), f("copy_same_bytes"));
            let gbs = |us: f64| numel as f64 * bytes_per_element(opt) / us / 1e3;
            let no_opt = f("step_inplace_no_opt");
            let (in_own, in_torch) = (f("step_inplace_own") - no_opt, f("step_inplace_torch") - no_opt);
            let _ = writeln!(
                alone,
                "| {m} | {o} | {numel} | **{own:.1}** | {torch:.1} | {:.0} | {:.0} | {copy:.1} | **{in_own:.1}** | {in_torch:.1} | {:.2} |",
                gbs(own),
                gbs(torch),
                in_own / copy
            );
        }
    }
    alone
}

/// CPU-fed against GPU-fed captured steps (target: CPU-fed within 10% of GPU-fed).
fn fed_table(rows: &[Row]) -> String {
    let mut fed = String::from(
        "| model | opt | graph, GPU-fed | graph, CPU pinned | pinned/GPU | graph, CPU pageable | pageable/GPU |\n|---|---|---:|---:|---:|---:|---:|\n",
    );
    for kind in [ModelKind::SmallMlp, ModelKind::MediumMlp] {
        for opt in Opt::ALL {
            let (m, o) = (kind.name(), opt.name());
            let f = |mode: &str| find(rows, m, o, mode).unwrap_or(f64::NAN);
            let (g, p, q) = (f("graph"), f("graph_cpu_pinned"), f("graph_cpu_pageable"));
            let _ = writeln!(fed, "| {m} | {o} | {g:.1} | {p:.1} | {:.2} | {q:.1} | {:.2} |", p / g, q / g);
        }
    }
    fed
}

/// bf16 autocast: this crate's graph against PyTorch's best graph, and torch.compile + graph as
/// a reference for what a compiler adds beyond graphs (target: graph_bf16/torch ≤ 1.0).
fn amp_table(rows: &[Row]) -> String {
    let mut amp = String::from(
        "| model | opt | graph fp32 | **graph bf16 (this crate)** | (backward in autocast) | torch graph bf16 best | bf16: ours/torch | torch compile + graph fp32 | torch compile + graph bf16 |\n|---|---|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for kind in ModelKind::ALL {
        for opt in Opt::ALL {
            let (m, o) = (kind.name(), opt.name());
            let f = |mode: &str| find(rows, m, o, mode).unwrap_or(f64::NAN);
            let (g, gb, gi) = (f("graph"), f("graph_bf16"), f("graph_bf16_bwd_in_autocast"));
            let tb = best(rows, m, o, &["torch_graph_bf16_capturable", "torch_graph_bf16_fused"]);
            let (c32, c16) = (f("torch_compile_graph"), f("torch_compile_graph_bf16"));
            let _ = writeln!(
                amp,
                "| {m} | {o} | {g:.1} | **{gb:.1}** | {gi:.1} | {tb:.1} | {:.2} | {c32:.1} | {c16:.1} |",
                gb / tb
            );
        }
    }
    amp
}

/// results.json, results.csv, table.md (with the headline table) and chart.svg under args.out.
fn write_outputs(args: &Args, rows: &[Row], extras: &[Extra], mut table: String) {
    let json = serde_json::to_string_pretty(&serde_json::json!({ "rows": rows, "extras": extras }))
        .expect("serialize the results");
    let mut csv = String::from("model,opt,mode,us_per_step\n");
    for r in rows {
        let _ = writeln!(csv, "{},{},{},{:.2}", r.model, r.opt, r.mode, r.us);
    }
    std::fs::write(format!("{}/results.json", args.out), json).expect("write results.json");
    std::fs::write(format!("{}/results.csv", args.out), csv).expect("write results.csv");
    let headline = headline_table(rows);
    println!(
        "The headline: this crate's captured step against PyTorch's best torch.cuda.graph and torch.compile + graph\n"
    );
    println!("{headline}");
    table.push('\n');
    table.push_str(&headline);
    std::fs::write(format!("{}/table.md", args.out), &table).expect("write table.md");
    let chart = format!("{}/chart.svg", args.out);
    let title = format!("µs per training step, {}", gpu_name());
    if let Err(e) = reference::run("benches/plot.py", &[format!("{}/results.csv", args.out), chart.clone(), title]) {
        eprintln!("bench step: the chart was not drawn: {e}");
        std::process::exit(1);
    }
    println!("wrote {0}/results.json, {0}/results.csv, {0}/table.md, {chart}", args.out);
}

/// The GPU's name, as the driver gives it.
fn gpu_name() -> String {
    std::process::Command::new("nvidia-smi")
        .args(["--query-gpu=name", "--format=csv,noheader", "-i", "0"])
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| "CUDA device 0".into())
}

/// The README's table: per model and optimizer, fp32 and bf16, this crate's captured step beside
/// PyTorch's best `torch.cuda.graph` (capturable or fused optimizer) and `torch.compile` + graph.
fn headline_table(rows: &[Row]) -> String {
    let mut t = String::from(
        "| model | opt | **fp32: this crate** | torch graph | compile + graph | ours / graph | ours / compile | **bf16: this crate** | torch graph | compile + graph | ours / graph | ours / compile |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for kind in ModelKind::ALL {
        for opt in Opt::ALL {
            let (m, o) = (kind.name(), opt.name());
            let _ = write!(t, "| {m} | {o} |");
            for (ours, graph, compile) in [
                ("graph", &["torch_graph_capturable", "torch_graph_fused"][..], "torch_compile_graph"),
                (
                    "graph_bf16",
                    &["torch_graph_bf16_capturable", "torch_graph_bf16_fused"][..],
                    "torch_compile_graph_bf16",
                ),
            ] {
                let us = find(rows, m, o, ours).unwrap_or(f64::NAN);
                let g = best(rows, m, o, graph);
                let c = find(rows, m, o, compile).unwrap_or(f64::NAN);
                let _ = write!(t, " **{us:.1}** | {g:.1} | {c:.1} | {:.2} | {:.2} |", us / g, us / c);
            }
            t.push('\n');
        }
    }
    t
}
