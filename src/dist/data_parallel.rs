//! Data parallel training pieces: the same parameters on every rank at start, gradients
//! averaged across ranks in flat buckets inside the (captured) step.

use super::{ProcessGroup, ReduceOp};
use crate::error::{Error, Result};
use crate::optim::Optimizer;
use crate::scalar::cpu_i64;
use crate::sys::dist::{
    plan_buckets, BucketsHandle, BucketsOptions, RawBucketBuffers, RawBucketCollective, RawBucketCompression,
    RawBucketLayout,
};
use tch::{nn::VarStore, Kind, Tensor};

/// A fixed-size summary of a model's variables (count, sizes, ranks, dtypes, names), the same
/// on every rank exactly when the models match.
fn signature(vars: &[(String, Tensor)]) -> Vec<i64> {
    let mut sig = vec![vars.len() as i64, 0, 0, 0, 0];
    for (i, (name, t)) in vars.iter().enumerate() {
        let w = i as i64 + 1;
        sig[1] = sig[1].wrapping_add(t.numel() as i64);
        sig[2] = sig[2].wrapping_add(w.wrapping_mul(t.numel() as i64));
        sig[3] = sig[3].wrapping_add(w.wrapping_mul(t.dim() as i64 * 31 + t.kind() as i64));
        let h = name.bytes().fold(1469598103934665603u64, |h, b| (h ^ u64::from(b)).wrapping_mul(1099511628211));
        sig[4] = sig[4].wrapping_add(w.wrapping_mul((h >> 16) as i64));
    }
    sig
}

/// Checks that every rank has the same variables (names, shapes, dtypes), then copies rank
/// 0's values into every rank's, in place. [`Error::Misuse`] on every rank when the models
/// differ (nothing is copied then).
pub fn broadcast_parameters(pg: &ProcessGroup, vs: &VarStore) -> Result<()> {
    let mut vars: Vec<(String, Tensor)> = vs.variables().into_iter().collect();
    vars.sort_by(|a, b| a.0.cmp(&b.0));
    // Each rank checks that the sum of all signatures is world × its own (true for every rank
    // exactly when all are equal); then the ranks agree on the verdict with one more sum.
    let sig = Tensor::from_slice(&signature(&vars)).f_to_device(pg.device())?;
    let sum = sig.copy();
    pg.all_reduce(&sum, ReduceOp::Sum)?;
    let mismatch = sum.f_ne_tensor(&sig.f_mul(&cpu_i64(pg.world_size() as i64)?)?)?.f_any()?.f_to_kind(Kind::Int64)?;
    pg.all_reduce(&mismatch, ReduceOp::Sum)?;
    if i64::try_from(&mismatch)? != 0 {
        return Err(Error::Misuse(format!(
            "the model differs across ranks (rank {}: {} variables): build the same model on every rank",
            pg.rank(),
            vars.len()
        )));
    }
    let _no_grad = tch::no_grad_guard();
    for (_, t) in &vars {
        pg.broadcast(t, 0)?;
    }
    Ok(())
}

