//! Benchmark: graphed callables (`make_graphed_callables`) in a step that cannot be captured
//! whole because it reads the loss on the host every step. N pre-LayerNorm MLP blocks (LayerNorm,
//! Linear w→4w, GELU, Linear 4w→w, residual), a Linear head w→w, MSE loss, Adam on the crate's
//! kernels, `loss` read on the host each step; fp32, TF32 off. Side by side with PyTorch
//! (`torch_graphed.py`: eager, `torch.cuda.make_graphed_callables` on the blocks, and the whole
//! step captured without the host read) on the same GPU in the same run.
//!
//! `cargo bench --bench graphed -- [--steps N] [--rows W:N:B,...] [--no-torch] [--out DIR]`
//!
//! Modes: `tch_eager` (the step in tch, eager), `graphed_callables` (the blocks graphed),
//! `whole_step` (the step without the host read captured whole by [`TrainStep`]). Each figure is
//! the median over blocks of 50 steps of (block time / 50), after 20 warmup steps, the device
//! synchronized before and after each block; inputs rotate over 8 pre-made batches. A host-side
//! breakdown of the two eager-loop modes (where the CPU spends each step: zero_grad, blocks,
//! head and loss, backward, optimizer, and the wait of the host read) follows the table; DIR
//! (default target/bench) gets `graphed.json`.

#[path = "../tests/common/prenorm.rs"]
mod prenorm;
mod reference;
mod timing;

use prenorm::PreLnModel;
use std::time::Instant;
use tch::{nn, nn::Module, Device, Kind, Reduction, Tensor};
use tch_cuda_graphs::optim::{Adam, AdamConfig, Optimizer};
use tch_cuda_graphs::{make_graphed_callables, Callable, GraphedCallable, GraphedOptions, StepOptions, TrainStep};
use timing::time_steps;

const PHASES: [&str; 6] = ["zero_grad", "blocks", "head+loss", "backward", "optimizer", "host read"];

struct Args {
    steps: usize,
    rows: Vec<(i64, usize, i64)>,
    torch: bool,
    out: String,
}

const USAGE: &str = "\
usage: graphed [--steps N] [--rows W:N:B,...] [--no-torch] [--out DIR]

Graphed callables in a step that reads its loss on the host, beside PyTorch's.
  --steps N          timed steps per row, at least 100 (default 1000)
  --rows W:N:B,...   width, blocks, batch of each row (default 256:4:32,256:8:32,1024:4:256)
  --no-torch         skip PyTorch's side (benches/torch_graphed.py)
  --out DIR          where graphed.json goes (default target/bench)
  -h, --help         this text";

/// The command line: `None` when it asked for the usage.
fn parse_args() -> Result<Option<Args>, lexopt::Error> {
    use lexopt::prelude::*;
    let mut a = Args {
        steps: 1000,
        rows: vec![(256, 4, 32), (256, 8, 32), (1024, 4, 256)],
        torch: true,
        out: "target/bench".into(),
    };
    let mut parser = lexopt::Parser::from_env();
    while let Some(arg) = parser.next()? {
        match arg {
            Long("steps") => a.steps = parser.value()?.parse()?,
            Long("rows") => {
                let spec = parser.value()?.string()?;
                a.rows = spec
                    .split(',')
                    .map(parse_row)
                    .collect::<Option<_>>()
                    .ok_or_else(|| lexopt::Error::from(format!("bad --rows {spec:?} (expected W:N:B,...)")))?;
            }
            Long("no-torch") => a.torch = false,
            Long("out") => a.out = parser.value()?.string()?,
            Short('h') | Long("help") => return Ok(None),
            Long("bench") => {}
            Long("include-ignored") | Long("nocapture") => {}
            Long("test-threads") => {
                let _ = parser.value()?;
            }
            _ => return Err(arg.unexpected()),
        }
    }
    a.steps = a.steps.max(100);
    Ok(Some(a))
}

/// `W:N:B` (width, blocks, batch).
fn parse_row(r: &str) -> Option<(i64, usize, i64)> {
    let mut v = r.split(':');
    let row = (v.next()?.parse().ok()?, v.next()?.parse().ok()?, v.next()?.parse().ok()?);
    v.next().is_none().then_some(row)
}

/// Host time per phase of one eager-loop step, accumulated.
#[derive(Default)]
struct Phases {
    us: [f64; 6],
    steps: usize,
}

impl Phases {
    fn per_step(&self) -> Vec<f64> {
        self.us.iter().map(|t| t / self.steps.max(1) as f64).collect()
    }
}

