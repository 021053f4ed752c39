//! The main example: trains an MLP to imitate a random "teacher" network, feeding every batch
//! through the static inputs of a captured training step.
//!
//! On a GPU it captures the step into a CUDA graph, then trains the same model eagerly for the
//! same steps and prints eager vs graphed time per step, the speedup, and the largest
//! parameter difference between the two runs. On a CPU it runs the eager fallback.
//!
//! `cargo run --release --example train [-- STEPS]` (or `make run`).

use anyhow::Result;
use std::io::Write;
use std::time::Instant;
use tch::{nn, nn::Module, Device, Kind, Tensor};
use tch_cuda_graphs::optim::{Adam, AdamConfig, Optimizer};
use tch_cuda_graphs::{cuda_is_available, synchronize, StepOptions, TrainStep};

const IN: i64 = 64;
const HIDDEN: i64 = 256;
const OUT: i64 = 8;
const BATCH: i64 = 64;

fn mlp(p: nn::Path) -> nn::Sequential {
    nn::seq()
        .add(nn::linear(&p / "l1", IN, HIDDEN, Default::default()))
        .add_fn(|x| x.relu())
        .add(nn::linear(&p / "l2", HIDDEN, HIDDEN, Default::default()))
        .add_fn(|x| x.relu())
        .add(nn::linear(&p / "l3", HIDDEN, OUT, Default::default()))
}

/// The synthetic task: inputs and the teacher's outputs, all made in the process.
struct Task {
    teacher: nn::Sequential,
    _vs: nn::VarStore,
    device: Device,
}

impl Task {
    fn new(device: Device) -> Self {
        let vs = nn::VarStore::new(device);
        let teacher = mlp(vs.root() / "teacher");
        Task { teacher, _vs: vs, device }
    }
    fn batch(&self) -> (Tensor, Tensor) {
        let _g = tch::no_grad_guard();
        let x = Tensor::randn([BATCH, IN], (Kind::Float, self.device));
        let y = self.teacher.forward(&x).tanh();
        (x, y)
    }
}

/// A training step over a fresh student (seeded, so two calls build identical students).
fn student_step(device: Device, first: &(Tensor, Tensor), eager: bool) -> Result<(TrainStep, nn::VarStore)> {
    tch::manual_seed(42);
    let vs = nn::VarStore::new(device);
    let model = mlp(vs.root() / "student");
    let mut opt = Adam::new(&vs, AdamConfig::default().lr(1e-3))?;
    let step = TrainStep::new(&[("x", &first.0), ("y", &first.1)], StepOptions::default().eager(eager), move |inp| {
        opt.zero_grad()?;
        let loss = model.forward(&inp[0]).f_mse_loss(&inp[1], tch::Reduction::Mean)?;
        loss.f_backward()?;
        opt.step()?;
        Ok(vec![loss.detach()])
    })?;
    Ok((step, vs))
}

fn progress(step: usize, total: usize, loss: f64) {
    let width = 30;
    let done = (step * width) / total.max(1);
    print!("\r  [{}{}] {step:>5}/{total} loss {loss:.5}", "#".repeat(done), ".".repeat(width - done));
    let _ = std::io::stdout().flush();
}

/// Trains `steps` steps on `batches`, printing progress; returns seconds per step.
fn train(step: &mut TrainStep, batches: &[(Tensor, Tensor)], device: Device, show: bool) -> Result<f64> {
    let sync = || -> Result<()> {
        if let Device::Cuda(_) = device {
            synchronize(device)?;
        }
        Ok(())
    };
    sync()?;
    let start = Instant::now();
    let every = (batches.len() / 20).max(1);
    for (i, (x, y)) in batches.iter().enumerate() {
        let out = step.run(&[x, y])?;
        if show && (i % every == 0 || i + 1 == batches.len()) {
            progress(i + 1, batches.len(), f64::try_from(&out[0])?); // a sync: only for display
        }
    }
    sync()?;
    if show {
        println!();
    }
    Ok(start.elapsed().as_secs_f64() / batches.len() as f64)
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
    let steps: usize = std::env::args().nth(1).map(|s| s.parse()).transpose()?.unwrap_or(2000);
    let device = if cuda_is_available() { Device::Cuda(0) } else { Device::Cpu };
    tch::manual_seed(0);
    let task = Task::new(device);
    let first = task.batch();
    let batches: Vec<(Tensor, Tensor)> = (0..steps).map(|_| task.batch()).collect();

    let (mut step, vs_graph) = student_step(device, &first, false)?;
    if step.is_graphed() {
        println!("CUDA device found: the training step (forward, loss, backward, Adam) is one CUDA graph.");
        if let Some(g) = step.graph_mut() {
            g.upload()?;
        }
    } else {
        println!("No CUDA device: running the eager fallback (CUDA graphs need a CUDA device).");
    }
    println!("Training a {IN}-{HIDDEN}-{HIDDEN}-{OUT} MLP to imitate a random teacher, batch {BATCH}, {steps} steps:");
    let t_graph = train(&mut step, &batches, device, true)?;

    if step.is_graphed() {
        println!("Same model, same batches, eager (the same Adam, no graph):");
        let (mut eager, vs_eager) = student_step(device, &first, true)?;
        let t_eager = train(&mut eager, &batches, device, true)?;
        // Timed once more without the progress display's syncs.
        let (mut g2, _) = student_step(device, &first, false)?;
        let (mut e2, _) = student_step(device, &first, true)?;
        let t_graph = t_graph.min(train(&mut g2, &batches, device, false)?);
        let t_eager = t_eager.min(train(&mut e2, &batches, device, false)?);
        println!("eager:   {:8.1} µs/step", t_eager * 1e6);
        println!("graphed: {:8.1} µs/step", t_graph * 1e6);
        println!("speedup: {:8.2}x", t_eager / t_graph);
        println!("max |param_graphed - param_eager| after {steps} steps: {:e}", max_param_diff(&vs_graph, &vs_eager)?);
    } else {
        println!("eager: {:.1} µs/step", t_graph * 1e6);
    }
    Ok(())
}
