//! Weak-scaling benchmark: the captured data-parallel step of the three benchmark
//! models (per-rank batch fixed, Adam), gradients averaged with `GradAllReduce` inside the
//! graph, on 1 and 2 GPUs; run under torchrun beside `benches/torch_ddp.py` (PyTorch's captured
//! step with a flat all-reduce after backward).
//!
//! `make bench-ddp` (`scripts/gpu.sh ddp-bench`: 1 and 2 GPUs, ours and PyTorch's, under
//! `torchrun --no-python`). Rank 0 prints `ROW,<variant>,<model>,<world>,<µs>`
//! (the slowest rank's median). With one rank there is no all-reduce: the 1-GPU figure is the
//! plain captured step. Variants on several ranks: `ours` (one bucket, all-reduced after
//! backward, like the reference) and `ours_overlap_<KiB>` (buckets of that size, each
//! all-reduced as soon as backward has produced its gradients; sizes from `TCG_DDP_OVERLAP_KIB`,
//! comma-separated, default 4096,12300,25600). `TCG_DDP_MODELS` (comma-separated names)
//! limits the models.

mod models;

use models::{batch, Model, ModelKind};
use std::time::{Duration, Instant};
use tch::{nn, Device, Kind, Tensor};
use tch_cuda_graphs::dist::{
    broadcast_parameters, BucketConfig, BucketLayout, Collective, Compression, GradAllReduce, NcclBuffers,
    ProcessGroup, ReduceOp, Wire,
};
use tch_cuda_graphs::optim::{Adam, AdamConfig, Optimizer};
use tch_cuda_graphs::profiler::{Event, Profile, Profiler};
use tch_cuda_graphs::{synchronize, StepOptions, TrainStep};

const BLOCK: usize = 50;
const WARMUP: usize = 20;
const STEPS: usize = 1000;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// How the gradients are averaged: one bucket after backward, or overlapped buckets (as views
/// into the buckets, or packed around each all-reduce; packed, with each bucket's parameters
/// stepped as soon as it is averaged: `GradAllReduce::backward_and_step`; that without bucket
/// buffers, each bucket one grouped NCCL call: `BucketConfig::grouped`).
#[derive(Clone, Copy, PartialEq)]
enum Variant {
    After,
    Overlap(usize),
    PackedOverlap(usize),
    PackedStep(usize),
    GroupedStep(usize),
}

/// The step's precision: fp32; bf16 autocast with fp32 gradients on the wire; bf16 autocast
/// with the gradients all-reduced in bf16 (`Compression::BFloat16`).
#[derive(Clone, Copy, PartialEq)]
enum Precision {
    Fp32,
    Bf16,
    Bf16Wire,
}

impl Variant {
    fn name(self, p: Precision) -> String {
        let v = match self {
            Variant::After => "ours".into(),
            Variant::Overlap(bytes) => format!("ours_overlap_{}", bytes >> 10),
            Variant::PackedOverlap(bytes) => format!("ours_packed_overlap_{}", bytes >> 10),
            Variant::PackedStep(bytes) => format!("ours_packed_step_{}", bytes >> 10),
            Variant::GroupedStep(bytes) => format!("ours_grouped_step_{}", bytes >> 10),
        };
        match p {
            Precision::Fp32 => v,
            Precision::Bf16 => format!("bf16_{v}"),
            Precision::Bf16Wire => format!("bf16wire_{v}"),
        }
    }
}

