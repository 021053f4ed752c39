//! [`TrainStep`]: a whole training step (forward, loss, backward, optimizer) captured once and
//! replayed per batch through static inputs, with an eager fallback without a GPU.

use crate::capture::{capture_with_warmup, CaptureOptions, DEFAULT_WARMUP};
use crate::device::cuda_is_available;
use crate::error::{Error, Result};
use crate::graph::{CaptureMode, CudaGraph};
use crate::pool::PoolId;
use crate::watch::TensorWatch;
use tch::{nn::VarStore, Device, Tensor};

type StepFn = Box<dyn FnMut(&[Tensor]) -> Result<Vec<Tensor>> + Send>;

/// Options of a [`TrainStep`]. Builder style; each setter says its default.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StepOptions {
    warmup: Option<usize>,
    capture: CaptureOptions,
    eager: bool,
}

impl StepOptions {
    /// Warmup runs before capture (real steps on the initial contents of the static inputs).
    /// Default: [`DEFAULT_WARMUP`] (3). SGD with momentum needs at least 1.
    pub fn warmup(mut self, n: usize) -> Self {
        self.warmup = Some(n);
        self
    }
    /// The pool to capture into. Default: a private pool. Give an eval step the train step's
    /// [`TrainStep::pool`] to share memory (then replay them in capture order).
    pub fn pool(mut self, pool: PoolId) -> Self {
        self.capture = self.capture.pool(pool);
        self
    }
    /// The capture mode. Default: [`CaptureMode::Global`].
    pub fn mode(mut self, mode: CaptureMode) -> Self {
        self.capture = self.capture.mode(mode);
        self
    }
    /// Whether the graph keeps its `cudaGraph_t` (for node counts and dumps). Default: false.
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
    /// The number of warmup runs this gives.
    pub fn get_warmup(&self) -> usize {
        self.warmup.unwrap_or(DEFAULT_WARMUP)
    }
}

/// One training step, captured into a CUDA graph and replayed per batch.
///
/// Built from the step's static inputs (tensors allocated before capture, holding a first
/// batch) and a closure that computes the step from them and returns its outputs (the loss,
/// metrics). [`TrainStep::new`] runs the closure `warmup` times (real training steps), then
/// captures one call. [`TrainStep::run`] checks and copies a batch into the static inputs and
/// replays the graph; the returned outputs are the static output tensors, updated in place.
///
/// Without a CUDA device (or when the inputs live on the CPU, or with
/// [`StepOptions::eager`]) the same code runs the closure eagerly on every call, and
/// [`is_graphed`](Self::is_graphed) says `false`: one program for CPU development and GPU
/// training. The warmup runs happen in both modes, so both train the same number of steps.
///
/// The step keeps alive everything the graph touches: the static inputs and outputs, the
/// closure (move the model and the optimizer into it: their parameters and state are then held
/// by the step), anything given to [`watch`](Self::watch) or [`watch_vars`](Self::watch_vars),
/// and the graph's pool.
///
/// # Stale graphs
/// The graph works on the addresses its tensors had at capture. Before every
/// [`run`](Self::run) and [`replay`](Self::replay) the step checks, in one call costing a few
/// nanoseconds per tensor, that the static inputs and every watched tensor still have that
/// storage, dtype and shape; if one was replaced (`VarStore::set_kind`, `set_data`, a resize,
/// loading a checkpoint of another dtype) it returns [`Error::StaleGraph`] and runs nothing,
/// instead of silently training freed memory. Watch the parameters with
/// [`watch_vars`](Self::watch_vars). The eager fallback checks the same, so a program that
/// works on the CPU works graphed.
///
/// ```no_run
/// # fn main() -> tch_cuda_graphs::Result<()> {
/// use tch::{nn, nn::Module, Device, Kind, Tensor};
/// use tch_cuda_graphs::{optim::{Adam, AdamConfig, Optimizer}, StepOptions, TrainStep};
/// let dev = Device::cuda_if_available();
/// let vs = nn::VarStore::new(dev);
/// let model = nn::linear(vs.root(), 8, 1, Default::default());
/// let mut opt = Adam::new(&vs, AdamConfig::default())?;
/// let x = Tensor::randn([32, 8], (Kind::Float, dev));
/// let y = Tensor::randn([32, 1], (Kind::Float, dev));
/// let mut step = TrainStep::new(&[("x", &x), ("y", &y)], StepOptions::default(), move |inp| {
///     opt.zero_grad()?;
///     let loss = model.forward(&inp[0]).f_mse_loss(&inp[1], tch::Reduction::Mean)?;
///     loss.f_backward()?;
///     opt.step()?;
///     Ok(vec![loss])
/// })?;
/// for _ in 0..100 {
///     let (bx, by) = (Tensor::randn([32, 8], (Kind::Float, dev)), Tensor::randn([32, 1], (Kind::Float, dev)));
///     let out = step.run(&[&bx, &by])?;
///     let _loss = &out[0];
/// }
/// # Ok(()) }
/// ```
pub struct TrainStep {
    names: Vec<String>,
    inputs: Vec<Tensor>,
    outputs: Vec<Tensor>,
    graph: Option<CudaGraph>,
    step_fn: StepFn,
    watch: TensorWatch,
    runs: u64,
}

impl std::fmt::Debug for TrainStep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TrainStep")
            .field("inputs", &self.names)
            .field("outputs", &self.outputs.len())
            .field("graphed", &self.is_graphed())
            .field("runs", &self.runs)
            .finish()
    }
}

