//! Graphed callables: parts of a model captured as CUDA graphs and used inside an ordinary eager
//! training loop, PyTorch's `torch.cuda.make_graphed_callables` for tch.
//!
//! Not every step can be captured whole: host-side control flow, a loss read on the host every
//! step, data-dependent shapes in one part, CPU work in the middle. [`make_graphed_callables`]
//! captures the forward and the backward of each given [`Callable`] (a closure over tensors, a tch
//! module) as two graphs and returns [`GraphedCallable`]s: calling one replays its forward graph
//! and returns outputs wired into autograd, so `loss.backward()` in eager code replays its
//! backward graph and the parameters' `.grad` accumulate as without graphs. Everything else in
//! the loop stays eager: the crate's optimizers, [`crate::amp::GradScaler`], clipping,
//! [`crate::dist::GradAllReduce`]'s hooks (they fire on the gradients the backward graph
//! produces).
//!
//! # What is done, and in which order (as PyTorch 2.11's `torch/cuda/graphs.py`)
//! 1. Holding the device's [`crate::CaptureLock`], each callable runs `warmup` times (default 3)
//!    on the capture stream, forward and `autograd::grad` of its outputs, so that lazily made
//!    state (cuBLAS handles, autograd's device threads) is not captured.
//! 2. The forwards are captured in order, then the backwards in reverse order, all into one
//!    memory pool ([`GraphedOptions::pool`]; default a fresh one): the order they run in a step,
//!    which is what makes sharing the pool safe. **Run them in that order** (forwards first to
//!    last, backwards last to first, as a loss through all of them does); running them in another
//!    order lets one graph's replay overwrite memory another still needs.
//! 3. The backward graph of a callable computes the gradients of its outputs that require grad
//!    with respect to its inputs and parameters that require grad **at capture** (the samples'
//!    `requires_grad` is the contract: an input that requires grad where its sample did not is
//!    refused, as its gradient would be lost).
//!
//! # The rules (PyTorch's, plus the checks PyTorch leaves out)
//! - Call with tensors like the samples: same count, shape, dtype and device
//!   ([`Error::InputMismatch`] otherwise; nothing runs). Each input is copied into its static
//!   input (the sample tensor itself) unless it is that memory.
//! - Outputs are the graph's static outputs (aliases, as PyTorch returns them): the next call
//!   overwrites them. Clone what must outlive it. Do not modify them in place before backward.
//! - One backward per forward: a forward (grad mode on or off) overwrites the activations the
//!   backward graph reads, so a backward through outputs of an earlier call fails (with this
//!   crate's message, through the autograd engine: tch's `f_backward` returns it, `backward`
//!   panics with it) instead of computing wrong gradients. A block used twice in a step needs two graphed callables.
//! - Grad mode off ([`tch::no_grad`]): only the forward graph runs; nothing is recorded for
//!   autograd. tch modules have no train/eval flag: for an eval forward that differs (dropout,
//!   batch norm), call the module itself, or graph its eval forward separately.
//! - Autocast inside the callable (or around [`make_graphed_callables`]) needs the weight-cast
//!   cache off ([`crate::amp::Autocast::new`]`(dtype, false)`); with it on this fails
//!   ([`Error::Misuse`]), as PyTorch does.
//! - No double backward (create_graph): the backward graph is first-order.
//! - Parameters must keep their storage ([`Error::StaleGraph`] otherwise).
//!
//! # Gradients, exactly
//! The backward returns the static gradient buffers without a copy, so a parameter whose `.grad`
//! was none (`zero_grad()`, set to none) takes the buffer itself as its `.grad`, as in PyTorch.
//! PyTorch 2.11 keeps those buffers in the graphs' shared pool, where a block may also be a
//! forward graph's scratch: the next forward replay overwrites such a `.grad`, and the next
//! backward replay overwrites the rest, so accumulating over micro-batches (or zeroing in
//! place) gives wrong gradients (pytorch/pytorch#181723). Here the backward graph copies each
//! gradient into a buffer of its own outside the pool (a copy inside the graph), written by no
//! other graph, and before a backward replay any leaf whose `.grad` is still that buffer gets a
//! private copy of it. So accumulation and `zero_grad_in_place` give the eager results (one
//! extra copy per parameter in those cases, none in the usual set-to-none loop).
//!
//! ```no_run
//! # fn main() -> tch_cuda_graphs::Result<()> {
//! use tch::{nn, nn::Module, Device, Kind, Tensor};
//! use tch_cuda_graphs::graphed::{make_graphed_callables, Callable, GraphedOptions};
//! use tch_cuda_graphs::optim::{Adam, AdamConfig, Optimizer};
//! let dev = Device::Cuda(0);
//! let vs = nn::VarStore::new(dev);
//! let block = nn::seq().add(nn::linear(vs.root() / "a", 64, 256, Default::default())).add_fn(|x| x.gelu("none"))
//!     .add(nn::linear(vs.root() / "b", 256, 64, Default::default()));
//! let head = nn::linear(vs.root() / "head", 64, 1, Default::default());
//! let sample = Tensor::randn([32, 64], (Kind::Float, dev));
//! let block_params: Vec<Tensor> = vs.trainable_variables().into_iter().take(4).collect();
//! let graphed = make_graphed_callables(
//!     vec![Callable::module(&block, sample).params(block_params)],
//!     GraphedOptions::default(),
//! )?;
//! let mut opt = Adam::new(&vs, AdamConfig::default())?;
//! for _ in 0..10 {
//!     let x = Tensor::randn([32, 64], (Kind::Float, dev));
//!     opt.zero_grad()?;
//!     let loss = head.forward(&graphed[0].forward(&x)?).square().mean(Kind::Float);
//!     loss.backward(); // replays the block's backward graph
//!     opt.step()?;
//!     let _host = f64::try_from(&loss)?; // a host read: why the step is not captured whole
//! }
//! # Ok(()) }
//! ```

