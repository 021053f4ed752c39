//! Data parallel training pieces: the same parameters on every rank at start, gradients
//! averaged across ranks in flat buckets inside the (captured) step.

use super::{ProcessGroup, ReduceOp};
use crate::error::{check, Error, Result};
use crate::ffi;
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
    let mismatch = sum.f_ne_tensor(&sig.f_mul_scalar(pg.world_size() as i64)?)?.f_any()?.f_to_kind(Kind::Int64)?;
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

struct Bucket {
    flat: Tensor,
    /// (parameter, offset, numel), in the flat buffer's order
    members: Vec<(Tensor, i64, i64)>,
}

/// Averages gradients across ranks in flat buckets (DDP-style, `bucket_bytes` each): per
/// bucket, the gradients are packed into one flat buffer (one kernel), all-reduced with one
/// NCCL call, and unpacked (one multi-tensor kernel). The buffers are made here, once, so the whole thing can be captured: call
/// [`all_reduce`](Self::all_reduce) in the step closure between backward and the optimizer.
pub struct GradAllReduce {
    pg: ProcessGroup,
    buckets: Vec<Bucket>,
}

impl std::fmt::Debug for GradAllReduce {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GradAllReduce")
            .field("rank", &self.pg.rank())
            .field("buckets", &self.buckets.iter().map(|b| b.members.len()).collect::<Vec<_>>())
            .finish()
    }
}

/// The default bucket size: 25 MiB, as PyTorch's DDP.
pub const DEFAULT_BUCKET_BYTES: usize = 25 << 20;

impl GradAllReduce {
    /// Buckets for `params` (all of one dtype and on the group's device), in reverse order (the
    /// order backward produces gradients), each up to `bucket_bytes`.
    pub fn new(pg: &ProcessGroup, params: &[Tensor], bucket_bytes: usize) -> Result<Self> {
        let first = params.first().ok_or_else(|| Error::Misuse("no parameters to all-reduce".into()))?;
        let kind = first.kind();
        if let Some(p) = params.iter().find(|p| p.kind() != kind || p.device() != pg.device()) {
            return Err(Error::Misuse(format!(
                "gradient buckets need one dtype on {:?}; got {:?} on {:?}",
                pg.device(),
                p.kind(),
                p.device()
            )));
        }
        let elt = kind.elt_size_in_bytes().max(1);
        let mut buckets = Vec::new();
        let mut current: Vec<(Tensor, i64, i64)> = Vec::new();
        let mut size = 0i64;
        for p in params.iter().rev() {
            let n = p.numel() as i64;
            if !current.is_empty() && ((size + n) as usize) * elt > bucket_bytes {
                buckets.push(Self::bucket(std::mem::take(&mut current), size, kind, pg)?);
                size = 0;
            }
            current.push((p.shallow_clone(), size, n));
            size += n;
        }
        if !current.is_empty() {
            buckets.push(Self::bucket(current, size, kind, pg)?);
        }
        Ok(GradAllReduce { pg: pg.clone(), buckets })
    }

    fn bucket(members: Vec<(Tensor, i64, i64)>, size: i64, kind: Kind, pg: &ProcessGroup) -> Result<Bucket> {
        Ok(Bucket { flat: Tensor::f_zeros([size], (kind, pg.device()))?, members })
    }

    /// How many buckets (NCCL calls per step).
    pub fn bucket_count(&self) -> usize {
        self.buckets.len()
    }

    /// Averages every parameter's gradient across ranks, in place (no host sync). Every
    /// parameter must have a gradient.
    pub fn all_reduce(&mut self) -> Result<()> {
        let _no_grad = tch::no_grad_guard();
        for b in &self.buckets {
            let mut grads = Vec::with_capacity(b.members.len());
            for (p, _, _) in &b.members {
                let g = p.f_grad()?;
                if !g.defined() {
                    return Err(Error::Misuse(
                        "GradAllReduce: a parameter has no gradient (run backward first)".into(),
                    ));
                }
                grads.push(g);
            }
            let g = ffi::tensor_ptrs(&grads);
            // SAFETY: `g` and the bucket's flat buffer are live handles for the calls; the flat
            // buffer holds exactly the gradients' elements (made from the same parameters).
            check(unsafe { ffi::tcg_flat_pack(g.as_ptr(), g.len(), ffi::tensor_ptr(&b.flat)) })?;
            self.pg.all_reduce(&b.flat, ReduceOp::Avg)?;
            // SAFETY: as above.
            check(unsafe { ffi::tcg_flat_unpack(ffi::tensor_ptr(&b.flat), g.as_ptr(), g.len()) })?;
        }
        Ok(())
    }
}
