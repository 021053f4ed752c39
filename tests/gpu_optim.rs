//! The crate's own optimizer kernels against PyTorch's fused ones (`_fused_adam_`,
//! `_fused_adamw_`, `_fused_sgd_`, run through the same optimizers with `Kernels::PyTorch`):
//! bit for bit, over 1000 steps, for every option, on odd sizes, a misaligned view, a frozen
//! parameter, a parameter that starts late, and skipped steps (found_inf set).
mod common;

use common::cuda;
use tch::{Device, Kind, Tensor};
use tch_cuda_graphs::kernels::{KernelPath, Kernels};
use tch_cuda_graphs::optim::{Adam, AdamConfig, Optimizer, Sgd, SgdConfig};
use tch_cuda_graphs::{Error, StepOptions, TrainStep};

/// Steps per comparison: 1000, or `TCG_TEST_OPTIM_STEPS` (the sanitizer run takes fewer).
fn steps() -> i64 {
    std::env::var("TCG_TEST_OPTIM_STEPS").ok().and_then(|v| v.parse().ok()).unwrap_or(1000)
}
/// From this step on the "late" parameter has a gradient.
fn late_from() -> i64 {
    (steps() / 10).max(1)
}

/// The parameters of one side: odd sizes, 2-D ones, a misaligned view (a view at element 1 of a
/// buffer, so not 16-byte aligned), one that never gets a gradient (frozen), one that gets its
/// first at step LATE_FROM. The same values on both sides.
struct Side {
    params: Vec<Tensor>,
    /// Keeps the misaligned view's buffer.
    _buffer: Tensor,
}

const SHAPES: &[&[i64]] = &[&[1], &[3], &[257], &[65537], &[256, 256], &[1000, 37], &[4]];
const FROZEN: usize = SHAPES.len() + 1;
const LATE: usize = SHAPES.len() + 2;

fn side(device: Device, kind: Kind) -> Side {
    tch::manual_seed(7);
    let mut params: Vec<Tensor> =
        SHAPES.iter().map(|s| Tensor::randn(*s, (Kind::Float, device)).to_kind(kind).set_requires_grad(true)).collect();
    let buffer = Tensor::randn([1001], (Kind::Float, device)).to_kind(kind);
    params.push(buffer.narrow(0, 1, 1000).detach().set_requires_grad(true)); // misaligned view
    params.push(Tensor::randn([33], (Kind::Float, device)).to_kind(kind).set_requires_grad(true)); // frozen
    params.push(Tensor::randn([129], (Kind::Float, device)).to_kind(kind).set_requires_grad(true)); // late
    Side { params, _buffer: buffer }
}

/// Gives `p` a gradient (zeros) if it has none, and returns it.
fn grad_of(p: &Tensor) -> Tensor {
    let g = p.grad();
    if g.defined() {
        return g;
    }
    (p * 0.0).sum(p.kind()).backward();
    p.grad()
}

/// How far apart two tensors are, in units in the last place of their largest magnitude (0:
/// bit for bit; NaN where they differ: infinite). Relative to the tensor's scale, not each
/// element's own: an update `p - lr * g` that cancels to nearly zero keeps the absolute error
/// of its inputs, which is many ulps of the tiny result but a fraction of one of its inputs.
fn ulps(x: &Tensor, y: &Tensor) -> f64 {
    if x.equal(y) {
        return 0.0;
    }
    let mantissa = match x.kind() {
        Kind::Float => 23,
        Kind::Double => 52,
        Kind::Half => 10,
        Kind::BFloat16 => 7,
        k => panic!("no ulps for {k:?}"),
    };
    let (a, b) = (x.to_kind(Kind::Double), y.to_kind(Kind::Double));
    let big = f64::try_from(a.abs().max().maximum(&b.abs().max())).unwrap().max(f64::MIN_POSITIVE);
    let ulp = (big.log2().floor() - f64::from(mantissa)).exp2();
    let d = f64::try_from((a - b).abs().max()).unwrap() / ulp;
    if d.is_nan() {
        f64::INFINITY
    } else {
        d
    }
}