/// Averages gradients across ranks in flat buckets (DDP-style, about `bucket_bytes` each,
/// filled in reverse parameter order: the order backward produces gradients). The buffers are
/// made here, once, so all of it can be captured.
///
/// By default each bucket is packed (one kernel) and all-reduced (one NCCL call, average) on
/// the buckets' side stream, and then each parameter's `.grad` becomes its view of the bucket
/// (no unpack kernel; the next `zero_grad` sets it to none again, so backward writes fresh
/// gradients without adding). With
/// [`BucketLayout::Views`] each parameter's `.grad` is a **view into its bucket**
/// (PyTorch DDP's `gradient_as_bucket_view`): backward accumulates into the views, each bucket
/// is all-reduced in place, and nothing is packed or unpacked. The views stay valid:
/// the crate's `zero_grad` zeroes them in place instead of setting them to none, the optimizers
/// read them like any gradient, and a gradient that something put elsewhere (set to none by
/// other code, then made again by backward) is copied back into its view before its bucket is
/// reduced. Both layouts give the same results bit for bit; the packed one measured faster
/// (`docs/distributed.md`).
/// [`Compression::BFloat16`] sends the buckets in bf16 (PyTorch's `bf16_compress_hook`,
/// averaged): half the bytes, the gradients cast back to float32 for the optimizer.
///
/// Two ways to use it inside the step closure:
/// - after backward: [`all_reduce`](Self::all_reduce) reduces every bucket, on the current
///   stream.
/// - overlapped: [`arm`](Self::arm) before backward. Each parameter carries an autograd hook
///   (post-accumulate-grad); armed, a bucket whose gradients are all ready is packed and
///   all-reduced on a side stream while backward goes on (buckets start in the
///   same order on every rank, all on that one stream). [`all_reduce`](Self::all_reduce) then
///   does what is left there, makes the current stream wait for the side stream (no host wait)
///   and disarms. Under capture the fork and the join are recorded into the graph.
///   [`backward`](Self::backward) does all three.
///
/// One backward per armed step: a parameter whose gradient arrives twice while armed is an
/// error (accumulate over several backward passes without arming, then call `all_reduce`).
/// Disarmed, the hooks do nothing. Holds its group; the hooks are removed on drop.
///
/// ```no_run
/// # fn main() -> tch_cuda_graphs::Result<()> {
/// # use std::time::Duration;
/// use tch::nn::{self, Module};
/// use tch_cuda_graphs::dist::{broadcast_parameters, GradAllReduce, ProcessGroup};
/// use tch_cuda_graphs::optim::{Adam, AdamConfig, Optimizer};
/// let pg = ProcessGroup::from_env(Duration::from_secs(60))?;
/// let vs = nn::VarStore::new(pg.device());
/// let model = nn::linear(vs.root(), 64, 8, Default::default());
/// broadcast_parameters(&pg, &vs)?;
/// let mut opt = Adam::new(&vs, AdamConfig::default())?;
/// let mut reduce = GradAllReduce::new(&pg, opt.params(), 4 << 20)?;
/// let x = tch::Tensor::randn([32, 64], (tch::Kind::Float, pg.device()));
/// opt.zero_grad()?;
/// let loss = model.forward(&x).square().mean(None);
/// reduce.backward(&loss)?; // backward, each bucket's all-reduce overlapping the rest of it
/// opt.step()?;
/// # Ok(()) }
/// ```
pub struct GradAllReduce {
    handle: BucketsHandle,
    buckets: usize,
    /// The parameters, in the order the shim's indices use.
    params: Vec<Tensor>,
    pg: ProcessGroup,
}

impl std::fmt::Debug for GradAllReduce {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GradAllReduce").field("rank", &self.pg.rank()).field("buckets", &self.buckets).finish()
    }
}

/// The default bucket size: 25 MiB, as PyTorch's DDP.
pub const DEFAULT_BUCKET_BYTES: usize = 25 << 20;

/// Where [`GradAllReduce`]'s bucket buffers come from, and what NCCL knows of them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum NcclBuffers {
    /// From PyTorch's caching allocator, like any tensor (the default).
    #[default]
    Caching,
    /// One allocation of NCCL's own allocator (`ncclMemAlloc`) for all buckets, not registered
    /// (NCCL may still register it for a captured collective, `NCCL_GRAPH_REGISTER`).
    NcclMem,
    /// That allocation registered with the communicator (`ncclCommRegister`, NCCL's
    /// user-buffer registration: zero-copy where NCCL supports it).
    Registered,
    /// That allocation registered as a symmetric window (`ncclCommWindowRegister` with
    /// `NCCL_WIN_COLL_SYMMETRIC`; NCCL >= 2.27): NCCL's symmetric-memory kernels.
    Window,
}

/// The bucket layout of a [`BucketConfig`] ([`BucketConfig::plan`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BucketPlan {
    /// The buckets in the order their all-reduces start (the last parameters first).
    pub buckets: Vec<PlannedBucket>,
}