use crate::capture::{refuse_cached_autocast, CaptureOptions, CaptureSession};
use crate::device::cuda_is_available;
use crate::error::{Error, Result};
use crate::graph::CudaGraph;
use crate::pool::{MemPool, PoolId};
use crate::sys::graphed::{GraphedHandle, GraphedStatics};
use crate::watch::TensorWatch;
use tch::{Device, Kind, Tensor};

type CallableFn<'f> = Box<dyn FnMut(&[Tensor]) -> Result<Vec<Tensor>> + 'f>;

/// One callable to graph: a closure from input tensors to output tensors, the sample inputs it is
/// captured with, and the parameters it reads (the tensors besides its inputs that take
/// gradients: a module's trainable variables). The closure only runs inside
/// [`make_graphed_callables`] (warmup and capture).
pub struct Callable<'f> {
    f: CallableFn<'f>,
    samples: Vec<Tensor>,
    params: Vec<Tensor>,
}

impl std::fmt::Debug for Callable<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Callable").field("samples", &self.samples.len()).field("params", &self.params.len()).finish()
    }
}

impl<'f> Callable<'f> {
    /// `f` with its sample inputs: tensors like the ones it will be called with (shape, dtype,
    /// device, `requires_grad`). They become its static inputs: do not reuse them for anything
    /// else. Without [`params`](Self::params), gradients flow to the inputs only.
    ///
    /// ```no_run
    /// use tch::{Device, Kind, Tensor};
    /// use tch_cuda_graphs::graphed::Callable;
    /// let x = Tensor::randn([8, 16], (Kind::Float, Device::Cuda(0))).set_requires_grad(true);
    /// let relu = Callable::new(vec![x], |xs| Ok(vec![xs[0].relu()]));
    /// # let _ = relu;
    /// ```
    pub fn new(samples: Vec<Tensor>, f: impl FnMut(&[Tensor]) -> Result<Vec<Tensor>> + 'f) -> Self {
        Callable { f: Box::new(f), samples, params: Vec::new() }
    }

    /// A tch module of one input and one output, with its sample input. Give its trainable
    /// variables with [`params`](Self::params).
    pub fn module<M: tch::nn::Module + ?Sized>(module: &'f M, sample: Tensor) -> Self {
        Self::new(vec![sample], move |xs: &[Tensor]| Ok(vec![module.forward(&xs[0])]))
    }