/// Writes an SVG timeline of `events` (GPU kernels, copies, memsets), one lane per stream, the
/// NCCL kernels in red: the timeline picture of `docs/distributed.md`.
fn timeline_svg(path: &str, events: &[Event], title: &str) -> std::io::Result<()> {
    let gpu: Vec<&Event> = events.iter().filter(|e| e.kind.on_gpu()).collect();
    let (t0, t1) = match (gpu.iter().map(|e| e.start_ns).min(), gpu.iter().map(|e| e.end_ns).max()) {
        (Some(a), Some(b)) if b > a => (a, b),
        _ => return Ok(()),
    };
    let mut lanes: Vec<i64> = Vec::new();
    for e in &gpu {
        if !lanes.contains(&e.stream) {
            lanes.push(e.stream);
        }
    }
    let (w, lane_h, left) = (1200.0, 28.0, 110.0);
    let h = 40.0 + lane_h * lanes.len() as f64 + 30.0;
    let x = |t: u64| left + (t - t0) as f64 / (t1 - t0) as f64 * (w - left - 10.0);
    let mut s = format!(
        "<svg xmlns='http://www.w3.org/2000/svg' width='{w}' height='{h}' font-family='sans-serif' font-size='12'>\n\
         <rect width='100%' height='100%' fill='white'/>\n<text x='10' y='18'>{title}</text>\n"
    );
    for (i, lane) in lanes.iter().enumerate() {
        let y = 30.0 + lane_h * i as f64;
        s += &format!("<text x='10' y='{}'>stream {lane}</text>\n", y + 17.0);
        for e in gpu.iter().filter(|e| e.stream == *lane) {
            let (a, b) = (x(e.start_ns), x(e.end_ns));
            let color = if e.is_nccl() { "#d62728" } else { "#1f77b4" };
            s += &format!(
                "<rect x='{a:.2}' y='{y}' width='{:.2}' height='{}' fill='{color}'/>\n",
                (b - a).max(0.5),
                lane_h - 6.0
            );
        }
    }
    let y = 30.0 + lane_h * lanes.len() as f64 + 18.0;
    s += &format!(
        "<text x='{left}' y='{y}'>0 µs</text><text x='{}' y='{y}' text-anchor='end'>{:.0} µs</text>\n\
         <text x='{}' y='{y}' text-anchor='middle'>blue: compute kernels, red: NCCL</text>\n</svg>\n",
        w - 10.0,
        (t1 - t0) as f64 / 1e3,
        (left + w) / 2.0
    );
    std::fs::write(path, s)
}

/// The bucket configuration of a variant: `bucket` bytes, `layout` as a bucket layout with its
/// wire when it has one, and the environment's tuning: TCG_DDP_FIRST_KIB, TCG_DDP_HIGH_PRIORITY,
/// and for the layouts with a wire TCG_DDP_SPLIT and TCG_DDP_BUFFERS.
fn bucket_config(bucket: usize, layout: fn(Wire) -> BucketLayout, compression: Compression) -> BucketConfig {
    let first_bucket_bytes =
        std::env::var("TCG_DDP_FIRST_KIB").ok().and_then(|v| v.parse::<usize>().ok()).map(|k| k << 10);
    let high_priority = std::env::var("TCG_DDP_HIGH_PRIORITY").is_ok_and(|v| v == "1");
    let collective = if std::env::var("TCG_DDP_SPLIT").is_ok_and(|v| v == "1") {
        Collective::ReduceScatterAllGather
    } else {
        Collective::AllReduce
    };
    let buffers = match std::env::var("TCG_DDP_BUFFERS").unwrap_or_default().as_str() {
        "mem" => NcclBuffers::NcclMem,
        "register" => NcclBuffers::Registered,
        "window" => NcclBuffers::Window,
        _ => NcclBuffers::Caching,
    };
    let layout = layout(Wire { collective, compression, buffers });
    BucketConfig { bucket_bytes: bucket, first_bucket_bytes, layout, high_priority }
}

/// The slowest rank's median µs per captured step of `kind` with `variant` at `precision`;
/// with `profile` (a folder), 10 more steps are profiled: rank 0 prints a PROFILE row (per-step
/// figures) and writes a Chrome trace and an SVG timeline there.
fn measure(pg: &ProcessGroup, kind: ModelKind, variant: Variant, precision: Precision, profile: Option<&str>) -> f64 {
    let (rank, world, device) = (pg.rank(), pg.world_size(), pg.device());
    let (mut step, batches) = bench_step(pg, kind, variant, precision);
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
    if let Some(dir) = profile {
        let prof = Profiler::start().expect("profiler");
        for _ in 0..10 {
            run(i);
            i += 1;
        }
        synchronize(device).expect("sync");
        let p = prof.stop().expect("profile");
        if rank == 0 {
            report_profile(&p, &format!("{}_{}_{}gpu", variant.name(precision), kind.name(), world), dir, us);
        }
    }
    let mut all = vec![0f64; world];
    all[rank] = us;
    let all_t = Tensor::from_slice(&all).to_device(device);
    pg.all_reduce(&all_t, ReduceOp::Sum).expect("all-reduce");
    Vec::<f64>::try_from(all_t.to_device(Device::Cpu)).expect("values").into_iter().fold(0f64, f64::max)
}

