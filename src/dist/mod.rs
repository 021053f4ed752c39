//! Several GPUs: a NCCL process group over libtorch's own c10d (`c10d::ProcessGroupNCCL`,
//! `c10d::TCPStore`), launched by `torchrun`. Collectives make the current stream wait for their
//! result without a host wait, so they can be captured in a training step's graph (after a first
//! eager collective has set up the NCCL communicator).
//!
//! ```no_run
//! # fn main() -> tch_cuda_graphs::Result<()> {
//! // .venv/bin/torchrun --nproc_per_node=2 --no-python target/release/examples/...
//! use tch_cuda_graphs::dist::{ProcessGroup, ReduceOp};
//! let pg = ProcessGroup::from_env(std::time::Duration::from_secs(60))?;
//! let t = tch::Tensor::ones([4], (tch::Kind::Float, pg.device()));
//! pg.all_reduce(&t, ReduceOp::Sum)?; // every element is now the world size
//! # Ok(()) }
//! ```
//!
//! Data parallel: [`broadcast_parameters`] (same model on every rank, checked, rank 0's values)
//! and [`GradAllReduce`] (gradients averaged in flat buckets inside the captured step, each
//! bucket's all-reduce overlapping the rest of backward when armed); ZeRO-1 ([`ShardedAdam`]:
//! gradients reduce-scattered, each rank stepping and holding the state of its shard, the
//! parameters all-gathered).
//!
//! # Lifetimes
//! A graph that holds NCCL kernels must be gone before its group is shut down (c10d's
//! `shutdown` waits for them: with a live graph it hangs). Every collective issued while this
//! crate records a capture hands a clone of its group to the graph being recorded
//! ([`crate::retain_in_capture`]); [`GradAllReduce`] holds its group too. So a group is shut
//! down only when the last of its handles, buckets and graphs is gone, in whatever order the
//! caller drops them.
//!
//! # Faster captured collectives: `NCCL_GRAPH_MIXING_SUPPORT=0`
//! By default NCCL lets a communicator's graph launches run alongside its other launches (other
//! graphs, eager collectives), at a cost inside every captured collective. With
//! `NCCL_GRAPH_MIXING_SUPPORT=0` in the environment it drops that support: captured steps get
//! faster (`docs/distributed.md`: mlp_medium on 2 × H200 815 → 784 µs per step), and NCCL is
//! correct only if no eager NCCL launch follows a graph launch that has not finished, whatever
//! the streams. This crate keeps that rule for its own collectives: when the variable is `0`,
//! every eager collective (of a [`ProcessGroup`], [`broadcast_parameters`], a [`GradAllReduce`]
//! used outside a capture) first waits on the host for the device (nothing changes inside a
//! capture). Collectives issued by other code on the same communicator are the caller's to
//! order. Do not replay graphs from several streams at once with it set.
//!
//! # Failures
//! A rank that never joins: the store's timeout ends [`ProcessGroup::from_env`] (or the first
//! collective) with [`Error::Distributed`]. A rank that dies: an eager collective's kernels
//! are watched by c10d's watchdog (the group's timeout; what follows is
//! `TORCH_NCCL_ASYNC_ERROR_HANDLING`'s choice, by default tearing the process down), but a graph
//! replay's NCCL kernels are invisible to it and would spin forever. Wait for the device with
//! [`ProcessGroup::wait_device`] instead of a plain synchronize or a host read: it returns
//! [`Error::DistributedTimeout`] within the timeout and aborts the group without waiting for
//! any peer: NCCL's `ncclCommRevoke` (NCCL ≥ 2.28, as in the libtorch 2.11 wheel) stops the
//! in-flight operations, so the spinning kernels exit; with an older NCCL, c10d's abort runs on
//! a background thread (its resource reclaim can wait for good on a dead peer of the same
//! node). The group then refuses every collective, and dropping it leaves it as it is (leaked)
//! rather than wait: the process is expected to exit, as torchrun's workers do when one of them
//! fails.