/// One bucket of a [`BucketPlan`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlannedBucket {
    /// The indices of its parameters, in the order of its flat buffer.
    pub members: Vec<usize>,
    /// Each member's offset in the flat buffer (elements).
    pub offsets: Vec<i64>,
    /// The flat buffer's length (elements), alignment and split padding included.
    pub numel: i64,
}

/// How [`GradAllReduce`] buckets and sends gradients: a plain struct with [`Default`], as tch's
/// configs.
///
/// ```
/// use tch_cuda_graphs::dist::{BucketConfig, BucketLayout, Compression, Wire};
/// // DDP's `gradient_as_bucket_view` with `bf16_compress_hook`, and a 1 MiB first bucket
/// let config = BucketConfig {
///     first_bucket_bytes: Some(1 << 20),
///     layout: BucketLayout::Views(Wire { compression: Compression::BFloat16, ..Default::default() }),
///     ..Default::default()
/// };
/// # let _ = config;
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BucketConfig {
    /// Bytes per bucket (a parameter larger than that gets a bucket of its own); default
    /// [`DEFAULT_BUCKET_BYTES`].
    pub bucket_bytes: usize,
    /// Bytes of the first bucket (the last parameters, whose gradients come first), so that
    /// communication starts early; PyTorch's DDP uses 1 MiB. Default (`None`): as the others.
    pub first_bucket_bytes: Option<usize>,
    /// How a bucket's gradients meet the wire; default [`BucketLayout::Packed`] with the
    /// default [`Wire`].
    pub layout: BucketLayout,
    /// Run the overlapped collectives on a high-priority stream (captured graphs keep each
    /// kernel's priority), so NCCL's blocks are scheduled before backward's; default false.
    pub high_priority: bool,
}

impl Default for BucketConfig {
    /// Buckets of [`DEFAULT_BUCKET_BYTES`], packed, averaged by one all-reduce in the
    /// gradients' dtype, buffers from the caching allocator, the side stream of normal priority.
    fn default() -> Self {
        BucketConfig {
            bucket_bytes: DEFAULT_BUCKET_BYTES,
            first_bucket_bytes: None,
            layout: BucketLayout::default(),
            high_priority: false,
        }
    }
}

/// Where a bucket's gradients live and how they are reduced (a [`BucketConfig`]'s `layout`).
/// Only the layouts with a bucket buffer take a [`Wire`]: a grouped one with compression or
/// NCCL buffers cannot be written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum BucketLayout {
    /// Gradients packed into the bucket's flat buffer around each collective (one kernel),
    /// each `.grad` then made its view of the bucket; the next `zero_grad` sets it to none
    /// again. Measured as fast or faster than views (`docs/distributed.md`): the default.
    Packed(Wire),
    /// Every `.grad` a view into its bucket (PyTorch DDP's `gradient_as_bucket_view`):
    /// backward accumulates into the views, nothing is packed; one copy of the gradients
    /// instead of two.
    Views(Wire),
    /// No bucket buffer: each bucket's gradients all-reduced where backward put them, in one
    /// NCCL group (one kernel, no pack), in their own dtype.
    Grouped,
}

impl Default for BucketLayout {
    fn default() -> Self {
        BucketLayout::Packed(Wire::default())
    }
}

/// How a bucket's flat buffer is averaged over the group, and where it comes from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Wire {
    /// The collective; default one all-reduce.
    pub collective: Collective,
    /// The dtype on the wire; default the gradients'.
    pub compression: Compression,
    /// Where the buffers come from; default the caching allocator.
    pub buffers: NcclBuffers,
}

/// The collective that averages a bucket.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Collective {
    /// One all-reduce (average).
    #[default]
    AllReduce,
    /// A reduce-scatter then an all-gather, both in place (the bucket padded to a multiple of
    /// the world size). The same sum in the same order for two ranks. Meant for NCCL's zero-CTA
    /// policy with [`NcclBuffers::Window`], under which a newer NCCL runs the all-gather on copy
    /// engines instead of SMs; NCCL 2.28.9 (libtorch 2.11's) still ran SM kernels, and this
    /// measured slower than one all-reduce (`docs/distributed.md`).
    ReduceScatterAllGather,
}

