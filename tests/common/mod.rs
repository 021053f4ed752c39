//! Helpers shared by the test files.
#![allow(dead_code)]

use tch::{nn, nn::Module, Device, Kind, Tensor};

/// The CUDA device for a GPU test; panics (fails loudly) when there is none.
pub fn cuda() -> Device {
    assert!(
        tch_cuda_graphs::cuda_is_available(),
        "this test needs a CUDA device, and none is available (run GPU tests on a GPU machine)"
    );
    Device::Cuda(0)
}

/// max |a - b| / max |b|, in f64.
pub fn rel(a: &Tensor, b: &Tensor) -> f64 {
    let (a, b) = (a.to_kind(Kind::Double), b.to_kind(Kind::Double));
    f64::try_from((&a - &b).abs().max()).unwrap() / f64::try_from(b.abs().max()).unwrap().max(1e-30)
}

/// The largest |a - b| in units of b's bf16 ulp (b rounded: a power of two per binade).
pub fn bf16_ulps(a: &Tensor, b: &Tensor) -> f64 {
    let (a, b) = (a.to_kind(Kind::Float), b.to_kind(Kind::Float));
    let ulp = (b.abs().clamp_min(1e-30).log2().floor() - 7.0).exp2();
    f64::try_from(((&a - &b).abs() / ulp).max()).unwrap()
}

/// A 3-layer MLP `d -> h -> h -> o` with ReLUs.
pub fn mlp(p: nn::Path, d: i64, h: i64, o: i64) -> nn::Sequential {
    nn::seq()
        .add(nn::linear(&p / "l1", d, h, Default::default()))
        .add_fn(|x| x.relu())
        .add(nn::linear(&p / "l2", h, h, Default::default()))
        .add_fn(|x| x.relu())
        .add(nn::linear(&p / "l3", h, o, Default::default()))
}

/// Two VarStores on `device` holding the same MLP weights.
pub fn twin_mlps(
    device: Device,
    d: i64,
    h: i64,
    o: i64,
) -> (nn::VarStore, nn::Sequential, nn::VarStore, nn::Sequential) {
    let vs_a = nn::VarStore::new(device);
    let a = mlp(vs_a.root(), d, h, o);
    let mut vs_b = nn::VarStore::new(device);
    let b = mlp(vs_b.root(), d, h, o);
    vs_b.copy(&vs_a).expect("copy weights");
    (vs_a, a, vs_b, b)
}

/// Mean-squared-error loss of `model` on (x, y).
pub fn mse(model: &impl Module, x: &Tensor, y: &Tensor) -> Tensor {
    model.forward(x).mse_loss(y, tch::Reduction::Mean)
}

/// Largest absolute difference between the parameters of two VarStores (matched by name).
pub fn max_param_diff(a: &nn::VarStore, b: &nn::VarStore) -> f64 {
    let va = a.variables();
    let vb = b.variables();
    let mut worst = 0f64;
    for (name, ta) in &va {
        let tb = &vb[name];
        let d = f64::try_from((ta - tb).abs().max()).expect("scalar");
        worst = worst.max(d);
    }
    worst
}

/// Largest relative difference max|a-b| / max|b| over the parameters of two VarStores.
pub fn max_param_rel_diff(a: &nn::VarStore, b: &nn::VarStore) -> f64 {
    let va = a.variables();
    let vb = b.variables();
    let mut worst = 0f64;
    for (name, ta) in &va {
        let tb = &vb[name];
        let num = f64::try_from((ta - tb).abs().max()).expect("scalar");
        let den = f64::try_from(tb.abs().max()).expect("scalar").max(1e-12);
        worst = worst.max(num / den);
    }
    worst
}

/// A batch of a synthetic regression task.
pub fn batch(device: Device, n: i64, d: i64, o: i64) -> (Tensor, Tensor) {
    let x = Tensor::randn([n, d], (Kind::Float, device));
    let y = x.narrow(1, 0, o).sin() * 2.0;
    (x, y)
}

/// A fixed sequence of CPU batches of the synthetic task, with the given batch sizes.
pub fn cpu_batches(seed: i64, sizes: &[i64], d: i64, o: i64) -> Vec<(Tensor, Tensor)> {
    tch::manual_seed(seed);
    sizes.iter().map(|&n| batch(Device::Cpu, n, d, o)).collect()
}

/// The usual step closure: zero_grad, MSE loss, backward, optimizer step; returns the loss.
pub fn mse_step(
    model: nn::Sequential,
    mut opt: impl tch_cuda_graphs::optim::Optimizer + Send + 'static,
) -> impl FnMut(&[Tensor]) -> tch_cuda_graphs::Result<Vec<Tensor>> + Send + 'static {
    move |inp| {
        opt.zero_grad()?;
        let loss = model.forward(&inp[0]).f_mse_loss(&inp[1], tch::Reduction::Mean)?;
        loss.f_backward()?;
        opt.step()?;
        Ok(vec![loss.detach()])
    }
}

/// The same training done by hand: one eager step per batch (moved to `device`).
pub fn plain_loop(
    model: &nn::Sequential,
    opt: &mut impl tch_cuda_graphs::optim::Optimizer,
    batches: &[(Tensor, Tensor)],
    device: Device,
) {
    for (x, y) in batches {
        let (x, y) = (x.to(device), y.to(device));
        opt.zero_grad().unwrap();
        mse(model, &x, &y).backward();
        opt.step().unwrap();
    }
}

