//! # tch-cuda-graphs
//!
//! CUDA graphs for [tch](https://docs.rs/tch) (libtorch 2.11): capture a whole training step
//! (forward, backward, optimizer) once and replay it per batch, so a launch-bound step costs
//! one graph launch instead of hundreds of kernel launches.
//!
//! Where to look:
//! - `sys` (crate-private): the safe layer over the C++ shim (`csrc/`), one file per shim family,
//!   and the only code that calls into it; [`error`]: [`Error`].
//! - [`graph`]: [`CudaGraph`], the safe owner of an `at::cuda::CUDAGraph` (no capture policy).
//! - [`capture`]: [`CaptureOptions`], [`CudaGraph::capture`], [`capture_with_warmup`] (capture
//!   stream, warmup, capture) and the per-device [`CaptureLock`] (one capture at a time).
//! - [`watch`]: [`TensorWatch`], the storage check that keeps replays off replaced tensors.
//! - [`pool`]: [`PoolId`], [`graph_pool_handle`], [`MemPool`]; [`memory`]: allocator figures.
//! - [`stream`]: [`Stream`], [`StreamGuard`], capture status; [`device`]: availability, sync.
//! - [`graphed`]: [`make_graphed_callables`], parts of a model (forward and backward) as graphs
//!   inside an eager loop (PyTorch's `torch.cuda.make_graphed_callables`); [`autograd`]:
//!   `autograd::grad` with output gradients.
//! - [`control`]: conditional IF and WHILE nodes inside a capture (decisions on the device).
//! - [`amp`]: mixed precision: the [`amp::Autocast`] guard and [`amp::GradScaler`] on the device.
//! - [`optim`]: capturable fused [`optim::Sgd`] and [`optim::Adam`] (Adam/AdamW) on the crate's
//!   own kernels (every SM busy whatever the parameter count; PyTorch's fused kernels as the
//!   fallback) with parameter groups and learning-rate handles; [`schedule`]: schedules applied from the host or computed
//!   on the device; [`clip`]: on-device gradient clipping; [`checkpoint`]: save and resume.
//! - [`kernels`]: which kernels run, the crate's own or ATen's: one choice ([`kernels::Kernels`])
//!   in every config, one answer ([`kernels::KernelPath`]) from every `last_path()`.
//! - [`norm`]: [`norm::LayerNorm`] (and RMSNorm) with the residual add and dropout folded in, on
//!   the crate's own fused kernels (ATen's operators where they do not apply).
//! - [`shadow`]: weight shadows, the low-precision copies of the weights a captured autocast
//!   step reads instead of casting each weight at each use.
//! - [`linear`]: [`linear::Linear`], whose backward computes the bias gradient inside the
//!   weight-gradient GEMM (cuBLASLt's epilogue) and can write float32 weight gradients directly;
//!   [`gemm`]: how those GEMMs choose their algorithm (cuBLASLt's heuristic, or timing);
//!   [`loss`]: the cross-entropy of a language model's head in one read of the logits.
//! - [`rotary`]: [`rotary::Rotary`], rotary position embeddings on q and k in one kernel each
//!   way; [`swiglu`]: SwiGLU read from the fused `[gate | up]` projection in one pass each way;
//!   [`embedding`]: [`embedding::Embedding`], tch's embedding with a deterministic one-kernel
//!   backward; [`gelu`]: GELU with the preceding layer's bias folded in, its gradient summed in the
//!   backward's one pass; [`mlp`]: an MLP with GELU's tanh approximation in cuBLASLt's GEMM
//!   epilogues (no GELU kernel either way).
//! - [`transformer`]: [`transformer::TransformerLayer`], a pre-norm transformer layer on those
//!   layers, and the [`transformer::ResidualStream`] that carries each residual add into the next
//!   norm, so a model stacked from layers gets every fusion without restructuring.
//! - [`dist`]: NCCL process groups over libtorch's c10d, from torchrun's environment.
//! - [`train_step`]: [`TrainStep`], a training step captured per batch shape into one pool, fed
//!   from the GPU or the CPU, with an eager fallback on machines without a GPU; [`bucket`]:
//!   [`Buckets`] for variable-length sequences; [`feed`]: pinned buffers and device-side metrics.
//!
//! ```no_run
//! # fn main() -> tch_cuda_graphs::Result<()> {
//! use tch::{Device, Kind, Tensor};
//! use tch_cuda_graphs::{graph_pool_handle, CaptureOptions, CudaGraph};
//! let (mut a, b) = (Tensor::ones([8], (Kind::Float, Device::Cuda(0))), Tensor::ones([8], (Kind::Float, Device::Cuda(0))));
//! let pool = graph_pool_handle()?;
//! let mut g = CudaGraph::new()?;
//! let out = g.capture(CaptureOptions::default().pool(pool), || Ok(a.f_add(&b)?))?;
//! a.copy_(&Tensor::full([8], 5.0, (Kind::Float, Device::Cuda(0))));
//! g.replay()?; // `out` is now 6.0 everywhere
//! # let _ = out; Ok(()) }
//! ```
#![warn(missing_docs)]