/// Every tensor a step writes: parameters, gradients (unscaled in place) and the state.
fn everything(opt: &dyn Optimizer, side: &Side) -> Vec<(String, Tensor)> {
    let mut out: Vec<(String, Tensor)> = Vec::new();
    for (i, p) in side.params.iter().enumerate() {
        out.push((format!("param {i}"), p.detach()));
        if p.grad().defined() {
            out.push((format!("grad {i}"), p.grad()));
        }
    }
    out.extend(opt.state().unwrap());
    out
}

/// What a comparison found.
#[derive(Debug)]
struct Outcome {
    /// The largest difference in one step, in ulps (0: every step bit for bit).
    worst_ulps: f64,
    /// How many of the steps differed at all.
    steps_differing: i64,
}

/// Runs both optimizers for STEPS steps on the same gradients. After each step every tensor it
/// wrote is compared, then the PyTorch side is copied into the own side, so each step starts
/// from the same state and a difference cannot grow: the figure is one step's difference.
fn compare(
    mut own: Box<dyn Optimizer>,
    mut torch: Box<dyn Optimizer>,
    a: &Side,
    b: &Side,
    kind: Kind,
    scaled: bool,
) -> Outcome {
    own.set_kernels(Kernels::Own).expect("own kernels available");
    torch.set_kernels(Kernels::PyTorch).unwrap();
    let device = a.params[0].device();
    let scale = Tensor::full([], 1024.0, (Kind::Float, device));
    let found = Tensor::zeros([], (Kind::Float, device));
    let mut outcome = Outcome { worst_ulps: 0.0, steps_differing: 0 };
    for step in 0..steps() {
        for (i, (pa, pb)) in a.params.iter().zip(&b.params).enumerate() {
            if i == FROZEN || (i == LATE && step < late_from()) {
                continue;
            }
            let g = Tensor::randn(pa.size(), (Kind::Float, device));
            let g = if scaled { g * 1024.0 } else { g };
            let g = g.to_kind(kind);
            grad_of(pa).copy_(&g);
            grad_of(pb).copy_(&g);
        }
        if scaled {
            // every 7th step overflowed: skipped, nothing changes (step counts included)
            let _ = found.shallow_clone().fill_(if step % 7 == 3 { 1.0 } else { 0.0 });
            own.step_scaled(Some(&scale), Some(&found)).unwrap();
            torch.step_scaled(Some(&scale), Some(&found)).unwrap();
        } else {
            own.step().unwrap();
            torch.step().unwrap();
        }
        assert_eq!(own.last_path(), Some(KernelPath::Own));
        assert_eq!(torch.last_path(), Some(KernelPath::PyTorch));
        let (ea, eb) = (everything(own.as_ref(), a), everything(torch.as_ref(), b));
        assert_eq!(ea.len(), eb.len());
        let mut worst = 0f64;
        for ((na, ta), (nb, tb)) in ea.iter().zip(&eb) {
            assert_eq!(na, nb);
            worst = worst.max(ulps(ta, tb));
        }
        if worst > 0.0 {
            outcome.steps_differing += 1;
            outcome.worst_ulps = outcome.worst_ulps.max(worst);
            let _no_grad = tch::no_grad_guard();
            for ((_, ta), (_, tb)) in ea.iter().zip(&eb) {
                ta.shallow_clone().copy_(tb);
            }
        }
    }
    outcome
}

fn adam_case(kind: Kind, config: AdamConfig, scaled: bool) -> Outcome {
    let device = cuda();
    let (a, b) = (side(device, kind), side(device, kind));
    let own = Adam::from_params(a.params.iter().map(Tensor::shallow_clone).collect(), config).unwrap();
    let torch = Adam::from_params(b.params.iter().map(Tensor::shallow_clone).collect(), config).unwrap();
    compare(Box::new(own), Box::new(torch), &a, &b, kind, scaled)
}