/// The dtype a bucket travels in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Compression {
    /// The gradients' own dtype.
    #[default]
    None,
    /// bf16 (float32 gradients only; PyTorch's `bf16_compress_hook`, averaged): half the
    /// bytes, cast back to float32 for the optimizer.
    BFloat16,
}

impl BucketConfig {
    /// The buckets [`GradAllReduce::with_config`] makes with this configuration for parameters
    /// of `numels` elements of `kind` (in the optimizer's order) over `world_size` ranks: which
    /// parameters share a bucket and where each lies in its flat buffer. Computed on the host,
    /// no GPU needed.
    ///
    /// ```
    /// use tch_cuda_graphs::dist::BucketConfig;
    /// let plan = BucketConfig { bucket_bytes: 1024, ..Default::default() }.plan(&[100, 100, 300], tch::Kind::Float, 1)?;
    /// // gradients come in reverse order: the last parameter fills the first bucket
    /// assert_eq!(plan.buckets[0].members, vec![2]);
    /// assert_eq!(plan.buckets[1].members, vec![1, 0]);
    /// # Ok::<(), tch_cuda_graphs::Error>(())
    /// ```
    pub fn plan(&self, numels: &[i64], kind: Kind, world_size: usize) -> Result<BucketPlan> {
        let world =
            i32::try_from(world_size).map_err(|_| Error::Misuse(format!("world size {world_size} is too large")))?;
        let element_bytes = i64::try_from(kind.elt_size_in_bytes()).unwrap_or(i64::MAX);
        let (slots, lengths) = plan_buckets(numels, element_bytes, &self.options(), world)?;
        let mut buckets: Vec<PlannedBucket> =
            lengths.iter().map(|&numel| PlannedBucket { members: Vec::new(), offsets: Vec::new(), numel }).collect();
        // the members of a bucket in buffer order: by offset, later parameters first on a tie
        let mut order: Vec<usize> = (0..slots.len()).collect();
        order.sort_by_key(|&i| (slots[i].1, std::cmp::Reverse(i)));
        for i in order {
            let (k, offset) = slots[i];
            let bucket = buckets
                .get_mut(k)
                .ok_or_else(|| Error::Libtorch(format!("bucket plan: bucket {k} of {}", lengths.len())))?;
            bucket.members.push(i);
            bucket.offsets.push(offset);
        }
        Ok(BucketPlan { buckets })
    }

    fn options(&self) -> BucketsOptions {
        let (layout, wire) = match self.layout {
            BucketLayout::Packed(wire) => (RawBucketLayout::TCG_BUCKET_LAYOUT_PACKED, wire),
            BucketLayout::Views(wire) => (RawBucketLayout::TCG_BUCKET_LAYOUT_VIEWS, wire),
            BucketLayout::Grouped => (RawBucketLayout::TCG_BUCKET_LAYOUT_GROUPED, Wire::default()),
        };
        BucketsOptions {
            bucket_bytes: i64::try_from(self.bucket_bytes).unwrap_or(i64::MAX),
            first_bucket_bytes: self.first_bucket_bytes.map_or(0, |b| i64::try_from(b).unwrap_or(i64::MAX).max(1)),
            layout,
            collective: match wire.collective {
                Collective::AllReduce => RawBucketCollective::TCG_BUCKET_COLLECTIVE_ALL_REDUCE,
                Collective::ReduceScatterAllGather => {
                    RawBucketCollective::TCG_BUCKET_COLLECTIVE_REDUCE_SCATTER_ALL_GATHER
                }
            },
            compression: match wire.compression {
                Compression::None => RawBucketCompression::TCG_BUCKET_COMPRESSION_NONE,
                Compression::BFloat16 => RawBucketCompression::TCG_BUCKET_COMPRESSION_BF16,
            },
            buffers: match wire.buffers {
                NcclBuffers::Caching => RawBucketBuffers::TCG_BUCKET_BUFFERS_CACHING,
                NcclBuffers::NcclMem => RawBucketBuffers::TCG_BUCKET_BUFFERS_NCCL_MEM,
                NcclBuffers::Registered => RawBucketBuffers::TCG_BUCKET_BUFFERS_NCCL_REGISTERED,
                NcclBuffers::Window => RawBucketBuffers::TCG_BUCKET_BUFFERS_NCCL_WINDOW,
            },
            high_priority: self.high_priority,
        }
    }
}

