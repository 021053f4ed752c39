//! ZeRO-1: the optimizer's state sharded across ranks, inside the (captured) step.
//!
//! [`ShardPlan`] lays the parameters out end to end in one flat buffer (each starting on an
//! aligned offset) and cuts it into one equal shard per rank. [`ShardedAdam`] steps only its
//! rank's shard: the gradients are packed into the flat buffer (one kernel), reduce-scattered
//! (each rank receives the average of its shard), each rank's own Adam kernel updates its pieces
//! of the parameters in place (the moments exist only for those pieces: 1/world of Adam's
//! state), and the updated shards are all-gathered and copied back into every parameter (one
//! kernel each way). All of it is on the current stream and capturable.
//!
//! Adam's update is per element, so a step equals the unsharded [`Adam`] step over the same
//! averaged gradients bit for bit: on one rank exactly (`tests/gpu_zero.rs`); on several, the
//! reduce-scatter's sums may round in another order than an all-reduce's.

use super::{ProcessGroup, ReduceOp};
use crate::error::{Error, Result};
use crate::kernels::{KernelPath, Kernels};
use crate::optim::{Adam, AdamConfig, LrHandle, Optimizer, ParamGroup};
use std::collections::HashMap;
use tch::{Device, Kind, Tensor};

/// `n` rounded up to a multiple of `unit` (both non-negative, `unit` ≥ 1).
fn round_up(n: i64, unit: i64) -> i64 {
    (n + unit - 1) / unit * unit
}

/// One parameter's part of one rank's shard.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Piece {
    /// Which parameter (index in the plan's order).
    pub param: usize,
    /// Where the piece starts in the parameter (flattened), and how many values it holds.
    pub start: i64,
    /// How many values.
    pub len: i64,
    /// Where the piece starts in its rank's shard.
    pub shard_offset: i64,
}

/// The flat layout of parameters across ranks: parameter `i` at
/// [`offset(i)`](Self::offset) of a buffer of [`flat_len`](Self::flat_len) values (each offset a
/// multiple of `align`, zeros between), rank `r`'s shard the values
/// `[r · shard_len, (r + 1) · shard_len)`.
///
/// ```
/// use tch_cuda_graphs::dist::ShardPlan;
/// let plan = ShardPlan::new(&[10, 3, 7], 2, 4)?; // offsets 0, 12, 16; 24 values, shards of 12
/// assert_eq!((plan.shard_len(), plan.offset(2)), (12, 16));
/// let rank1 = plan.pieces(1); // parameter 1 whole, then parameter 2 whole
/// assert_eq!((rank1[0].param, rank1[1].param, rank1[1].shard_offset), (1, 2, 4));
/// # Ok::<(), tch_cuda_graphs::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardPlan {
    numels: Vec<i64>,
    offsets: Vec<i64>,
    world: usize,
    shard: i64,
}

impl ShardPlan {
    /// The plan for parameters of `numels` values on `world` ranks, every offset and the shard
    /// length multiples of `align` (values; 16 for the own kernels' 64-byte loads of float32).
    /// [`Error::Misuse`] for no ranks, an alignment below 1 or a negative size.
    pub fn new(numels: &[i64], world: usize, align: i64) -> Result<Self> {
        if world == 0 || align < 1 {
            return Err(Error::Misuse(format!("shard plan: {world} ranks, alignment {align}")));
        }
        let mut offsets = Vec::with_capacity(numels.len());
        let mut end = 0i64;
        for &n in numels {
            if n < 0 {
                return Err(Error::Misuse(format!("shard plan: a parameter of {n} values")));
            }
            let at = round_up(end, align);
            offsets.push(at);
            end = at + n;
        }
        let unit = align * world as i64;
        let total = round_up(end, unit);
        Ok(ShardPlan { numels: numels.to_vec(), offsets, world, shard: total / world as i64 })
    }

    /// How many values each rank's shard holds.
    pub fn shard_len(&self) -> i64 {
        self.shard
    }

    /// The flat buffer's length: ranks × shard length.
    pub fn flat_len(&self) -> i64 {
        self.shard * self.world as i64
    }

    /// Where parameter `i` starts in the flat buffer.
    pub fn offset(&self, i: usize) -> i64 {
        self.offsets[i]
    }

    /// How many ranks.
    pub fn world(&self) -> usize {
        self.world
    }

