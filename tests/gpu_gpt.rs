//! The GPT example's step (`examples/gpt/step.rs`) and sampler (`sample.rs`) on a GPU: captured and replayed, the step equals the
//! same step run eagerly bit for bit over 200 iterations, dropout, bf16 autocast, clipping, the
//! device schedule and AdamW included (the crate's RNG handling gives replays the eager step's
//! dropout masks). The model is small enough that its kernels are deterministic (two runs agree
//! bit for bit); at the example's full size a GPU rerun is not bit-identical (`docs/gpt.md`).
//! Ignored without a GPU; fails loudly there.

#[path = "../examples/gpt/llama.rs"]
mod llama;
#[path = "../examples/gpt/lm.rs"]
mod lm;
#[path = "../examples/gpt/model.rs"]
mod model;
#[path = "../examples/gpt/sample.rs"]
mod sample;
#[path = "../examples/gpt/step.rs"]
mod step;

use tch::{nn, Device, Kind, Tensor};
use tch_cuda_graphs::linear::WeightGrad;
use tch_cuda_graphs::transformer::Activation;

/// Trains a small GPT for `iters` iterations from seed 7, captured or eager; returns its
/// variables (sorted by name) and the losses.
fn train(eager: bool, iters: usize) -> Run {
    train_with(eager, iters, 0.2, None, false)
}

/// [`train`] with a dropout probability, the crate's fused norms and linear layers (with their
/// weight-gradient mode) or ATen's, weight shadows or not.
fn train_with(
    eager: bool,
    iters: usize,
    dropout: f64,
    fused: Option<WeightGrad>,
    shadows: bool,
) -> (Vec<(String, Tensor)>, Vec<f64>) {
    train_gpt(eager, iters, shadows, gpt_config(dropout, fused))
}

/// The small GPT (2 × 128, 4 heads, block 64) with a dropout probability, on the crate's fused
/// layers (with their weight-gradient mode) or ATen's.
fn gpt_config(dropout: f64, fused: Option<WeightGrad>) -> model::Config {
    let (weight_grad, fused) = (fused.unwrap_or_default(), fused.is_some());
    let activation = Activation::Gelu;
    let chunked_loss = false;
    model::Config {
        vocab: 96,
        block: 64,
        layers: 2,
        heads: 4,
        embd: 128,
        dropout,
        fused,
        weight_grad,
        activation,
        chunked_loss,
    }
}

/// [`train_model`] on the GPT of `config`.
fn train_gpt(eager: bool, iters: usize, shadows: bool, config: model::Config) -> Run {
    train_model(eager, iters, shadows, |p| Box::new(model::Gpt::new(p, config)))
}

/// A small Llama-style model (2 × 128, 4 heads / 2 KV heads, SwiGLU 256, block 64), on the
/// crate's fused layers or ATen's.
fn small_llama(fused: bool) -> llama::Config {
    llama::Config {
        block: 64,
        layers: 2,
        heads: 4,
        kv_heads: 2,
        embd: 128,
        hidden: 256,
        fused,
        ..llama::Config::small(96)
    }
}

/// Trains the model `build` makes for `iters` iterations from seed 7 (batch 8, two micro-batches
/// per step), captured or eager, with weight shadows or not.
fn train_model(
    eager: bool,
    iters: usize,
    shadows: bool,
    build: impl Fn(&nn::Path) -> Box<dyn lm::LanguageModel>,
) -> Run {
    let dev = Device::Cuda(0);
    assert!(tch_cuda_graphs::cuda_is_available(), "this test needs a CUDA device");
    tch::manual_seed(7);
    let vs = nn::VarStore::new(dev);
    let model = build(&vs.root());
    let hyper =
        step::Hyper { batch: 8, accum: 2, iters: iters as u64, warmup: 10, eager, shadows, ..Default::default() };
    let mut steps = step::build(&vs, model.as_ref(), hyper).expect("the steps");
    if shadows {
        assert_eq!(steps.shadowed, vs.trainable_variables().len(), "every parameter shadowed");
    }
    let data = Tensor::randint(96, [iters as i64, 2, 8, 65], (Kind::Int64, Device::Cpu)).to_device(dev);
    let mut losses = Vec::new();
    for i in 0..iters as i64 {
        let w = data.get(i);
        let (x, y) = (w.narrow(2, 0, 64), w.narrow(2, 1, 64));
        let loss = steps.train.run(&[&x, &y]).expect("a step");
        losses.push(f64::try_from(&loss[0]).expect("the loss"));
    }
    if !eager {
        assert!(steps.train.graph_count() == 1, "the step was captured");
    }
    let mut vars: Vec<(String, Tensor)> = vs.variables().into_iter().collect();
    vars.sort_by(|a, b| a.0.cmp(&b.0));
    (vars, losses)
}