impl GradAllReduce {
    /// Buckets for `params` (leaves that require grad, all of one dtype, on the group's device),
    /// each up to `bucket_bytes`, packed ([`BucketConfig::default`]).
    pub fn new(pg: &ProcessGroup, params: &[Tensor], bucket_bytes: usize) -> Result<Self> {
        Self::with_config(pg, params, BucketConfig { bucket_bytes, ..Default::default() })
    }

    /// Buckets for `params` as `config` says, with a gradient hook on each parameter (and, as
    /// views, each gradient made a view into its bucket, keeping any value it had).
    /// [`Error::Misuse`] (checked by the shim) for no parameters, several dtypes, another
    /// device, a parameter that is not a leaf requiring grad, one that already belongs to
    /// another `GradAllReduce`, or bf16 compression of gradients that are not float32.
    pub fn with_config(pg: &ProcessGroup, params: &[Tensor], config: BucketConfig) -> Result<Self> {
        let handle = BucketsHandle::new(pg.handle(), params, &config.options())?;
        let buckets = handle.count()?;
        Ok(GradAllReduce {
            handle,
            buckets,
            params: params.iter().map(Tensor::shallow_clone).collect(),
            pg: pg.clone(),
        })
    }

    /// How many buckets (NCCL calls per step).
    pub fn bucket_count(&self) -> usize {
        self.buckets
    }

    /// Arms the hooks for the next backward pass (forgetting any round a failed step left
    /// half done): each bucket's all-reduce starts as soon as its gradients are ready.
    pub fn arm(&mut self) -> Result<()> {
        self.handle.arm()
    }

    /// Averages every parameter's gradient across ranks, in place, with no host sync: starts
    /// the buckets not started yet (all of them when not armed), makes the current stream wait
    /// for every bucket, and disarms. Every parameter must have a gradient; afterwards each is
    /// its view of its bucket.
    pub fn all_reduce(&mut self) -> Result<()> {
        self.pg.retain_in_capture();
        self.handle.finish()
    }

    /// [`arm`](Self::arm), `loss.backward()`, [`all_reduce`](Self::all_reduce): gradients
    /// averaged across ranks, each bucket's all-reduce overlapping the rest of backward.
    pub fn backward(&mut self, loss: &Tensor) -> Result<()> {
        self.arm()?;
        loss.f_backward()?;
        self.all_reduce()
    }

