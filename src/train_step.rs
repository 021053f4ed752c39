//! [`TrainStep`]: a whole training step (forward, loss, backward, optimizer) captured into CUDA
//! graphs, one per batch shape, all in one memory pool, and replayed per batch through static
//! inputs; fed from the GPU or the CPU; with an eager fallback without a GPU.

use crate::amp::Autocast;
use crate::capture::{capture_with_warmup, run_on_capture_stream, CaptureOptions, DEFAULT_WARMUP};
use crate::device::cuda_is_available;
use crate::error::{Error, Result};
use crate::feed::{copy_non_blocking, is_pinned, Stager};
use crate::graph::{CaptureMode, CudaGraph};
use crate::memory::OomWatch;
use crate::optim::Optimizer;
use crate::pool::{MemPool, PoolId};
use crate::shadow::WeightShadows;
use crate::watch::{storage_nbytes, TensorWatch};
use tch::{nn::VarStore, Device, Kind, Tensor};

/// The step closure: the state the step lends it, and the static inputs.
type StepFn<'a, S> = Box<dyn FnMut(&mut S, &[Tensor]) -> Result<Vec<Tensor>> + 'a>;

/// The default bound on the graphs a [`TrainStep`] keeps (one per batch shape).
pub const DEFAULT_MAX_GRAPHS: usize = 8;

/// Options of a [`TrainStep`]. Builder style; each setter says its default.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepOptions {
    warmup: Option<usize>,
    capture: CaptureOptions,
    eager: bool,
    max_graphs: usize,
    copy_stream: bool,
    autocast: Option<Kind>,
    shadows: bool,
}

impl Default for StepOptions {
    fn default() -> Self {
        StepOptions {
            warmup: None,
            capture: CaptureOptions::default(),
            eager: false,
            max_graphs: DEFAULT_MAX_GRAPHS,
            copy_stream: true,
            autocast: None,
            shadows: false,
        }
    }
}

