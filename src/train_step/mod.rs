//! [`TrainStep`]: a whole training step (forward, loss, backward, optimizer) captured into CUDA
//! graphs, one per batch shape, all in one memory pool, and replayed per batch through static
//! inputs; fed from the GPU or the CPU; with an eager fallback without a GPU.

mod batch;
mod options;
mod record;
mod shadows;
mod shapes;
mod stale;

pub use options::{StepOptions, DEFAULT_MAX_GRAPHS};

use crate::capture::run_on_capture_stream;
use crate::device::cuda_is_available;
use crate::error::{Error, Result};
use crate::graph::CudaGraph;
use crate::memory::OomWatch;
use crate::optim::Optimizer;
use crate::pool::{MemPool, PoolId};
use crate::shadow::WeightShadows;
use crate::watch::TensorWatch;
use record::{call_step, compact, on_cuda, put_to_work, Installed, StepFn};
use shapes::ShapeEntry;
use tch::{Device, Kind, Tensor};

/// What [`TrainStep::recapture`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Recaptured {
    /// Graphs whose executable was updated in place to the new capture.
    pub updated: usize,
    /// Graphs replaced by the new capture (CUDA refused the update: another topology).
    pub replaced: usize,
}

/// One training step, captured into CUDA graphs (one per batch shape) and replayed per batch.
///
/// Built from example static inputs (names, dtypes, device, and a first shape) and a closure
/// that computes the step from the static inputs and returns its outputs (the loss, metrics).
/// [`run`](Self::run) takes a batch of any shape (same dtypes and ranks), on the step's device
/// or on the CPU:
/// - The first time a shape is seen, it gets static inputs of its own. Its first
///   [`StepOptions::warmup`] batches run eagerly (real steps, on the capture stream); the next
///   batch of that shape captures the graph (recording only) and replays it; later batches
///   replay. So **every batch trains exactly once**, whatever its shape, and a run over mixed
///   shapes equals the same run done eagerly (same kernels, bit for bit).
/// - All graphs of a step share one memory pool: N shapes cost about the memory of the largest,
///   not the sum. Graphs of one pool may reuse each other's temporary memory, so **outputs are
///   valid until the next run of this step** (or of a step sharing its pool): each replay
///   overwrites them in place. Read or accumulate them right away ([`crate::feed::DeviceMeter`]).
/// - At most [`StepOptions::max_graphs`] graphs are kept: capturing one more evicts the least
///   recently used graph (a shape still in its warmup never evicts one). The step holds its pool
///   ([`MemPool`]), so a shape captured after every other graph was evicted still reuses the
///   pool's memory. The evicted graph's executable is kept (one, the last evicted): the next
///   capture updates it in place ([`CudaGraph::update_from`]) instead of instantiating a new
///   one where CUDA allows, which is cheaper ([`updates`](Self::updates) counts them). For
///   sequences, pad to a few [`crate::Buckets`] to keep the number of shapes small.
/// - CPU batches are copied without blocking the host (see [`StepOptions::copy_stream`]); a
///   pinned batch must not be overwritten before the step that used it has run.
///
/// Without a CUDA device (or when the inputs live on the CPU, or with [`StepOptions::eager`])
/// the same code runs the closure eagerly on every call, and [`is_graphed`](Self::is_graphed)
/// says `false`: one program for CPU development and GPU training.
///
/// # Errors
/// An out-of-memory error is [`Error::OutOfMemory`] on every path that runs the closure (eager
/// fallback on a GPU, warmup, capture), told by the caching allocator's OOM counter; match it to
/// shrink the batch and retry. On the CPU it comes back as [`Error::Torch`] (libtorch's CPU
/// allocator counts no OOMs). After a failed capture the shape has no graph; its next batch
/// captures again.
///
/// The step keeps alive what the graphs touch that it owns: the static inputs and outputs, the
/// closure and its state, anything given to [`watch`](Self::watch) or
/// [`watch_vars`](Self::watch_vars), and the pool. The closure may borrow (the model, the
/// VarStore: `TrainStep<'a>` lives no longer than they do), so the same model is evaluated,
/// sampled and checkpointed through plain references between runs. What the closure must
/// mutate, the optimizer above all, is best given to the step as its state
/// ([`with_state`](Self::with_state)): the step lends it to the closure on every call, and to
/// the caller between runs ([`state`](Self::state), [`state_mut`](Self::state_mut)).
///
/// A step is not `Send`: its closure may hold references and `Rc`s. Build it on the thread that
/// runs it.
///
/// # Stale graphs
/// A graph works on the addresses its tensors had at capture. Before every
/// [`run`](Self::run) and [`replay`](Self::replay) the step checks, in one call costing a few
/// nanoseconds per tensor, that the static inputs and every watched tensor still have that
/// storage, dtype and shape; if one was replaced (`VarStore::set_kind`, `set_data`, a resize)
/// it returns [`Error::StaleGraph`] and runs nothing, instead of silently training freed
/// memory. Watch the parameters with [`watch_vars`](Self::watch_vars). The eager fallback
/// checks the same, so a program that works on the CPU works graphed.
///
/// ```no_run
/// # fn main() -> tch_cuda_graphs::Result<()> {
/// use tch::{nn, nn::Module, Device, Kind, Tensor};
/// use tch_cuda_graphs::{optim::{Adam, AdamConfig, Optimizer}, StepOptions, TrainStep};
/// let dev = Device::cuda_if_available();
/// let vs = nn::VarStore::new(dev);
/// let model = nn::linear(vs.root(), 8, 1, Default::default());
/// let opt = Adam::new(&vs, AdamConfig::default())?;
/// let x = Tensor::zeros([32, 8], (Kind::Float, dev));
/// let y = Tensor::zeros([32, 1], (Kind::Float, dev));
/// // the closure borrows the model; the optimizer is the step's state, lent back between runs
/// let mut step = TrainStep::with_state(opt, &[("x", &x), ("y", &y)], StepOptions::default(), |opt, inp| {
///     opt.zero_grad()?;
///     let loss = model.forward(&inp[0]).f_mse_loss(&inp[1], tch::Reduction::Mean)?;
///     loss.f_backward()?;
///     opt.step()?;
///     Ok(vec![loss])
/// })?;
/// step.watch_vars(&vs)?;
/// for n in [32, 32, 32, 32, 32, 17] { // a ragged last batch gets a graph of its own
///     let (bx, by) = (Tensor::randn([n, 8], (Kind::Float, Device::Cpu)), Tensor::randn([n, 1], (Kind::Float, Device::Cpu)));
///     let out = step.run(&[&bx, &by])?;
///     let _loss = &out[0];
/// }
/// # Ok(()) }
/// ```
pub struct TrainStep<'a, S = ()> {
    names: Vec<String>,
    kinds: Vec<Kind>,
    ranks: Vec<usize>,
    device: Device,
    graphed: bool,
    options: StepOptions,
    shapes: Vec<ShapeEntry>,
    /// The entry of the last run (whose outputs are current).
    current: usize,
    step_fn: StepFn<'a, S>,
    /// What the step lends its closure on every call (and its caller between runs).
    state: S,
    /// The shadows the step keeps fresh and reads ([`TrainStep::shadow_parameters`]).
    shadows: Option<WeightShadows>,
    watch: TensorWatch,
    runs: u64,
    captures: u64,
    /// Captures that updated a kept executable in place instead of instantiating a new one.
    updates: u64,
    /// The last evicted graph, kept for its executable: the next capture of a shape updates it
    /// in place ([`CudaGraph::update_from`]) where CUDA allows. It is never replayed as it is
    /// (its outputs are gone). Before `pool`, so it is released first.
    spare: Option<CudaGraph>,
    /// Shapes given to [`declare_shapes`](Self::declare_shapes); an entry made for one of them
    /// is marked `declared`.
    declared: Vec<Vec<Vec<i64>>>,
    /// The step's hold on its pool (graphed steps): the pool stays open for the next capture
    /// even when every graph in it was evicted. Declared last, so it is released after the
    /// graphs and outputs above, and the pool's memory then goes back to CUDA.
    pool: Option<MemPool>,
}