    /// The parameters the callable reads (e.g. the module's `VarStore::trainable_variables()`,
    /// or the part of them it uses): their gradients come out of the backward graph and
    /// accumulate into their `.grad`. Tensors that do not require grad may be listed (they are
    /// read, not differentiated).
    pub fn params(mut self, params: impl IntoIterator<Item = Tensor>) -> Self {
        self.params = params.into_iter().collect();
        self
    }
}

/// Options of [`make_graphed_callables`]. Builder style; each setter says its default.
///
/// ```
/// use tch_cuda_graphs::graphed::GraphedOptions;
/// let o = GraphedOptions::default().warmup(11).allow_unused_input(true);
/// assert_eq!(o.get_warmup(), 11);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GraphedOptions {
    warmup: usize,
    allow_unused_input: bool,
    pool: Option<PoolId>,
}

impl Default for GraphedOptions {
    fn default() -> Self {
        GraphedOptions { warmup: 3, allow_unused_input: false, pool: None }
    }
}

impl GraphedOptions {
    /// Warmup runs of each callable (forward and backward) before capture. Default 3, as
    /// PyTorch (which advises 11 under DDP).
    pub fn warmup(mut self, n: usize) -> Self {
        self.warmup = n;
        self
    }

    /// Whether an input or parameter that requires grad but is not used by the outputs is
    /// allowed (its gradient is then none). Default false: an error, as PyTorch.
    pub fn allow_unused_input(mut self, yes: bool) -> Self {
        self.allow_unused_input = yes;
        self
    }

    /// The memory pool to capture into (shared with other graphs: then mind the order of
    /// replays). Default: a fresh pool for this set of callables.
    pub fn pool(mut self, pool: PoolId) -> Self {
        self.pool = Some(pool);
        self
    }

    /// The warmup count set by [`warmup`](Self::warmup).
    pub fn get_warmup(&self) -> usize {
        self.warmup
    }
}

/// Shape, dtype, device and `requires_grad` of a sample input.
#[derive(Clone, Debug, PartialEq)]
struct Meta {
    size: Vec<i64>,
    kind: Kind,
    device: Device,
    requires_grad: bool,
}

impl Meta {
    fn of(t: &Tensor) -> Result<Self> {
        if !t.defined() {
            return Err(Error::Misuse("graphed callable: an undefined tensor".into()));
        }
        Ok(Meta { size: t.size(), kind: t.f_kind()?, device: t.device(), requires_grad: t.requires_grad() })
    }

    fn describe(&self) -> String {
        format!("{:?} {:?} on {:?}, requires_grad {}", self.size, self.kind, self.device, self.requires_grad)
    }
}

/// A callable whose forward and backward are CUDA graphs, made by [`make_graphed_callables`].
/// Call it from eager code with [`call`](Self::call) / [`forward`](Self::forward); backward
/// through its outputs replays its backward graph. See the [module docs](self) for the rules.
///
/// # Threads
/// `Send`, not `Sync`: use it from one thread at a time. Its backward may run on autograd's
/// device thread; the shim serializes that with calls under a lock of its own.
pub struct GraphedCallable {
    /// The shim's state with the forward graph and the backward graph (none if no output
    /// required grad) it replays; it frees itself before the graphs.
    handle: GraphedHandle<CudaGraph>,
    samples: Vec<Meta>,
    params: Vec<Tensor>,
    params_grad: Vec<bool>,
    n_out: usize,
    watch: TensorWatch,
    /// A hold on the pool, released after the graphs (so the pool's memory goes back to CUDA
    /// with the last of them).
    _pool: MemPool,
    index: usize,
}

impl std::fmt::Debug for GraphedCallable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GraphedCallable")
            .field("index", &self.index)
            .field("inputs", &self.samples.len())
            .field("params", &self.params.len())
            .field("outputs", &self.n_out)
            .field("has_backward", &self.has_backward())
            .finish()
    }
}