mod data_parallel;
mod zero;

pub use data_parallel::{
    broadcast_parameters, BucketConfig, BucketLayout, BucketPlan, Collective, Compression, GradAllReduce, NcclBuffers,
    PlannedBucket, Wire, DEFAULT_BUCKET_BYTES,
};
pub use zero::{Piece, ShardPlan, ShardedAdam};

use crate::error::{Error, Result};
use crate::sys::dist::{self as sys, PgHandle, RawReduceOp, Rendezvous};
use std::sync::Arc;
use std::time::Duration;
use tch::{Device, Tensor};

/// How [`ProcessGroup::all_reduce`] combines.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReduceOp {
    /// The sum over ranks.
    Sum,
    /// The mean over ranks (NCCL's average: no separate divide).
    Avg,
}

impl ReduceOp {
    fn raw(self) -> RawReduceOp {
        match self {
            ReduceOp::Sum => RawReduceOp::TCG_REDUCE_SUM,
            ReduceOp::Avg => RawReduceOp::TCG_REDUCE_AVG,
        }
    }
}

/// A NCCL process group: this rank, the world size, this rank's CUDA device. Clones share the
/// group; it is shut down when the last clone goes.
#[derive(Clone, Debug)]
pub struct ProcessGroup {
    handle: Arc<PgHandle>,
    rank: usize,
    size: usize,
    device: Device,
}

/// Checked (rank, size, CUDA device index) for the shim.
fn coordinates(rank: usize, size: usize, device: Device) -> Result<(i32, i32, i32)> {
    if size == 0 || rank >= size {
        return Err(Error::Misuse(format!("invalid rank {rank} of {size}")));
    }
    let as_int = |v: usize| i32::try_from(v).map_err(|_| Error::Misuse(format!("{v} is too large")));
    match device {
        Device::Cuda(i) => Ok((as_int(rank)?, as_int(size)?, as_int(i)?)),
        other => Err(Error::Misuse(format!("a NCCL group needs a CUDA device, got {other:?}"))),
    }
}

fn millis(timeout: Duration) -> i64 {
    i64::try_from(timeout.as_millis()).unwrap_or(i64::MAX)
}

impl ProcessGroup {
    /// Whether this build has c10d/NCCL.
    pub fn available() -> bool {
        sys::available()
    }

    /// The group torchrun describes in the environment (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`,
    /// `MASTER_ADDR`, `MASTER_PORT`; torchrun's agent store when `TORCHELASTIC_USE_AGENT_STORE`
    /// is set). Makes `cuda:LOCAL_RANK` current. `timeout` bounds the store and collectives.
    pub fn from_env(timeout: Duration) -> Result<Self> {
        Self::wrap(PgHandle::new(Rendezvous::Env, (0, 0, 0), millis(timeout))?)
    }

    /// A group from explicit coordinates: rank 0 hosts a TCP store at `host:port`.
    pub fn new_tcp(host: &str, port: u16, rank: usize, size: usize, device: Device, timeout: Duration) -> Result<Self> {
        let at = coordinates(rank, size, device)?;
        Self::wrap(PgHandle::new(Rendezvous::Tcp { host, port }, at, millis(timeout))?)
    }

    /// A group from explicit coordinates over a file store (`c10d::FileStore`) at `path`: a
    /// file on storage every rank reaches (a shared file system across nodes). Use a new path
    /// per run: a file left by an earlier run confuses the new one.
    pub fn new_file(
        path: &std::path::Path,
        rank: usize,
        size: usize,
        device: Device,
        timeout: Duration,
    ) -> Result<Self> {
        let at = coordinates(rank, size, device)?;
        let text = path.to_str().ok_or_else(|| Error::Misuse(format!("file store path {path:?} is not UTF-8")))?;
        Self::wrap(PgHandle::new(Rendezvous::File { path: text }, at, millis(timeout))?)
    }