fn describe(t: &Tensor) -> String {
    format!("shape {:?} {:?} on {:?}", t.size(), t.kind(), t.device())
}

impl TrainStep {
    /// Declares the static inputs (name, tensor holding the first batch), warms up, and
    /// captures `step` (see the type's docs). The static inputs are copies made here, so feeding
    /// batches never overwrites the caller's tensors; [`inputs`](Self::inputs) gives them, to
    /// fill directly before a [`replay`](Self::replay).
    pub fn new<F>(inputs: &[(&str, &Tensor)], options: StepOptions, step: F) -> Result<Self>
    where
        F: FnMut(&[Tensor]) -> Result<Vec<Tensor>> + Send + 'static,
    {
        let names: Vec<String> = inputs.iter().map(|(n, _)| (*n).to_owned()).collect();
        let copy = |t: &Tensor| -> Result<Tensor> {
            let mut s = t.f_empty_like()?;
            s.f_copy_(t)?;
            Ok(s)
        };
        let statics = inputs.iter().map(|(_, t)| copy(t)).collect::<Result<Vec<Tensor>>>()?;
        let mut step_fn: StepFn = Box::new(step);
        let device = statics.first().map(Tensor::device).or(options.capture.get_device());
        if let Some((i, t)) = statics.iter().enumerate().find(|(_, t)| Some(t.device()) != device) {
            return Err(Error::Misuse(format!(
                "static input `{}` is on {:?} but the step runs on {device:?}: all inputs must share one device",
                names[i],
                t.device()
            )));
        }
        let graphed = !options.eager && matches!(device, Some(Device::Cuda(_))) && cuda_is_available();
        let warmup = options.get_warmup();
        let (graph, outputs) = if graphed {
            let mut capture = options.capture;
            if let Some(d) = device {
                capture = capture.device(d);
            }
            let (graph, outputs) = capture_with_warmup(warmup, capture, || step_fn(&statics))?;
            (Some(graph), outputs)
        } else {
            let mut outputs = Vec::new();
            for _ in 0..warmup {
                outputs = step_fn(&statics)?;
            }
            (None, outputs)
        };
        let mut watch = TensorWatch::new()?;
        watch.add(names.iter().map(|n| format!("static input `{n}`")), &statics)?;
        Ok(TrainStep { names, inputs: statics, outputs, graph, step_fn, watch, runs: 0 })
    }

    /// Whether the step replays a CUDA graph (`false`: the eager fallback).
    pub fn is_graphed(&self) -> bool {
        self.graph.is_some()
    }

    /// Checks `batch` against the static inputs (count, shape, dtype, device; all before copying
    /// anything), copies it in, and runs the step. Returns the static outputs.
    pub fn run(&mut self, batch: &[&Tensor]) -> Result<&[Tensor]> {
        self.check_batch(batch)?;
        self.watch.check()?;
        for (dst, src) in self.inputs.iter_mut().zip(batch) {
            dst.f_copy_(src)?;
        }
        self.replay_checked()
    }

    /// Runs the step on what the static inputs hold now (no copy).
    pub fn replay(&mut self) -> Result<&[Tensor]> {
        self.watch.check()?;
        self.replay_checked()
    }

    fn replay_checked(&mut self) -> Result<&[Tensor]> {
        match &mut self.graph {
            Some(g) => g.replay()?,
            None => self.outputs = (self.step_fn)(&self.inputs)?,
        }
        self.runs += 1;
        Ok(&self.outputs)
    }

    /// Validates a batch without copying it.
    pub fn check_batch(&self, batch: &[&Tensor]) -> Result<()> {
        if batch.len() != self.inputs.len() {
            return Err(Error::Misuse(format!(
                "the step has {} static inputs ({}), got {} tensors",
                self.inputs.len(),
                self.names.join(", "),
                batch.len()
            )));
        }
        for (index, (s, b)) in self.inputs.iter().zip(batch).enumerate() {
            if s.size() != b.size() || s.kind() != b.kind() || s.device() != b.device() {
                return Err(Error::InputMismatch {
                    name: self.names[index].clone(),
                    index,
                    expected: describe(s),
                    got: describe(b),
                });
            }
        }
        Ok(())
    }

    /// The static outputs (updated in place by each run when graphed).
    pub fn outputs(&self) -> &[Tensor] {
        &self.outputs
    }

    /// The static inputs.
    pub fn inputs(&self) -> &[Tensor] {
        &self.inputs
    }

    /// The names of the static inputs, in order.
    pub fn input_names(&self) -> &[String] {
        &self.names
    }

    /// How many times [`run`](Self::run) or [`replay`](Self::replay) ran (warmup excluded).
    pub fn runs(&self) -> u64 {
        self.runs
    }

    /// The pool of the graph, to share with another step (`None` when eager).
    pub fn pool(&self) -> Result<Option<PoolId>> {
        self.graph.as_ref().map(CudaGraph::pool).transpose()
    }

    /// The graph, when graphed (node counts, upload, ...).
    pub fn graph_mut(&mut self) -> Option<&mut CudaGraph> {
        self.graph.as_mut()
    }

    /// Keeps `tensors` alive as long as the step and checks before every run that each still
    /// has the storage, dtype and shape it has now (see "Stale graphs" above). Call it right
    /// after [`new`](Self::new), with tensors the captured step uses.
    pub fn watch<'a>(&mut self, tensors: impl IntoIterator<Item = (&'a str, &'a Tensor)>) -> Result<()> {
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