/// The largest difference between two runs' variables (printing each new worst one).
fn max_param_difference(a: &[(String, Tensor)], b: &[(String, Tensor)]) -> f64 {
    let mut worst = 0f64;
    for ((name, g), (_, e)) in a.iter().zip(b) {
        let d = f64::try_from((g - e).abs().max()).expect("a difference");
        if d > worst {
            println!("{name}: max |a - b| = {d:e}");
        }
        worst = worst.max(d);
    }
    worst
}

/// Asserts two runs (variables, losses) equal bit for bit, printing both largest differences.
fn assert_bit_for_bit(what: &str, (a, a_losses): &Run, (b, b_losses): &Run) {
    let worst = max_param_difference(a, b);
    let loss_diff = a_losses.iter().zip(b_losses).map(|(x, y)| (x - y).abs()).fold(0f64, f64::max);
    println!("{what}: max |param difference| = {worst:e}, max |loss difference| = {loss_diff:e}");
    assert_eq!(worst, 0.0, "{what}: parameters bit for bit");
    assert_eq!(loss_diff, 0.0, "{what}: losses bit for bit");
}

/// A run's variables (sorted by name) and losses.
type Run = (Vec<(String, Tensor)>, Vec<f64>);

#[test]
#[ignore = "needs a CUDA device"]
fn the_captured_gpt_step_equals_the_eager_step_bit_for_bit_with_dropout() {
    let iters = 200;
    let graphed = train(false, iters);
    let (first, last) = (graphed.1[0], graphed.1[iters - 1]);
    println!("loss {first:.4} -> {last:.4}");
    assert!(last < first, "it trains");
    assert_bit_for_bit(&format!("after {iters} iterations, graphed against eager"), &graphed, &train(true, iters));
}

/// Weight shadows change no bit: the captured step reading the weights' bf16 shadows (refreshed
/// once per step) equals the captured step casting each weight at each use, over 200 iterations
/// with dropout.
#[test]
#[ignore = "needs a CUDA device"]
fn weight_shadows_change_no_bit_of_the_step() {
    let iters = 200;
    let shadowed = train_with(false, iters, 0.2, None, true);
    let cast = train_with(false, iters, 0.2, None, false);
    assert_bit_for_bit(&format!("weight shadows, {iters} iterations, against casts"), &shadowed, &cast);
}

