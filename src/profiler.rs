//! A profiler in the crate: libtorch's Kineto (CUPTI on the GPU) through the shim, since tch has
//! none and the GPU hosts have no `nsys`.
//!
//! [`Profiler::start`] records until [`Profiler::stop`], which returns a [`Profile`]: every GPU
//! kernel, copy and memset of the process (the kernels inside CUDA graph replays included:
//! CUPTI reports them one by one), the CPU ops of the calling thread and the CUDA runtime calls.
//! [`Profile::save_chrome_trace`] writes a trace that Perfetto (ui.perfetto.dev) or
//! `chrome://tracing` opens; [`Profile::summary`] gives the figures a test or a benchmark can
//! assert on: kernel count, busy time per stream, and how much NCCL time overlapped compute.
//!
//! One profiler at a time per process (Kineto's state is global): a second `start` is
//! [`Error::Misuse`]. A `Profiler` stays on the thread that started it (it is not `Send`;
//! Kineto keeps its CPU-side state per thread); dropped without `stop`, it stops and discards.
//!
//! ```no_run
//! # fn main() -> tch_cuda_graphs::Result<()> {
//! use tch_cuda_graphs::profiler::Profiler;
//! # let mut g = tch_cuda_graphs::CudaGraph::new()?;
//! let prof = Profiler::start()?;
//! for _ in 0..10 {
//!     g.replay()?;
//! }
//! tch_cuda_graphs::synchronize(tch::Device::Cuda(0))?;
//! let profile = prof.stop()?;
//! profile.save_chrome_trace("step.json")?;
//! let s = profile.summary();
//! println!("{} kernels, GPU busy {:.1} µs, NCCL hidden {:.1} of {:.1} µs", s.kernels, s.busy_us, s.overlap_us, s.nccl_us);
//! # Ok(()) }
//! ```

use crate::error::{Error, Result};
use crate::sys::profiler::{ProfileHandle, ProfilerSession, RawEventKind};
use std::path::Path;

/// What a profiled event is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    /// A GPU kernel.
    Kernel,
    /// A GPU copy.
    Memcpy,
    /// A GPU memset.
    Memset,
    /// A CPU op (an ATen operator on the profiling thread).
    CpuOp,
    /// A CUDA runtime or driver call on the host.
    Runtime,
    /// Anything else Kineto reports (annotations, overhead, ...).
    Other,
}

impl EventKind {
    /// Whether it ran on a GPU (kernel, copy, memset).
    pub fn on_gpu(self) -> bool {
        matches!(self, EventKind::Kernel | EventKind::Memcpy | EventKind::Memset)
    }
}

impl EventKind {
    fn from_raw(kind: RawEventKind) -> Self {
        match kind {
            RawEventKind::TCG_PROF_KERNEL => EventKind::Kernel,
            RawEventKind::TCG_PROF_MEMCPY => EventKind::Memcpy,
            RawEventKind::TCG_PROF_MEMSET => EventKind::Memset,
            RawEventKind::TCG_PROF_CPU_OP => EventKind::CpuOp,
            RawEventKind::TCG_PROF_RUNTIME => EventKind::Runtime,
            _ => EventKind::Other,
        }
    }
}

/// One profiled event.
#[derive(Clone, Debug, PartialEq)]
pub struct Event {
    /// The kernel's or op's name.
    pub name: String,
    /// What it is.
    pub kind: EventKind,
    /// GPU events: the device index.
    pub device: i32,
    /// GPU events: the stream (Kineto's resource id).
    pub stream: i64,
    /// Start, ns (Kineto's clock; compare events of one profile only).
    pub start_ns: u64,
    /// End, ns.
    pub end_ns: u64,
}

impl Event {
    /// Whether it is an NCCL kernel (its name starts with `nccl`).
    pub fn is_nccl(&self) -> bool {
        self.kind == EventKind::Kernel && self.name.starts_with("nccl")
    }
}

/// A running profiler (see the [module docs](self)). Not `Send`: Kineto's CPU-side state
/// belongs to the thread that started it.
#[derive(Debug)]
pub struct Profiler {
    session: ProfilerSession,
}

impl Profiler {
    /// Starts profiling CPU ops (this thread) and, when CUDA is there, every GPU activity.
    /// [`Error::Misuse`] if a profiler is running already.
    pub fn start() -> Result<Profiler> {
        Ok(Profiler { session: ProfilerSession::start(true)? })
    }

