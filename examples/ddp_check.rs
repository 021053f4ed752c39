//! A two-GPU check of data parallel training (issue 10): each rank trains the same MLP on its own
//! shard with a captured step whose gradients are averaged across ranks (GradAllReduce) inside
//! the graph. After 100 steps: parameters bitwise identical on every rank, and compared with one
//! GPU trained on the concatenated batches. Then a mismatched model is refused on every rank.
//!
//! `torchrun --nproc_per_node=2 --no-python target/release/examples/ddp_check`

use anyhow::{ensure, Result};
use std::time::Duration;
use tch::{nn, nn::Module, Kind, Tensor};
use tch_cuda_graphs::dist::{broadcast_parameters, GradAllReduce, ProcessGroup, ReduceOp, DEFAULT_BUCKET_BYTES};
use tch_cuda_graphs::optim::{Adam, AdamConfig, Optimizer};
use tch_cuda_graphs::{synchronize, Error, StepOptions, TrainStep};

const D: i64 = 64;
const H: i64 = 256;
const O: i64 = 8;
const B: i64 = 32; // per rank

fn mlp(p: nn::Path) -> nn::Sequential {
    nn::seq().add(nn::linear(&p / "l1", D, H, Default::default())).add_fn(|x| x.relu()).add(nn::linear(
        &p / "l2",
        H,
        O,
        Default::default(),
    ))
}

fn flat(vs: &nn::VarStore) -> Tensor {
    let mut v: Vec<(String, Tensor)> = vs.variables().into_iter().collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    Tensor::cat(&v.iter().map(|(_, t)| t.detach().view([-1])).collect::<Vec<_>>(), 0)
}

fn main() -> Result<()> {
    let pg = ProcessGroup::from_env(Duration::from_secs(60))?;
    let (rank, world, d) = (pg.rank(), pg.world_size(), pg.device());
    // every rank makes the same global batches; each trains on its shard
    tch::manual_seed(7);
    let global: Vec<(Tensor, Tensor)> = (0..100)
        .map(|_| {
            let x = Tensor::randn([B * world as i64, D], (Kind::Float, d));
            let y = x.narrow(1, 0, O).sin();
            (x, y)
        })
        .collect();
    tch::manual_seed(100 + rank as i64); // different initial weights per rank: the broadcast fixes it
    let vs = nn::VarStore::new(d);
    let model = mlp(vs.root());
    broadcast_parameters(&pg, &vs)?;
    let mut opt = Adam::new(&vs, AdamConfig::adamw().lr(1e-3))?;
    let mut reduce = GradAllReduce::new(&pg, opt.params(), DEFAULT_BUCKET_BYTES)?;
    let (x0, y0) = (Tensor::zeros([B, D], (Kind::Float, d)), Tensor::zeros([B, O], (Kind::Float, d)));
    let mut step = TrainStep::new(&[("x", &x0), ("y", &y0)], StepOptions::default(), move |inp| {
        opt.zero_grad()?;
        let loss = model.forward(&inp[0]).f_mse_loss(&inp[1], tch::Reduction::Mean)?;
        loss.f_backward()?;
        reduce.all_reduce()?; // averaged across ranks, inside the graph
        opt.step()?;
        Ok(vec![loss.detach()])
    })?;
    let shard = |t: &Tensor| t.narrow(0, B * rank as i64, B);
    for (x, y) in &global {
        step.run(&[&shard(x), &shard(y)])?;
    }
    synchronize(d)?;
    ensure!(step.graph_count() == 1, "captured");
    // 1. identical on every rank: rank 0's parameters against ours
    let mine = flat(&vs);
    let theirs = mine.copy();
    pg.broadcast(&theirs, 0)?;
    let cross = f64::try_from((&mine - &theirs).abs().max())?;
    // 2. against one GPU on the concatenated batch (mean over the global batch = mean of shard
    //    means), from rank 0's initial weights (made again from rank 0's seed)
    tch::manual_seed(100);
    let vs1 = nn::VarStore::new(d);
    let model1 = mlp(vs1.root());
    let mut opt1 = Adam::new(&vs1, AdamConfig::adamw().lr(1e-3))?;
    for (x, y) in &global {
        opt1.zero_grad()?;
        model1.forward(x).mse_loss(y, tch::Reduction::Mean).backward();
        opt1.step()?;
    }
    let single = f64::try_from((&flat(&vs) - &flat(&vs1)).abs().max())?;
    println!(
        "rank {rank}: 100 captured data-parallel steps ({world} GPUs, batch {B} each): max |param - rank 0's| = {cross:e}; \
         max |param - one GPU on the {}-batch| = {single:e}",
        B * world as i64
    );
    ensure!(cross == 0.0, "ranks differ: {cross}");
    // 3. a mismatched model is refused on every rank
    let vs2 = nn::VarStore::new(d);
    let width = if rank == 1 { H + 1 } else { H };
    let _m2 = nn::linear(vs2.root() / "l1", D, width, Default::default());
    match broadcast_parameters(&pg, &vs2) {
        Err(Error::Misuse(msg)) => println!("rank {rank}: mismatched model refused: {msg}"),
        other => anyhow::bail!("rank {rank}: expected the mismatch to be refused, got {other:?}"),
    }
    drop(step); // the graph holding NCCL work goes before the group
    let done = Tensor::ones([1], (Kind::Float, d));
    pg.all_reduce(&done, ReduceOp::Sum)?;
    println!("rank {rank}: ok");
    Ok(())
}