impl GraphedCallable {
    /// Runs the callable on `inputs` (like its samples): copies them into the static inputs,
    /// replays the forward graph on the current stream, and returns the outputs (the static
    /// outputs: overwritten by the next call). With grad mode on and an input or parameter
    /// requiring grad, the outputs that required grad at capture are wired into autograd.
    pub fn call(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        if inputs.len() != self.samples.len() {
            return Err(Error::Misuse(format!(
                "graphed callable #{}: {} inputs given, {} expected (as its samples)",
                self.index,
                inputs.len(),
                self.samples.len()
            )));
        }
        for (i, (x, meta)) in inputs.iter().zip(&self.samples).enumerate() {
            let got = Meta::of(x)?;
            let grad_lost = got.requires_grad && !meta.requires_grad;
            if got.size != meta.size || got.kind != meta.kind || got.device != meta.device || grad_lost {
                return Err(Error::InputMismatch {
                    name: format!("graphed callable #{} input", self.index),
                    index: i,
                    expected: meta.describe(),
                    got: got.describe(),
                });
            }
        }
        for (j, (p, captured)) in self.params.iter().zip(&self.params_grad).enumerate() {
            if p.requires_grad() && !captured {
                return Err(Error::Misuse(format!(
                    "graphed callable #{}: parameter #{j} requires grad now but did not at capture: its \
                     gradient is not in the backward graph; make the graphed callable again",
                    self.index
                )));
            }
        }
        self.watch.check()?;
        let all: Vec<&Tensor> = inputs.iter().chain(&self.params).collect();
        self.handle.apply(&all)
    }

    /// [`call`](Self::call) for a callable of one input and one output.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if self.n_out != 1 {
            return Err(Error::Misuse(format!(
                "graphed callable #{}: forward() is for one output; it has {} (use call())",
                self.index, self.n_out
            )));
        }
        let mut out = self.call(std::slice::from_ref(x))?;
        Ok(out.remove(0))
    }

    /// The parameters given to [`Callable::params`].
    pub fn params(&self) -> &[Tensor] {
        &self.params
    }

    /// Its position in the list given to [`make_graphed_callables`].
    pub fn index(&self) -> usize {
        self.index
    }

    /// Whether it has a backward graph (some output required grad at capture).
    pub fn has_backward(&self) -> bool {
        self.handle.graphs().1.is_some()
    }

    /// The id of the pool its graphs live in.
    pub fn pool(&self) -> PoolId {
        self._pool.id()
    }
}

