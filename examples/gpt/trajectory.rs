//! The step-for-step comparison with PyTorch: the GPT trained from weights and batches written to
//! a folder, which `benches/torch_gpt.py --trajectory` reads to train PyTorch's same model from
//! the same start on the same batches and to compare the two runs.
//!
//! Files in the folder (safetensors, read by `torch_gpt.py` with no package beyond torch):
//! - `meta.json`: the model's shape and the step's settings (schedule, decay, betas, clipping,
//!   autocast, dropout);
//! - `init.safetensors`: the initial variables, under the crate's names;
//!
//! Both sides seed their generator with the run's seed right before the first step, so with
//! dropout on they draw the same masks as long as they run the same random operations in the
//! same order.
//! - `batches.safetensors`: `x` and `y`, `[steps, batch, block]` int32;
//! - `crate.safetensors`: `loss` and `grad_norm` of every step (float64, the gradient norm
//!   before clipping), `grad@1/NAME` (the gradients of step 1 as backward wrote them: the step clips inside its
//!   update, `Optimizer::step_clipped`) and `param@K/NAME`
//!   (the variables after step K, for K in [`RECORDED`] up to the last step, and the last);
//! - `val.safetensors` (when validation tokens are given): `x` and `y`, [`VAL_BATCHES`] batches
//!   on which `torch_gpt.py` evaluates both runs' final parameters with one model, so that the
//!   two validation losses see the same batches.
#![allow(dead_code)]

use crate::model::{Config, Gpt};
use crate::step::{self, Hyper};
use anyhow::{ensure, Context, Result};
use std::path::Path;
use tch::{nn, Device, Kind, Tensor};

/// The steps after which every variable is recorded (and the last).
pub const RECORDED: [usize; 3] = [1, 10, 100];

/// Validation batches written beside the trajectory.
pub const VAL_BATCHES: i64 = 200;

/// What is trained: the model, the step, how many steps, from which seed.
#[derive(Clone, Copy, Debug)]
pub struct Spec {
    pub config: Config,
    pub hyper: Hyper,
    pub steps: usize,
    pub seed: i64,
}

/// The crate's side of a trajectory: every step's loss and gradient norm (before clipping).
#[derive(Debug)]
pub struct Trajectory {
    pub loss: Vec<f64>,
    pub grad_norm: Vec<f64>,
}

impl std::fmt::Display for Trajectory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (l, g) = (&self.loss, &self.grad_norm);
        match (l.first(), l.last(), g.first(), g.last()) {
            (Some(l0), Some(l1), Some(g0), Some(g1)) => {
                write!(f, "{} steps, loss {l0:.6} -> {l1:.6}, gradient norm {g0:.4} -> {g1:.4}", l.len())
            }
            _ => write!(f, "no steps"),
        }
    }
}

/// Copies of the variables of `vs` (or of their gradients) on the CPU, sorted by name, under
/// `prefix`. Made without autograd: a copy that kept a variable's gradient accumulator alive
/// would tie the next capture's backward to the stream it was made on.
fn variables(vs: &nn::VarStore, prefix: &str, grads: bool) -> Result<Vec<(String, Tensor)>> {
    let _no_grad = tch::no_grad_guard();
    let mut vars: Vec<(String, Tensor)> = vs.variables().into_iter().collect();
    vars.sort_by(|a, b| a.0.cmp(&b.0));
    vars.into_iter()
        .map(|(n, t)| {
            let t = if grads { t.grad() } else { t };
            ensure!(t.defined(), "{n} has no gradient after step 1");
            // a copy: on the CPU `to_device` returns the live variable itself
            Ok((format!("{prefix}{n}"), t.f_detach_copy()?.f_to_device(Device::Cpu)?.f_contiguous()?))
        })
        .collect()
}

/// The settings `torch_gpt.py` needs to run the same step.
fn meta(spec: &Spec) -> serde_json::Value {
    let (c, h) = (&spec.config, &spec.hyper);
    serde_json::json!({
        "vocab": c.vocab, "block": c.block, "layers": c.layers, "heads": c.heads, "embd": c.embd,
        "dropout": c.dropout, "batch": h.batch, "steps": spec.steps, "iters": h.iters,
        "warmup": h.warmup, "lr": h.lr, "min_lr": h.min_lr, "weight_decay": h.weight_decay,
        "betas": [step::BETA1, step::BETA2], "eps": step::EPS, "clip": h.clip,
        "autocast": h.autocast.map(|_| "bf16"), "seed": spec.seed, "recorded": RECORDED,
    })
}