/// With `--fused` (the crate's fused norms, linear layers with float32 weight gradients, and
/// weight shadows): the captured step equals its eager twin bit for bit, dropout included (the
/// fused kernels draw their masks from PyTorch's generator, graph-safe);
/// and without dropout it trains as the ATen step does: after 200 iterations the mean loss of the
/// last 20 is within 1% of the unfused step's (bf16 autocast; the two differ by the roundings of
/// the fused kernels, which keep the residual add and the norm in fp32, and by the float32 weight
/// gradients). The same holds for the fused step with rounded weight gradients.
#[test]
#[ignore = "needs a CUDA device"]
fn the_fused_gpt_step_replays_its_eager_twin_and_trains_like_the_aten_step() {
    let iters = 200;
    let fp32 = Some(WeightGrad::Float32);
    let graphed = train_with(false, iters, 0.2, fp32, true);
    let eager = train_with(true, iters, 0.2, fp32, true);
    assert_bit_for_bit(&format!("fused, dropout 0.2, {iters} iterations, graphed against eager"), &graphed, &eager);

    let tail = |l: &[f64]| l[iters - 20..].iter().sum::<f64>() / 20.0;
    let (aten, aten_losses) = train_with(false, iters, 0.0, None, false);
    let a = tail(&aten_losses);
    for mode in [WeightGrad::Float32, WeightGrad::Rounded] {
        let (fused, fused_losses) = train_with(false, iters, 0.0, Some(mode), true);
        let f = tail(&fused_losses);
        let param_diff = max_param_difference(&fused, &aten);
        println!(
            "dropout 0, {iters} iterations, weight gradients {mode:?}: mean loss of the last 20 fused {f:.5}, ATen {a:.5} ({:+.3}%); first losses {:.5} / {:.5}; max |param fused - param ATen| = {param_diff:e}",
            (f - a) / a * 100.0,
            fused_losses[0],
            aten_losses[0]
        );
        assert!(((f - a) / a).abs() < 0.01, "the fused step ({mode:?}) trains like the ATen step");
    }
}

/// GELU's tanh form (`Activation::GeluTanh`), which the fused step computes in the MLP's GEMM
/// epilogues ([`tch_cuda_graphs::mlp`]): the captured step equals its eager twin bit for bit with
/// dropout, and without dropout it trains as the ATen step with `gelu(approximate="tanh")` does
/// (the mean loss of the last 20 of 200 iterations within 1%).
#[test]
#[ignore = "needs a CUDA device"]
fn the_fused_gpt_step_with_gelu_in_the_epilogues_replays_and_trains_like_the_aten_step() {
    let iters = 200;
    let fp32 = Some(WeightGrad::Float32);
    let tanh = |dropout, fused| model::Config { activation: Activation::GeluTanh, ..gpt_config(dropout, fused) };
    let graphed = train_gpt(false, iters, true, tanh(0.2, fp32));
    let eager = train_gpt(true, iters, true, tanh(0.2, fp32));
    assert_bit_for_bit(
        &format!("GELU tanh, fused, dropout 0.2, {iters} iterations, graphed against eager"),
        &graphed,
        &eager,
    );
    let tail = |l: &[f64]| l[iters - 20..].iter().sum::<f64>() / 20.0;
    let (aten, aten_losses) = train_gpt(false, iters, false, tanh(0.0, None));
    let (fused, fused_losses) = train_gpt(false, iters, true, tanh(0.0, fp32));
    let (f, a) = (tail(&fused_losses), tail(&aten_losses));
    let param_diff = max_param_difference(&fused, &aten);
    println!(
        "GELU tanh, dropout 0, {iters} iterations: mean loss of the last 20 fused (GEMM epilogues) {f:.5}, ATen {a:.5} ({:+.3}%); max |param fused - param ATen| = {param_diff:e}",
        (f - a) / a * 100.0
    );
    assert!(((f - a) / a).abs() < 0.01, "the fused tanh step trains like the ATen one");
}

/// The float32 weight-gradient switch (`WeightGrad::Float32`, Megatron's `main_grad`) against
/// the rounded gradients, both on the crate's fused step without dropout: after 200 iterations
/// they differ (one bf16 rounding fewer per gradient) by the figures printed, and train alike
/// (the mean loss of the last 20 within 0.5%).
#[test]
#[ignore = "needs a CUDA device"]
fn float32_weight_gradients_against_rounded_ones() {
    let iters = 200;
    let (fp32, fp32_losses) = train_with(false, iters, 0.0, Some(WeightGrad::Float32), true);
    let (rounded, rounded_losses) = train_with(false, iters, 0.0, Some(WeightGrad::Rounded), true);
    let tail = |l: &[f64]| l[iters - 20..].iter().sum::<f64>() / 20.0;
    let (f, r) = (tail(&fp32_losses), tail(&rounded_losses));
    let param_diff = max_param_difference(&fp32, &rounded);
    let scale = fp32.iter().map(|(_, t)| f64::try_from(t.abs().max()).expect("a max")).fold(0f64, f64::max);
    println!(
        "after {iters} iterations: max |param fp32 grads - param rounded grads| = {param_diff:e} (largest parameter {scale:.4}); mean loss of the last 20: fp32 grads {f:.5}, rounded {r:.5} ({:+.3}%)",
        (f - r) / r * 100.0
    );
    assert!(param_diff > 0.0, "float32 weight gradients change the step");
    assert!(((f - r) / r).abs() < 0.005, "and train alike");
}