fn sgd_case(kind: Kind, config: SgdConfig, scaled: bool) -> Outcome {
    let device = cuda();
    let (a, b) = (side(device, kind), side(device, kind));
    let own = Sgd::from_params(a.params.iter().map(Tensor::shallow_clone).collect(), config).unwrap();
    let torch = Sgd::from_params(b.params.iter().map(Tensor::shallow_clone).collect(), config).unwrap();
    compare(Box::new(own), Box::new(torch), &a, &b, kind, scaled)
}

fn adam_configs() -> Vec<(String, AdamConfig)> {
    let mut out = Vec::new();
    for adamw in [false, true] {
        for amsgrad in [false, true] {
            for maximize in [false, true] {
                for wd in [0.0, 0.1] {
                    let base = if adamw { AdamConfig::adamw() } else { AdamConfig::default() };
                    let c = base.lr(1e-3).amsgrad(amsgrad).maximize(maximize).weight_decay(wd);
                    out.push((format!("adamw={adamw} amsgrad={amsgrad} maximize={maximize} wd={wd}"), c));
                }
            }
        }
    }
    out
}

fn sgd_configs() -> Vec<(String, SgdConfig)> {
    let mut out = Vec::new();
    for (momentum, dampening, nesterov) in [(0.0, 0.0, false), (0.9, 0.0, false), (0.9, 0.1, false), (0.9, 0.0, true)] {
        for wd in [0.0, 1e-2] {
            for maximize in [false, true] {
                let c = SgdConfig::default()
                    .lr(1e-2)
                    .momentum(momentum)
                    .dampening(dampening)
                    .nesterov(nesterov)
                    .weight_decay(wd)
                    .maximize(maximize);
                out.push((
                    format!(
                        "momentum={momentum} dampening={dampening} nesterov={nesterov} wd={wd} maximize={maximize}"
                    ),
                    c,
                ));
            }
        }
    }
    out
}

/// The cases of a numerics test: every config in float32, unscaled and with a grad scale, then
/// every third in bfloat16 and float64 (unscaled) and float16 (scaled, as fp16 training is).
fn cases<C: Copy>(configs: Vec<(String, C)>) -> Vec<(Kind, String, C, bool)> {
    let mut out = Vec::new();
    for (name, c) in &configs {
        for scaled in [false, true] {
            out.push((Kind::Float, name.clone(), *c, scaled));
        }
    }
    for kind in [Kind::BFloat16, Kind::Half, Kind::Double] {
        for (name, c) in configs.iter().step_by(3) {
            out.push((kind, name.clone(), *c, kind == Kind::Half));
        }
    }
    out
}

/// Adam: bit for bit, except one combination: Adam (not AdamW) with weight decay and no grad
/// scale, where `grad += param * weight_decay` (the one multiply-add of `adam_math` that is not
/// an explicit `std::fma`) is rounded differently by the compiler in PyTorch's binary than in
/// ours. That one rounding of the weight-decayed gradient goes into both moments and the update
/// within the step, and the update divides by the root of the second moment, which amplifies it
/// where that moment is small: within 64 ulps of each tensor's scale per step (measured on an
/// H100: 3 after 20 steps, 32 after 200, 8 after 1000). Each step starts from PyTorch's state,
/// so it does not accumulate.
#[test]
#[ignore = "needs a CUDA device"]
fn own_adam_equals_pytorch_fused_adam_over_1000_steps() {
    let mut report = Vec::new();
    let cases = cases(adam_configs());
    for (kind, name, c, scaled) in cases {
        let o = adam_case(kind, c, scaled);
        println!(
            "adam {kind:?} {name} scaled={scaled}: {} of {} steps differ, at most {} ulp of the tensor's scale",
            o.steps_differing,
            steps(),
            o.worst_ulps
        );
        let exempt = !c.is_adamw() && !scaled && name.contains("wd=0.1");
        let bound = if exempt { 64.0 } else { 0.0 };
        if o.worst_ulps > bound {
            report.push(format!("{kind:?} {name} scaled={scaled}: {o:?}"));
        }
    }
    assert!(report.is_empty(), "own Adam differs from PyTorch's: {report:#?}");
}

