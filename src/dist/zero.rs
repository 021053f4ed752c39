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
use tch::{Kind, Tensor};

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
    /// The gaps' zeros (packed with the gradients) and sinks (the unpack's), in flat order.
    gaps: Vec<Tensor>,
    gap_sinks: Vec<Tensor>,
    /// The flat buffer's segments: (length, parameter or gap).
    segments: Vec<(i64, Option<usize>)>,
    /// Views of the parameters' pieces in this rank's shard (what `inner` updates), and views of
    /// `shard_grads` at the same places.
    pieces: Vec<Tensor>,
    piece_grads: Vec<Tensor>,
    /// This rank's shard in order: a piece (index into `pieces`) or a gap (the next of
    /// `own_gaps`, zeros).
    own_layout: Vec<Option<usize>>,
    own_gaps: Vec<Tensor>,
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

impl ShardedAdam {
    /// The sharded optimizer over `groups` (each with its own hyper-parameters, as
    /// [`Adam::with_groups`]) on the ranks of `pg`. Every rank must pass the same parameters
    /// in the same order. [`Error::Misuse`] for a parameter that is not float32 on the group's
    /// device, or no parameters.
    pub fn new(pg: &ProcessGroup, groups: Vec<ParamGroup<AdamConfig>>) -> Result<Self> {
        let params: Vec<(String, Tensor)> =
            groups.iter().flat_map(|g| g.params.iter().map(|(n, t)| (n.clone(), t.shallow_clone()))).collect();
        if params.is_empty() {
            return Err(Error::Misuse("ShardedAdam: no parameters".into()));
        }
        for (name, t) in &params {
            if t.kind() != Kind::Float || t.device() != pg.device() {
                return Err(Error::Misuse(format!(
                    "ShardedAdam: `{name}` is {:?} on {:?}; it takes float32 parameters on the group's device ({:?})",
                    t.kind(),
                    t.device(),
                    pg.device()
                )));
            }
        }
        let numels: Vec<i64> = params.iter().map(|(_, t)| t.numel() as i64).collect();
        let plan = ShardPlan::new(&numels, pg.world_size(), ALIGN)?;
        let opts = (Kind::Float, pg.device());
        let flat_grads = Tensor::f_zeros([plan.flat_len()], opts)?;
        let flat_params = Tensor::f_zeros([plan.flat_len()], opts)?;
        let own_params = flat_params.f_narrow(0, plan.shard_len() * pg.rank() as i64, plan.shard_len())?;
        let shard_grads = Tensor::f_zeros([plan.shard_len()], opts)?;
        let segments = plan.segments();
        let mut gaps = Vec::new();
        let mut gap_sinks = Vec::new();
        for (len, who) in &segments {
            if who.is_none() {
                gaps.push(Tensor::f_zeros([*len], opts)?);
                gap_sinks.push(Tensor::f_zeros([*len], opts)?);
            }
        }
        // this rank's pieces, group by group, each a view of its parameter (updated in place)
        let mine = plan.pieces(pg.rank());
        let mut pieces = Vec::new();
        let mut piece_grads = Vec::new();
        let mut inner_groups = Vec::new();
        let mut first = 0;
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
        if pieces.is_empty() {
            return Err(Error::Misuse(format!(
                "ShardedAdam: rank {}'s shard holds no parameter values ({} values on {} ranks)",
                pg.rank(),
                numels.iter().sum::<i64>(),
                pg.world_size()
            )));
        }
        let inner = Adam::with_groups(inner_groups)?;
        // this rank's shard: its pieces (in flat order, which is the pieces' order) and the gaps
        let mut order: Vec<usize> = (0..mine.len()).collect();
        order.sort_by_key(|&k| mine[k].shard_offset);
        let (mut own_layout, mut own_gaps, mut end) = (Vec::new(), Vec::new(), 0);
        for k in order {
            let p = &mine[k];
            if p.shard_offset > end {
                own_layout.push(None);
                own_gaps.push(Tensor::f_zeros([p.shard_offset - end], opts)?);
            }
            own_layout.push(Some(k));
            end = p.shard_offset + p.len;
        }
        if plan.shard_len() > end {
            own_layout.push(None);
            own_gaps.push(Tensor::f_zeros([plan.shard_len() - end], opts)?);
        }
        let params = params.into_iter().map(|(_, t)| t).collect();
        Ok(ShardedAdam {
            pg: pg.clone(),
            plan,
            params,
            flat_grads,
            flat_params,
            own_params,
            shard_grads,
            gaps,
            gap_sinks,
            segments,
            pieces,
            piece_grads,
            own_layout,
            own_gaps,
            inner,
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

    /// The flat buffer's parts in order, each parameter's from `of(i)`, each gap from `gaps`.
    fn flat_parts(&self, gaps: &[Tensor], of: impl Fn(usize) -> Result<Tensor>) -> Result<Vec<Tensor>> {
        let mut gaps = gaps.iter();
        self.segments
            .iter()
            .map(|(_, who)| match who {
                Some(i) => of(*i),
                None => gaps
                    .next()
                    .map(Tensor::shallow_clone)
                    .ok_or_else(|| Error::Libtorch("shard plan: a gap missing".into())),
            })
            .collect()
    }

    fn sharded_step(&mut self) -> Result<()> {
        let _no_grad = tch::no_grad_guard();
        // the gradients, end to end (one kernel); every parameter must have one
        let grads = self.flat_parts(&self.gaps, |i| {
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
        let mut gaps = self.own_gaps.iter();
        let own = self
            .own_layout
            .iter()
            .map(|at| match at {
                Some(k) => Ok(self.pieces[*k].shallow_clone()),
                None => {
                    gaps.next().map(Tensor::shallow_clone).ok_or_else(|| Error::Libtorch("shard: a gap missing".into()))
                }
            })
            .collect::<Result<Vec<_>>>()?;
        let _ = Tensor::f_cat_out(&self.own_params, &own, 0)?;
        self.pg.all_gather(&self.flat_params, &self.own_params)?;
        let outs = self.flat_parts(&self.gap_sinks, |i| Ok(self.params[i].f_detach()?.f_view([-1])?))?;
        let sizes: Vec<i64> = self.segments.iter().map(|(len, _)| *len).collect();
        self.flat_params.f_split_with_sizes_copy_out(&outs, sizes.as_slice(), 0)?;
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