/// The Llama-style model (`--arch llama`): the captured step equals its eager twin bit for bit
/// over 200 iterations, as written (ATen's operators) and fused (the crate's RMSNorm with the
/// residual add, rotary, SwiGLU, float32 weight gradients, cross-entropy, weight shadows); and
/// the fused step trains as the written one does: the mean loss of the last 20 within 1%.
#[test]
#[ignore = "needs a CUDA device"]
fn the_captured_llama_step_equals_the_eager_step_and_the_fused_one_trains_alike() {
    let iters = 200;
    let mut tails = Vec::new();
    for fused in [false, true] {
        let config = small_llama(fused);
        let build = |p: &nn::Path| -> Box<dyn lm::LanguageModel> { Box::new(llama::Llama::new(p, config)) };
        let graphed = train_model(false, iters, fused, build);
        let (first, last) = (graphed.1[0], graphed.1[iters - 1]);
        println!("Llama (fused: {fused}): loss {first:.4} -> {last:.4}");
        assert!(last < first, "it trains");
        let eager = train_model(true, iters, fused, build);
        assert_bit_for_bit(
            &format!("Llama (fused: {fused}), {iters} iterations, graphed against eager"),
            &graphed,
            &eager,
        );
        tails.push(graphed.1[iters - 20..].iter().sum::<f64>() / 20.0);
    }
    let (a, f) = (tails[0], tails[1]);
    println!("Llama, mean loss of the last 20: fused {f:.5}, as written {a:.5} ({:+.3}%)", (f - a) / a * 100.0);
    assert!(((f - a) / a).abs() < 0.01, "the fused Llama step trains like the written one");
}

/// The example's captured decode step (static shapes, a device-side position, Gumbel-max draws)
/// replayed 299 times draws the tokens the same step draws eagerly from the same seed, through
/// the shift of a full context (300 tokens into a block of 64).
#[test]
#[ignore = "needs a CUDA device"]
fn captured_sampling_draws_the_eager_tokens() {
    for fused in [false, true] {
        let config = small_llama(fused);
        tch::manual_seed(11);
        let vs = nn::VarStore::new(Device::Cuda(0));
        let model = llama::Llama::new(&vs.root(), config);
        let draw = |captured: bool| {
            tch::manual_seed(5);
            sample::sample(&model, Device::Cuda(0), 0, 300, captured).expect("sampling")
        };
        let (eager, replayed) = (draw(false), draw(true));
        let same = eager.iter().zip(&replayed).take_while(|(a, b)| a == b).count();
        println!("Llama (fused: {fused}), captured decoding: {} tokens, {same} equal to eager ones", replayed.len());
        assert_eq!(same, 300, "Llama (fused: {fused}): captured and eager sampling differ from token {same}");
    }
    let dev = Device::Cuda(0);
    assert!(tch_cuda_graphs::cuda_is_available(), "this test needs a CUDA device");
    let config = model::Config {
        vocab: 96,
        block: 64,
        layers: 2,
        heads: 4,
        embd: 128,
        dropout: 0.2,
        fused: false,
        weight_grad: WeightGrad::Float32,
        activation: Activation::Gelu,
        chunked_loss: false,
    };
    tch::manual_seed(11);
    let vs = nn::VarStore::new(dev);
    let gpt = model::Gpt::new(&vs.root(), config);
    let draw = |captured: bool| {
        tch::manual_seed(5);
        sample::sample(&gpt, dev, 0, 300, captured).expect("sampling")
    };
    let (eager, replayed) = (draw(false), draw(true));
    let same = eager.iter().zip(&replayed).take_while(|(a, b)| a == b).count();
    println!("captured decoding: {} tokens, {same} equal to eager ones before the first difference", replayed.len());
    assert_eq!(replayed.len(), 300);
    assert_eq!(same, 300, "captured and eager sampling differ from token {same}");
    assert!(eager.iter().any(|&t| t != eager[0]), "the draws are not all one token");
}

