//! ZeRO-1 on one GPU (`dist::ShardedAdam` on a one-rank NCCL group): the sharded step (the
//! gradients packed and reduce-scattered, the shard stepped by the own Adam kernel, the
//! parameters all-gathered and unpacked) trains an MLP whose parameters leave gaps in the flat
//! layout exactly as `Adam` does, with decay groups, eager and captured: every loss and
//! parameter equal bit for bit over 30 steps. Ignored without a GPU; fails loudly there.
mod common;

use common::{cuda, free_port, mlp, mse};
use std::time::Duration;
use tch::{nn, Kind, Tensor};
use tch_cuda_graphs::dist::{ProcessGroup, ShardedAdam};
use tch_cuda_graphs::optim::{decay_groups, Adam, AdamConfig, Optimizer};
use tch_cuda_graphs::{Error, StepOptions, TrainStep};

const D: i64 = 37;
const H: i64 = 53;
const O: i64 = 11;
const B: i64 = 64;

/// Trains the MLP 30 steps (a new batch each) with `make`'s optimizer, captured or eager; the
/// losses and the final parameters.
fn train(eager: bool, make: &dyn Fn(&nn::VarStore) -> Box<dyn Optimizer>) -> (Vec<f32>, Vec<Tensor>) {
    let device = cuda();
    tch::manual_seed(11);
    let vs = nn::VarStore::new(device);
    let model = mlp(vs.root(), D, H, O);
    let batches: Vec<(Tensor, Tensor)> = (0..30)
        .map(|_| (Tensor::randn([B, D], (Kind::Float, device)), Tensor::randn([B, O], (Kind::Float, device))))
        .collect();
    let options = StepOptions::default().eager(eager);
    let mut step =
        TrainStep::with_optimizer(make(&vs), &[("x", &batches[0].0), ("y", &batches[0].1)], options, |opt, inp| {
            opt.zero_grad()?;
            let loss = mse(&model, &inp[0], &inp[1]);
            loss.f_backward()?;
            opt.step()?;
            Ok(vec![loss.detach()])
        })
        .expect("step");
    let losses =
        batches.iter().map(|(x, y)| f32::try_from(&step.run(&[x, y]).expect("run")[0]).expect("loss")).collect();
    assert_eq!(step.is_graphed(), !eager);
    let mut params: Vec<(String, Tensor)> = vs.variables().into_iter().collect();
    params.sort_by(|a, b| a.0.cmp(&b.0));
    (losses, params.into_iter().map(|(_, t)| t.detach().copy()).collect())
}

#[test]
#[ignore = "needs a CUDA device"]
fn sharded_adam_on_one_rank_equals_adam_bit_for_bit() {
    let device = cuda();
    let pg = ProcessGroup::new_tcp("127.0.0.1", free_port(), 0, 1, device, Duration::from_secs(60)).expect("group");
    let config = AdamConfig::adamw().lr(3e-3);
    let groups = |vs: &nn::VarStore| decay_groups(vs, config.weight_decay(0.1), config.weight_decay(0.0));
    let plain = |vs: &nn::VarStore| -> Box<dyn Optimizer> { Box::new(Adam::with_groups(groups(vs)).expect("adam")) };
    let sharded = |vs: &nn::VarStore| -> Box<dyn Optimizer> {
        let opt = ShardedAdam::new(&pg, groups(vs)).expect("sharded");
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
    let (l_adam, p_adam) = train(true, &plain);
    for eager in [true, false] {
        let (l, p) = train(eager, &sharded);
        let losses_equal = l.iter().zip(&l_adam).filter(|(a, b)| a.to_bits() == b.to_bits()).count();
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
    // what it refuses: a bf16 parameter, clipping by the global norm, a GradScaler's step
    let vs = nn::VarStore::new(device);
    let half = vs.root().zeros("w", &[8]).f_to_kind(Kind::BFloat16).expect("bf16");
    let refused =
        ShardedAdam::new(&pg, vec![tch_cuda_graphs::optim::ParamGroup::new(vec![("w".into(), half)], config)]);
    assert!(matches!(refused, Err(Error::Misuse(_))), "a bf16 parameter is refused");
    let _ = mlp(vs.root() / "m", D, H, O);
    let mut opt = ShardedAdam::new(&pg, groups(&vs)).expect("sharded");
    assert!(matches!(opt.step_clipped(1.0), Err(Error::Unsupported(_))));
    match opt.step() {
        Err(Error::Misuse(why)) => println!("a step without gradients: {why}"),
        other => panic!("expected a misuse, got {other:?}"),
    }
}