/// The one CUDA device of every sample and parameter.
fn common_device(callables: &[Callable<'_>]) -> Result<Device> {
    if !cuda_is_available() {
        return Err(Error::NoCuda("graphed callables need a CUDA device (CUDA graphs); none is available".into()));
    }
    let mut device = None;
    for (k, c) in callables.iter().enumerate() {
        for t in c.samples.iter().chain(&c.params) {
            if !t.defined() {
                return Err(Error::Misuse(format!("graphed callable #{k}: an undefined sample or parameter")));
            }
            let d = t.device();
            if !matches!(d, Device::Cuda(_)) {
                return Err(Error::Misuse(format!(
                    "graphed callable #{k}: a sample or parameter is on {d:?}, not CUDA"
                )));
            }
            match device {
                None => device = Some(d),
                Some(first) if first != d => {
                    return Err(Error::Misuse(format!(
                        "graphed callable #{k}: tensors on {first:?} and {d:?}; all must be on one device"
                    )))
                }
                Some(_) => {}
            }
        }
    }
    device.ok_or_else(|| Error::Misuse("graphed callables: no sample input or parameter to tell the device".into()))
}

/// The gradients of a callable's outputs that require grad with respect to its surface entries
/// that do, spread back to one slot per surface entry. `grad_outputs`: one per output that
/// requires grad. `None` for every slot when nothing is differentiable.
fn surface_grads(
    outs: &[Tensor],
    surface: &[&Tensor],
    grad_outputs: &[Tensor],
    allow_unused: bool,
) -> Result<Vec<Option<Tensor>>> {
    let diff_outs: Vec<&Tensor> = outs.iter().filter(|o| o.requires_grad()).collect();
    let targets: Vec<&Tensor> = surface.iter().copied().filter(|t| t.requires_grad()).collect();
    if diff_outs.is_empty() || targets.is_empty() {
        return Ok(surface.iter().map(|_| None).collect());
    }
    let mut grads =
        crate::sys::autograd::grad(&diff_outs, &targets, Some(grad_outputs), false, allow_unused)?.into_iter();
    Ok(surface.iter().map(|t| if t.requires_grad() { grads.next().flatten() } else { None }).collect())
}

/// Captures each callable's forward and backward as CUDA graphs sharing one pool and returns
/// one [`GraphedCallable`] per callable, in order (PyTorch's `make_graphed_callables`; see the
/// [module docs](self)). Give several callables in the order a step runs them.
///
/// Errors: [`Error::NoCuda`] without a GPU; [`Error::Misuse`] for tensors off CUDA or on several
/// devices, or autocast with its cast cache on; whatever a callable returns, or libtorch reports
/// (an input unused without [`GraphedOptions::allow_unused_input`]); a capture's failure as
/// [`CudaGraph::capture`] reports it. On every failure (a panic in a callable included, which
/// resumes after the clean-up) nothing is left capturing and the graphs made so far are freed
/// with their pool.
pub fn make_graphed_callables(
    mut callables: Vec<Callable<'_>>,
    options: GraphedOptions,
) -> Result<Vec<GraphedCallable>> {
    if callables.is_empty() {
        return Err(Error::Misuse("make_graphed_callables: no callable given".into()));
    }
    let device = common_device(&callables)?;
    refuse_cached_autocast("make_graphed_callables")?;
    let pool = match options.pool {
        Some(id) => MemPool::hold(device, id)?,
        None => MemPool::on(device)?,
    };
    let session = CaptureSession::open(device)?;
    let allow_unused = options.allow_unused_input;

    // 1. Warmup, on the capture stream.
    warm_up(&mut callables, &session, options.warmup, allow_unused)?;

    // 2. Forward graphs in order, then backward graphs in reverse order, into one pool.
    let at = Captures { capture: CaptureOptions::default().pool(pool.id()).device(device), session: &session };
    let forwards = callables.iter_mut().map(|c| at.forward(c)).collect::<Result<Vec<_>>>()?;
    let mut backwards = Vec::with_capacity(forwards.len());
    for (c, fwd) in callables.iter().zip(&forwards).rev() {
        backwards.push(at.backward(c, &fwd.outputs, allow_unused)?);
    }
    backwards.reverse();

    // 3. One autograd function per callable over its graphs and static tensors.
    callables
        .into_iter()
        .zip(forwards)
        .zip(backwards)
        .enumerate()
        .map(|(index, ((c, fwd), bwd))| assemble(index, c, fwd, bwd, device, pool.id()))
        .collect()
}

/// Runs each callable `warmup` times on the capture stream, forward and backward (as
/// `torch.cuda.make_graphed_callables` does), so that lazily made state is not captured.
fn warm_up(callables: &mut [Callable<'_>], session: &CaptureSession, warmup: usize, allow_unused: bool) -> Result<()> {
    for c in callables.iter_mut() {
        let surface: Vec<&Tensor> = c.samples.iter().chain(&c.params).collect();
        for _ in 0..warmup {
            session.run(|| {
                let outs = (c.f)(&c.samples)?;
                let zeros: Vec<Tensor> = outs
                    .iter()
                    .filter(|o| o.requires_grad())
                    .map(|o| o.f_zeros_like())
                    .collect::<std::result::Result<_, _>>()?;
                drop(surface_grads(&outs, &surface, &zeros, allow_unused)?);
                Ok(())
            })?;
        }
    }
    session.settle()
}

/// A callable's captured forward: the graph and its static outputs.
struct Forward {
    graph: CudaGraph,
    outputs: Vec<Tensor>,
}

/// A callable's captured backward (no graph when nothing is differentiated) and its static
/// gradients.
struct Backward {
    graph: Option<CudaGraph>,
    /// One entry per output: its static incoming gradient, where it requires grad.
    grad_outputs: Vec<Option<Tensor>>,
    /// One entry per surface tensor (samples, then parameters): its static gradient, if any.
    grad_inputs: Vec<Option<Tensor>>,
}

/// Where the captures of one `make_graphed_callables` go: one pool, one side stream.
struct Captures<'a> {
    capture: CaptureOptions,
    session: &'a CaptureSession,
}

impl Captures<'_> {
    fn forward(&self, c: &mut Callable<'_>) -> Result<Forward> {
        let mut graph = CudaGraph::new()?;
        let (samples, f) = (&c.samples, &mut c.f);
        let outputs = self.session.record(&mut graph, &self.capture, || f(samples))?;
        Ok(Forward { graph, outputs })
    }

    fn backward(&self, c: &Callable<'_>, outputs: &[Tensor], allow_unused: bool) -> Result<Backward> {
        let surface: Vec<&Tensor> = c.samples.iter().chain(&c.params).collect();
        let statics: Vec<Option<Tensor>> = outputs
            .iter()
            .map(|o| if o.requires_grad() { o.f_empty_like().map(Some) } else { Ok(None) })
            .collect::<std::result::Result<_, _>>()?;
        let has_targets = surface.iter().any(|t| t.requires_grad());
        if !(statics.iter().any(Option::is_some) && has_targets) {
            // Nothing to differentiate: outputs are returned as not requiring grad.
            return Ok(Backward {
                graph: None,
                grad_outputs: statics.iter().map(|_| None).collect(),
                grad_inputs: surface.iter().map(|_| None).collect(),
            });
        }
        let feed: Vec<Tensor> = statics.iter().flatten().map(Tensor::shallow_clone).collect();
        // The static gradients live outside the pool (see "Gradients, exactly"): a block of
        // the pool may be another graph's scratch, and a parameter's .grad that is such a
        // block would be overwritten by that graph's next replay.
        let buffers: Vec<Option<Tensor>> = surface
            .iter()
            .map(|t| if t.requires_grad() { t.f_empty_like().map(Some) } else { Ok(None) })
            .collect::<std::result::Result<_, _>>()?;
        let mut graph = CudaGraph::new()?;
        let grad_inputs = self.session.record(&mut graph, &self.capture, || {
            let grads = surface_grads(outputs, &surface, &feed, allow_unused)?;
            let mut written = Vec::with_capacity(grads.len());
            for (buf, g) in buffers.iter().zip(grads) {
                written.push(match (buf, g) {
                    (Some(buf), Some(g)) => {
                        let mut dst = buf.shallow_clone();
                        dst.f_copy_(&g)?;
                        Some(dst)
                    }
                    _ => None, // not differentiated, or unused
                });
            }
            Ok(written)
        })?;
        Ok(Backward { graph: Some(graph), grad_outputs: statics, grad_inputs })
    }
}