    fn wrap(handle: PgHandle) -> Result<Self> {
        let (rank, size, device) = handle.info()?; // on failure `handle` frees the group
        Ok(ProcessGroup {
            handle: Arc::new(handle),
            rank: rank.max(0) as usize,
            size: size.max(0) as usize,
            device: Device::Cuda(device.max(0) as usize),
        })
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of ranks.
    pub fn world_size(&self) -> usize {
        self.size
    }

    /// This rank's CUDA device.
    pub fn device(&self) -> Device {
        self.device
    }

    /// Hands a clone of this group to the graph being recorded on its device, if any (see the
    /// module docs on lifetimes).
    pub(crate) fn retain_in_capture(&self) {
        crate::capture::retain_in_capture(self.device(), self.clone());
    }

    /// Reduces `t` (on this rank's device) over all ranks, in place, on the current stream.
    pub fn all_reduce(&self, t: &Tensor, op: ReduceOp) -> Result<()> {
        self.retain_in_capture();
        self.handle.all_reduce(t, op.raw())
    }

    /// Copies rank `root`'s `t` into every rank's `t`, in place, on the current stream.
    pub fn broadcast(&self, t: &Tensor, root: usize) -> Result<()> {
        let root = i32::try_from(root).map_err(|_| Error::Misuse(format!("root {root} is too large")))?;
        self.retain_in_capture();
        self.handle.broadcast(t, root)
    }

    /// ZeRO's gradient collective: `output` (`[n]`) becomes the reduction over all ranks of
    /// their `input`'s slice `[rank * n, (rank + 1) * n)` (`input`: `[world * n]`), on the
    /// current stream. Contiguous tensors of one dtype on this rank's device;
    /// [`Error::Misuse`] otherwise.
    pub fn reduce_scatter(&self, output: &Tensor, input: &Tensor, op: ReduceOp) -> Result<()> {
        self.retain_in_capture();
        self.handle.reduce_scatter(output, input, op.raw())
    }

    /// ZeRO's parameter collective: `output` (`[world * n]`) gets rank `r`'s `input` (`[n]`)
    /// at `r * n`, on the current stream. `input` may be this rank's slice of `output` (in
    /// place). Contiguous tensors of one dtype on this rank's device; [`Error::Misuse`]
    /// otherwise.
    pub fn all_gather(&self, output: &Tensor, input: &Tensor) -> Result<()> {
        self.retain_in_capture();
        self.handle.all_gather(output, input)
    }

    /// Waits (on the device) until every rank reached the barrier.
    pub fn barrier(&self) -> Result<()> {
        self.retain_in_capture();
        self.handle.barrier()
    }

    /// The host waits, at most `timeout`, for the work queued so far on this rank's current
    /// stream: graph replays included, whose NCCL kernels c10d's watchdog cannot see. Use it
    /// where a loop would synchronize or read a value back. On timeout (a rank died or stopped
    /// calling collectives) [`Error::DistributedTimeout`] comes back and the group is aborted
    /// (see [`abort`](Self::abort)).
    ///
    /// ```no_run
    /// # fn main() -> tch_cuda_graphs::Result<()> {
    /// # use std::time::Duration;
    /// # let pg = tch_cuda_graphs::dist::ProcessGroup::from_env(Duration::from_secs(60))?;
    /// // ... step.run(...) a few times ...
    /// pg.wait_device(Duration::from_secs(30))?; // then reading the loss cannot hang
    /// # Ok(()) }
    /// ```
    pub fn wait_device(&self, timeout: Duration) -> Result<()> {
        self.handle.wait_device(millis(timeout))
    }

    /// Aborts the group without waiting for any peer: its in-flight NCCL work is stopped
    /// (pending kernels exit), it refuses collectives from then on, and dropping it leaks it
    /// instead of waiting (see the module docs on failures).
    pub fn abort(&self) -> Result<()> {
        self.handle.abort()
    }

    /// The shared group handle (gradient buckets keep it alive).
    pub(crate) fn handle(&self) -> Arc<PgHandle> {
        Arc::clone(&self.handle)
    }
}