/// The captured step of `kind` with `variant` at `precision` (the model and optimizer its own),
/// and 8 batches of this rank.
fn bench_step(
    pg: &ProcessGroup,
    kind: ModelKind,
    variant: Variant,
    precision: Precision,
) -> (TrainStep<'static>, Vec<(Tensor, Tensor)>) {
    let (rank, world, device) = (pg.rank(), pg.world_size(), pg.device());
    tch::manual_seed(0);
    let vs = nn::VarStore::new(device);
    let model = Model::new(kind, &vs);
    broadcast_parameters(pg, &vs).expect("same model");
    let mut opt = Adam::new(&vs, AdamConfig::default().lr(1e-3)).expect("adam");
    let (bucket, overlap, layout): (usize, bool, fn(Wire) -> BucketLayout) = match variant {
        Variant::After => (usize::MAX, false, BucketLayout::Views),
        Variant::Overlap(bytes) => (bytes, true, BucketLayout::Views),
        Variant::PackedOverlap(bytes) | Variant::PackedStep(bytes) => (bytes, true, BucketLayout::Packed),
        Variant::GroupedStep(bytes) => (bytes, true, |_| BucketLayout::Grouped),
    };
    let step_in_backward = matches!(variant, Variant::PackedStep(_) | Variant::GroupedStep(_));
    let compression = if precision == Precision::Bf16Wire { Compression::BFloat16 } else { Compression::None };
    let config = bucket_config(bucket, layout, compression);
    let mut reduce =
        if world > 1 { Some(GradAllReduce::with_config(pg, opt.params(), config).expect("buckets")) } else { None };
    tch::manual_seed(1 + rank as i64);
    let batches: Vec<(Tensor, Tensor)> = (0..8).map(|_| batch(kind, device)).collect();
    let options = match precision {
        Precision::Fp32 => StepOptions::default(),
        Precision::Bf16 | Precision::Bf16Wire => StepOptions::default().autocast(Kind::BFloat16),
    };
    let step = TrainStep::new(&[("x", &batches[0].0), ("y", &batches[0].1)], options, move |inp| {
        opt.zero_grad()?;
        let loss = model.loss(&inp[0], &inp[1]);
        match &mut reduce {
            Some(r) if step_in_backward => r.backward_and_step(&loss, &mut opt)?,
            Some(r) if overlap => {
                r.backward(&loss)?;
                opt.step()?;
            }
            Some(r) => {
                loss.f_backward()?;
                r.all_reduce()?;
                opt.step()?;
            }
            None => {
                loss.f_backward()?;
                opt.step()?;
            }
        }
        Ok(vec![loss.detach()])
    })
    .expect("step");
    (step, batches)
}

/// Rank 0's PROFILE row (per-step figures of 10 profiled steps), Chrome trace and SVG timeline of
/// the last two steps, into `dir`.
fn report_profile(p: &Profile, name: &str, dir: &str, us: f64) {
    let s = p.summary();
    let main = s.streams.iter().map(|st| st.busy_us).fold(0f64, f64::max);
    println!(
        "PROFILE,{name},kernels/step {:.1},span/step {:.1},busy {:.1},compute {:.1},nccl {:.1},overlapped {:.1},exposed {:.1},busiest stream {:.1},streams {}",
        s.kernels as f64 / 10.0,
        s.span_us / 10.0,
        s.busy_us / 10.0,
        s.compute_us / 10.0,
        s.nccl_us / 10.0,
        s.overlap_us / 10.0,
        s.exposed_nccl_us() / 10.0,
        main / 10.0,
        s.streams.len()
    );
    let _ = std::fs::create_dir_all(dir);
    p.save_chrome_trace(format!("{dir}/{name}.json")).expect("trace");
    let gpu: Vec<Event> = p.events().iter().filter(|e| e.kind.on_gpu()).cloned().collect();
    let cut = gpu.iter().map(|e| e.end_ns).max().unwrap_or(0).saturating_sub((2.2 * us * 1e3) as u64);
    let last: Vec<Event> = gpu.into_iter().filter(|e| e.start_ns >= cut).collect();
    timeline_svg(&format!("{dir}/{name}.svg"), &last, &format!("{name}: the last steps, GPU of rank 0")).expect("svg");
}