/// One step of the eager loop: the blocks through `graphed` if given, else eagerly.
fn loop_step(
    model: &PreLnModel,
    graphed: Option<&[GraphedCallable]>,
    opt: &mut Adam,
    (x, y): &(Tensor, Tensor),
    phases: &mut Phases,
) {
    let mut t = Instant::now();
    let mut mark = |k: usize, t: &mut Instant| {
        let now = Instant::now();
        phases.us[k] += (now - *t).as_secs_f64() * 1e6;
        *t = now;
    };
    opt.zero_grad().unwrap();
    mark(0, &mut t);
    let mut h = x.shallow_clone();
    match graphed {
        Some(gs) => {
            for g in gs {
                h = g.forward(&h).unwrap();
            }
        }
        None => {
            for b in &model.blocks {
                h = b.forward(&h);
            }
        }
    }
    mark(1, &mut t);
    let loss = model.head.forward(&h).mse_loss(y, Reduction::Mean);
    mark(2, &mut t);
    loss.backward();
    mark(3, &mut t);
    opt.step().unwrap();
    mark(4, &mut t);
    let read = f64::try_from(&loss).unwrap();
    assert!(read.is_finite(), "the loss diverged");
    mark(5, &mut t);
    phases.steps += 1;
}

fn setup(device: Device, w: i64, n: usize) -> (nn::VarStore, PreLnModel, Adam) {
    tch::manual_seed(0);
    let vs = nn::VarStore::new(device);
    let model = PreLnModel::new(&vs, w, n);
    let opt = Adam::new(&vs, AdamConfig::default().lr(1e-3)).unwrap();
    (vs, model, opt)
}

#[derive(serde::Serialize)]
struct Row {
    width: i64,
    blocks: usize,
    batch: i64,
    mode: String,
    us: f64,
}

/// A row's shape: width, blocks, batch.
type Shape = (i64, usize, i64);
/// Host time per step by phase, µs, per mode.
type Breakdown = Vec<(String, Vec<f64>)>;

/// The crate's three modes on one (width, blocks, batch); returns the rows and the breakdowns.
fn bench_row(device: Device, (w, n, batch): Shape, steps: usize) -> (Vec<Row>, Breakdown) {
    let data: Vec<(Tensor, Tensor)> = (0..8)
        .map(|_| (Tensor::randn([batch, w], (Kind::Float, device)), Tensor::randn([batch, w], (Kind::Float, device))))
        .collect();
    let row = |mode: &str, us: f64| Row { width: w, blocks: n, batch, mode: mode.into(), us };
    let mut rows = Vec::new();
    let mut breakdowns = Vec::new();

    for graph_blocks in [false, true] {
        let (_vs, model, mut opt) = setup(device, w, n);
        let graphed = graph_blocks.then(|| {
            let callables = model
                .blocks
                .iter()
                .enumerate()
                .map(|(k, b)| {
                    let sample = Tensor::randn([batch, w], (Kind::Float, device)).set_requires_grad(k > 0);
                    Callable::module(b, sample).params(b.params())
                })
                .collect();
            make_graphed_callables(callables, GraphedOptions::default()).unwrap()
        });
        let mut phases = Phases::default();
        let us = time_steps(device, steps, |i| {
            loop_step(&model, graphed.as_deref(), &mut opt, &data[i % data.len()], &mut phases)
        });
        let mode = if graph_blocks { "graphed_callables" } else { "tch_eager" };
        rows.push(row(mode, us));
        breakdowns.push((mode.to_owned(), phases.per_step()));
    }

    let (_vs, model, mut opt) = setup(device, w, n);
    let mut step = TrainStep::new(&[("x", &data[0].0), ("y", &data[0].1)], StepOptions::default(), move |inp| {
        opt.zero_grad()?;
        let mut h = inp[0].shallow_clone();
        for b in &model.blocks {
            h = b.forward(&h);
        }
        let loss = model.head.forward(&h).f_mse_loss(&inp[1], Reduction::Mean)?;
        loss.f_backward()?;
        opt.step()?;
        Ok(vec![loss.detach()])
    })
    .unwrap();
    let us = time_steps(device, steps, |i| {
        let (x, y) = &data[i % data.len()];
        step.run(&[x, y]).unwrap();
    });
    rows.push(row("whole_step", us));
    (rows, breakdowns)
}