impl<S> std::fmt::Debug for TrainStep<'_, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TrainStep")
            .field("inputs", &self.names)
            .field("device", &self.device)
            .field("graphed", &self.graphed)
            .field("shapes", &self.shapes.iter().map(|e| &e.shape).collect::<Vec<_>>())
            .field("graphs", &self.graph_count())
            .field("runs", &self.runs)
            .finish()
    }
}

impl<'a> TrainStep<'a> {
    /// Declares the static inputs (name, example tensor: dtype, device, first shape) and the
    /// step. Nothing runs yet: the first [`run`](Self::run) of each shape warms up or captures
    /// (see the type's docs). The example tensors are copied into the first shape's static
    /// inputs, so [`replay`](Self::replay) before any run steps on them. The closure may borrow
    /// what outlives the step; for what it must mutate and the caller must reach between runs
    /// (the optimizer), see [`with_state`](Self::with_state).
    pub fn new<F>(inputs: &[(&str, &Tensor)], options: StepOptions, mut step: F) -> Result<Self>
    where
        F: FnMut(&[Tensor]) -> Result<Vec<Tensor>> + 'a,
    {
        TrainStep::with_state((), inputs, options, move |_, inputs| step(inputs))
    }
}

impl<'a, O: Optimizer + 'a> TrainStep<'a, O> {
    /// [`with_state`](TrainStep::with_state) with an optimizer as the state: the closure gets
    /// it on every call, the caller between runs; and with [`StepOptions::weight_shadows`]
    /// under autocast, the step shadows the optimizer's parameters itself
    /// ([`shadow_parameters`](Self::shadow_parameters)), so that option is the one switch.
    ///
    /// ```
    /// # fn main() -> tch_cuda_graphs::Result<()> {
    /// use tch::{nn, Device, Kind, Tensor};
    /// use tch_cuda_graphs::optim::{Adam, AdamConfig, Optimizer};
    /// use tch_cuda_graphs::{StepOptions, TrainStep};
    /// let vs = nn::VarStore::new(Device::Cpu);
    /// let fc = nn::linear(vs.root() / "fc", 4, 1, Default::default());
    /// let (x, y) = (Tensor::randn([8, 4], (Kind::Float, Device::Cpu)), Tensor::randn([8, 1], (Kind::Float, Device::Cpu)));
    /// let opt = Adam::new(&vs, AdamConfig::from(nn::AdamW::default()).lr(1e-3))?;
    /// let mut step = TrainStep::with_optimizer(opt, &[("x", &x), ("y", &y)], StepOptions::default(), |opt, inp| {
    ///     let loss = inp[0].apply(&fc).mse_loss(&inp[1], tch::Reduction::Mean);
    ///     opt.backward_step(&loss)?; // tch's backward_step, capturable
    ///     Ok(vec![loss.detach()])
    /// })?;
    /// let loss = &step.run(&[&x, &y])?[0];
    /// # let _ = loss; Ok(()) }
    /// ```
    pub fn with_optimizer<F>(optimizer: O, inputs: &[(&str, &Tensor)], options: StepOptions, step: F) -> Result<Self>
    where
        F: FnMut(&mut O, &[Tensor]) -> Result<Vec<Tensor>> + 'a,
    {
        let mut this = TrainStep::with_state(optimizer, inputs, options, step)?;
        if options.shadows {
            this.shadow_parameters()?;
        }
        Ok(this)
    }
}

