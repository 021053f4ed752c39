//! Weight shadows kept fresh without a second pass: the crate's Adam writes each bf16 shadow as
//! it updates its parameter (nothing is stale after its step, and each shadow equals its
//! parameter cast, bit for bit, odd sizes and a misaligned view included), and a step copies
//! whatever else changed a parameter: an update that writes no shadow (SGD) inside its body, and
//! a change made between two replays (which count no version).
mod common;

use common::cuda;
use tch::{nn, Device, Kind, Tensor};
use tch_cuda_graphs::amp::Autocast;
use tch_cuda_graphs::kernels::{KernelPath, Kernels};
use tch_cuda_graphs::optim::{Adam, AdamConfig, Optimizer, Sgd, SgdConfig};
use tch_cuda_graphs::shadow::{self, WeightShadows};
use tch_cuda_graphs::{StepOptions, TrainStep};

/// 2-D parameters (read back through a linear layer): odd sizes, one past a chunk, and a view
/// at element 1 of a buffer (not 16-byte aligned: the kernel's element-wise path).
fn params(device: Device) -> (Vec<Tensor>, Tensor) {
    tch::manual_seed(3);
    let shapes: &[[i64; 2]] = &[[3, 7], [257, 3], [256, 256], [1000, 37], [1, 1]];
    let mut out: Vec<Tensor> =
        shapes.iter().map(|s| Tensor::randn(s, (Kind::Float, device)).set_requires_grad(true)).collect();
    let buffer = Tensor::randn([27 * 37 + 1], (Kind::Float, device));
    out.push(buffer.narrow(0, 1, 27 * 37).view([27, 37]).detach().set_requires_grad(true));
    (out, buffer)
}

/// What a linear layer reads for `w` under bf16 autocast while `set` is read: `I · wᵀ` is the
/// bf16 weight it reads, exactly (one product per output).
fn read_back(set: &WeightShadows, w: &Tensor) -> Tensor {
    let eye = Tensor::eye(w.size()[1], (Kind::Float, w.device()));
    let _read = set.f_read().expect("read the shadows");
    let _bf16 = Autocast::new(Kind::BFloat16, false).expect("autocast");
    let _no_grad = tch::no_grad_guard();
    shadow::linear(&eye, w, None).expect("linear").tr()
}

/// Adam writes the shadows as it updates, on the own kernel, so nothing is stale after its step
/// and each shadow is its parameter cast (bit for bit); on PyTorch's kernel (which writes none)
/// every updated parameter is stale until the next refresh.
#[test]
#[ignore = "needs a CUDA device"]
fn adam_writes_the_shadows_it_updates() {
    let device = cuda();
    for kernels in [Kernels::Own, Kernels::PyTorch] {
        let (ps, _buffer) = params(device);
        let set = WeightShadows::new(&ps, Kind::BFloat16).expect("shadows");
        assert_eq!(set.len(), ps.len());
        let mut opt = Adam::from_params(ps.iter().map(Tensor::shallow_clone).collect(), AdamConfig::adamw().lr(0.05))
            .expect("adam");
        opt.set_kernels(kernels).expect("kernels");
        for step in 0..20 {
            for p in &ps {
                let g = Tensor::randn(p.size(), (Kind::Float, device));
                if p.grad().defined() {
                    p.grad().copy_(&g);
                } else {
                    (p * &g).sum(Kind::Float).backward();
                }
            }
            {
                let _read = set.f_read().expect("read");
                opt.step().expect("step");
            }
            let stale = set.f_stale().expect("stale");
            let expect_stale = if kernels == Kernels::Own { 0 } else { ps.len() };
            assert_eq!(
                opt.last_path(),
                Some(if kernels == Kernels::Own { KernelPath::Own } else { KernelPath::PyTorch })
            );
            assert_eq!(stale, expect_stale, "{kernels:?}, step {step}: stale shadows after the update");
        }
        let mut differing = 0;
        for (i, p) in ps.iter().enumerate() {
            let read = read_back(&set, p); // refreshes what is stale first
            let cast = p.detach().to_kind(Kind::BFloat16);
            let same = read.equal(&cast);
            println!("{kernels:?}: param {i} {:?}: shadow == cast: {same}", p.size());
            differing += usize::from(!same);
        }
        assert_eq!(differing, 0, "{kernels:?}: every shadow equals its parameter cast to bf16");
    }
}

/// Makes a step's optimizer over a VarStore.
type MakeOptimizer<'a> = &'a dyn Fn(&nn::VarStore) -> Box<dyn Optimizer>;

/// One linear layer trained by `make`'s optimizer with shadows, captured (or eager); after run
/// 5 the weight is halved in place (between two replays); the losses of every run and the final
/// parameters.
fn train(eager: bool, make: MakeOptimizer<'_>) -> (Vec<f32>, Vec<Tensor>) {
    let device = cuda();
    tch::manual_seed(5);
    let vs = nn::VarStore::new(device);
    let lin = nn::linear(vs.root() / "fc", 96, 64, Default::default());
    let x = Tensor::randn([32, 96], (Kind::Float, device));
    let options = StepOptions::default().autocast(Kind::BFloat16).weight_shadows(true).eager(eager);
    let mut step = TrainStep::with_optimizer(make(&vs), &[("x", &x)], options, |opt, inp| {
        opt.zero_grad()?;
        let loss = shadow::linear(&inp[0], &lin.ws, lin.bs.as_ref())?.f_square()?.f_mean(None)?;
        tch_cuda_graphs::amp::backward(&loss)?;
        opt.step()?;
        Ok(vec![loss.detach()])
    })
    .expect("step");
    let mut losses = Vec::new();
    for run in 0..10 {
        if run == 5 {
            let _no_grad = tch::no_grad_guard();
            let _ = lin.ws.shallow_clone().f_mul_scalar_(0.5).expect("halve the weight");
        }
        let out = step.run(&[&x]).expect("run");
        losses.push(f32::try_from(&out[0]).expect("loss"));
        assert_eq!(step.weight_shadows().expect("shadows").f_stale().expect("stale"), 0, "run {run}: none stale");
    }
    assert_eq!(step.is_graphed(), !eager);
    if !eager {
        assert_eq!(step.graph_count(), 1, "captured");
    }
    (losses, vs.trainable_variables().iter().map(|t| t.detach().copy()).collect())
}