/// Weight shadows cannot be lost silently: a step with `weight_shadows(true)` whose shadows were
/// never made is refused at its first run, and runs once the step shadows its optimizer's
/// parameters itself (`shadow_parameters`, which a second call refuses). A second step does not
/// find the first one's shadows (there is no registry), and a set of another dtype than
/// autocast's is refused by a step and by a linear layer reading it.
#[test]
#[ignore = "needs a CUDA device"]
fn a_step_without_its_shadows_is_refused_and_shadows_its_optimizer() {
    use tch_cuda_graphs::optim::{Adam, AdamConfig, Optimizer};
    use tch_cuda_graphs::{shadow, Error, StepOptions, TrainStep};
    let dev = Device::Cuda(0);
    assert!(tch_cuda_graphs::cuda_is_available(), "this test needs a CUDA device");
    let vs = nn::VarStore::new(dev);
    let lin = nn::linear(vs.root() / "fc", 64, 64, Default::default());
    let x = Tensor::randn([16, 64], (Kind::Float, dev));
    let options = StepOptions::default().autocast(Kind::BFloat16).weight_shadows(true);
    let make = || {
        let opt = Adam::new(&vs, AdamConfig::adamw()).expect("adam");
        TrainStep::with_state(opt, &[("x", &x)], options, |opt, inp| {
            opt.zero_grad()?;
            let loss = shadow::linear(&inp[0], &lin.ws, lin.bs.as_ref())?.f_square()?.f_mean(None)?;
            tch_cuda_graphs::amp::backward(&loss)?;
            opt.step()?;
            Ok(vec![loss.detach()])
        })
        .expect("the step")
    };
    let mut bare = make();
    let e = bare.run(&[&x]).expect_err("no shadows");
    println!("without shadows: {e}");
    assert!(matches!(e, Error::Misuse(_)));
    drop(bare);
    let mut step = make();
    let made = step.shadow_parameters().expect("shadows of the optimizer's parameters");
    assert_eq!(made, 2, "the weight and the bias");
    assert!(matches!(step.shadow_parameters(), Err(Error::Misuse(_))), "once");
    for _ in 0..6 {
        step.run(&[&x]).expect("a step with its shadows"); // warmup, capture, replays
    }
    assert!(step.is_graphed() && step.graph_count() == 1, "captured");

    // no process-wide registry: another step does not find the first one's shadows
    let mut other = make();
    let e = other.run(&[&x]).expect_err("the first step's shadows are not the second's");
    println!("a second step beside a shadowed one: {e}");
    assert!(matches!(e, Error::Misuse(_)));
    // a set of another dtype than autocast's is refused, by the step and by a linear layer
    let half = shadow::WeightShadows::new(&vs.trainable_variables(), Kind::Half).expect("f16 shadows");
    assert!(matches!(other.set_weight_shadows(half), Err(Error::Misuse(_))), "a step refuses another dtype");
    let bf16 = shadow::WeightShadows::new(&vs.trainable_variables(), Kind::BFloat16).expect("bf16 shadows");
    let read = bf16.f_read().expect("read them");
    let _f16 = tch_cuda_graphs::amp::Autocast::new(Kind::Half, false).expect("f16 autocast");
    match shadow::linear(&x, &lin.ws, lin.bs.as_ref()) {
        Err(Error::Misuse(m)) => println!("bf16 shadows read under f16 autocast: {m}"),
        other => panic!("expected a misuse, got {other:?}"),
    }
    drop(read);
    let _ = shadow::linear(&x, &lin.ws, lin.bs.as_ref()).expect("casts again once the guard is gone");
}