pub mod amp;
pub mod autograd;
pub mod bucket;
pub mod capture;
pub mod checkpoint;
pub mod clip;
pub mod control;
pub mod device;
pub mod dist;
pub mod embedding;
pub mod error;
pub mod feed;
pub mod gelu;
pub mod gemm;
pub mod graph;
pub mod graphed;
pub mod kernels;
pub mod linear;
pub mod loss;
pub mod memory;
pub mod mlp;
pub mod norm;
pub mod optim;
pub mod pool;
pub mod profiler;
pub mod rotary;
mod scalar;
pub mod schedule;
pub mod shadow;
pub mod stream;
pub mod swiglu;
mod sys;
pub mod testing;
pub mod train_step;
pub mod transformer;
pub mod watch;

pub use bucket::{Buckets, Padded};
pub use capture::{
    capture_with_warmup, retain_in_capture, run_on_capture_stream, CaptureLock, CaptureOptions, DEFAULT_WARMUP,
};
pub use clip::{clip_grad_norm, clip_grad_value};
pub use device::{built_with_cuda, cuda_device_count, cuda_is_available, synchronize};
pub use error::{Error, Result};
pub use graph::{CaptureMode, CudaGraph, NodeKinds};
pub use graphed::{make_graphed_callables, Callable, GraphedCallable, GraphedOptions};
pub use memory::{empty_cache, memory_stats, pool_memory, reset_peak_stats, MemoryStats, PoolMemory};
pub use pool::{graph_pool_handle, MemPool, PoolId};
pub use stream::{is_current_stream_capturing, CaptureStatus, Event, Stream, StreamGuard};
pub use train_step::{Recaptured, StepOptions, TrainStep, DEFAULT_MAX_GRAPHS};
pub use watch::TensorWatch;

/// The Rust blocks of the README and of the guide in `docs/`, compiled by `cargo test` as doc
/// tests so they cannot rot (`tests/docs.rs` checks every page is listed here).
#[cfg(doctest)]
mod doc_pages {
    #[doc = include_str!("../README.md")]
    struct Readme;
    #[doc = include_str!("../docs/index.md")]
    struct Index;
    #[doc = include_str!("../docs/adopting.md")]
    struct Adopting;
    #[doc = include_str!("../docs/capture.md")]
    struct Capture;
    #[doc = include_str!("../docs/train-step.md")]
    struct TrainStepPage;
    #[doc = include_str!("../docs/optimizers.md")]
    struct Optimizers;
    #[doc = include_str!("../docs/mixed-precision.md")]
    struct MixedPrecision;
    #[doc = include_str!("../docs/graphed-callables.md")]
    struct GraphedCallables;
    #[doc = include_str!("../docs/control.md")]
    struct Control;
    #[doc = include_str!("../docs/distributed.md")]
    struct Distributed;
    #[doc = include_str!("../docs/profiler.md")]
    struct Profiler;
    #[doc = include_str!("../docs/gpt.md")]
    struct Gpt;
    #[doc = include_str!("../docs/llama.md")]
    struct Llama;
    #[doc = include_str!("../docs/norm.md")]
    struct Norm;
    #[doc = include_str!("../docs/kernels.md")]
    struct Kernels;
    #[doc = include_str!("../docs/linear-loss.md")]
    struct LinearLoss;
    #[doc = include_str!("../docs/benchmarks.md")]
    struct Benchmarks;
    #[doc = include_str!("../docs/building.md")]
    struct Building;
}