/// SGD: bit for bit for most options, else within 8 ulps (of each tensor's scale) of PyTorch's
/// per step. Our kernel does PyTorch 2.11's float arithmetic (hyper-parameters converted to
/// float, as its SASS shows: F2F.F32.F64, then FFMA / FMUL) with every multiply-add fused, as
/// PyTorch's element-wise path does. Its vectorized path (float4, tensors of a multiple of 4
/// elements) rounds some products before adding, by the element's position in the float4 (its
/// SASS: FMUL + FADD for three lanes, FFMA for the fourth), and it rounds maximize with
/// momentum differently again: no formula in source reproduces that, so bit for bit is out of
/// reach there. Each step starts from PyTorch's state, so differences do not accumulate.
#[test]
#[ignore = "needs a CUDA device"]
fn own_sgd_equals_pytorch_fused_sgd_within_8_ulps_per_step_over_1000_steps() {
    let mut report = Vec::new();
    let mut bitwise = 0;
    let cases = cases(sgd_configs());
    let total = cases.len();
    for (kind, name, c, scaled) in cases {
        let o = sgd_case(kind, c, scaled);
        println!(
            "sgd {kind:?} {name} scaled={scaled}: {} of {} steps differ, at most {} ulp of the tensor's scale",
            o.steps_differing,
            steps(),
            o.worst_ulps
        );
        if o.worst_ulps == 0.0 {
            bitwise += 1;
        }
        if o.worst_ulps > 8.0 {
            report.push(format!("{kind:?} {name} scaled={scaled}: {o:?}"));
        }
    }
    println!("sgd: {bitwise} of {total} cases bit for bit over all {} steps", steps());
    assert!(report.is_empty(), "own SGD differs from PyTorch's by more than 8 ulps: {report:#?}");
}

/// More tensors than one launch table holds (128), plus empty ones: several launches, the
/// step counts of empty tensors still counted.
#[test]
#[ignore = "needs a CUDA device"]
fn many_tensors_take_several_launches_and_stay_equal() {
    let device = cuda();
    let make = || -> Vec<Tensor> {
        tch::manual_seed(3);
        (0..300i64).map(|i| Tensor::randn([(i * 37) % 300], (Kind::Float, device)).set_requires_grad(true)).collect()
    };
    let (pa, pb) = (make(), make());
    let mut own = Adam::from_params(pa.iter().map(Tensor::shallow_clone).collect(), AdamConfig::adamw()).unwrap();
    let mut torch = Adam::from_params(pb.iter().map(Tensor::shallow_clone).collect(), AdamConfig::adamw()).unwrap();
    own.set_kernels(Kernels::Own).unwrap();
    torch.set_kernels(Kernels::PyTorch).unwrap();
    for _ in 0..50 {
        for (a, b) in pa.iter().zip(&pb) {
            let g = Tensor::randn(a.size(), (Kind::Float, device));
            grad_of(a).copy_(&g);
            grad_of(b).copy_(&g);
        }
        own.step().unwrap();
        torch.step().unwrap();
    }
    let worst = pa.iter().zip(&pb).filter(|(a, b)| !a.equal(b)).count();
    let steps_equal = (0..300).all(|i| own.step_tensor(i).unwrap().equal(torch.step_tensor(i).unwrap()));
    println!("300 tensors, 50 steps: {worst} parameters differ; step counts equal: {steps_equal}");
    assert_eq!(worst, 0);
    assert!(steps_equal);
    assert_eq!(f64::try_from(own.step_tensor(0).unwrap()).unwrap(), 50.0); // an empty tensor
}