impl StepOptions {
    /// Eager steps a batch shape gets before its graph is captured. They are real training
    /// steps on real batches (the first `n` batches of that shape), run on the capture stream
    /// so that lazily made state (optimizer buffers, cuBLAS workspaces) exists before capture.
    /// Default: [`DEFAULT_WARMUP`] (3). SGD with momentum needs at least 1.
    pub fn warmup(mut self, n: usize) -> Self {
        self.warmup = Some(n);
        self
    }
    /// The pool every graph of the step is captured into. Default: a fresh pool of the step's
    /// own. The step holds the pool either way ([`MemPool::hold`]), so it stays open while the
    /// step lives. Give an eval step the train step's [`TrainStep::pool`] to share memory.
    pub fn pool(mut self, pool: PoolId) -> Self {
        self.capture = self.capture.pool(pool);
        self
    }
    /// The capture mode. Default: [`CaptureMode::Global`].
    pub fn mode(mut self, mode: CaptureMode) -> Self {
        self.capture = self.capture.mode(mode);
        self
    }
    /// Whether the graphs keep their `cudaGraph_t` (for node counts and dumps). Default: false.
    pub fn keep_graph(mut self, yes: bool) -> Self {
        self.capture = self.capture.keep_graph(yes);
        self
    }
    /// Run eagerly even on a GPU (the closure runs on every [`TrainStep::run`]). Default: false
    /// (graphed whenever the static inputs live on a CUDA device).
    pub fn eager(mut self, yes: bool) -> Self {
        self.eager = yes;
        self
    }
    /// The most graphs (batch shapes captured) kept at once. A shape about to be captured while
    /// `n` graphs are held first evicts the least recently used graph (its graph, static inputs
    /// and outputs are freed; its memory stays in the step's pool for the next capture; the
    /// shape is warmed up and captured again if it comes back). Shapes still in their warmup
    /// hold static inputs but no graph and never evict a graph; at most `n` of them are kept
    /// too, so a new shape past that drops the least recently used one still warming up (it
    /// starts its warmup again if it comes back). Eager steps keep at most `n` shapes' static
    /// inputs. Default: [`DEFAULT_MAX_GRAPHS`] (8). At least 1.
    pub fn max_graphs(mut self, n: usize) -> Self {
        self.max_graphs = n.max(1);
        self
    }
    /// For batches on the CPU: copy them to the device on a copy stream through two staging
    /// buffers, so the copy of the next batch overlaps the graph of the current one (ordered by
    /// events; the host never waits). Off: copy straight into the static inputs on the compute
    /// stream (asynchronous from pinned memory, blocking from pageable memory). Default: on.
    pub fn copy_stream(mut self, yes: bool) -> Self {
        self.copy_stream = yes;
        self
    }
    /// Runs the step under CUDA autocast with `dtype` (`Kind::BFloat16` or `Kind::Half`): every
    /// call of the closure (eager warmup, capture, eager fallback) is wrapped in an
    /// [`crate::amp::Autocast`] with the weight-cast cache off, so replays recompute the casts
    /// from the current weights and eager and graphed steps run the same kernels. Call
    /// backward through [`crate::amp::backward`] (or [`crate::amp::GradScaler::backward`]):
    /// PyTorch runs backward outside the autocast region, and a backward left inside it only
    /// adds casts. (CUDA autocast does not touch CPU tensors: the CPU fallback stays fp32.)
    /// Default: none (fp32).
    pub fn autocast(mut self, dtype: Kind) -> Self {
        self.autocast = Some(dtype);
        self
    }
    /// Has the step refresh its [`crate::shadow::WeightShadows`] at the start of each run (one
    /// multi-tensor copy, captured with the step) and let [`crate::shadow::linear`] and
    /// [`crate::linear::Linear`] read them under autocast instead of casting each weight at each
    /// use (default off). [`TrainStep::shadow_parameters`] makes the shadows of the step's
    /// optimizer, [`TrainStep::set_weight_shadows`] hands it others. A step on a CUDA device
    /// that holds none is refused with [`Error::Misuse`] rather than run without them; on the
    /// CPU, where autocast does not run, there is nothing to read and the option does nothing.
    pub fn weight_shadows(mut self, yes: bool) -> Self {
        self.shadows = yes;
        self
    }

    /// Whether the step reads weight shadows.
    pub fn get_weight_shadows(&self) -> bool {
        self.shadows
    }
    /// The autocast dtype, if any.
    pub fn get_autocast(&self) -> Option<Kind> {
        self.autocast
    }
    /// The number of warmup steps per shape this gives.
    pub fn get_warmup(&self) -> usize {
        self.warmup.unwrap_or(DEFAULT_WARMUP)
    }
    /// The bound on kept graphs.
    pub fn get_max_graphs(&self) -> usize {
        self.max_graphs
    }
}

/// What [`TrainStep::recapture`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Recaptured {
    /// Graphs whose executable was updated in place to the new capture.
    pub updated: usize,
    /// Graphs replaced by the new capture (CUDA refused the update: another topology).
    pub replaced: usize,
}

/// The static inputs, outputs and graph of one batch shape.
struct ShapeEntry {
    shape: Vec<Vec<i64>>,
    inputs: Vec<Tensor>,
    outputs: Vec<Tensor>,
    graph: Option<CudaGraph>,
    /// Eager (warmup) steps run for this shape so far.
    warmed: usize,
    last_used: u64,
    /// The static inputs' storage.
    watch: TensorWatch,
    /// Made by the first CPU batch of this shape.
    stager: Option<Stager>,
    /// Declared up front ([`TrainStep::declare_shapes`]): captured only after every larger
    /// declared shape already seen, and never dropped while it waits.
    declared: bool,
}

