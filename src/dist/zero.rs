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
/// Float32 parameters on the group's device, every one with a gradient at each step.
/// [`Optimizer::step_clipped`] clips by the global norm of the averaged gradients, folded into the
/// update as [`Adam`]'s. Not for a [`crate::amp::GradScaler`] step ([`Error::Unsupported`]).
/// Its state ([`Optimizer::state`], a collective) is [`Adam`]'s, whole: a checkpoint of it loads
/// into a `ShardedAdam` on any number of ranks, or into an [`Adam`], and an [`Adam`]'s into it.
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
    /// The flat buffer as parameters and gaps, and what its unpack writes into, made once: each
    /// parameter's flat view, a sink for each gap.
    flat: Layout,
    unpack_into: Vec<Tensor>,
    /// Views of `shard_grads` at this rank's pieces of the parameters (what `inner`, which updates
    /// views of those pieces, reads as their gradients).
    piece_grads: Vec<Tensor>,
    /// This rank's shard as pieces (indices into `piece_at`) and gaps, and those tensors in order
    /// (what its pack reads, made once).
    own: Layout,
    own_parts: Vec<Tensor>,
    /// The parameters' names and groups, AMSGrad per group, and each piece's place (its name in
    /// `inner`: [`piece_name`](Self::piece_name)): what the state translates between.
    names: Vec<String>,
    param_group: Vec<usize>,
    amsgrad: Vec<bool>,
    piece_at: Vec<Piece>,
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

/// Adam's moments, by their state names (the third only with AMSGrad).
const MOMENTS: [&str; 3] = ["exp_avg", "exp_avg_sq", MAX_EXP_AVG_SQ];
const MAX_EXP_AVG_SQ: &str = "max_exp_avg_sq";

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