fn run_torch(steps: usize, rows: &[(i64, usize, i64)]) -> Result<Vec<Row>, String> {
    let spec: Vec<String> = rows.iter().map(|(w, n, b)| format!("{w}:{n}:{b}")).collect();
    let out = reference::run(
        "benches/torch_graphed.py",
        &["--steps".into(), steps.to_string(), "--rows".into(), spec.join(",")],
    )?;
    let mut got = Vec::new();
    for line in out.lines() {
        let f: Vec<&str> = line.split(',').collect();
        if f.len() == 6 && f[0] == "ROW" {
            let parse = |s: &str| s.parse::<f64>().map_err(|e| format!("bad row {line}: {e}"));
            got.push(Row {
                width: parse(f[1])? as i64,
                blocks: parse(f[2])? as usize,
                batch: parse(f[3])? as i64,
                mode: f[4].into(),
                us: parse(f[5])?,
            });
        } else if !line.is_empty() {
            println!("torch: {line}");
        }
    }
    Ok(got)
}

fn find(rows: &[Row], (w, n, b): Shape, mode: &str) -> Option<f64> {
    rows.iter().find(|r| r.width == w && r.blocks == n && r.batch == b && r.mode == mode).map(|r| r.us)
}

fn main() {
    let args = reference::args_or_exit("graphed", parse_args(), USAGE);
    reference::require_cuda("graphed");
    if args.torch {
        reference::require_torch("graphed");
    }
    let device = Device::Cuda(0);
    let mut rows = Vec::new();
    let mut breakdowns = Vec::new();
    for &shape in &args.rows {
        let (r, b) = bench_row(device, shape, args.steps);
        for row in &r {
            println!(
                "  w {:>5} blocks {:>2} batch {:>4}  {:<20} {:>9.1} µs/step",
                row.width, row.blocks, row.batch, row.mode, row.us
            );
        }
        rows.extend(r);
        breakdowns.push((shape, b));
    }
    if args.torch {
        match run_torch(args.steps, &args.rows) {
            Ok(t) => rows.extend(t),
            Err(e) => {
                eprintln!("bench graphed: PyTorch's side failed: {e}");
                std::process::exit(1);
            }
        }
    }
    print_speed_table(&rows, &args.rows);
    print_breakdowns(&breakdowns);
    let _ = std::fs::create_dir_all(&args.out);
    let path = format!("{}/graphed.json", args.out);
    match serde_json::to_string_pretty(&rows).map(|j| std::fs::write(&path, j)) {
        Ok(Ok(())) => println!("\nwrote {path}"),
        _ => println!("\ncould not write {path}"),
    }
}

/// The table of µs per step, ours and PyTorch's, per shape.
fn print_speed_table(rows: &[Row], shapes: &[Shape]) {
    println!("\nµs per step (median), same GPU, same run; speedup = eager / graphed callables");
    println!(
        "| width, blocks, batch | tch eager | graphed callables | speedup | whole step | PyTorch eager | PyTorch graphed callables | PyTorch speedup | PyTorch whole step |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    let fmt = |v: Option<f64>| v.map_or("-".to_owned(), |u| format!("{u:.1}"));
    for &shape in shapes {
        let (e, g, s) =
            (find(rows, shape, "tch_eager"), find(rows, shape, "graphed_callables"), find(rows, shape, "whole_step"));
        let (te, tg, ts) = (
            find(rows, shape, "torch_eager"),
            find(rows, shape, "torch_graphed_callables"),
            find(rows, shape, "torch_whole_step"),
        );
        let ratio = |a: Option<f64>, b: Option<f64>| a.zip(b).map_or("-".to_owned(), |(a, b)| format!("{:.2}×", a / b));
        println!(
            "| {}, {}, {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            shape.0,
            shape.1,
            shape.2,
            fmt(e),
            fmt(g),
            ratio(e, g),
            fmt(s),
            fmt(te),
            fmt(tg),
            ratio(te, tg),
            fmt(ts)
        );
    }
}

/// Host time per step by phase, per shape and mode.
fn print_breakdowns(breakdowns: &[(Shape, Breakdown)]) {
    println!("\nhost time per step by phase, µs (the eager loop's step; the host read waits for the GPU)");
    println!("| width, blocks, batch | mode | {} |", PHASES.join(" | "));
    println!("|---|---|{}", "---:|".repeat(PHASES.len()));
    for ((w, n, b), modes) in breakdowns {
        for (mode, us) in modes {
            let cells: Vec<String> = us.iter().map(|u| format!("{u:.1}")).collect();
            println!("| {w}, {n}, {b} | {mode} | {} |", cells.join(" | "));
        }
    }
}
