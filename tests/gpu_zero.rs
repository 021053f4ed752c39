//! ZeRO-1 on one GPU (`dist::ShardedAdam` on a one-rank NCCL group): the sharded step (the
//! gradients packed and reduce-scattered, the shard stepped by the own Adam kernel, the
//! parameters all-gathered and unpacked) trains an MLP whose parameters leave gaps in the flat
//! layout exactly as `Adam` does, with decay groups, eager and captured: every loss and
//! parameter equal bit for bit over 30 steps; clipped by the global norm too (norms equal); and
//! its state is `Adam`'s (names and values), so a run switches from one to the other halfway
//! and goes on as if it had not. Ignored without a GPU; fails loudly there.
mod common;

use common::{cuda, free_port, mlp, mse};
use std::collections::HashMap;
use std::time::Duration;
use tch::{nn, Kind, Tensor};
use tch_cuda_graphs::dist::{ProcessGroup, ShardedAdam};
use tch_cuda_graphs::optim::{decay_groups, Adam, AdamConfig, Optimizer, ParamGroup};
use tch_cuda_graphs::{Error, StepOptions, TrainStep};

const D: i64 = 37;
const H: i64 = 53;
const O: i64 = 11;
const B: i64 = 64;

/// A group of one rank on the GPU.
fn one_rank() -> ProcessGroup {
    ProcessGroup::new_tcp("127.0.0.1", free_port(), 0, 1, cuda(), Duration::from_secs(60)).expect("group")
}

/// AdamW (lr 3e-3) with decay 0.1 on matrices, none on biases.
fn decay(vs: &nn::VarStore) -> Vec<ParamGroup<AdamConfig>> {
    let config = AdamConfig::adamw().lr(3e-3);
    decay_groups(vs, config.weight_decay(0.1), config.weight_decay(0.0))
}

fn adam(vs: &nn::VarStore) -> Box<dyn Optimizer> {
    Box::new(Adam::with_groups(decay(vs)).expect("adam"))
}

/// The same weights and 30 batches every call.
fn mlp_and_batches(device: tch::Device) -> (nn::VarStore, nn::Sequential, Vec<(Tensor, Tensor)>) {
    tch::manual_seed(5);
    let vs = nn::VarStore::new(device);
    let model = mlp(vs.root(), D, H, O);
    let batches = (0..30)
        .map(|_| (Tensor::randn([B, D], (Kind::Float, device)), Tensor::randn([B, O], (Kind::Float, device))))
        .collect();
    (vs, model, batches)
}

/// What a run gives: its losses, the norms before clipping (clipped runs), the optimizer's state
/// after.
struct Run {
    losses: Vec<f32>,
    norms: Vec<f32>,
    state: HashMap<String, Tensor>,
}

/// Steps `opt` over `batches` on `model`, captured or eager, clipped at `clip` where given.
fn run(
    model: &nn::Sequential,
    opt: Box<dyn Optimizer>,
    batches: &[(Tensor, Tensor)],
    eager: bool,
    clip: Option<f64>,
) -> Run {
    let options = StepOptions::default().eager(eager);
    let mut step =
        TrainStep::with_optimizer(opt, &[("x", &batches[0].0), ("y", &batches[0].1)], options, |opt, inp| {
            opt.zero_grad()?;
            let loss = mse(model, &inp[0], &inp[1]);
            loss.f_backward()?;
            let mut out = vec![loss.detach()];
            match clip {
                Some(max_norm) => out.push(opt.step_clipped(max_norm)?),
                None => opt.step()?,
            }
            Ok(out)
        })
        .expect("step");
    let (mut losses, mut norms) = (Vec::new(), Vec::new());
    for (x, y) in batches {
        let out = step.run(&[x, y]).expect("run");
        losses.push(f32::try_from(&out[0]).expect("loss"));
        if let Some(norm) = out.get(1) {
            norms.push(f32::try_from(norm).expect("norm"));
        }
    }
    assert_eq!(step.is_graphed(), !eager);
    let state = step.state().state().expect("state").into_iter().map(|(k, t)| (k, t.copy())).collect();
    Run { losses, norms, state }
}

/// The variables of `vs`, by name.
fn params_of(vs: &nn::VarStore) -> Vec<Tensor> {
    let mut params: Vec<(String, Tensor)> = vs.variables().into_iter().collect();
    params.sort_by(|a, b| a.0.cmp(&b.0));
    params.into_iter().map(|(_, t)| t.detach().copy()).collect()
}

fn count_equal(a: &[f32], b: &[f32]) -> usize {
    a.iter().zip(b).filter(|(x, y)| x.to_bits() == y.to_bits()).count()
}

/// How many entries of `a` equal `b`'s of the same name (dtype, shape and values); names in one
/// and not the other.
fn compare_states(a: &HashMap<String, Tensor>, b: &HashMap<String, Tensor>) -> (usize, Vec<String>) {
    let equal = a
        .iter()
        .filter(|(k, t)| b.get(*k).is_some_and(|u| t.kind() == u.kind() && t.to_device(u.device()).equal(u)))
        .count();
    let mut odd: Vec<String> =
        a.keys().filter(|k| !b.contains_key(*k)).chain(b.keys().filter(|k| !a.contains_key(*k))).cloned().collect();
    odd.sort();
    (equal, odd)
}