const USAGE: &str = "\
usage: torchrun --nproc_per_node=N --no-python ddp

Weak scaling of the captured data-parallel step, 1 to N GPUs; rank 0 prints
ROW,<variant>,<model>,<world>,<us>. Environment:
  TCG_DDP_OVERLAP_KIB   bucket sizes of the overlapped variants (default 4096,12300,25600)
  TCG_DDP_MODELS        the models to run (comma-separated; default all)
  TCG_DDP_PACKED=1      also the packed layout (gradients not views) of each overlapped size
  TCG_DDP_BF16=1        also bf16 autocast rows (fp32 and bf16 gradients on the wire)
  TCG_DDP_STEP=1        also the packed layout with each bucket's parameters stepped as soon as
                        it is averaged (GradAllReduce::backward_and_step)
  TCG_DDP_GROUPED=1     also that without bucket buffers (BucketConfig::grouped: one grouped
                        NCCL all-reduce of the gradients where they are, per bucket)
  TCG_DDP_SPLIT=1       reduce-scatter + all-gather instead of all-reduce
  TCG_DDP_FIRST_KIB     size of the first bucket (default: as the others)
  TCG_DDP_HIGH_PRIORITY=1  the all-reduces on a high-priority stream
  TCG_DDP_BUFFERS       bucket buffers: mem (ncclMemAlloc), register (and ncclCommRegister),
                        window (and a symmetric window); default the caching allocator
  TCG_DDP_PROFILE=DIR   profile 10 steps of each overlapped variant: PROFILE rows, and a Chrome
                        trace and an SVG timeline per variant in DIR (rank 0)
  -h, --help            this text";

/// Whether to run: false when the command line asked for the usage or this binary was started
/// as a test (`cargo test --benches`).
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
        eprintln!("bench ddp: no RANK: run it under torchrun --nproc_per_node=N --no-python (make bench-ddp does)");
        std::process::exit(1);
    }
    let pg = ProcessGroup::from_env(Duration::from_secs(120)).expect("process group");
    let kib = std::env::var("TCG_DDP_OVERLAP_KIB").unwrap_or_else(|_| "4096,12300,25600".into());
    let flag = |name: &str| std::env::var(name).is_ok_and(|v| v == "1");
    let sizes: Vec<usize> = kib.split(',').filter_map(|k| k.trim().parse::<usize>().ok()).map(|k| k << 10).collect();
    let mut variants = vec![(Variant::After, Precision::Fp32)];
    let multi = pg.world_size() > 1;
    if multi {
        variants.extend(sizes.iter().map(|&b| (Variant::Overlap(b), Precision::Fp32)));
        if flag("TCG_DDP_PACKED") {
            variants.extend(sizes.iter().map(|&b| (Variant::PackedOverlap(b), Precision::Fp32)));
        }
        if flag("TCG_DDP_STEP") {
            variants.extend(sizes.iter().map(|&b| (Variant::PackedStep(b), Precision::Fp32)));
        }
        if flag("TCG_DDP_GROUPED") {
            variants.extend(sizes.iter().map(|&b| (Variant::GroupedStep(b), Precision::Fp32)));
        }
    }
    if flag("TCG_DDP_BF16") {
        variants.push((Variant::After, Precision::Bf16));
        if multi {
            for p in [Precision::Bf16, Precision::Bf16Wire] {
                variants.extend(sizes.iter().map(|&b| (Variant::Overlap(b), p)));
            }
        }
    }
    let profile = std::env::var("TCG_DDP_PROFILE").ok();
    let only = std::env::var("TCG_DDP_MODELS").unwrap_or_default();
    for kind in ModelKind::ALL.into_iter().filter(|k| only.is_empty() || only.split(',').any(|m| m == k.name())) {
        for &(v, p) in &variants {
            let prof = if matches!(v, Variant::After) && multi { None } else { profile.as_deref() };
            let us = measure(&pg, kind, v, p, prof);
            if pg.rank() == 0 {
                println!("ROW,{},{},{},{us:.2}", v.name(p), kind.name(), pg.world_size());
            }
        }
    }
}
