//! Data parallel tests on two GPUs. Each test is its own launcher: run plainly, it
//! spawns this test binary once per rank (only that test, with `RANK`, `WORLD_SIZE`,
//! `LOCAL_RANK`, `MASTER_ADDR`, `MASTER_PORT` set, as torchrun would, rank 0 hosting the store),
//! waits for the ranks with a time limit (killing them past it), and checks how each ended.
//! Run as a rank, it is that rank's body, and it prints a line naming its test when the body
//! has returned: the parent requires that line, so a rank that ran no test (a renamed test
//! makes `--exact` match nothing, and the child exits 0) fails the test.
//!
//! Run them one at a time on a host with two GPUs, NVLink multicast off:
//! `NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
//!  cargo test --release --test gpu_dist -- --ignored --test-threads=1 --nocapture`

mod common;

use anyhow::{bail, ensure, Context, Result};
use common::{free_port, mlp};
use std::fs::File;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};
use tch::{nn, nn::Module, Kind, Tensor};
use tch_cuda_graphs::dist::{
    broadcast_parameters, BucketConfig, BucketLayout, Collective, Compression, GradAllReduce, NcclBuffers,
    ProcessGroup, ReduceOp, Wire,
};
use tch_cuda_graphs::optim::{Adam, AdamConfig, Optimizer, Sgd, SgdConfig};
use tch_cuda_graphs::{synchronize, CaptureOptions, CudaGraph, Error, StepOptions, TrainStep};

const WORLD: usize = 2;
/// Set in a rank's environment: the name of the test it runs as a rank.
const ROLE: &str = "TCG_DIST_TEST_RANK_OF";
const D: i64 = 64;
const H: i64 = 256;
const O: i64 = 8;
const B: i64 = 32; // per rank

/// How one rank ended, and what it printed.
struct Ended {
    rank: usize,
    status: Option<ExitStatus>, // None: killed at the time limit
    output: String,
    /// Whether it printed [`done_marker`]: its body ran and returned.
    finished: bool,
}

/// The line a rank prints when its body has returned.
fn done_marker(test: &str) -> String {
    format!("tcg-dist: a rank of {test} finished its body")
}