    /// Stops and returns what was recorded. Synchronize the device first if the last GPU work
    /// must be in the profile (CUPTI reports what has finished).
    pub fn stop(self) -> Result<Profile> {
        let handle = self.session.stop()?;
        let events = (0..handle.len()?)
            .map(|i| {
                let (e, name) = handle.event(i)?;
                Ok(Event {
                    name,
                    kind: EventKind::from_raw(e.kind),
                    device: e.device,
                    stream: e.stream,
                    start_ns: e.start_ns,
                    end_ns: e.end_ns.max(e.start_ns),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Profile { handle, events })
    }
}

/// What a [`Profiler`] recorded.
#[derive(Debug)]
pub struct Profile {
    handle: ProfileHandle,
    events: Vec<Event>,
}

impl Profile {
    /// Every event, in Kineto's order.
    pub fn events(&self) -> &[Event] {
        &self.events
    }

    /// Writes a Chrome trace (JSON) to `path`: open it in Perfetto or `chrome://tracing`.
    pub fn save_chrome_trace(&self, path: impl AsRef<Path>) -> Result<()> {
        let p = path.as_ref().to_str().ok_or_else(|| Error::Misuse("profile path is not UTF-8".into()))?;
        self.handle.save(p)
    }

    /// The figures of the GPU events (see [`Summary`]).
    pub fn summary(&self) -> Summary {
        Summary::of(&self.events)
    }
}

/// Busy time of one stream.
#[derive(Clone, Debug, PartialEq)]
pub struct StreamBusy {
    /// Device index.
    pub device: i32,
    /// Stream id.
    pub stream: i64,
    /// Kernels run there.
    pub kernels: usize,
    /// NCCL kernels among them.
    pub nccl_kernels: usize,
    /// Time with at least one GPU event running there, µs.
    pub busy_us: f64,
}

/// Figures of a profile's GPU events (kernels, copies, memsets); times are unions of intervals,
/// so concurrent work is counted once.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Summary {
    /// GPU kernels.
    pub kernels: usize,
    /// From the first GPU event's start to the last one's end, µs.
    pub span_us: f64,
    /// Time with any GPU event running, µs.
    pub busy_us: f64,
    /// Time with an NCCL kernel running, µs.
    pub nccl_us: f64,
    /// Time with a GPU event other than an NCCL kernel running, µs.
    pub compute_us: f64,
    /// Time with both an NCCL kernel and other GPU work running: the communication hidden
    /// behind compute, µs.
    pub overlap_us: f64,
    /// Per stream, in order of first use.
    pub streams: Vec<StreamBusy>,
}

impl Summary {
    /// NCCL time not hidden behind compute, µs.
    pub fn exposed_nccl_us(&self) -> f64 {
        self.nccl_us - self.overlap_us
    }

    /// The figures of `events` (only the GPU ones count).
    pub fn of(events: &[Event]) -> Summary {
        let gpu: Vec<&Event> = events.iter().filter(|e| e.kind.on_gpu()).collect();
        let iv = |pred: &dyn Fn(&Event) -> bool| -> Vec<(u64, u64)> {
            gpu.iter().filter(|e| pred(e)).map(|e| (e.start_ns, e.end_ns)).collect()
        };
        let all = union(iv(&|_| true));
        let nccl = union(iv(&|e| e.is_nccl()));
        let compute = union(iv(&|e| !e.is_nccl()));
        let mut streams: Vec<StreamBusy> = Vec::new();
        let mut per: Vec<Vec<(u64, u64)>> = Vec::new();
        for e in &gpu {
            let i = match streams.iter().position(|s| s.device == e.device && s.stream == e.stream) {
                Some(i) => i,
                None => {
                    streams.push(StreamBusy {
                        device: e.device,
                        stream: e.stream,
                        kernels: 0,
                        nccl_kernels: 0,
                        busy_us: 0.0,
                    });
                    per.push(Vec::new());
                    streams.len() - 1
                }
            };
            if e.kind == EventKind::Kernel {
                streams[i].kernels += 1;
            }
            if e.is_nccl() {
                streams[i].nccl_kernels += 1;
            }
            per[i].push((e.start_ns, e.end_ns));
        }
        for (s, iv) in streams.iter_mut().zip(per) {
            s.busy_us = length(&union(iv)) / 1e3;
        }
        let span = match (all.first(), all.last()) {
            (Some(a), Some(b)) => (b.1 - a.0) as f64 / 1e3,
            _ => 0.0,
        };
        Summary {
            kernels: gpu.iter().filter(|e| e.kind == EventKind::Kernel).count(),
            span_us: span,
            busy_us: length(&all) / 1e3,
            nccl_us: length(&nccl) / 1e3,
            compute_us: length(&compute) / 1e3,
            overlap_us: length(&intersect(&nccl, &compute)) / 1e3,
            streams,
        }
    }
}

/// Sorted, disjoint intervals covering the same time as `v`.
fn union(mut v: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    v.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(v.len());
    for (s, e) in v {
        match out.last_mut() {
            Some(last) if s <= last.1 => last.1 = last.1.max(e),
            _ => out.push((s, e)),
        }
    }
    out
}

/// The intersection of two sorted, disjoint interval lists.
fn intersect(a: &[(u64, u64)], b: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let (mut i, mut j, mut out) = (0, 0, Vec::new());
    while i < a.len() && j < b.len() {
        let (s, e) = (a[i].0.max(b[j].0), a[i].1.min(b[j].1));
        if s < e {
            out.push((s, e));
        }
        if a[i].1 < b[j].1 {
            i += 1;
        } else {
            j += 1;
        }
    }
    out
}

fn length(v: &[(u64, u64)]) -> f64 {
    v.iter().map(|(s, e)| (e - s) as f64).sum()
}
