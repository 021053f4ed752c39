//! A two-GPU check of the process group (issue 10's first step): eager all-reduce, broadcast
//! and barrier, then an all-reduce captured in a CUDA graph and replayed.
//!
//! `torchrun --nproc_per_node=2 --no-python target/release/examples/dist_check`
//! (with NCCL_NVLS_ENABLE=0 on hosts where NVLink multicast must stay off).

use anyhow::{ensure, Result};
use std::time::Duration;
use tch::{Kind, Tensor};
use tch_cuda_graphs::dist::{ProcessGroup, ReduceOp};
use tch_cuda_graphs::{synchronize, CaptureOptions, CudaGraph};

fn main() -> Result<()> {
    let pg = ProcessGroup::from_env(Duration::from_secs(60))?;
    let (rank, world, d) = (pg.rank(), pg.world_size(), pg.device());
    println!("rank {rank}/{world} on {d:?}");
    let t = Tensor::full([1024], (rank + 1) as f64, (Kind::Float, d));
    pg.all_reduce(&t, ReduceOp::Sum)?;
    let want = (1..=world).sum::<usize>() as f64;
    ensure!(f64::try_from(t.mean(Kind::Double))? == want, "all-reduce sum");
    let b = Tensor::full([16], rank as f64 * 10.0 + 7.0, (Kind::Float, d));
    pg.broadcast(&b, 0)?;
    ensure!(f64::try_from(b.mean(Kind::Double))? == 7.0, "broadcast from rank 0");
    pg.barrier()?;
    // captured: the all-reduce is part of the graph; the communicator exists (eager calls above)
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
        synchronize(d)?;
        // mean over ranks of 2 * (rank * 100 + step)
        let want = (0..world).map(|r| 2.0 * (r * 100 + step) as f64).sum::<f64>() / world as f64;
        let got = f64::try_from(y.mean(Kind::Double))?;
        ensure!(got == want, "replay {step}: {got} vs {want}");
    }
    drop(g); // graphs holding NCCL work go before the group is shut down
    println!("rank {rank}: eager all-reduce, broadcast, barrier and 20 replays of a captured all-reduce: ok");
    Ok(())
}