/// In the test process: spawns the ranks of `test` and waits for them at most `limit`. In a
/// rank (the environment names `test`): runs `body` and panics (fails) on its error.
fn ranks(test: &str, limit: Duration, body: fn(ProcessGroup) -> Result<()>) -> Option<Vec<Ended>> {
    if std::env::var(ROLE).as_deref() == Ok(test) {
        let pg = ProcessGroup::from_env(Duration::from_secs(60)).expect("process group from the environment");
        if let Err(e) = body(pg) {
            panic!("rank failed: {e:?}");
        }
        println!("{}", done_marker(test));
        return None;
    }
    assert!(
        tch::Cuda::device_count() >= WORLD as i64,
        "this test needs {WORLD} CUDA devices, found {}",
        tch::Cuda::device_count()
    );
    let port = free_port().to_string();
    let exe = std::env::current_exe().expect("test binary");
    let mut children: Vec<(Child, PathBuf)> = (0..WORLD)
        .map(|rank| {
            let log = std::env::temp_dir().join(format!("tcg-{test}-{port}-rank{rank}.log"));
            let out = File::create(&log).expect("log file");
            let err = out.try_clone().expect("log file");
            let child = Command::new(&exe)
                .args([test, "--exact", "--ignored", "--nocapture", "--test-threads=1"])
                .env(ROLE, test)
                .env("RANK", rank.to_string())
                .env("LOCAL_RANK", rank.to_string())
                .env("WORLD_SIZE", WORLD.to_string())
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", &port)
                .env_remove("TORCHELASTIC_USE_AGENT_STORE")
                .env("NCCL_NVLS_ENABLE", "0")
                .env("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
                .env("NVSHMEM_DISABLE_NVLS", "1")
                .stdout(Stdio::from(out))
                .stderr(Stdio::from(err))
                .spawn()
                .expect("spawn a rank");
            (child, log)
        })
        .collect();
    let start = Instant::now();
    let mut statuses: Vec<Option<ExitStatus>> = vec![None; WORLD];
    while statuses.iter().any(Option::is_none) && start.elapsed() < limit {
        for (i, (c, _)) in children.iter_mut().enumerate() {
            if statuses[i].is_none() {
                statuses[i] = c.try_wait().expect("wait for a rank");
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut ended = Vec::new();
    for (rank, (mut c, log)) in children.drain(..).enumerate() {
        if statuses[rank].is_none() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let output = std::fs::read_to_string(&log).unwrap_or_default();
        let _ = std::fs::remove_file(&log);
        // a rank's lines (the first may follow the test harness's "test ... " on its line)
        for line in output.lines().filter_map(|l| l.find("rank ").map(|i| &l[i..])) {
            println!("{line}");
        }
        let finished = output.contains(&done_marker(test));
        ended.push(Ended { rank, status: statuses[rank], output, finished });
    }
    println!("{test}: {WORLD} ranks ended after {:.1} s", start.elapsed().as_secs_f64());
    Some(ended)
}

/// Asserts that every rank ran its body to the end and exited successfully, showing the output
/// of those that did not.
fn all_succeeded(ended: &[Ended]) {
    for e in ended {
        assert!(
            e.status.is_some_and(|s| s.success()) && e.finished,
            "rank {} ended with {:?} (None: killed at the time limit), body finished: {}; its output:\n{}",
            e.rank,
            e.status,
            e.finished,
            e.output
        );
    }
}

/// [`ranks`], then [`all_succeeded`] in the test process.
fn all_ranks_succeed(test: &str, limit: Duration, body: fn(ProcessGroup) -> Result<()>) {
    if let Some(ended) = ranks(test, limit, body) {
        all_succeeded(&ended);
    }
}

/// Every variable of `vs`, by name, flattened into one vector.
fn flat(vs: &nn::VarStore) -> Tensor {
    let mut v: Vec<(String, Tensor)> = vs.variables().into_iter().collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    Tensor::cat(&v.iter().map(|(_, t)| t.detach().view([-1])).collect::<Vec<_>>(), 0)
}

/// The same global batches on every rank (each trains on its shard).
fn global_batches(device: tch::Device, world: usize, n: usize) -> Vec<(Tensor, Tensor)> {
    tch::manual_seed(7);
    (0..n)
        .map(|_| {
            let x = Tensor::randn([B * world as i64, D], (Kind::Float, device));
            let y = x.narrow(1, 0, O).sin();
            (x, y)
        })
        .collect()
}

/// When the gradients are averaged: after backward, overlapped with it, or overlapped with it
/// and each bucket's parameters stepped as soon as it is averaged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Overlap {
    After,
    Backward,
    BackwardAndStep,
}

/// A graphed data parallel step of `model` on its shard: gradients averaged by `reduce` as
/// `overlap` says.
fn ddp_step<O: Optimizer + Send + 'static>(
    model: nn::Sequential,
    mut opt: O,
    mut reduce: GradAllReduce,
    overlap: Overlap,
    device: tch::Device,
) -> Result<TrainStep<'static>> {
    let (x0, y0) = (Tensor::zeros([B, D], (Kind::Float, device)), Tensor::zeros([B, O], (Kind::Float, device)));
    Ok(TrainStep::new(&[("x", &x0), ("y", &y0)], StepOptions::default(), move |inp| {
        opt.zero_grad()?;
        let loss = model.forward(&inp[0]).f_mse_loss(&inp[1], tch::Reduction::Mean)?;
        match overlap {
            Overlap::After => {
                loss.f_backward()?;
                reduce.all_reduce()?;
                opt.step()?;
            }
            Overlap::Backward => {
                reduce.backward(&loss)?;
                opt.step()?;
            }
            Overlap::BackwardAndStep => reduce.backward_and_step(&loss, &mut opt)?,
        }
        Ok(vec![loss.detach()])
    })?)
}

/// The optimizers of the equivalence test.
#[derive(Clone, Copy, Debug)]
enum Opt {
    Sgd,
    Adam,
}

impl Opt {
    fn make(self, vs: &nn::VarStore) -> Result<Box<dyn Optimizer + Send>> {
        Ok(match self {
            Opt::Sgd => Box::new(Sgd::new(vs, SgdConfig::default().lr(0.05).momentum(0.9))?),
            Opt::Adam => Box::new(Adam::new(vs, AdamConfig::adamw().lr(1e-3))?),
        })
    }
}

fn hundred_steps_body(pg: ProcessGroup) -> Result<()> {
    let (rank, world, d) = (pg.rank(), pg.world_size(), pg.device());
    let global = global_batches(d, world, 100);
    for opt_kind in [Opt::Sgd, Opt::Adam] {
        let mut first: Option<Tensor> = None;
        // (overlap, bucket bytes, gradients as views, bf16 compression, NCCL's buffers, a
        // small first bucket and a high-priority stream, reduce-scatter + all-gather): all
        // must give the first one's bits
        use Overlap::{After, Backward, BackwardAndStep};
        for (overlap, bucket_bytes, views, bf16, buffers, tuned, split, grouped) in [
            (Backward, 16 << 10, true, false, NcclBuffers::Caching, false, false),
            (Backward, 16 << 10, false, false, NcclBuffers::Caching, false, false),
            (After, 16 << 10, true, false, NcclBuffers::Caching, false, false),
            (After, usize::MAX, true, false, NcclBuffers::Caching, false, false),
            (Backward, 16 << 10, true, false, NcclBuffers::NcclMem, true, false),
            (Backward, 16 << 10, false, false, NcclBuffers::Registered, false, false),
            (Backward, 16 << 10, true, false, NcclBuffers::Window, true, false),
            (BackwardAndStep, 16 << 10, false, false, NcclBuffers::Caching, false, false),
            (BackwardAndStep, 16 << 10, true, false, NcclBuffers::Window, false, true),
            (Backward, 16 << 10, false, false, NcclBuffers::Caching, false, true),
            (Backward, 16 << 10, true, true, NcclBuffers::Caching, false, false),
        ]
        .into_iter()
        .map(|(o, b, v, c, n, t, s)| (o, b, v, c, n, t, s, false))
        .chain([
            // packed without bucket buffers: one grouped NCCL call per bucket
            (Backward, 16 << 10, false, false, NcclBuffers::Caching, false, false, true),
            (BackwardAndStep, 16 << 10, false, false, NcclBuffers::Caching, false, false, true),
        ]) {
            tch::manual_seed(100 + rank as i64); // different weights per rank: the broadcast fixes it
            let vs = nn::VarStore::new(d);
            let model = mlp(vs.root(), D, H, O);
            broadcast_parameters(&pg, &vs)?;
            let mut vs1 = nn::VarStore::new(d); // one GPU, from the same (rank 0's) weights
            let model1 = mlp(vs1.root(), D, H, O);
            vs1.copy(&vs)?;
            let opt = opt_kind.make(&vs)?;
            let collective = if split { Collective::ReduceScatterAllGather } else { Collective::AllReduce };
            let compression = if bf16 { Compression::BFloat16 } else { Compression::None };
            let wire = Wire { collective, compression, buffers };
            let layout = match (grouped, views) {
                (true, _) => BucketLayout::Grouped,
                (_, true) => BucketLayout::Views(wire),
                _ => BucketLayout::Packed(wire),
            };
            let first_bucket_bytes = tuned.then_some(4 << 10);
            let config = BucketConfig { bucket_bytes, first_bucket_bytes, layout, high_priority: tuned };
            let reduce = GradAllReduce::with_config(&pg, opt.params(), config)?;
            let buckets = reduce.bucket_count();
            let mut step = ddp_step(model, opt, reduce, overlap, d)?;
            let shard = |t: &Tensor| t.narrow(0, B * rank as i64, B);
            for (x, y) in &global {
                step.run(&[&shard(x), &shard(y)])?;
            }
            pg.wait_device(Duration::from_secs(60))?;
            ensure!(step.graph_count() == 1, "one graph, got {}", step.graph_count());
            // 1. bitwise identical across ranks
            let mine = flat(&vs);
            let theirs = mine.copy();
            pg.broadcast(&theirs, 0)?;
            let cross = f64::try_from((&mine - &theirs).abs().max())?;
            // 2. the same whatever the bucketing and overlap (an average of two values per element)
            let variants = match &first {
                Some(f) => f64::try_from((&mine - f).abs().max())?,
                None if bf16 => 0.0,
                None => {
                    first = Some(mine.copy());
                    0.0
                }
            };
            // 3. one GPU on the concatenated batch (the global mean = the mean of the shard means)
            let mut opt1 = opt_kind.make(&vs1)?;
            for (x, y) in &global {
                opt1.zero_grad()?;
                model1.forward(x).f_mse_loss(y, tch::Reduction::Mean)?.f_backward()?;
                opt1.step()?;
            }
            let single = f64::try_from((&flat(&vs) - &flat(&vs1)).abs().max())?;
            println!(
                "rank {rank}: {opt_kind:?}, overlap {overlap:?}, {buckets} buckets, views {views}, bf16 {bf16}, {buffers:?}, first small + high priority {tuned}, reduce-scatter + all-gather {split}, grouped {grouped}: 100 graphed steps on {world} GPUs \
                 (batch {B} each): max |param - rank 0's| = {cross:e}; max |param - first variant| = {variants:e}; \
                 max |param - one GPU on the {}-batch| = {single:e}",
                B * world as i64
            );
            ensure!(cross == 0.0, "ranks differ by {cross:e}");
            ensure!(bf16 || variants == 0.0, "bucketing/overlap/views changed the result by {variants:e}");
            ensure!(overlap == After || buckets > 2, "the overlap case needs several buckets, got {buckets}");
            // SGD keeps one-GPU rounding differences at rounding level; Adam divides by sqrt(v)
            // and so magnifies them where a gradient is near zero: bounded more loosely.
            let bound = match (opt_kind, bf16) {
                (Opt::Sgd, false) => 1e-5,
                (Opt::Adam, false) => 2e-2,
                (Opt::Sgd, true) => 1e-2, // bf16 gradients: 8 bits of mantissa on the wire
                (Opt::Adam, true) => 5e-2,
            };
            ensure!(single < bound, "one-GPU training differs by {single:e} (bound {bound:e})");
        }
    }
    Ok(())
}

#[test]
#[ignore = "needs two CUDA devices"]
fn hundred_graphed_steps_agree_across_ranks_and_with_one_gpu() {
    all_ranks_succeed(
        "hundred_graphed_steps_agree_across_ranks_and_with_one_gpu",
        Duration::from_secs(180),
        hundred_steps_body,
    );
}

fn collectives_body(pg: ProcessGroup) -> Result<()> {
    let (rank, world, d) = (pg.rank(), pg.world_size(), pg.device());
    let t = Tensor::full([1024], (rank + 1) as f64, (Kind::Float, d));
    pg.all_reduce(&t, ReduceOp::Sum)?;
    let want = (1..=world).sum::<usize>() as f64;
    ensure!(f64::try_from(t.mean(Kind::Double))? == want, "all-reduce sum");
    let b = Tensor::full([16], rank as f64 * 10.0 + 7.0, (Kind::Float, d));
    pg.broadcast(&b, 0)?;
    ensure!(f64::try_from(b.mean(Kind::Double))? == 7.0, "broadcast from rank 0");
    pg.barrier()?;
    // captured: the all-reduce is part of the graph (the communicator exists: eager calls above)
    let mut x = Tensor::zeros([4096], (Kind::Float, d));
    let mut g = CudaGraph::new()?;
    let y = g.capture(CaptureOptions::default().device(d), || {
        let y = x.f_mul_scalar(2.0)?;
        pg.all_reduce(&y, ReduceOp::Avg)?;
        Ok(y)
    })?;
    for step in 0..20 {
        let _ = x.fill_((rank * 100 + step) as f64);
        g.replay()?;
        pg.wait_device(Duration::from_secs(60))?;
        // the mean over ranks of 2 * (rank * 100 + step)
        let want = (0..world).map(|r| 2.0 * (r * 100 + step) as f64).sum::<f64>() / world as f64;
        let got = f64::try_from(y.mean(Kind::Double))?;
        ensure!(got == want, "replay {step}: {got} vs {want}");
    }
    // a second group, over a file store (the same path on both ranks, new for each run)
    let port = std::env::var("MASTER_PORT")?;
    let path = std::env::temp_dir().join(format!("tcg-file-store-{port}"));
    let fpg = ProcessGroup::new_file(&path, rank, world, d, Duration::from_secs(60))?;
    let f = Tensor::full([8], (rank + 1) as f64, (Kind::Float, d));
    fpg.all_reduce(&f, ReduceOp::Sum)?;
    ensure!(f64::try_from(f.mean(Kind::Double))? == want, "all-reduce over the file store");
    println!(
        "rank {rank}: eager all-reduce, broadcast, barrier, 20 replays of a captured all-reduce, and an all-reduce \
         over a file store: ok"
    );
    Ok(())
}

#[test]
#[ignore = "needs two CUDA devices"]
fn collectives_run_eagerly_and_in_a_graph() {
    all_ranks_succeed("collectives_run_eagerly_and_in_a_graph", Duration::from_secs(120), collectives_body);
}

fn mismatch_body(pg: ProcessGroup) -> Result<()> {
    let rank = pg.rank();
    let vs = nn::VarStore::new(pg.device());
    let width = if rank == 1 { H + 1 } else { H };
    let _m = mlp(vs.root(), D, width, O);
    match broadcast_parameters(&pg, &vs) {
        Err(Error::Misuse(msg)) => println!("rank {rank}: mismatched model refused: {msg}"),
        other => bail!("expected the mismatch to be refused, got {other:?}"),
    }
    // the group is still usable, and a matching model goes through
    let vs2 = nn::VarStore::new(pg.device());
    let _m2 = mlp(vs2.root(), D, H, O);
    broadcast_parameters(&pg, &vs2).context("a matching model after the refusal")?;
    Ok(())
}

#[test]
#[ignore = "needs two CUDA devices"]
fn mismatched_models_are_refused_at_start_on_every_rank() {
    all_ranks_succeed("mismatched_models_are_refused_at_start_on_every_rank", Duration::from_secs(120), mismatch_body);
}

/// A graphed step with overlapped buckets (AdamW), and a batch for it.
fn overlapped_step(pg: &ProcessGroup) -> Result<(TrainStep<'static>, Tensor, Tensor)> {
    let d = pg.device();
    tch::manual_seed(1);
    let vs = nn::VarStore::new(d);
    let model = mlp(vs.root(), D, H, O);
    broadcast_parameters(pg, &vs)?;
    let opt = Adam::new(&vs, AdamConfig::default())?;
    let reduce = GradAllReduce::new(pg, opt.params(), 16 << 10)?;
    let step = ddp_step(model, opt, reduce, Overlap::Backward, d)?;
    Ok((step, Tensor::randn([B, D], (Kind::Float, d)), Tensor::randn([B, O], (Kind::Float, d))))
}

fn shutdown_body(pg: ProcessGroup) -> Result<()> {
    let (rank, d) = (pg.rank(), pg.device());
    let (mut step, x, y) = overlapped_step(&pg)?;
    for _ in 0..10 {
        step.run(&[&x, &y])?;
    }
    // and a plain graph around a collective
    let t = Tensor::ones([1024], (Kind::Float, d));
    let mut graph = CudaGraph::new()?;
    graph.capture(CaptureOptions::default(), || pg.all_reduce(&t, ReduceOp::Sum))?;
    graph.replay()?;
    pg.wait_device(Duration::from_secs(60))?;
    ensure!(f64::try_from(t.mean(None))? == 2.0, "the captured all-reduce ran");
    // Drop the group's handle first: the graphs keep the group alive (a shutdown now would
    // hang on their NCCL kernels); it goes with the last graph.
    let t0 = Instant::now();
    drop(pg);
    drop(graph);
    drop(step);
    synchronize(d)?;
    println!("rank {rank}: handle, graph, step dropped in that order: shut down in {:?}", t0.elapsed());
    Ok(())
}

#[test]
#[ignore = "needs two CUDA devices"]
fn shutdown_is_clean_with_live_graphs() {
    all_ranks_succeed("shutdown_is_clean_with_live_graphs", Duration::from_secs(120), shutdown_body);
}

/// The survivor's limit for a step that makes no progress.
const KILL_TIMEOUT: Duration = Duration::from_secs(5);

fn killed_body(pg: ProcessGroup) -> Result<()> {
    let rank = pg.rank();
    let (mut step, x, y) = overlapped_step(&pg)?;
    for _ in 0..20 {
        step.run(&[&x, &y])?;
        pg.wait_device(KILL_TIMEOUT)?;
    }
    if rank == 1 {
        println!("rank 1: dying after 20 graphed steps");
        std::process::abort(); // as if killed: no clean-up, no goodbye
    }
    let start = Instant::now();
    let outcome = loop {
        if let Err(e) = step.run(&[&x, &y]).and_then(|_| pg.wait_device(KILL_TIMEOUT)) {
            break e;
        }
        ensure!(start.elapsed() < Duration::from_secs(60), "no error 60 s after the peer died");
    };
    let waited = start.elapsed();
    println!("rank 0: the peer died; error after {waited:.2?} (timeout {KILL_TIMEOUT:?}): {outcome}");
    ensure!(matches!(outcome, Error::DistributedTimeout(_)), "expected DistributedTimeout, got {outcome:?}");
    ensure!(waited < KILL_TIMEOUT * 3, "the error took {waited:?}");
    match pg.all_reduce(&x, ReduceOp::Sum) {
        Err(Error::Distributed(msg)) => println!("rank 0: the aborted group refuses collectives: {msg}"),
        other => bail!("the aborted group should refuse collectives, got {other:?}"),
    }
    let t0 = Instant::now();
    drop(step);
    drop(pg);
    println!("rank 0: step and group dropped in {:.2?}; exiting", t0.elapsed());
    Ok(())
}

#[test]
#[ignore = "needs two CUDA devices"]
fn a_killed_rank_gives_the_survivor_an_error_within_the_timeout() {
    if let Some(ended) =
        ranks("a_killed_rank_gives_the_survivor_an_error_within_the_timeout", Duration::from_secs(60), killed_body)
    {
        let (survivor, killed) = (&ended[0], &ended[1]);
        assert!(killed.status.is_some_and(|s| !s.success()), "rank 1 should have died: {:?}", killed.status);
        assert!(
            survivor.status.is_some_and(|s| s.success()) && survivor.finished,
            "rank 0 should have returned the error and exited (None: hung until killed): {:?}\n{}",
            survivor.status,
            survivor.output
        );
    }
}