/// A TrainStep replaying its graph with the own kernels trains exactly like eager steps with
/// them, and exactly like PyTorch's kernels replayed.
#[test]
#[ignore = "needs a CUDA device"]
fn replayed_own_kernels_equal_eager_and_pytorch_replayed() {
    let device = cuda();
    let run = |kernels: Kernels, graphed: bool| -> tch::nn::VarStore {
        tch::manual_seed(11);
        let vs = tch::nn::VarStore::new(device);
        let model = common::mlp(vs.root(), 32, 256, 8);
        let mut opt = Adam::new(&vs, AdamConfig::adamw().lr(1e-3)).unwrap();
        opt.set_kernels(kernels).unwrap();
        let x = Tensor::randn([64, 32], (Kind::Float, device));
        let y = Tensor::randn([64, 8], (Kind::Float, device));
        let options = StepOptions::default().warmup(3).eager(!graphed);
        let mut step = TrainStep::new(&[("x", &x), ("y", &y)], options, move |inp| {
            opt.zero_grad()?;
            let loss = common::mse(&model, &inp[0], &inp[1]);
            loss.f_backward()?;
            opt.step()?;
            Ok(vec![loss.detach()])
        })
        .unwrap();
        assert_eq!(step.is_graphed(), graphed);
        for _ in 0..100 {
            step.run(&[&x, &y]).unwrap();
        }
        drop(step);
        tch_cuda_graphs::synchronize(device).unwrap();
        vs
    };
    let eager = run(Kernels::Own, false);
    let graphed = run(Kernels::Own, true);
    let torch = run(Kernels::PyTorch, true);
    let (d1, d2) = (common::max_param_diff(&graphed, &eager), common::max_param_diff(&graphed, &torch));
    println!("own kernels, 100 steps: replayed vs eager {d1:e}, vs PyTorch's kernels replayed {d2:e}");
    assert_eq!(d1, 0.0);
    assert_eq!(d2, 0.0);
}

/// Auto picks the own kernels on a GPU; Own is refused where they cannot take the tensors
/// (a non-contiguous parameter), where Auto falls back to PyTorch's for that launch.
#[test]
#[ignore = "needs a CUDA device"]
fn auto_runs_own_kernels_and_falls_back_where_they_do_not_apply() {
    let device = cuda();
    tch_cuda_graphs::kernels::own_kernels_available(device).expect("own kernels on this GPU");
    let p = Tensor::randn([8, 8], (Kind::Float, device)).set_requires_grad(true);
    let mut opt = Adam::from_params(vec![p.shallow_clone()], AdamConfig::default()).unwrap();
    assert_eq!(opt.kernels(), Kernels::Auto);
    let _ = grad_of(&p);
    opt.step().unwrap();
    assert_eq!(opt.last_path(), Some(KernelPath::Own));

    let t = Tensor::randn([8, 8], (Kind::Float, device)).tr().set_requires_grad(true); // not contiguous
    assert!(!t.is_contiguous());
    let mut opt = Sgd::from_params(vec![t.shallow_clone(), p.shallow_clone()], SgdConfig::default().lr(0.1)).unwrap();
    let _ = grad_of(&t).fill_(1.0);
    let before = t.copy();
    opt.set_kernels(Kernels::Own).unwrap();
    let err = opt.step().unwrap_err();
    println!("forced own kernels on a non-contiguous parameter: {err}");
    assert!(matches!(err, Error::Unsupported(_)), "{err:?}");
    assert!(t.equal(&before), "a refused step changed nothing");
    opt.set_kernels(Kernels::Auto).unwrap();
    opt.step().unwrap();
    assert_eq!(opt.last_path(), Some(KernelPath::PyTorch));
    assert!(!t.equal(&before));
}