/// The graphed callable `index` over its captured graphs: uploaded, its inputs watched, tied to
/// autograd through the shim, holding the pool `pool`.
fn assemble(
    index: usize,
    c: Callable<'_>,
    fwd: Forward,
    bwd: Backward,
    device: Device,
    pool: PoolId,
) -> Result<GraphedCallable> {
    let Forward { graph: mut fwd, outputs } = fwd;
    let Backward { graph: mut bwd, grad_outputs, grad_inputs } = bwd;
    fwd.upload()?;
    if let Some(b) = bwd.as_mut() {
        b.upload()?;
    }
    let statics: Vec<Tensor> = outputs.iter().map(Tensor::detach).collect();
    let surface: Vec<&Tensor> = c.samples.iter().chain(&c.params).collect();
    // Everything fallible before the handle exists.
    let samples = c.samples.iter().map(Meta::of).collect::<Result<Vec<_>>>()?;
    let params_grad = c.params.iter().map(Tensor::requires_grad).collect();
    let mut watch = TensorWatch::new()?;
    let names = (0..c.samples.len())
        .map(|i| format!("graphed callable #{index} static input #{i}"))
        .chain((0..c.params.len()).map(|j| format!("graphed callable #{index} parameter #{j}")));
    watch.add(names, surface.iter().copied())?;
    let hold = MemPool::hold(device, pool)?;
    let statics_of = GraphedStatics {
        surface: &surface,
        n_user: c.samples.len(),
        outputs: &statics,
        grad_outputs: &grad_outputs,
        grad_inputs: &grad_inputs,
    };
    let handle = GraphedHandle::new(fwd, bwd, &statics_of)?;
    Ok(GraphedCallable {
        handle,
        samples,
        params: c.params,
        params_grad,
        n_out: statics.len(),
        watch,
        _pool: hold,
        index,
    })
}