impl<'a, S: 'a> TrainStep<'a, S> {
    /// [`new`](TrainStep::new) with a state the step owns and lends: the closure gets `&mut`
    /// it on every call, the caller gets it between runs through [`state`](Self::state) and
    /// [`state_mut`](Self::state_mut) (checkpoint the optimizer, set its learning rate), and
    /// back with [`into_state`](Self::into_state). A captured graph works on the addresses the
    /// state's tensors had at capture: change their values in place (a checkpoint load does),
    /// never replace them.
    ///
    /// ```
    /// # fn main() -> tch_cuda_graphs::Result<()> {
    /// use tch::{nn, nn::Module, Device, Kind, Tensor};
    /// use tch_cuda_graphs::{optim::{Adam, AdamConfig, Optimizer}, StepOptions, TrainStep};
    /// let vs = nn::VarStore::new(Device::Cpu);
    /// let model = nn::linear(vs.root(), 8, 1, Default::default());
    /// let x = Tensor::zeros([4, 8], (Kind::Float, Device::Cpu));
    /// let opt = Adam::new(&vs, AdamConfig::default().lr(1e-2))?;
    /// let mut step = TrainStep::with_state(opt, &[("x", &x)], StepOptions::default(), |opt, inp| {
    ///     opt.zero_grad()?;
    ///     let loss = model.forward(&inp[0]).f_square()?.f_mean(None)?;
    ///     loss.f_backward()?;
    ///     opt.step()?;
    ///     Ok(vec![loss.detach()])
    /// })?;
    /// step.run(&[&Tensor::ones([4, 8], (Kind::Float, Device::Cpu))])?;
    /// step.state_mut().set_lr(1e-3)?; // the optimizer, between runs
    /// let _eval = model.forward(&x); // the model, through a plain reference
    /// # Ok(()) }
    /// ```
    pub fn with_state<F>(state: S, inputs: &[(&str, &Tensor)], options: StepOptions, step: F) -> Result<Self>
    where
        F: FnMut(&mut S, &[Tensor]) -> Result<Vec<Tensor>> + 'a,
    {
        let names: Vec<String> = inputs.iter().map(|(n, _)| (*n).to_owned()).collect();
        let device = inputs.first().map(|(_, t)| t.device()).or(options.capture.get_device());
        let device = device.ok_or_else(|| Error::Misuse("a step needs at least one static input".into()))?;
        if let Some((n, t)) = inputs.iter().find(|(_, t)| t.device() != device) {
            return Err(Error::Misuse(format!(
                "static input `{n}` is on {:?} but the step runs on {device:?}: all inputs must share one device",
                t.device()
            )));
        }
        let graphed = !options.eager && matches!(device, Device::Cuda(_)) && cuda_is_available();
        let pool = match (graphed, options.capture.get_pool()) {
            (false, _) => None,
            (true, p) if !p.is_private() => Some(MemPool::hold(device, p)?),
            (true, _) => Some(MemPool::on(device)?),
        };
        let copies = inputs
            .iter()
            .map(|(_, t)| -> Result<Tensor> {
                let mut s = t.f_empty_like()?;
                s.f_copy_(t)?;
                Ok(s)
            })
            .collect::<Result<Vec<_>>>()?;
        let mut step = TrainStep {
            kinds: inputs.iter().map(|(_, t)| t.kind()).collect(),
            ranks: inputs.iter().map(|(_, t)| t.dim()).collect(),
            names,
            device,
            graphed,
            options,
            shapes: Vec::new(),
            current: 0,
            step_fn: Box::new(step),
            state,
            shadows: None,
            watch: TensorWatch::new()?,
            runs: 0,
            captures: 0,
            updates: 0,
            spare: None,
            declared: Vec::new(),
            pool,
        };
        step.push_entry(inputs.iter().map(|(_, t)| t.size()).collect(), Some(copies))?;
        Ok(step)
    }

    /// The state lent to the closure ([`with_state`](Self::with_state)).
    pub fn state(&self) -> &S {
        &self.state
    }

    /// The state, mutably (between runs).
    pub fn state_mut(&mut self) -> &mut S {
        &mut self.state
    }

    /// The state back; the step, its graphs and their pool are released.
    pub fn into_state(self) -> S {
        self.state
    }

    /// Whether the step replays CUDA graphs (`false`: the eager fallback).
    pub fn is_graphed(&self) -> bool {
        self.graphed
    }

    /// Checks `batch` (count, dtypes, ranks, devices: the step's, or the CPU), finds or makes
    /// the static inputs of its shape, copies it in and runs the step (eager warmup, capture
    /// and replay, or replay). Returns the outputs, valid until the next run.
    pub fn run(&mut self, batch: &[&Tensor]) -> Result<&[Tensor]> {
        let shape = self.batch_shape(batch)?;
        self.watch.check()?;
        let i = self.entry_for(shape)?;
        self.shapes[i].watch.check()?;
        self.fill(i, batch)?;
        self.step(i)
    }

    /// Runs the step on what the static inputs of the last run's shape hold now (no copy).
    pub fn replay(&mut self) -> Result<&[Tensor]> {
        self.watch.check()?;
        self.shapes[self.current].watch.check()?;
        self.step(self.current)
    }

    /// One step of entry `i`: eager, eager warmup, or (capture and) replay.
    fn step(&mut self, mut i: usize) -> Result<&[Tensor]> {
        let entry = &self.shapes[i];
        let warm = entry.warmed >= self.options.get_warmup() && !self.waits_for_larger(i);
        if !self.graphed {
            let oom = OomWatch::start(self.device)?;
            let entry = &mut self.shapes[i];
            entry.outputs =
                call_step(&mut self.step_fn, &mut self.state, &self.options, self.shadows.as_ref(), &entry.inputs)
                    .map_err(|e| oom.classify(e))?;
            self.keep_asked_shadows(i)?;
        } else if entry.graph.is_none() && !warm {
            let TrainStep { shapes, step_fn, state, device, options, shadows, .. } = self;
            let entry = &mut shapes[i];
            let inputs = &entry.inputs;
            let shadows = shadows.as_ref();
            entry.outputs = run_on_capture_stream(*device, || call_step(step_fn, state, options, shadows, inputs))?;
            entry.warmed += 1;
            self.keep_asked_shadows(i)?;
        } else {
            if entry.graph.is_none() {
                i = self.capture_evicting(i)?;
            }
            if let Some(set) = &self.shadows {
                set.f_refresh()?; // parameters changed since the last run (a replay counts no version)
            }
            if let Some(g) = &mut self.shapes[i].graph {
                g.replay()?;
            }
        }
        self.runs += 1;
        self.shapes[i].last_used = self.runs;
        self.current = i;
        Ok(&self.shapes[i].outputs)
    }

    /// After the step's first run, which ran eagerly and read its weight shadows, and before any
    /// capture: only the shadows that a layer asked for stay in the set (an embedding table or
    /// a norm's weight, read by no matmul, is then not written on every step).
    fn keep_asked_shadows(&mut self, i: usize) -> Result<()> {
        let read = self.options.shadows && on_cuda(&self.shapes[i].inputs);
        if self.runs == 0 && self.captures == 0 && read {
            if let Some(set) = self.shadows.as_mut() {
                set.f_keep_asked()?;
            }
        }
        Ok(())
    }

    /// Captures entry `i`, after evicting the least recently used graph past the bound.
    /// Returns where entry `i` is now.
    fn capture_evicting(&mut self, mut i: usize) -> Result<usize> {
        if self.graph_count() >= self.options.max_graphs {
            if let Some(j) = self.lru(true) {
                i = self.evict(j, i);
            }
        }
        self.capture_entry(i)?;
        Ok(i)
    }

    /// Captures entry `j`'s graph (recording only; nothing trains). With a spare executable (an
    /// evicted graph's), the capture keeps its `cudaGraph_t` and updates the spare in place when
    /// CUDA allows (the same kernel sequence on other addresses and sizes), which costs less
    /// than instantiating; otherwise it is instantiated as usual and the spare is kept.
    fn capture_entry(&mut self, j: usize) -> Result<()> {
        let (graph, outputs) = self.record_entry(j, self.spare.is_some())?;
        let graph = match self.spare.take() {
            Some(mut spare) => match put_to_work(Some(&mut spare), graph)? {
                Installed::Updated => {
                    self.updates += 1;
                    spare
                }
                Installed::New(graph) => {
                    self.spare = Some(spare);
                    graph
                }
            },
            None => graph, // instantiated when its capture ended
        };
        let entry = &mut self.shapes[j];
        entry.graph = Some(graph);
        entry.outputs = outputs;
        Ok(())
    }

    /// Records entry `j`'s step into a new graph, in the step's pool, without running it; with
    /// `keep`, the graph keeps its `cudaGraph_t` (to update another executable from it). The one
    /// capture path of the step, for [`Self::capture_entry`] and [`Self::recapture`].
    fn record_entry(&mut self, j: usize, keep: bool) -> Result<(CudaGraph, Vec<Tensor>)> {
        let capture = match &self.pool {
            Some(pool) => self.options.capture.pool(pool.id()).device(self.device),
            None => self.options.capture,
        };
        let capture = if keep { capture.keep_graph(true) } else { capture };
        let mut graph = CudaGraph::with_keep_graph(capture.get_keep_graph())?;
        if let Some(set) = &self.shadows {
            set.f_refresh()?; // now, so the capture records no copy of what is stale only now
        }
        let TrainStep { shapes, step_fn, state, options, shadows, captures, .. } = self;
        let (inputs, shadows) = (&shapes[j].inputs, shadows.as_ref());
        let outputs = graph.capture(capture, || compact(call_step(step_fn, state, options, shadows, inputs)?))?;
        *captures += 1;
        Ok((graph, outputs))
    }

    /// The outputs of the last run (overwritten in place by the next).
    pub fn outputs(&self) -> &[Tensor] {
        &self.shapes[self.current].outputs
    }

    /// The static inputs of the last run's shape.
    pub fn inputs(&self) -> &[Tensor] {
        &self.shapes[self.current].inputs
    }

    /// The names of the static inputs, in order.
    pub fn input_names(&self) -> &[String] {
        &self.names
    }

    /// How many times [`run`](Self::run) or [`replay`](Self::replay) ran (each one step).
    pub fn runs(&self) -> u64 {
        self.runs
    }

    /// How many captures updated a kept executable in place instead of instantiating one: a
    /// shape captured after an eviction (the evicted graph's executable is kept for it) and
    /// [`recapture`](Self::recapture)'s updates.
    pub fn updates(&self) -> u64 {
        self.updates
    }

    /// How many graphs were captured so far (re-captures after eviction included).
    pub fn captures(&self) -> u64 {
        self.captures
    }

    /// The pool all graphs of the step are captured into (`None` when eager). Give it to an
    /// eval step ([`StepOptions::pool`]) to share memory.
    pub fn pool(&self) -> Option<PoolId> {
        self.pool.as_ref().map(MemPool::id)
    }

    /// The graph of the last run's shape, once captured (node counts, upload, ...).
    pub fn graph_mut(&mut self) -> Option<&mut CudaGraph> {
        self.shapes[self.current].graph.as_mut()
    }
}