    /// The parts of parameters in rank `rank`'s shard, in flat order (none past the last rank).
    pub fn pieces(&self, rank: usize) -> Vec<Piece> {
        let (lo, hi) = (self.shard * rank as i64, self.shard * (rank as i64 + 1));
        let mut out = Vec::new();
        for (param, (&at, &n)) in self.offsets.iter().zip(&self.numels).enumerate() {
            let (start, end) = (at.max(lo), (at + n).min(hi));
            if start < end {
                out.push(Piece { param, start: start - at, len: end - start, shard_offset: start - lo });
            }
        }
        out
    }

    /// The split of the flat buffer into the parameters and the gaps around them: (length,
    /// parameter or `None` for a gap), in flat order, empty parts left out.
    fn segments(&self) -> Vec<(i64, Option<usize>)> {
        let mut out = Vec::new();
        let mut end = 0;
        for (i, (&at, &n)) in self.offsets.iter().zip(&self.numels).enumerate() {
            if at > end {
                out.push((at - end, None));
            }
            if n > 0 {
                out.push((n, Some(i)));
            }
            end = at + n;
        }
        if self.flat_len() > end {
            out.push((self.flat_len() - end, None));
        }
        out
    }
}

/// AdamW (or Adam) with ZeRO-1's sharded state ([module docs](self)): [`Optimizer::step`]
/// averages the gradients across the group's ranks and updates every parameter, each rank
/// holding and updating the moments of its shard only. It replaces [`Adam`] together with the
/// gradient all-reduce ([`super::GradAllReduce`]): backward, then `step`.
///
/// Float32 parameters on the group's device, every one with a gradient at each step. Not for a
/// [`crate::amp::GradScaler`] step nor [`Optimizer::step_clipped`] ([`Error::Unsupported`]).
/// Its state ([`Optimizer::state`]) is the rank's shard's, keyed by piece
/// (`"{name}[{start}..{end}].exp_avg"`, ...): it loads into the same plan on the same number of
/// ranks.
///
/// ```no_run
/// # fn main() -> tch_cuda_graphs::Result<()> {
/// # use std::time::Duration;
/// use tch::nn::{self, Module};
/// use tch_cuda_graphs::dist::{broadcast_parameters, ProcessGroup, ShardedAdam};
/// use tch_cuda_graphs::optim::{decay_groups, AdamConfig, Optimizer};
/// let pg = ProcessGroup::from_env(Duration::from_secs(60))?;
/// let vs = nn::VarStore::new(pg.device());
/// let model = nn::linear(vs.root(), 64, 8, Default::default());
/// broadcast_parameters(&pg, &vs)?;
/// let adamw = AdamConfig::adamw().lr(3e-4);
/// let mut opt = ShardedAdam::new(&pg, decay_groups(&vs, adamw.weight_decay(0.1), adamw.weight_decay(0.0)))?;
/// let x = tch::Tensor::randn([32, 64], (tch::Kind::Float, pg.device()));
/// opt.zero_grad()?;
/// model.forward(&x).square().mean(None).backward();
/// opt.step()?; // reduce-scatter, this rank's shard updated, all-gather
/// # Ok(()) }
/// ```
pub struct ShardedAdam {
    pg: ProcessGroup,
    plan: ShardPlan,
    /// Every parameter, in the plan's order.
    params: Vec<Tensor>,
    /// The flat gradients and parameters (`[flat_len]`), this rank's slice of the latter, and
    /// the reduced gradients of this rank's shard.
    flat_grads: Tensor,
    flat_params: Tensor,
    own_params: Tensor,
    shard_grads: Tensor,
    /// The flat buffer as parameters and gaps, and the unpack's sinks for its gaps.
    flat: Layout,
    gap_sinks: Vec<Tensor>,
    /// Views of the parameters' pieces in this rank's shard (what `inner` updates), and views of
    /// `shard_grads` at the same places.
    pieces: Vec<Tensor>,
    piece_grads: Vec<Tensor>,
    /// This rank's shard as pieces (indices into `pieces`) and gaps.
    own: Layout,
    inner: Adam,
}

impl std::fmt::Debug for ShardedAdam {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardedAdam")
            .field("rank", &self.pg.rank())
            .field("world", &self.plan.world())
            .field("shard_len", &self.plan.shard_len())
            .finish()
    }
}

/// The values of parameter pieces and of gradients are laid out on 16-value (64-byte) offsets.
const ALIGN: i64 = 16;