/// A piece's name among the inner optimizer's parameters: `"{name}[{start}..{end}]"`.
fn piece_name(param: &str, p: &Piece) -> String {
    format!("{param}[{}..{}]", p.start, p.start + p.len)
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
        let (mut piece_at, mut param_group, mut amsgrad) = (Vec::new(), Vec::new(), Vec::new());
        for (gi, g) in groups.into_iter().enumerate() {
            let count = g.params.len();
            param_group.extend(std::iter::repeat(gi).take(count));
            amsgrad.push(g.config.uses_amsgrad());
            let mut named = Vec::new();
            for p in mine.iter().filter(|p| p.param >= first && p.param < first + count) {
                let (name, t) = &params[p.param];
                let view = t.f_detach()?.f_view([-1])?.f_narrow(0, p.start, p.len)?;
                named.push((piece_name(name, p), view.shallow_clone()));
                pieces.push(view);
                piece_grads.push(shard_grads.f_narrow(0, p.shard_offset, p.len)?);
                piece_at.push(*p);
            }
            inner_groups.push(ParamGroup::new(named, g.config));
            first += count;
        }
        let flat = Layout::new(&plan.segments(), device)?;
        let gap_sinks: Vec<Tensor> =
            flat.gaps.iter().map(Tensor::f_zeros_like).collect::<std::result::Result<_, _>>()?;
        let unpack_into = flat.assemble(&gap_sinks, |i| Ok(params[i].1.f_detach()?.f_view([-1])?))?;
        let own = Layout::new(&shard_segments(&mine, plan.shard_len()), device)?;
        let own_parts = own.assemble(&own.gaps, |k| Ok(pieces[k].shallow_clone()))?;
        Ok(ShardedAdam {
            pg: pg.clone(),
            flat_grads: Tensor::f_zeros([plan.flat_len()], (Kind::Float, device))?,
            own_params: flat_params.f_narrow(0, plan.shard_len() * pg.rank() as i64, plan.shard_len())?,
            flat_params,
            shard_grads,
            own,
            own_parts,
            flat,
            unpack_into,
            piece_grads,
            inner: Adam::with_groups(inner_groups)?,
            names: params.iter().map(|(n, _)| n.clone()).collect(),
            param_group,
            amsgrad,
            piece_at,
            params: params.into_iter().map(|(_, t)| t).collect(),
            plan,
        })
    }

    /// Piece `k`'s name in `inner` (its state's keys).
    fn piece_name(&self, k: usize) -> String {
        let p = &self.piece_at[k];
        piece_name(&self.names[p.param], p)
    }

    /// The layout of the parameters across ranks.
    pub fn plan(&self) -> &ShardPlan {
        &self.plan
    }

    /// How many Adam state values this rank holds per moment (its pieces' values).
    pub fn state_len(&self) -> i64 {
        self.piece_at.iter().map(|p| p.len).sum()
    }

    /// Packs the gradients (one kernel; every parameter must have one) and reduce-scatters them:
    /// this rank's shard of their average in `shard_grads`.
    fn reduce(&mut self) -> Result<()> {
        let _no_grad = tch::no_grad_guard();
        let grads = self.flat.assemble(&self.flat.gaps, |i| {
            let g = self.params[i].f_grad()?;
            if !g.defined() {
                return Err(Error::Misuse(format!("ShardedAdam: parameter #{i} has no gradient")));
            }
            Ok(g.f_reshape([-1])?)
        })?;
        let _ = Tensor::f_cat_out(&self.flat_grads, &grads, 0)?;
        self.pg.reduce_scatter(&self.shard_grads, &self.flat_grads, ReduceOp::Avg)
    }

    /// Steps this rank's pieces in place (their gradients times `clip_coef` where given), then
    /// all-gathers the shards and copies them back into every parameter.
    fn update(&mut self, clip_coef: Option<&Tensor>) -> Result<()> {
        let _no_grad = tch::no_grad_guard();
        self.inner.step_with_grads(&self.piece_grads, clip_coef)?;
        let _ = Tensor::f_cat_out(&self.own_params, &self.own_parts, 0)?;
        self.pg.all_gather(&self.flat_params, &self.own_params)?;
        self.flat_params.f_split_with_sizes_copy_out(&self.unpack_into, self.flat.sizes.as_slice(), 0)?;
        Ok(())
    }

    /// The global L2 norm of the averaged gradients and clipping's factor
    /// `min(1, max_norm / (norm + 1e-6))`, both 0-d on the device, from this rank's shard: its
    /// pieces' norms as [`crate::clip_grad_norm`] computes them, and with several ranks the
    /// squares of every rank's summed (one all-reduce of one value).
    fn global_clip_factor(&self, max_norm: f64) -> Result<(Tensor, Tensor)> {
        let _no_grad = tch::no_grad_guard();
        let (local, coef) = crate::clip::clip_factor_of(&self.piece_grads, max_norm, 2.0, self.inner.kernels())?;
        if self.plan.world() == 1 {
            return Ok((local, coef)); // the whole norm already: nothing to add
        }
        let squares = local.f_square()?;
        self.pg.all_reduce(&squares, ReduceOp::Sum)?;
        let norm = squares.f_sqrt()?;
        // PyTorch's clip_grad_norm_: max_norm / (norm + 1e-6), clamped at 1 (NaN kept)
        let coef = norm.f_add_scalar(1e-6)?.f_reciprocal()?.f_mul_scalar(max_norm)?.f_clamp_max(1.0)?;
        Ok((norm, coef))
    }

    /// One moment of every parameter, whole, in the parameters' order and shapes: this rank's
    /// pieces of it (`inner`'s state; zeros for a piece without it) packed into a shard, the
    /// shards all-gathered.
    fn gather_moment(&self, inner: &HashMap<String, Tensor>, field: &str) -> Result<Vec<Tensor>> {
        let device = self.pg.device();
        let parts =
            self.own.assemble(&self.own.gaps, |k| match inner.get(&format!("{}.{field}", self.piece_name(k))) {
                Some(t) => Ok(t.f_reshape([-1])?),
                None => Ok(Tensor::f_zeros([self.piece_at[k].len], (Kind::Float, device))?),
            })?;
        let shard = Tensor::f_cat(&parts, 0)?;
        let flat = Tensor::f_empty([self.plan.flat_len()], (Kind::Float, device))?;
        self.pg.all_gather(&flat, &shard)?;
        let mut out: Vec<Tensor> = self
            .params
            .iter()
            .map(|p| Tensor::f_zeros(p.size(), (Kind::Float, device)))
            .collect::<std::result::Result<_, _>>()?;
        let mut at = 0;
        for (part, &len) in self.flat.parts.iter().zip(&self.flat.sizes) {
            if let Part::Tensor(i) = *part {
                out[i] = flat.f_narrow(0, at, len)?.f_view(self.params[i].size().as_slice())?;
            }
            at += len;
        }
        Ok(out)
    }
}

impl Optimizer for ShardedAdam {
    fn step_scaled(&mut self, grad_scale: Option<&Tensor>, found_inf: Option<&Tensor>) -> Result<()> {
        if grad_scale.is_some() || found_inf.is_some() {
            return Err(Error::Unsupported("ShardedAdam: a GradScaler's step".into()));
        }
        self.reduce()?;
        self.update(None)
    }

