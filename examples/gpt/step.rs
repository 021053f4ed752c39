//! The GPT's training and evaluation steps, as a user of the crate writes them: one `TrainStep`
//! capturing the whole step (K micro-batches of forward and backward under bf16 autocast,
//! gradient clipping on the device, the warmup + cosine learning rate computed on the device,
//! fused AdamW with weight-decay and no-decay groups on the crate's own kernels; optionally the
//! weights' bf16 shadows), and an evaluation step sharing its pool and weights. Both borrow the
//! model; the optimizer is the training step's state. Shared by `examples/gpt/main.rs` and
//! `benches/gpt.rs`.
#![allow(dead_code)]

use crate::lm::LanguageModel;
use tch::{nn, Kind, Tensor};
use tch_cuda_graphs::dist::{GradAllReduce, ProcessGroup, ReduceOp, ShardedAdam};
use tch_cuda_graphs::optim::{decay_groups, Adam, AdamConfig, Optimizer};
use tch_cuda_graphs::schedule::{DeviceLrScheduler, WarmupCosine};
use tch_cuda_graphs::{amp, Result, StepOptions, TrainStep};

/// AdamW's betas and epsilon (nanoGPT's `shakespeare_char`; epsilon PyTorch's default).
pub const BETA1: f64 = 0.9;
pub const BETA2: f64 = 0.99;
pub const EPS: f64 = 1e-8;

/// How the model is trained (nanoGPT's `shakespeare_char` settings by default).
#[derive(Clone, Copy, Debug)]
pub struct Hyper {
    /// Sequences per micro-batch.
    pub batch: i64,
    /// Micro-batches per optimizer step (gradient accumulation inside the captured step).
    pub accum: i64,
    /// Peak learning rate.
    pub lr: f64,
    /// Final learning rate.
    pub min_lr: f64,
    /// Warmup iterations.
    pub warmup: u64,
    /// Iterations of the cosine decay (the run's length).
    pub iters: u64,
    /// AdamW's weight decay on matrices (none on biases, norms and... nothing else).
    pub weight_decay: f64,
    /// Gradient clipping (global L2 norm).
    pub clip: f64,
    /// None: fp32; Some(BFloat16): bf16 autocast.
    pub autocast: Option<Kind>,
    /// Run the steps eagerly (no graph).
    pub eager: bool,
    /// Weight shadows: each weight cast to the autocast dtype once per step, not at each use.
    pub shadows: bool,
    /// Data-parallel only: ZeRO-1 (`ShardedAdam`: each rank holds and steps its shard of AdamW's
    /// state) instead of the gradients' all-reduce and a whole AdamW on every rank.
    pub zero: bool,
}

impl Default for Hyper {
    fn default() -> Self {
        Hyper {
            batch: 64,
            accum: 1,
            lr: 1e-3,
            min_lr: 1e-4,
            warmup: 100,
            iters: 5000,
            weight_decay: 0.1,
            clip: 1.0,
            autocast: Some(Kind::BFloat16),
            eager: false,
            shadows: false,
            zero: false,
        }
    }
}

/// The steps and what the loop around them needs. The steps borrow the model: it stays usable
/// (evaluation, sampling) through plain references; the optimizer is the training step's state
/// (`steps.train.state()` between runs, for checkpoints).
pub struct Steps<'a> {
    /// Inputs `[accum, batch, block]` twice (tokens, targets); outputs: the mean loss and the
    /// gradients' norm before clipping (0-d each).
    pub train: TrainStep<'a, Box<dyn Optimizer>>,
    /// Inputs `[batch, block]` twice; output: the loss, dropout off.
    pub eval: TrainStep<'a>,
    /// The device step counter of the learning-rate schedule (for checkpoints).
    pub schedule_step: Tensor,
    /// How many parameters the training step shadows (0 without shadows).
    pub shadowed: usize,
}

/// Builds both steps for `model`, whose variables are in `vs`, on `vs`'s device.
pub fn build<'a>(vs: &nn::VarStore, model: &'a dyn LanguageModel, h: Hyper) -> Result<Steps<'a>> {
    build_on(vs, model, h, None)
}

/// [`build`], data-parallel over `pg`: the gradients of the last micro-batch's backward are
/// all-reduced (averaged) in buckets while backward runs (the earlier micro-batches only
/// accumulate, as DDP's `no_sync`), inside the captured step; the loss is averaged too. With
/// `h.zero`, ZeRO-1 instead: the accumulated gradients are reduce-scattered by the optimizer's
/// step, each rank steps its shard, and the parameters are all-gathered.
pub fn build_ddp<'a>(
    vs: &nn::VarStore,
    model: &'a dyn LanguageModel,
    h: Hyper,
    pg: &ProcessGroup,
) -> Result<Steps<'a>> {
    build_on(vs, model, h, Some(pg))
}