    /// [`backward`](Self::backward) and `opt.step()`, overlapped further: each bucket's
    /// parameters are updated ([`Optimizer::step_only`]) as soon as that bucket's all-reduce
    /// is done, while later buckets are still on the wire, instead of one step after the last
    /// all-reduce (PyTorch's "optimizer in backward" for DDP). The steps run on the current
    /// stream after backward (measured: on a stream of their own, beside backward, they slowed
    /// backward down more than they saved). The same update, bit for bit: every parameter is
    /// stepped once, from its averaged gradient. The optimizer's parameters outside these
    /// buckets are stepped last. Not for a [`crate::amp::GradScaler`] step or gradient
    /// clipping (both need every gradient first).
    ///
    /// ```no_run
    /// # fn main() -> tch_cuda_graphs::Result<()> {
    /// # use std::time::Duration;
    /// use tch::nn::{self, Module};
    /// use tch_cuda_graphs::dist::{broadcast_parameters, GradAllReduce, ProcessGroup};
    /// use tch_cuda_graphs::optim::{Adam, AdamConfig, Optimizer};
    /// let pg = ProcessGroup::from_env(Duration::from_secs(60))?;
    /// let vs = nn::VarStore::new(pg.device());
    /// let model = nn::linear(vs.root(), 64, 8, Default::default());
    /// broadcast_parameters(&pg, &vs)?;
    /// let mut opt = Adam::new(&vs, AdamConfig::default())?;
    /// let mut reduce = GradAllReduce::new(&pg, opt.params(), 4 << 20)?;
    /// let x = tch::Tensor::randn([32, 64], (tch::Kind::Float, pg.device()));
    /// opt.zero_grad()?;
    /// let loss = model.forward(&x).square().mean(None);
    /// reduce.backward_and_step(&loss, &mut opt)?;
    /// # Ok(()) }
    /// ```
    pub fn backward_and_step<O: Optimizer + ?Sized>(&mut self, loss: &Tensor, opt: &mut O) -> Result<()> {
        // where each of our parameters is in the optimizer's list (by storage; checked before
        // any work is queued)
        let at: std::collections::HashMap<usize, usize> =
            opt.params().iter().enumerate().map(|(j, p)| (p.data_ptr() as usize, j)).collect();
        let mut parts = Vec::with_capacity(self.buckets);
        let mut covered = vec![false; opt.params().len()];
        for k in 0..self.buckets {
            let mut part = Vec::new();
            for i in self.members(k)? {
                let j = *at.get(&(self.params[i].data_ptr() as usize)).ok_or_else(|| {
                    Error::Misuse(format!("backward_and_step: parameter #{i} of the buckets is not in the optimizer"))
                })?;
                covered[j] = true;
                part.push(j);
            }
            parts.push(part);
        }
        let rest: Vec<usize> = (0..covered.len()).filter(|&j| !covered[j]).collect();
        self.arm()?;
        loss.f_backward()?;
        self.pg.retain_in_capture();
        // each bucket's parameters stepped once its reduction is done; the side stream is
        // joined whatever happens (a capture must end joined)
        self.handle.finish_each(|k| opt.step_only(parts.get(k).map_or(&[][..], Vec::as_slice)))?;
        if !rest.is_empty() {
            opt.step_only(&rest)?;
        }
        Ok(())
    }

    /// The indices (into the parameters the buckets were made from) of bucket `k`'s members.
    fn members(&self, k: usize) -> Result<Vec<usize>> {
        self.handle.members(k)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shim refuses what the Rust types cannot express: a grouped layout with a wire
    /// setting, or an enumerator it does not know (the C API's own check, no GPU needed).
    #[test]
    fn the_shim_refuses_raw_options_that_do_not_combine() {
        let grouped = BucketConfig { layout: BucketLayout::Grouped, ..Default::default() }.options();
        assert!(plan_buckets(&[4], 4, &grouped, 1).is_ok());
        let bf16 = BucketsOptions { compression: RawBucketCompression::TCG_BUCKET_COMPRESSION_BF16, ..grouped };
        let window = BucketsOptions { buffers: RawBucketBuffers::TCG_BUCKET_BUFFERS_NCCL_WINDOW, ..grouped };
        let split = BucketsOptions {
            collective: RawBucketCollective::TCG_BUCKET_COLLECTIVE_REDUCE_SCATTER_ALL_GATHER,
            ..grouped
        };
        let unknown = BucketsOptions { layout: RawBucketLayout(7), ..grouped };
        for (what, raw) in [("bf16", bf16), ("window", window), ("reduce-scatter", split), ("layout 7", unknown)] {
            let got = plan_buckets(&[4], 4, &raw, 1);
            println!("grouped + {what}: {got:?}");
            assert!(matches!(got, Err(Error::Misuse(_))), "grouped + {what}: {got:?}");
        }
    }
}
