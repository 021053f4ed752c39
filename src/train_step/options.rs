//! [`StepOptions`]: how a [`super::TrainStep`] warms up, captures, feeds and casts.

use crate::capture::{CaptureOptions, DEFAULT_WARMUP};
use crate::graph::CaptureMode;
use crate::pool::PoolId;
use tch::Kind;

/// The default bound on the graphs a [`TrainStep`](crate::TrainStep) keeps (one per batch shape).
pub const DEFAULT_MAX_GRAPHS: usize = 8;

/// Options of a [`TrainStep`](crate::TrainStep). Builder style; each setter says its default.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepOptions {
    pub(super) warmup: Option<usize>,
    pub(super) capture: CaptureOptions,
    pub(super) eager: bool,
    pub(super) max_graphs: usize,
    pub(super) copy_stream: bool,
    pub(super) autocast: Option<Kind>,
    pub(super) shadows: bool,
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
    /// own. The step holds the pool either way ([`crate::MemPool::hold`]), so it stays open while the
    /// step lives. Give an eval step the train step's [`crate::TrainStep::pool`] to share memory.
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
    /// Run eagerly even on a GPU (the closure runs on every [`crate::TrainStep::run`]). Default: false
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
    /// Has the step keep its [`crate::shadow::WeightShadows`] fresh (the crate's Adam writes them
    /// as it updates; the step copies whatever else changed a parameter, before each run and at
    /// the end of its body: [`crate::shadow::WeightShadows::f_refresh`]) and let [`crate::shadow::linear`] and
    /// [`crate::linear::Linear`] read them under autocast instead of casting each weight at each
    /// use (default off). [`crate::TrainStep::shadow_parameters`] makes the shadows of the step's
    /// optimizer, [`crate::TrainStep::set_weight_shadows`] hands it others. After the first run,
    /// when it ran eagerly (a warmup), the step keeps only the shadows a layer read in it: a
    /// parameter no matmul reads (an embedding table, a norm's weight) then costs no shadow write
    /// per step; where a later run asks for one it no longer has, the layer casts the weight as
    /// without shadows. A step on a CUDA device that holds none is refused with
    /// [`crate::Error::Misuse`] rather than run without them; on the CPU, where autocast does not
    /// run, there is nothing to read and the option does nothing.
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