/// The captured step equals its eager twin bit for bit, with an optimizer that writes the
/// shadows (Adam: the graph copies nothing) and one that does not (SGD: the graph copies them
/// at the end of its body), through a weight changed between two replays.
#[test]
#[ignore = "needs a CUDA device"]
fn a_captured_step_keeps_its_shadows_fresh() {
    let adam = |vs: &nn::VarStore| -> Box<dyn Optimizer> {
        Box::new(Adam::new(vs, AdamConfig::adamw().lr(0.01)).expect("adam"))
    };
    let sgd = |vs: &nn::VarStore| -> Box<dyn Optimizer> {
        Box::new(Sgd::new(vs, SgdConfig::default().lr(0.05).momentum(0.9)).expect("sgd"))
    };
    let cases: [(&str, MakeOptimizer<'_>); 2] = [("adam", &adam), ("sgd", &sgd)];
    for (name, make) in cases {
        let (graph_losses, graph_params) = train(false, make);
        let (eager_losses, eager_params) = train(true, make);
        println!("{name}: captured losses {graph_losses:?}");
        println!("{name}: eager losses    {eager_losses:?}");
        assert_eq!(graph_losses, eager_losses, "{name}: the captured losses are the eager ones, bit for bit");
        let worst = graph_params
            .iter()
            .zip(&eager_params)
            .map(|(a, b)| f64::try_from((a - b).abs().max()).expect("diff"))
            .fold(0f64, f64::max);
        println!("{name}: max |param captured - param eager| = {worst:e}");
        assert_eq!(worst, 0.0, "{name}: the parameters bit for bit");
        assert!(graph_losses[5] < graph_losses[4] * 0.6, "{name}: the halved weight reached the forward");
    }
}

/// An embedding table (read by a gather, never by a matmul) feeding a linear layer, trained by
/// Adam with or without shadows, captured or eager: the losses of every run and the final
/// parameters, and how many shadows the step held before its first run and after its last.
fn train_embedding(shadows: bool, eager: bool) -> (Vec<f32>, Vec<Tensor>, usize, usize) {
    let device = cuda();
    tch::manual_seed(9);
    let vs = nn::VarStore::new(device);
    let table = nn::embedding(vs.root() / "table", 50, 96, Default::default());
    let lin = nn::linear(vs.root() / "fc", 96, 64, Default::default());
    let tokens = Tensor::randint(50, [32], (Kind::Int64, device));
    let options = StepOptions::default().autocast(Kind::BFloat16).weight_shadows(shadows).eager(eager);
    let opt = Adam::new(&vs, AdamConfig::adamw().lr(0.01)).expect("adam");
    let mut step = TrainStep::with_optimizer(opt, &[("tokens", &tokens)], options, |opt, inp| {
        opt.zero_grad()?;
        let h = inp[0].apply(&table);
        let loss = shadow::linear(&h, &lin.ws, lin.bs.as_ref())?.f_square()?.f_mean(None)?;
        tch_cuda_graphs::amp::backward(&loss)?;
        opt.step()?;
        Ok(vec![loss.detach()])
    })
    .expect("step");
    let before = step.weight_shadows().map_or(0, WeightShadows::len);
    let mut losses = Vec::new();
    for _ in 0..10 {
        losses.push(f32::try_from(&step.run(&[&tokens]).expect("run")[0]).expect("loss"));
    }
    let after = step.weight_shadows().map_or(0, WeightShadows::len);
    (losses, vs.trainable_variables().iter().map(|t| t.detach().copy()).collect(), before, after)
}

/// After its first (warmup) run a step keeps only the shadows its layers read: the embedding
/// table's is dropped, the linear layer's weight and bias keep theirs. The captured step then
/// equals the eager step that casts every weight at each use (no shadows), bit for bit.
#[test]
#[ignore = "needs a CUDA device"]
fn a_step_keeps_only_the_shadows_its_layers_read() {
    let (losses, params, before, after) = train_embedding(true, false);
    let (cast_losses, cast_params, _, _) = train_embedding(false, true);
    println!("shadows before the first run {before}, after the last {after}");
    println!("captured, shadows kept as read: {losses:?}");
    println!("eager, casting:                 {cast_losses:?}");
    assert_eq!((before, after), (3, 2), "the table's shadow dropped, the linear layer's two kept");
    assert_eq!(losses, cast_losses, "the losses, bit for bit");
    let differing = params.iter().zip(&cast_params).filter(|(a, b)| !a.equal(b)).count();
    println!("parameters unlike the casting step's: {differing} of {}", params.len());
    assert_eq!(differing, 0, "every parameter bit for bit");
}