/// `batches` moved to `device`.
pub fn on(device: Device, batches: &[(Tensor, Tensor)]) -> Vec<(Tensor, Tensor)> {
    batches.iter().map(|(x, y)| (x.to(device), y.to(device))).collect()
}

/// A TCP port free right now on 127.0.0.1 (for a process group's store).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("a free port")
}

/// One MLP `d -> h -> h -> o` trained twice from the same weights with Adam (`lr`) under
/// `schedule`: once with the schedule applied from the host between steps (`host`, `step_h`),
/// once with it computed on the device inside the step (`step_d`). Steps take batches of `n`.
pub struct ScheduleTwins {
    pub host: tch_cuda_graphs::schedule::LrScheduler<tch_cuda_graphs::schedule::WarmupCosine>,
    pub step_h: tch_cuda_graphs::TrainStep<'static>,
    pub vs_h: nn::VarStore,
    pub lr_h: tch_cuda_graphs::optim::LrHandle,
    pub step_d: tch_cuda_graphs::TrainStep<'static>,
    pub vs_d: nn::VarStore,
    pub lr_d: tch_cuda_graphs::optim::LrHandle,
}

pub fn schedule_twins(
    device: Device,
    schedule: tch_cuda_graphs::schedule::WarmupCosine,
    lr: f64,
    (d, h, o, n): (i64, i64, i64, i64),
) -> ScheduleTwins {
    use tch_cuda_graphs::optim::{Adam, AdamConfig, Optimizer};
    use tch_cuda_graphs::schedule::{DeviceLrScheduler, LrScheduler};
    use tch_cuda_graphs::{StepOptions, TrainStep};
    let (vs_h, model_h, vs_d, model_d) = twin_mlps(device, d, h, o);
    let (x0, y0) = (Tensor::zeros([n, d], (Kind::Float, device)), Tensor::zeros([n, o], (Kind::Float, device)));
    let opt_h = Adam::new(&vs_h, AdamConfig::default().lr(lr)).unwrap();
    let lr_h = opt_h.lr_handles().remove(0);
    let host = LrScheduler::new(schedule, opt_h.lr_handles());
    let step_h = TrainStep::new(&[("x", &x0), ("y", &y0)], StepOptions::default(), mse_step(model_h, opt_h)).unwrap();
    let opt_d = Adam::new(&vs_d, AdamConfig::default().lr(lr)).unwrap();
    let lr_d = opt_d.lr_handles().remove(0);
    let mut dev = DeviceLrScheduler::new(schedule, opt_d.lr_handles()).unwrap();
    let mut inner = mse_step(model_d, opt_d);
    let step_d = TrainStep::new(&[("x", &x0), ("y", &y0)], StepOptions::default(), move |inp| {
        dev.step()?;
        inner(inp)
    })
    .unwrap();
    ScheduleTwins { host, step_h, vs_h, lr_h, step_d, vs_d, lr_d }
}

/// The cross-entropy through `loss::CrossEntropyLoss`, and whether its forward ran the crate's
/// fused kernels.
pub fn cross_entropy_ran(
    logits: &Tensor,
    targets: &Tensor,
    config: &tch_cuda_graphs::loss::CrossEntropyConfig,
) -> tch_cuda_graphs::Result<(Tensor, bool)> {
    let loss_fn = tch_cuda_graphs::loss::CrossEntropyLoss::new(*config);
    let loss = loss_fn.f_forward(logits, targets)?;
    Ok((loss, loss_fn.last_path() == Some(tch_cuda_graphs::kernels::KernelPath::Own)))
}

/// `step`'s result captured (into a buffer, after one warmup) and replayed, against the same step
/// run eagerly afterwards: max |replayed - eager| (0 for a step that replays bit for bit).
pub fn captured_minus_eager(step: impl Fn() -> tch_cuda_graphs::Result<Tensor>) -> f64 {
    use tch_cuda_graphs::{capture_with_warmup, CaptureOptions};
    let out = step().expect("the eager step").zeros_like();
    let (mut graph, ()) = capture_with_warmup(1, CaptureOptions::default(), || {
        out.shallow_clone().f_copy_(&step()?)?;
        Ok(())
    })
    .expect("capture");
    let _ = out.shallow_clone().fill_(0.0);
    graph.replay().expect("replay");
    let eager = step().expect("the eager step");
    f64::try_from((&out - &eager).abs().max()).unwrap()
}

/// What `f` returns, and the names of the GPU kernels it ran (profiled, the device synchronized
/// before the profile stops).
pub fn kernels_of<T>(device: Device, f: impl FnOnce() -> T) -> (T, Vec<String>) {
    use tch_cuda_graphs::profiler::{EventKind, Profiler};
    tch_cuda_graphs::synchronize(device).expect("sync");
    let profiler = Profiler::start().expect("profiler");
    let out = f();
    tch_cuda_graphs::synchronize(device).expect("sync");
    let profile = profiler.stop().expect("profile");
    let names = profile.events().iter().filter(|e| e.kind == EventKind::Kernel).map(|e| e.name.clone()).collect();
    (out, names)
}

/// A step's output and its gradients (each used) in float32, flattened into one tensor, y
/// detached: the result keeps no autograd graph (nor the parameters' accumulators) alive.
pub fn output_and_grads(y: &Tensor, grads: &[Option<Tensor>]) -> Tensor {
    let mut parts = vec![y.detach().to_kind(Kind::Float).reshape([-1])];
    parts.extend(grads.iter().map(|g| g.as_ref().expect("used").to_kind(Kind::Float).reshape([-1])));
    Tensor::cat(&parts, 0)
}