/// A buffer's parts in order: tensors (an index into the caller's list) and gaps (zeros).
struct Layout {
    parts: Vec<Part>,
    /// Each part's length, in order (the unpack's split sizes).
    sizes: Vec<i64>,
    /// A zeros tensor per gap, in order.
    gaps: Vec<Tensor>,
}

#[derive(Clone, Copy)]
enum Part {
    Tensor(usize),
    Gap(usize),
}

impl Layout {
    /// From `(length, tensor or gap)` segments; gap zeros made on `device`.
    fn new(segments: &[(i64, Option<usize>)], device: Device) -> Result<Self> {
        let (mut parts, mut gaps) = (Vec::new(), Vec::new());
        for &(len, who) in segments {
            parts.push(match who {
                Some(i) => Part::Tensor(i),
                None => {
                    gaps.push(Tensor::f_zeros([len], (Kind::Float, device))?);
                    Part::Gap(gaps.len() - 1)
                }
            });
        }
        Ok(Layout { parts, sizes: segments.iter().map(|(len, _)| *len).collect(), gaps })
    }

    /// The parts' tensors in order, each tensor part from `of(i)`, each gap from `gaps`.
    fn assemble(&self, gaps: &[Tensor], of: impl Fn(usize) -> Result<Tensor>) -> Result<Vec<Tensor>> {
        self.parts
            .iter()
            .map(|part| match *part {
                Part::Tensor(i) => of(i),
                Part::Gap(g) => Ok(gaps[g].shallow_clone()),
            })
            .collect()
    }
}

/// A rank's shard, given its pieces, as `(length, piece or gap)` segments in shard order.
fn shard_segments(mine: &[Piece], shard_len: i64) -> Vec<(i64, Option<usize>)> {
    let mut order: Vec<usize> = (0..mine.len()).collect();
    order.sort_by_key(|&k| mine[k].shard_offset);
    let (mut out, mut end) = (Vec::new(), 0);
    for k in order {
        let p = &mine[k];
        if p.shard_offset > end {
            out.push((p.shard_offset - end, None));
        }
        out.push((p.len, Some(k)));
        end = p.shard_offset + p.len;
    }
    if shard_len > end {
        out.push((shard_len - end, None));
    }
    out
}

/// The float32 parameters of `groups` on `device`, named, in order; [`Error::Misuse`] for none
/// or any other.
fn checked_params(groups: &[ParamGroup<AdamConfig>], device: Device) -> Result<Vec<(String, Tensor)>> {
    let params: Vec<(String, Tensor)> =
        groups.iter().flat_map(|g| g.params.iter().map(|(n, t)| (n.clone(), t.shallow_clone()))).collect();
    if params.is_empty() {
        return Err(Error::Misuse("ShardedAdam: no parameters".into()));
    }
    for (name, t) in &params {
        if t.kind() != Kind::Float || t.device() != device {
            return Err(Error::Misuse(format!(
                "ShardedAdam: `{name}` is {:?} on {:?}; it takes float32 parameters on the group's device ({device:?})",
                t.kind(),
                t.device(),
            )));
        }
    }
    Ok(params)
}