impl ShapeEntry {
    /// Elements of all static inputs: the order declared shapes are captured in (largest first).
    fn numel(&self) -> i64 {
        self.shape.iter().map(|s| s.iter().product::<i64>()).sum()
    }
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
    /// The shadows the step refreshes and reads ([`TrainStep::shadow_parameters`]).
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

/// One call of the step closure with its state, under autocast (cast cache off) if asked.
fn call_step<S>(
    step_fn: &mut StepFn<'_, S>,
    state: &mut S,
    options: &StepOptions,
    shadows: Option<&WeightShadows>,
    inputs: &[Tensor],
) -> Result<Vec<Tensor>> {
    let cuda = inputs.first().is_some_and(|t| t.device().is_cuda());
    let _shadows = match (options.shadows, shadows) {
        (true, Some(set)) => Some(set.f_read()?),
        (true, None) if cuda => {
            return Err(Error::Misuse(
                "weight_shadows(true), but the step holds no shadows: call TrainStep::shadow_parameters (or \
                 set_weight_shadows) before the first run"
                    .into(),
            ))
        }
        _ => None,
    };
    let _autocast = options.autocast.map(|dtype| Autocast::new(dtype, false)).transpose()?;
    step_fn(state, inputs)
}

/// The outputs of a captured call, each a tensor of its own: an output that views a larger
/// buffer (a 0-d loss that aliases a batch-sized buffer, a slice of an activation) would keep
/// the whole buffer allocated in the pool for as long as the graph lives, and split the pool's
/// segments for the captures after it. Such an output is cloned inside the capture (one small
/// copy per replay) and the buffer goes back to the pool. Outputs that require grad are left as
/// they are (a clone would keep the buffer through its autograd history).
fn compact(outputs: Vec<Tensor>) -> Result<Vec<Tensor>> {
    outputs
        .into_iter()
        .map(|t| {
            let bytes = t.numel() * t.kind().elt_size_in_bytes();
            if t.defined() && !t.requires_grad() && storage_nbytes(&t)? > bytes {
                let mut own = t.f_empty_like()?;
                own.f_copy_(&t)?;
                Ok(own)
            } else {
                Ok(t)
            }
        })
        .collect()
}

/// What [`put_to_work`] did with a new capture.
enum Installed {
    /// The old graph's executable now runs the new capture's work.
    Updated,
    /// CUDA refused the update: the new graph, instantiated, replaces the old one.
    New(CudaGraph),
}

/// Puts a capture that kept its `cudaGraph_t` to work: updates `old`'s executable from it where
/// CUDA allows ([`CudaGraph::update_from`]), else instantiates it.
fn put_to_work(old: Option<&mut CudaGraph>, mut graph: CudaGraph) -> Result<Installed> {
    if let Some(old) = old {
        if old.update_from(&mut graph)? {
            return Ok(Installed::Updated);
        }
    }
    graph.instantiate()?;
    Ok(Installed::New(graph))
}

fn describe(t: &Tensor) -> String {
    format!("shape {:?} {:?} on {:?}", t.size(), t.kind(), t.device())
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

    /// Gives every float32 CUDA parameter of the step's optimizer (its state) a shadow in the
    /// autocast dtype, held by the step and refreshed at the start of each run: the one call that
    /// [`StepOptions::weight_shadows`] needs. Returns how many parameters got one. Call it before
    /// the first run (a graph captured without the refresh would not read them).
    ///
    /// # Errors
    /// [`Error::Misuse`] without `weight_shadows(true)` and an autocast dtype, after the first
    /// run, or when called twice.
    pub fn shadow_parameters(&mut self) -> Result<usize> {
        let dtype = self.shadow_dtype()?;
        let shadows = WeightShadows::new(self.state.params(), dtype)?;
        self.set_weight_shadows(shadows)
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

    /// Gives the step a set of weight shadows to refresh at the start of each run and read
    /// ([`StepOptions::weight_shadows`]); how many parameters it shadows. The step owns it from
    /// now on. [`shadow_parameters`](TrainStep::shadow_parameters) makes the set of a step's
    /// optimizer; this takes any set (a step with no optimizer in its state, or a subset).
    ///
    /// # Errors
    /// [`Error::Misuse`] without `weight_shadows(true)` and an autocast dtype, for a set of
    /// another dtype than autocast's, after the first run (a graph captured without the refresh
    /// would not read them), or when the step holds a set already.
    pub fn set_weight_shadows(&mut self, shadows: WeightShadows) -> Result<usize> {
        let dtype = self.shadow_dtype()?;
        if shadows.dtype() != dtype {
            return Err(Error::Misuse(format!(
                "weight shadows of {:?} for a step under {dtype:?} autocast: make them in the autocast dtype",
                shadows.dtype()
            )));
        }
        if self.runs > 0 || self.shadows.is_some() {
            return Err(Error::Misuse("weight shadows: give a step its set once, before the first run".into()));
        }
        let made = shadows.len();
        self.shadows = Some(shadows);
        Ok(made)
    }

    /// The weight shadows the step holds, if any.
    pub fn weight_shadows(&self) -> Option<&WeightShadows> {
        self.shadows.as_ref()
    }

    /// The autocast dtype, which shadows must have; an error without shadows asked for.
    fn shadow_dtype(&self) -> Result<Kind> {
        match (self.options.shadows, self.options.autocast) {
            (true, Some(dtype)) => Ok(dtype),
            _ => Err(Error::Misuse("weight shadows need StepOptions::weight_shadows(true) and autocast".into())),
        }
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

    /// Validates a batch without copying it.
    pub fn check_batch(&self, batch: &[&Tensor]) -> Result<()> {
        self.batch_shape(batch).map(drop)
    }

    fn batch_shape(&self, batch: &[&Tensor]) -> Result<Vec<Vec<i64>>> {
        if batch.len() != self.names.len() {
            return Err(Error::Misuse(format!(
                "the step has {} static inputs ({}), got {} tensors",
                self.names.len(),
                self.names.join(", "),
                batch.len()
            )));
        }
        let mut shape = Vec::with_capacity(batch.len());
        for (index, b) in batch.iter().enumerate() {
            let device_ok = b.device() == self.device || (self.device != Device::Cpu && b.device() == Device::Cpu);
            let size = b.size();
            if b.kind() != self.kinds[index] || !device_ok || size.len() != self.ranks[index] {
                return Err(Error::InputMismatch {
                    name: self.names[index].clone(),
                    index,
                    expected: format!(
                        "rank {} {:?} on {:?}{}",
                        self.ranks[index],
                        self.kinds[index],
                        self.device,
                        if self.device == Device::Cpu { "" } else { " or the CPU" }
                    ),
                    got: describe(b),
                });
            }
            shape.push(size);
        }
        Ok(shape)
    }

    /// The entry of `shape`, made if new; past the bound on shapes still warming up, the least
    /// recently used of those goes first (see [`StepOptions::max_graphs`]).
    fn entry_for(&mut self, shape: Vec<Vec<i64>>) -> Result<usize> {
        if let Some(i) = self.shapes.iter().position(|e| e.shape == shape) {
            return Ok(i);
        }
        let warming = self.shapes.iter().filter(|e| e.graph.is_none() && !e.declared).count();
        if warming >= self.options.max_graphs {
            if let Some(j) = self.lru(false) {
                self.evict(j, 0);
            }
        }
        self.push_entry(shape, None)
    }

    /// The least recently used entry with (`captured`) or without a graph; declared shapes
    /// waiting for their capture are never chosen.
    fn lru(&self, captured: bool) -> Option<usize> {
        let candidate = |e: &ShapeEntry| e.graph.is_some() == captured && (captured || !e.declared);
        self.shapes.iter().enumerate().filter(|(_, e)| candidate(e)).min_by_key(|(_, e)| e.last_used).map(|(j, _)| j)
    }

    /// Drops entry `j` (its graph, static inputs, outputs, staging buffers); returns where the
    /// entry at index `i` is now.
    fn evict(&mut self, j: usize, i: usize) -> usize {
        let entry = self.shapes.remove(j);
        if let Some(graph) = entry.graph {
            self.spare = Some(graph); // its executable serves the next capture (capture_entry)
        }
        if self.current > j {
            self.current -= 1;
        } else if self.current == j {
            self.current = 0; // its outputs are gone; the next run sets it
        }
        if i > j {
            i - 1
        } else {
            i
        }
    }

    fn push_entry(&mut self, shape: Vec<Vec<i64>>, inputs: Option<Vec<Tensor>>) -> Result<usize> {
        let inputs = match inputs {
            Some(t) => t,
            None => shape
                .iter()
                .zip(&self.kinds)
                .map(|(s, &k)| Ok(Tensor::f_empty(s.as_slice(), (k, self.device))?))
                .collect::<Result<Vec<_>>>()?,
        };
        let mut watch = TensorWatch::new()?;
        watch.add(self.names.iter().map(|n| format!("static input `{n}`")), &inputs)?;
        let declared = self.declared.contains(&shape);
        self.shapes.push(ShapeEntry {
            shape,
            inputs,
            outputs: Vec::new(),
            graph: None,
            warmed: 0,
            last_used: 0,
            watch,
            stager: None,
            declared,
        });
        Ok(self.shapes.len() - 1)
    }

    /// Copies `batch` into entry `i`'s static inputs.
    fn fill(&mut self, i: usize, batch: &[&Tensor]) -> Result<()> {
        let entry = &mut self.shapes[i];
        let from_cpu = self.device != Device::Cpu && batch.iter().all(|b| b.device() == Device::Cpu);
        if self.graphed && from_cpu && self.options.copy_stream {
            let stager = match &mut entry.stager {
                Some(s) => s,
                none => none.insert(Stager::new(self.device, &entry.inputs)?),
            };
            return stager.feed(&mut entry.inputs, batch);
        }
        for (dst, src) in entry.inputs.iter_mut().zip(batch) {
            if src.device() != Device::Cpu || is_pinned(src) {
                copy_non_blocking(dst, src)?; // queued on the current stream
            } else {
                dst.f_copy_(src)?; // pageable memory: CUDA copies synchronously
            }
        }
        Ok(())
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
        } else if entry.graph.is_none() && !warm {
            let TrainStep { shapes, step_fn, state, device, options, shadows, .. } = self;
            let entry = &mut shapes[i];
            let inputs = &entry.inputs;
            let shadows = shadows.as_ref();
            entry.outputs = run_on_capture_stream(*device, || call_step(step_fn, state, options, shadows, inputs))?;
            entry.warmed += 1;
        } else {
            if entry.graph.is_none() {
                i = self.capture_evicting(i)?;
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

    /// Whether declared entry `i` must wait (run eagerly) for a larger declared shape that has
    /// been seen (warmed up at least once) but not captured yet.
    fn waits_for_larger(&self, i: usize) -> bool {
        let e = &self.shapes[i];
        e.declared
            && self.shapes.iter().any(|o| o.declared && o.graph.is_none() && o.warmed > 0 && o.numel() > e.numel())
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
        let TrainStep { shapes, step_fn, state, options, shadows, captures, .. } = self;
        let (inputs, shadows) = (&shapes[j].inputs, shadows.as_ref());
        let recorded =
            capture_with_warmup(0, capture, || compact(call_step(step_fn, state, options, shadows, inputs)?))?;
        *captures += 1;
        Ok(recorded)
    }

    /// Declares batch shapes the step will see (each: one shape per static input), so that
    /// their graphs are captured largest first into the step's pool: later captures then fit
    /// into the memory earlier ones freed (see `docs/train-step.md`, "Several shapes, one pool"). Use it
    /// where the shapes are known: the buckets of [`crate::Buckets`], an epoch's ragged last
    /// batch.
    ///
    /// Every shape still gets its own eager warmup (its first [`StepOptions::warmup`] batches)
    /// before its capture, as in PyTorch, and its static inputs are made when it first comes:
    /// declaring changes the order of captures and nothing else. A declared shape that is
    /// warmed up while a larger declared shape that has already come has no graph yet keeps
    /// running eagerly (real steps, just not graphed) until that one is captured; a larger shape
    /// that has not come yet is not waited for. So declare shapes that recur: one that comes
    /// once and never again keeps the smaller ones eager. Declared shapes are never dropped
    /// while they wait; once captured they are evicted like any other graph. At most [`StepOptions::max_graphs`] shapes may be
    /// declared ([`Error::Misuse`] otherwise, and for a shape whose count or ranks do not match
    /// the static inputs). Eager steps only check the shapes.
    ///
    /// ```no_run
    /// # fn main() -> tch_cuda_graphs::Result<()> {
    /// # use tch::{Device, Kind, Tensor};
    /// # use tch_cuda_graphs::{StepOptions, TrainStep};
    /// # let x = Tensor::zeros([64, 32], (Kind::Float, Device::Cuda(0)));
    /// # let y = Tensor::zeros([64, 4], (Kind::Float, Device::Cuda(0)));
    /// let mut step = TrainStep::new(&[("x", &x), ("y", &y)], StepOptions::default(), |_| Ok(vec![]))?;
    /// // sequences padded to buckets of 128, 256 and 512 tokens, batches of 16
    /// step.declare_shapes(&[vec![vec![16, 512], vec![16, 512]], vec![vec![16, 256], vec![16, 256]], vec![vec![16, 128], vec![16, 128]]])?;
    /// # Ok(()) }
    /// ```
    pub fn declare_shapes(&mut self, shapes: &[Vec<Vec<i64>>]) -> Result<()> {
        for shape in shapes {
            let ranks_ok = shape.len() == self.names.len() && shape.iter().zip(&self.ranks).all(|(s, &r)| s.len() == r);
            if !ranks_ok || shape.iter().flatten().any(|&d| d < 0) {
                return Err(Error::Misuse(format!(
                    "declared shape {shape:?} does not fit the static inputs ({} of ranks {:?})",
                    self.names.join(", "),
                    self.ranks
                )));
            }
        }
        let mut all = self.declared.clone();
        for shape in shapes {
            if !all.contains(shape) {
                all.push(shape.clone());
            }
        }
        if all.len() > self.options.max_graphs {
            return Err(Error::Misuse(format!(
                "{} shapes declared, but the step keeps at most {} graphs (StepOptions::max_graphs)",
                all.len(),
                self.options.max_graphs
            )));
        }
        for entry in self.shapes.iter_mut() {
            entry.declared |= all.contains(&entry.shape);
        }
        self.declared = all; // entries made later for these shapes are marked when made
        Ok(())
    }

    /// [`declare_shapes`](Self::declare_shapes) for batches that differ in their first
    /// dimension only: each size replaces the first dimension of every static input's shape as
    /// given to [`new`](Self::new).
    pub fn declare_batch_sizes(&mut self, sizes: &[i64]) -> Result<()> {
        let first = self.shapes.first().map(|e| e.shape.clone()).unwrap_or_default();
        if first.iter().any(|s| s.is_empty()) {
            return Err(Error::Misuse("declare_batch_sizes: a static input has rank 0 (no batch dimension)".into()));
        }
        let shapes: Vec<Vec<Vec<i64>>> = sizes
            .iter()
            .map(|&n| first.iter().map(|s| std::iter::once(n).chain(s[1..].iter().copied()).collect()).collect())
            .collect();
        self.declare_shapes(&shapes)
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

    /// How many graphs the step holds now (one per captured shape).
    pub fn graph_count(&self) -> usize {
        self.shapes.iter().filter(|e| e.graph.is_some()).count()
    }

    /// The batch shapes the step holds static inputs for, most recently used last.
    pub fn shapes(&self) -> Vec<Vec<Vec<i64>>> {
        let mut v: Vec<&ShapeEntry> = self.shapes.iter().collect();
        v.sort_by_key(|e| e.last_used);
        v.into_iter().map(|e| e.shape.clone()).collect()
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

    /// Captures every graph of the step again, on what its tensors are now, after a watched
    /// tensor's storage was replaced (a parameter's `set_data`, a reloaded buffer: the runs that
    /// returned [`Error::StaleGraph`]), and accepts the new storage from here on. Each new
    /// capture updates the old graph's executable in place where CUDA allows it
    /// ([`CudaGraph::update_from`]: the same kernels on other addresses), which costs less
    /// than instantiating; otherwise the new graph replaces the old one. Nothing trains: like a
    /// capture, it only records. The replaced tensors must keep their shapes and dtypes (the
    /// optimizer's state was made for them). Shapes without a graph yet (still warming up)
    /// and the eager fallback only accept the new storage.
    ///
    /// ```no_run
    /// # fn main() -> tch_cuda_graphs::Result<()> {
    /// # use tch::{nn, Device, Kind, Tensor};
    /// # use tch_cuda_graphs::{Error, StepOptions, TrainStep};
    /// # let vs = nn::VarStore::new(Device::Cuda(0));
    /// # let x = Tensor::zeros([1], (Kind::Float, Device::Cuda(0)));
    /// # let mut step = TrainStep::new(&[("x", &x)], StepOptions::default(), |_| Ok(vec![]))?;
    /// match step.run(&[&x]) {
    ///     Err(Error::StaleGraph { .. }) => {
    ///         let r = step.recapture()?;
    ///         println!("{} graphs updated in place, {} replaced", r.updated, r.replaced);
    ///         step.run(&[&x])?;
    ///     }
    ///     other => drop(other?),
    /// }
    /// # Ok(()) }
    /// ```
    pub fn recapture(&mut self) -> Result<Recaptured> {
        let mut report = Recaptured::default();
        if self.graphed {
            for j in 0..self.shapes.len() {
                if self.shapes[j].graph.is_none() {
                    continue;
                }
                let (graph, outputs) = self.record_entry(j, true)?;
                let entry = &mut self.shapes[j];
                match put_to_work(entry.graph.as_mut(), graph)? {
                    Installed::Updated => {
                        report.updated += 1;
                        self.updates += 1;
                    }
                    Installed::New(graph) => {
                        entry.graph = Some(graph);
                        report.replaced += 1;
                    }
                }
                entry.outputs = outputs;
            }
        }
        self.watch.refresh()?;
        for entry in &mut self.shapes {
            entry.watch.refresh()?;
        }
        Ok(report)
    }

    /// Keeps `tensors` alive as long as the step and checks before every run that each still
    /// has the storage, dtype and shape it has now (see "Stale graphs" above). Call it right
    /// after [`new`](Self::new), with tensors the step uses.
    pub fn watch<'t>(&mut self, tensors: impl IntoIterator<Item = (&'t str, &'t Tensor)>) -> Result<()> {
        let (names, tensors): (Vec<String>, Vec<&Tensor>) =
            tensors.into_iter().map(|(n, t)| (format!("tensor `{n}`"), t)).unzip();
        self.watch.add(names, tensors)
    }

    /// [`watch`](Self::watch) every variable of `vs` (the model's parameters and buffers), named
    /// as in the VarStore.
    ///
    /// ```no_run
    /// # fn main() -> tch_cuda_graphs::Result<()> {
    /// # use tch::{nn, Device, Kind, Tensor};
    /// # use tch_cuda_graphs::{StepOptions, TrainStep};
    /// # let vs = nn::VarStore::new(Device::Cuda(0));
    /// # let x = Tensor::zeros([1], (Kind::Float, Device::Cuda(0)));
    /// let mut step = TrainStep::new(&[("x", &x)], StepOptions::default(), |_| Ok(vec![]))?;
    /// step.watch_vars(&vs)?;
    /// # Ok(()) }
    /// ```
    pub fn watch_vars(&mut self, vs: &VarStore) -> Result<()> {
        let mut vars: Vec<(String, Tensor)> = vs.variables().into_iter().collect();
        vars.sort_by(|a, b| a.0.cmp(&b.0));
        let names = vars.iter().map(|(n, _)| format!("parameter `{n}`"));
        self.watch.add(names, vars.iter().map(|(_, t)| t))
    }
}