/// `[n, batch, block]` inputs and targets drawn from `tokens`, as an int32 file's tensors.
fn draw(tokens: &Tensor, n: i64, batch: i64, block: i64) -> Result<(Tensor, Tensor)> {
    let (mut xs, mut ys) = (Vec::new(), Vec::new());
    for _ in 0..n {
        let (x, y) = crate::data::batch(tokens, batch, block)?;
        xs.push(x);
        ys.push(y);
    }
    Ok((Tensor::f_stack(&xs, 0)?, Tensor::f_stack(&ys, 0)?))
}

/// Writes `x` and `y` (int32, on the CPU) into `path`.
fn write_batches(path: &Path, xs: &Tensor, ys: &Tensor) -> Result<()> {
    let file = |t: &Tensor| t.f_to_kind(Kind::Int)?.f_to_device(Device::Cpu);
    Ok(Tensor::write_safetensors(&[("x".to_string(), file(xs)?), ("y".to_string(), file(ys)?)], path)?)
}

/// Writes the initial weights and `spec.steps` batches drawn from `tokens` (uint8) into `dir`
/// (and [`VAL_BATCHES`] drawn from `val`, if given), trains the GPT on them with the example's
/// step on `device`, and writes what it saw.
pub fn run(dir: &Path, spec: &Spec, tokens: &Tensor, val: Option<&Tensor>, device: Device) -> Result<Trajectory> {
    ensure!(spec.hyper.accum == 1, "a trajectory runs one micro-batch per step");
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    std::fs::write(dir.join("meta.json"), serde_json::to_string_pretty(&meta(spec))?)?;
    tch::manual_seed(spec.seed);
    let vs = nn::VarStore::new(device);
    let gpt = Gpt::new(&vs.root(), spec.config);
    Tensor::write_safetensors(&variables(&vs, "", false)?, dir.join("init.safetensors"))?;
    let (block, batch) = (spec.config.block, spec.hyper.batch);
    let (xs, ys) = draw(tokens, spec.steps as i64, batch, block)?;
    write_batches(&dir.join("batches.safetensors"), &xs, &ys)?;
    if let Some(val) = val {
        let (vx, vy) = draw(val, VAL_BATCHES, batch, block)?;
        write_batches(&dir.join("val.safetensors"), &vx, &vy)?;
    }

    let mut steps = step::build(&vs, &gpt, spec.hyper)?;
    // both sides draw their dropout masks from the same seed, in the same order of operations
    tch::manual_seed(spec.seed);
    let mut out = Trajectory { loss: Vec::new(), grad_norm: Vec::new() };
    let mut recorded = Vec::new();
    for k in 0..spec.steps {
        let shape = [1, batch, block];
        let o = steps.train.run(&[&xs.get(k as i64).f_view(shape)?, &ys.get(k as i64).f_view(shape)?])?;
        out.loss.push(f64::try_from(&o[0])?);
        out.grad_norm.push(f64::try_from(&o[1])?);
        let done = k + 1;
        if done == 1 {
            recorded.extend(variables(&vs, "grad@1/", true)?);
        }
        if RECORDED.contains(&done) || done == spec.steps {
            recorded.extend(variables(&vs, &format!("param@{done}/"), false)?);
        }
    }
    recorded.push(("loss".into(), Tensor::from_slice(&out.loss)));
    recorded.push(("grad_norm".into(), Tensor::from_slice(&out.grad_norm)));
    Tensor::write_safetensors(&recorded, dir.join("crate.safetensors"))?;
    Ok(out)
}

/// PyTorch's side of the trajectory in `dir`: what `torch_gpt.py --trajectory` wrote into
/// `torch.safetensors` beside [`run`]'s files.
pub fn read_torch(dir: &Path) -> Result<Trajectory> {
    let named = Tensor::read_safetensors(dir.join("torch.safetensors"))?;
    let get = |name: &str| -> Result<Vec<f64>> {
        let t =
            named.iter().find(|(n, _)| n == name).map(|(_, t)| t).context(format!("no {name} in torch.safetensors"))?;
        Ok(Vec::<f64>::try_from(&t.f_to_kind(Kind::Double)?)?)
    };
    Ok(Trajectory { loss: get("loss")?, grad_norm: get("grad_norm")? })
}