impl ShardedAdam {
    /// The sharded optimizer over `groups` (each with its own hyper-parameters, as
    /// [`Adam::with_groups`]) on the ranks of `pg`. Every rank must pass the same parameters
    /// in the same order. [`Error::Misuse`] for a parameter that is not float32 on the group's
    /// device, or no parameters.
    pub fn new(pg: &ProcessGroup, groups: Vec<ParamGroup<AdamConfig>>) -> Result<Self> {
        let device = pg.device();
        let params = checked_params(&groups, device)?;
        let numels: Vec<i64> = params.iter().map(|(_, t)| t.numel() as i64).collect();
        let plan = ShardPlan::new(&numels, pg.world_size(), ALIGN)?;
        let flat_params = Tensor::f_zeros([plan.flat_len()], (Kind::Float, device))?;
        let shard_grads = Tensor::f_zeros([plan.shard_len()], (Kind::Float, device))?;
        let mine = plan.pieces(pg.rank());
        if mine.is_empty() {
            return Err(Error::Misuse(format!(
                "ShardedAdam: rank {}'s shard holds no parameter values ({} values on {} ranks)",
                pg.rank(),
                numels.iter().sum::<i64>(),
                pg.world_size()
            )));
        }
        // this rank's pieces, group by group (the plan's order), each a view of its parameter
        let (mut pieces, mut piece_grads, mut inner_groups, mut first) = (Vec::new(), Vec::new(), Vec::new(), 0);
        for g in groups {
            let count = g.params.len();
            let mut named = Vec::new();
            for p in mine.iter().filter(|p| p.param >= first && p.param < first + count) {
                let (name, t) = &params[p.param];
                let view = t.f_detach()?.f_view([-1])?.f_narrow(0, p.start, p.len)?;
                named.push((format!("{name}[{}..{}]", p.start, p.start + p.len), view.shallow_clone()));
                pieces.push(view);
                piece_grads.push(shard_grads.f_narrow(0, p.shard_offset, p.len)?);
            }
            inner_groups.push(ParamGroup::new(named, g.config));
            first += count;
        }
        let flat = Layout::new(&plan.segments(), device)?;
        let gap_sinks = flat.gaps.iter().map(Tensor::f_zeros_like).collect::<std::result::Result<_, _>>()?;
        Ok(ShardedAdam {
            pg: pg.clone(),
            flat_grads: Tensor::f_zeros([plan.flat_len()], (Kind::Float, device))?,
            own_params: flat_params.f_narrow(0, plan.shard_len() * pg.rank() as i64, plan.shard_len())?,
            flat_params,
            shard_grads,
            own: Layout::new(&shard_segments(&mine, plan.shard_len()), device)?,
            flat,
            gap_sinks,
            pieces,
            piece_grads,
            inner: Adam::with_groups(inner_groups)?,
            params: params.into_iter().map(|(_, t)| t).collect(),
            plan,
        })
    }

    /// The layout of the parameters across ranks.
    pub fn plan(&self) -> &ShardPlan {
        &self.plan
    }

    /// How many Adam state values this rank holds per moment (its pieces' values).
    pub fn state_len(&self) -> i64 {
        self.pieces.iter().map(|p| p.numel() as i64).sum()
    }

    fn sharded_step(&mut self) -> Result<()> {
        let _no_grad = tch::no_grad_guard();
        // the gradients, end to end (one kernel); every parameter must have one
        let grads = self.flat.assemble(&self.flat.gaps, |i| {
            let g = self.params[i].f_grad()?;
            if !g.defined() {
                return Err(Error::Misuse(format!("ShardedAdam: parameter #{i} has no gradient")));
            }
            Ok(g.f_reshape([-1])?)
        })?;
        let _ = Tensor::f_cat_out(&self.flat_grads, &grads, 0)?;
        self.pg.reduce_scatter(&self.shard_grads, &self.flat_grads, ReduceOp::Avg)?;
        // this rank's pieces, in place; then its shard to every rank and back into the parameters
        self.inner.step_with_grads(&self.piece_grads)?;
        let own = self.own.assemble(&self.own.gaps, |k| Ok(self.pieces[k].shallow_clone()))?;
        let _ = Tensor::f_cat_out(&self.own_params, &own, 0)?;
        self.pg.all_gather(&self.flat_params, &self.own_params)?;
        let outs = self.flat.assemble(&self.gap_sinks, |i| Ok(self.params[i].f_detach()?.f_view([-1])?))?;
        self.flat_params.f_split_with_sizes_copy_out(&outs, self.flat.sizes.as_slice(), 0)?;
        Ok(())
    }
}

impl Optimizer for ShardedAdam {
    fn step_scaled(&mut self, grad_scale: Option<&Tensor>, found_inf: Option<&Tensor>) -> Result<()> {
        if grad_scale.is_some() || found_inf.is_some() {
            return Err(Error::Unsupported("ShardedAdam: a GradScaler's step".into()));
        }
        self.sharded_step()
    }

    fn step_clipped(&mut self, _max_norm: f64) -> Result<Tensor> {
        Err(Error::Unsupported("ShardedAdam: clipping by the global norm".into()))
    }

    fn params(&self) -> &[Tensor] {
        &self.params
    }

    fn lr_handles(&self) -> Vec<LrHandle> {
        self.inner.lr_handles()
    }

    fn kernels(&self) -> Kernels {
        self.inner.kernels()
    }

    fn set_kernels(&mut self, kernels: Kernels) -> Result<()> {
        self.inner.set_kernels(kernels)
    }

    fn last_path(&self) -> Option<KernelPath> {
        self.inner.last_path()
    }

    fn state(&self) -> Result<Vec<(String, Tensor)>> {
        self.inner.state()
    }

    fn load_state(&mut self, state: &HashMap<String, Tensor>) -> Result<()> {
        self.inner.load_state(state)
    }
}
