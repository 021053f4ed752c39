//! Kernel time of a captured step's replays, grouped by kernel family, as the language models'
//! benches print it (`bench gpt -- --profile`, `bench llama -- --profile`): the crate's profiler
//! around a number of replays, each kernel's time divided by the replays.
#![allow(dead_code)]

use std::collections::BTreeMap;
use tch::Device;
use tch_cuda_graphs::profiler::{EventKind, Profile, Profiler};
use tch_cuda_graphs::{synchronize, Result};

/// Kernel time per replay: by family and by kernel (launches, µs), the total, the replay span.
#[derive(Debug, Default)]
pub struct KernelTimes {
    pub families: BTreeMap<&'static str, (usize, f64)>,
    pub kernels: BTreeMap<String, (usize, f64)>,
    /// All kernels: launches and µs per replay.
    pub total: (usize, f64),
    /// µs per replay the GPU was busy, and the span from first to last event.
    pub busy_us: f64,
    pub span_us: f64,
}

/// The family of a kernel, by its name: the crate's own kernels by their `tcg_` names, then
/// PyTorch's and the libraries' by what their names hold.
pub fn family(name: &str) -> &'static str {
    let n = name.to_lowercase();
    let has = |keys: &[&str]| keys.iter().any(|k| n.contains(k));
    if has(&["tcg_norm"]) {
        "norms (+ residual add)"
    } else if has(&["tcg_ce_", "tcg_embedding"]) {
        "loss and embeddings"
    } else if has(&["tcg_rotary"]) {
        "rotary"
    } else if has(&["tcg_swiglu"]) {
        "SwiGLU"
    } else if has(&["tcg_gelu"]) {
        "GELU"
    } else if has(&["tcg_split"]) {
        "split projection (gradients packed, bias gradient)"
    } else if has(&["tcg_wgrad"]) {
        "reductions"
    } else if has(&["tcg_", "adam", "multi_tensor", "fused_sgd"]) {
        "optimizer"
    } else if has(&["sdpa", "flash", "fmha", "attention"]) {
        "attention"
    } else if has(&["bgrad"]) {
        "bias gradients (cuBLASLt)"
    } else if has(&["gemm", "nvjet", "cutlass", "xmma", "cublas"]) {
        "GEMM"
    } else if has(&["layer_norm", "layernorm", "gammabeta"]) {
        "norms (+ residual add)"
    } else if has(&["dropout"]) {
        "dropout"
    } else if has(&["copy"]) {
        "dtype casts and copies"
    } else if has(&["reduce", "norm"]) {
        "reductions"
    } else if has(&["gelu"]) {
        "GELU"
    } else if has(&["silu"]) {
        "SwiGLU"
    } else if has(&["softmax", "nll", "cross_entropy", "log_softmax", "embedding", "index"]) {
        "loss and embeddings"
    } else {
        "other element-wise"
    }
}

/// The crate's profiler around `calls` calls of `f`, the device synchronized before and after.
pub fn profiled(device: Device, calls: usize, mut f: impl FnMut() -> Result<()>) -> Result<Profile> {
    synchronize(device)?;
    let prof = Profiler::start()?;
    for _ in 0..calls {
        f()?;
    }
    synchronize(device)?;
    prof.stop()
}

/// Profiles `replays` calls of `replay` (a captured step, warm) and sums its kernels.
pub fn measure(device: Device, replays: usize, replay: impl FnMut() -> Result<()>) -> Result<KernelTimes> {
    let profile = profiled(device, replays, replay)?;
    let mut t = KernelTimes::default();
    for e in profile.events().iter().filter(|e| e.kind == EventKind::Kernel) {
        let us = (e.end_ns - e.start_ns) as f64 / 1e3 / replays as f64;
        for f in [t.families.entry(family(&e.name)).or_default(), t.kernels.entry(e.name.clone()).or_default()] {
            f.0 += 1;
            f.1 += us;
        }
        t.total.0 += 1;
        t.total.1 += us;
    }
    let n = |(k, us): (usize, f64)| (k / replays, us);
    t.families.values_mut().for_each(|v| *v = n(*v));
    t.kernels.values_mut().for_each(|v| *v = n(*v));
    t.total.0 /= replays;
    let s = profile.summary();
    (t.busy_us, t.span_us) = (s.busy_us / replays as f64, s.span_us / replays as f64);
    Ok(t)
}

/// The families of one or more profiles side by side (kernels, µs per replay), largest first by
/// the first profile, and the `top` longest kernels of each.
pub fn report(titled: &[(&str, &KernelTimes)], top: usize) -> String {
    use std::fmt::Write as _;
    let mut s = String::from("| family |");
    let mut rule = String::from("|---|");
    for (title, _) in titled {
        let _ = write!(s, " {title}: kernels | µs |");
        rule.push_str("---:|---:|");
    }
    let _ = writeln!(s, "\n{rule}");
    let mut names: Vec<&'static str> = titled.iter().flat_map(|(_, t)| t.families.keys().copied()).collect();
    names.sort_unstable();
    names.dedup();
    let first = |f: &str| titled.first().and_then(|(_, t)| t.families.get(f)).map_or(0.0, |v| v.1);
    names.sort_by(|a, b| first(b).total_cmp(&first(a)));
    for f in names {
        let _ = write!(s, "| {f} |");
        for (_, t) in titled {
            let (k, us) = t.families.get(f).copied().unwrap_or_default();
            let _ = write!(s, " {k} | {us:.0} |");
        }
        s.push('\n');
    }
    let _ = write!(s, "| **all** (replay span) |");
    for (_, t) in titled {
        let _ = write!(s, " {} | **{:.0}** ({:.0}) |", t.total.0, t.total.1, t.span_us);
    }
    s.push('\n');
    for (title, t) in titled {
        let mut kernels: Vec<_> = t.kernels.iter().collect();
        kernels.sort_by(|a, b| b.1 .1.total_cmp(&a.1 .1));
        let _ = writeln!(
            s,
            "\n{title}: the {top} kernels that take longest, per replay\n\n| kernel | launches | µs |\n|---|---:|---:|"
        );
        for (k, (n, us)) in kernels.into_iter().take(top) {
            let short: String = k.chars().take(100).collect();
            let _ = writeln!(s, "| `{short}` | {n} | {us:.0} |");
        }
    }
    s
}