    /// Clipping by the global norm of the averaged gradients, folded into the update as
    /// [`Adam`]'s: each rank's pieces' norms, summed across ranks as squares (one all-reduce of
    /// one value), give the factor that the Adam kernel applies as it reads each gradient. On
    /// one rank the norm and the update are [`Adam::step_clipped`]'s bit for bit; on several, the
    /// norm is the same sum in another order. The gradients in memory are left as backward
    /// wrote them.
    fn step_clipped(&mut self, max_norm: f64) -> Result<Tensor> {
        crate::clip::check_norm_args(max_norm, 2.0)?; // before any collective
        self.reduce()?;
        let (norm, coef) = self.global_clip_factor(max_norm)?;
        self.update(Some(&coef))?;
        Ok(norm)
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

    /// [`Adam`]'s state for the same parameters and groups, whole (every rank's moments
    /// all-gathered): the same names, shapes and values, so it loads into an [`Adam`], or into a
    /// `ShardedAdam` on any number of ranks. A collective: every rank calls it, in the same
    /// order as its other collectives.
    fn state(&self) -> Result<Vec<(String, Tensor)>> {
        let _no_grad = tch::no_grad_guard();
        let inner: HashMap<String, Tensor> = self.inner.state()?.into_iter().collect();
        let mut out: Vec<(String, Tensor)> = inner
            .iter()
            .filter(|(k, _)| k.starts_with("group."))
            .map(|(k, t)| (k.clone(), t.shallow_clone()))
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        // every piece is stepped at every step: one step count
        let step = inner.get(&format!("{}.step", self.piece_name(0)));
        for (i, name) in self.names.iter().enumerate() {
            out.push((format!("{name}.group"), crate::scalar::cpu_i64(self.param_group[i] as i64)?));
            if let Some(s) = step {
                out.push((format!("{name}.step"), s.copy()));
            }
        }
        for field in MOMENTS {
            if field == MAX_EXP_AVG_SQ && !self.amsgrad.iter().any(|&a| a) {
                continue;
            }
            for (i, t) in self.gather_moment(&inner, field)?.into_iter().enumerate() {
                if field != MAX_EXP_AVG_SQ || self.amsgrad[self.param_group[i]] {
                    out.push((format!("{}.{field}", self.names[i]), t));
                }
            }
        }
        Ok(out)
    }

    /// Loads [`Adam`]'s state for these parameters and groups (what [`state`](Self::state)
    /// gives, on any number of ranks, or an [`Adam`]'s): this rank takes its pieces of every
    /// moment. Everything is checked first (names, shapes, dtypes, groups): on error nothing
    /// changed. Not a collective.
    fn load_state(&mut self, state: &HashMap<String, Tensor>) -> Result<()> {
        let fields = ["group", "step", MOMENTS[0], MOMENTS[1], MOMENTS[2]];
        let known: std::collections::HashSet<String> =
            self.names.iter().flat_map(|n| fields.iter().map(move |f| format!("{n}.{f}"))).collect();
        if let Some(k) = state.keys().find(|k| !k.starts_with("group.") && !known.contains(*k)) {
            return Err(Error::Checkpoint(format!(
                "optimizer state `{k}` does not belong to this optimizer (another model, or another group layout?)"
            )));
        }
        if let Some(name) = self.names.iter().find(|n| !state.contains_key(&format!("{n}.group"))) {
            return Err(Error::Checkpoint(format!("optimizer state `{name}.group` is missing")));
        }
        let mut mine: HashMap<String, Tensor> = state
            .iter()
            .filter(|(k, _)| k.starts_with("group."))
            .map(|(k, t)| (k.clone(), t.shallow_clone()))
            .collect();
        for (k, piece) in self.piece_at.iter().enumerate() {
            let (name, piece_name) = (&self.names[piece.param], self.piece_name(k));
            for field in fields {
                let Some(t) = state.get(&format!("{name}.{field}")) else { continue };
                let t = if MOMENTS.contains(&field) {
                    let want = self.params[piece.param].size();
                    if t.size() != want {
                        return Err(Error::Checkpoint(format!(
                            "optimizer state `{name}.{field}` is {:?}, expected {want:?}",
                            t.size()
                        )));
                    }
                    t.f_reshape([-1])?.f_narrow(0, piece.start, piece.len)?
                } else {
                    t.shallow_clone()
                };
                mine.insert(format!("{piece_name}.{field}"), t);
            }
        }
        self.inner.load_state(&mine)
    }
}