#[test]
#[ignore = "needs a CUDA device"]
fn sharded_adam_on_one_rank_equals_adam_bit_for_bit() {
    let device = cuda();
    let pg = one_rank();
    let sharded = |vs: &nn::VarStore| -> Box<dyn Optimizer> {
        let opt = ShardedAdam::new(&pg, decay(vs)).expect("sharded");
        let total: i64 = vs.trainable_variables().iter().map(|t| t.numel() as i64).sum();
        let plan = opt.plan();
        println!(
            "one rank: {total} parameter values in a flat buffer of {} ({} parameters, gaps between), state for {}",
            plan.flat_len(),
            vs.trainable_variables().len(),
            opt.state_len()
        );
        assert_eq!(opt.state_len(), total, "one rank holds the whole state");
        Box::new(opt)
    };
    let (vs, model, batches) = mlp_and_batches(device);
    let l_adam = run(&model, adam(&vs), &batches, true, None).losses;
    let p_adam = params_of(&vs);
    for eager in [true, false] {
        let (vs, model, _) = mlp_and_batches(device);
        let l = run(&model, sharded(&vs), &batches, eager, None).losses;
        let p = params_of(&vs);
        let losses_equal = count_equal(&l, &l_adam);
        let params_equal = p.iter().zip(&p_adam).filter(|(a, b)| a.equal(b)).count();
        println!(
            "ShardedAdam {} against Adam eager: {losses_equal}/{} losses and {params_equal}/{} parameters equal bit for bit (last loss {} against {})",
            if eager { "eager" } else { "captured" },
            l.len(),
            p.len(),
            l[l.len() - 1],
            l_adam[l_adam.len() - 1]
        );
        assert_eq!((losses_equal, params_equal), (l.len(), p.len()));
    }
    // what it refuses: a bf16 parameter, an invalid max_norm, a GradScaler's step, a step
    // without gradients
    let vs = nn::VarStore::new(device);
    let half = vs.root().zeros("w", &[8]).f_to_kind(Kind::BFloat16).expect("bf16");
    let refused = ShardedAdam::new(&pg, vec![ParamGroup::new(vec![("w".into(), half)], AdamConfig::adamw())]);
    assert!(matches!(refused, Err(Error::Misuse(_))), "a bf16 parameter is refused");
    let _ = mlp(vs.root() / "m", D, H, O);
    let mut opt = ShardedAdam::new(&pg, decay(&vs)).expect("sharded");
    assert!(matches!(opt.step_clipped(f64::NAN), Err(Error::Misuse(_))), "an invalid max_norm is refused first");
    let one = Tensor::ones([], (Kind::Float, device));
    assert!(matches!(opt.step_scaled(Some(&one), None), Err(Error::Unsupported(_))), "a GradScaler's step");
    match opt.step() {
        Err(Error::Misuse(why)) => println!("a step without gradients: {why}"),
        other => panic!("expected a misuse, got {other:?}"),
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn sharded_adam_clips_as_adam_and_keeps_adams_state() {
    let device = cuda();
    let pg = one_rank();
    let sharded =
        |vs: &nn::VarStore| -> Box<dyn Optimizer> { Box::new(ShardedAdam::new(&pg, decay(vs)).expect("sharded")) };
    // a small max_norm: every step is clipped
    let clip = 0.25;
    let (vs, model, batches) = mlp_and_batches(device);
    let reference = run(&model, adam(&vs), &batches, true, Some(clip));
    let (l_ref, n_ref, s_ref) = (&reference.losses, &reference.norms, &reference.state);
    let clipped = n_ref.iter().filter(|&&n| n > clip as f32).count();
    println!("Adam, clipped at {clip}: {clipped}/30 steps clipped, norms {:.4} .. {:.4}", n_ref[0], n_ref[29]);
    assert!(clipped > 0, "the test clips");
    for eager in [true, false] {
        let (vs, model, _) = mlp_and_batches(device);
        let r = run(&model, sharded(&vs), &batches, eager, Some(clip));
        let (state_equal, odd) = compare_states(&r.state, s_ref);
        println!(
            "ShardedAdam {}, clipped: {}/30 losses, {}/30 norms, {state_equal}/{} state entries equal to Adam's bit for bit (names only one has: {odd:?})",
            if eager { "eager" } else { "captured" },
            count_equal(&r.losses, l_ref),
            count_equal(&r.norms, n_ref),
            s_ref.len()
        );
        assert_eq!((count_equal(&r.losses, l_ref), count_equal(&r.norms, n_ref)), (30, 30));
        assert!(odd.is_empty() && state_equal == s_ref.len(), "the state is Adam's");
    }
    // switching halfway, either way, through the state: the run goes on as Adam's alone
    type Make<'a> = &'a dyn Fn(&nn::VarStore) -> Box<dyn Optimizer>;
    let orders: [(Make, Make, &str); 2] =
        [(&sharded, &adam, "ShardedAdam then Adam"), (&adam, &sharded, "Adam then ShardedAdam")];
    for (first, then, names) in orders {
        let (vs, model, _) = mlp_and_batches(device);
        let a = run(&model, first(&vs), &batches[..15], true, Some(clip));
        let mut second = then(&vs);
        second.load_state(&a.state).expect("the state loads");
        let b = run(&model, second, &batches[15..], true, Some(clip));
        let (l, n) = ([a.losses, b.losses].concat(), [a.norms, b.norms].concat());
        println!(
            "{names}, switched after 15 steps: {}/30 losses and {}/30 norms equal to Adam's alone",
            count_equal(&l, l_ref),
            count_equal(&n, n_ref)
        );
        assert_eq!((count_equal(&l, l_ref), count_equal(&n, n_ref)), (30, 30));
    }
    // a state of another model is refused, and changes nothing
    let vs = nn::VarStore::new(device);
    let _ = mlp(vs.root() / "other", D, H, O);
    let mut opt = ShardedAdam::new(&pg, decay(&vs)).expect("sharded");
    match opt.load_state(s_ref) {
        Err(Error::Checkpoint(why)) => println!("another model's state: {why}"),
        other => panic!("expected a checkpoint error, got {other:?}"),
    }
}