/// Clipping folded into Adam (`step_clipped`) is `clip_grad_norm` then `step`, bit for bit, on
/// the own kernel (which multiplies as it reads) and on PyTorch's (which reads clipped copies),
/// with the clip on and off (large and small gradients in turn): the same norms, parameters and
/// state at every step, and the gradients left as backward wrote them.
#[test]
#[ignore = "needs a CUDA device"]
fn step_clipped_equals_clip_grad_norm_then_step() {
    let device = cuda();
    let config = AdamConfig::adamw().lr(1e-2).weight_decay(0.1);
    for kernels in [Kernels::Own, Kernels::PyTorch] {
        let (a, b) = (side(device, Kind::Float), side(device, Kind::Float));
        let shallow = |s: &Side| s.params.iter().map(Tensor::shallow_clone).collect::<Vec<_>>();
        let mut reference = Adam::from_params(shallow(&a), config).unwrap();
        let mut folded = Adam::from_params(shallow(&b), config).unwrap();
        reference.set_kernels(kernels).unwrap();
        folded.set_kernels(kernels).unwrap();
        let mut worst = 0f64;
        for step in 0..200 {
            let mut given = Vec::new();
            for (i, (pa, pb)) in a.params.iter().zip(&b.params).enumerate() {
                if i == FROZEN || (i == LATE && step < late_from()) {
                    continue;
                }
                let g = Tensor::randn(pa.size(), (Kind::Float, device)) * if step % 2 == 0 { 1.0 } else { 1e-4 };
                grad_of(pa).copy_(&g);
                grad_of(pb).copy_(&g);
                given.push((i, g));
            }
            let norm_a = tch_cuda_graphs::clip_grad_norm(&a.params, 1.0, 2.0).unwrap();
            reference.step().unwrap();
            let norm_b = folded.step_clipped(1.0).unwrap();
            assert!(norm_a.equal(&norm_b), "step {step}: the norms");
            assert_eq!(folded.last_path(), reference.last_path());
            for (i, g) in &given {
                assert!(b.params[*i].grad().equal(g), "step {step}: grad {i} left as backward wrote it");
            }
            let (ea, eb) = (everything(&reference, &a), everything(&folded, &b));
            for ((na, ta), (_, tb)) in ea.iter().zip(&eb) {
                if !na.starts_with("grad") {
                    worst = worst.max(ulps(ta, tb));
                }
            }
        }
        println!("{kernels:?}: step_clipped against clip_grad_norm + step, 200 steps: worst {worst} ulps");
        assert_eq!(worst, 0.0, "{kernels:?}: bit for bit");
    }
}

/// Clipping's factor comes from one launch of the own kernel: clip_grad_norm's gradients equal
/// the gradients times ATen's `clamp_max(reciprocal(total + 1e-6) · max_norm, 1)` from the norm it
/// returns, bit for bit, where the factor clips, where it is 1, and where the norm is inf or NaN.
#[test]
#[ignore = "needs a CUDA device"]
fn clipping_factor_equals_aten_operators() {
    let device = cuda();
    tch::manual_seed(7);
    let shapes: [&[i64]; 3] = [&[384, 384], &[384], &[1000, 7]];
    let mut cases = 0;
    for (scale, max_norm) in [(1.0, 1.0), (1e-4, 1.0), (3.0, 0.37), (1.0, 1e6), (f64::INFINITY, 1.0), (f64::NAN, 1.0)] {
        let params: Vec<Tensor> =
            shapes.iter().map(|s| Tensor::zeros(*s, (Kind::Float, device)).set_requires_grad(true)).collect();
        let mut given = Vec::new();
        for (k, p) in params.iter().enumerate() {
            let g = Tensor::randn(p.size(), (Kind::Float, device)) * scale.min(1e30);
            if k == 1 && !scale.is_finite() {
                let _ = g.get(0).fill_(scale); // one inf or NaN value
            }
            grad_of(p).copy_(&g);
            given.push(g);
        }
        let total = tch_cuda_graphs::clip_grad_norm(&params, max_norm, 2.0).unwrap();
        let coef = ((&total + 1e-6).reciprocal() * max_norm).clamp_max(1.0);
        let mut diff = 0usize;
        for (p, g) in params.iter().zip(&given) {
            let want = g * &coef;
            if !p
                .grad()
                .to_kind(Kind::Double)
                .nan_to_num(0.0, None, None)
                .equal(&want.to_kind(Kind::Double).nan_to_num(0.0, None, None))
                || p.grad().isnan().sum(Kind::Int64) != want.isnan().sum(Kind::Int64)
            {
                diff += 1;
            }
        }
        println!(
            "grads x{scale:e}, max_norm {max_norm:e}: total {}, factor {}, gradients unlike ATen's: {diff}",
            f64::try_from(&total).unwrap(),
            f64::try_from(&coef).unwrap()
        );
        assert_eq!(diff, 0, "scale {scale}, max_norm {max_norm}");
        cases += 1;
        if cases == 1 {
            // captured: the own kernels' two (each chunk's sum of squares, each tensor's norm),
            // the norm of the norms (as PyTorch's clip_grad_norm_), the factor (one kernel, not
            // four), the multiply; ATen's `_foreach_norm` and stack would take four
            let mut g = tch_cuda_graphs::CudaGraph::with_keep_graph(true).unwrap();
            g.capture(tch_cuda_graphs::CaptureOptions::default(), || {
                tch_cuda_graphs::clip_grad_norm(&params, max_norm, 2.0).map(drop)
            })
            .unwrap();
            let kernels = g.node_kinds().unwrap().kernel;
            let (_, names) = common::kernels_of(device, || tch_cuda_graphs::clip_grad_norm(&params, max_norm, 2.0));
            println!("clip_grad_norm captured: {kernels} kernels; eager: {names:?}");
            assert!(kernels <= 5, "{kernels} kernels");
        }
    }
    assert_eq!(cases, 6);
}