fn build_on<'a>(
    vs: &nn::VarStore,
    model: &'a dyn LanguageModel,
    h: Hyper,
    pg: Option<&ProcessGroup>,
) -> Result<Steps<'a>> {
    let dev = vs.device();
    let block = model.block();
    let (opt, mut reduce) = optimizer(vs, &h, pg)?;
    let schedule = WarmupCosine { warmup: h.warmup, total: h.iters, min_factor: h.min_lr / h.lr };
    let mut sched = DeviceLrScheduler::new(schedule, opt.lr_handles())?;
    let schedule_step = sched.step_tensor().shallow_clone();
    let pg = pg.cloned();
    let mut options = StepOptions::default().eager(h.eager);
    if let Some(dtype) = h.autocast {
        options = options.autocast(dtype).weight_shadows(h.shadows);
    }
    let tokens = Tensor::zeros([h.accum, h.batch, block], (Kind::Int64, dev));
    let inv_accum = Tensor::from(1.0 / h.accum as f32);
    let train = TrainStep::with_optimizer(opt, &[("x", &tokens), ("y", &tokens)], options, move |opt, inp| {
        model.set_train(true);
        opt.zero_grad()?;
        let mut total: Option<Tensor> = None;
        for k in 0..h.accum {
            let loss = model.loss(&inp[0].f_get(k)?, &inp[1].f_get(k)?)?.f_mul(&inv_accum)?;
            if let (Some(reduce), true) = (reduce.as_mut(), k == h.accum - 1) {
                reduce.arm()?; // the last micro-batch: each bucket is reduced once it is ready
            }
            amp::backward(&loss)?; // backward outside autocast, as PyTorch runs it
            let loss = loss.detach();
            total = Some(match total {
                Some(t) => t.f_add(&loss)?,
                None => loss,
            });
        }
        let total = total.expect("accum ≥ 1");
        if let Some(reduce) = reduce.as_mut() {
            reduce.all_reduce()?; // what is left, then the step waits for every bucket
        }
        if let Some(pg) = &pg {
            pg.all_reduce(&total, ReduceOp::Avg)?;
        }
        sched.step()?; // this step's learning rate, computed on the device
                       // clip_grad_norm_ then step, in one pass over the grads (ZeRO: reduce-scatter, the norm
                       // across ranks, this rank's shard stepped, all-gather)
        let norm = opt.step_clipped(h.clip)?;
        Ok(vec![total, norm])
    })?;
    // with `shadows` (under autocast) the step shadows its optimizer's parameters itself
    let shadowed = train.weight_shadows().map_or(0, |s| s.len());
    let eval = eval_step(model, &train, options, h.batch, dev)?;
    Ok(Steps { train, eval, schedule_step, shadowed })
}

/// Fused AdamW with decay on matrices (ZeRO-1's `ShardedAdam` with `h.zero` over `pg`) and,
/// data-parallel without ZeRO, the gradients' buckets.
fn optimizer(
    vs: &nn::VarStore,
    h: &Hyper,
    pg: Option<&ProcessGroup>,
) -> Result<(Box<dyn Optimizer>, Option<GradAllReduce>)> {
    let cfg = AdamConfig::adamw().lr(h.lr).betas(BETA1, BETA2).eps(EPS).weight_decay(h.weight_decay);
    let groups = decay_groups(vs, cfg, cfg.weight_decay(0.0));
    let opt: Box<dyn Optimizer> = match pg {
        Some(pg) if h.zero => Box::new(ShardedAdam::new(pg, groups)?),
        _ => Box::new(Adam::with_groups(groups)?),
    };
    let reduce = match pg {
        Some(pg) if !h.zero => Some(GradAllReduce::new(pg, opt.params(), 25 << 20)?),
        _ => None,
    };
    Ok((opt, reduce))
}

/// The evaluation step: the loss on `[batch, block]` inputs, dropout off, in `train`'s pool. The
/// shadows are the training step's: evaluation casts each weight where it reads it.
fn eval_step<'a>(
    model: &'a dyn LanguageModel,
    train: &TrainStep<'a, Box<dyn Optimizer>>,
    options: StepOptions,
    batch: i64,
    dev: tch::Device,
) -> Result<TrainStep<'a>> {
    let options = options.weight_shadows(false);
    let options = match train.pool() {
        Some(pool) => options.pool(pool).warmup(1),
        None => options,
    };
    let x = Tensor::zeros([batch, model.block()], (Kind::Int64, dev));
    TrainStep::new(&[("x", &x), ("y", &x)], options, move |inp| {
        let _no_grad = tch::no_grad_guard();
        model.set_train(false); // captured without dropout
        let loss = model.loss(&inp[0], &inp[1]);
        model.set_train(true);
        Ok(vec![loss?])
    })
}