/// Clipping's norm from the own kernels (the per-tensor norms of float32 gradients) equals
/// PyTorch's `clip_grad_norm_` (ATen's `_foreach_norm`, then the norm of their stack), which
/// Adam's `step_clipped` computes under `Kernels::PyTorch`, bit for bit: for a tensor of more
/// chunks than the finishing block has threads (513 of 65536), sizes that are not multiples of 4
/// (ATen's element path), an empty one, and more tensors than one launch takes (146), at scales
/// from 1e-3 to 1e3.
#[test]
#[ignore = "needs a CUDA device"]
fn clipping_norm_equals_pytorchs() {
    let device = cuda();
    tch::manual_seed(11);
    let mut shapes: Vec<Vec<i64>> =
        vec![vec![8193, 4096], vec![999, 7], vec![3], vec![0], vec![65536 * 3 + 5], vec![768, 768]];
    shapes.extend((0..140).map(|k| vec![17 + 5 * k]));
    let params: Vec<Tensor> =
        shapes.iter().map(|s| Tensor::zeros(s.as_slice(), (Kind::Float, device)).set_requires_grad(true)).collect();
    let mut aten =
        Adam::from_params(params.iter().map(Tensor::shallow_clone).collect(), AdamConfig::adamw().lr(0.0)).unwrap();
    aten.set_kernels(Kernels::PyTorch).unwrap();
    let mut unequal = 0;
    for round in 0..7 {
        let scale = 10f64.powi(round - 3);
        for p in &params {
            grad_of(p).copy_(&(Tensor::randn(p.size(), (Kind::Float, device)) * scale));
        }
        // a max_norm past the norm: the factor is 1 and the gradients stay as they are
        let own = tch_cuda_graphs::clip_grad_norm(&params, 1e30, 2.0).unwrap();
        let want = aten.step_clipped(1e30).unwrap();
        let (o, w) = (f64::try_from(&own).unwrap(), f64::try_from(&want).unwrap());
        println!("scale {scale:e}: own {o:e}, PyTorch's {w:e}, equal: {}", own.equal(&want));
        unequal += usize::from(!own.equal(&want));
    }
    assert_eq!(aten.last_path(), Some(KernelPath::PyTorch));
    assert_eq!(unequal, 0, "norms unlike PyTorch's in {unequal} of 7 rounds");
}
