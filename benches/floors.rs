//! The fused norm's kernels beside a device-to-device copy of the bytes they must move
//! (`bench gpt -- --floors`): how close the memory-bound kernels of the fused step come to what
//! the GPU's memory allows at the step's own shapes.
//!
//! At a row's shape ([batch · block, width], the row's dropout) one fused LayerNorm with the
//! residual add runs as the fused step runs it: a float32 residual stream, a bf16 branch under
//! bf16 autocast, bf16 out. Its forward moves 12 bytes a value (the stream and the branch read,
//! the new stream and the output written), its backward 16 (the stream's gradient, the stream and
//! the output's gradient read, the two input gradients written; the per-block partial sums of
//! the weight and bias gradients are not counted). Each kernel's time, and a `copy_` of as many
//! bytes (a device-to-device memcpy: half of them read, half written), come from the crate's
//! profiler over 20 calls: the median call.

use crate::kernel_profile;
use tch::{nn, Device, Kind, Tensor};
use tch_cuda_graphs::amp::Autocast;
use tch_cuda_graphs::kernels::Kernels;
use tch_cuda_graphs::norm::{layer_norm, NormConfig, NormKind};
use tch_cuda_graphs::profiler::{Event, EventKind};
use tch_cuda_graphs::Result;

const CALLS: usize = 20;

/// One kernel beside a copy of the bytes it must move.
#[derive(Debug, Clone)]
pub struct Floor {
    /// What ran: "forward" or "backward".
    pub pass: &'static str,
    pub rows: i64,
    pub cols: i64,
    /// Bytes the kernel must move (reads and writes).
    pub bytes: f64,
    /// The kernel's median call, µs.
    pub us: f64,
    /// A device-to-device copy of `bytes` (half read, half written), µs.
    pub copy_us: f64,
}

impl Floor {
    /// Bytes moved per second, TB/s.
    pub fn tbps(&self) -> f64 {
        self.bytes / self.us / 1e6
    }
    /// The copy's TB/s.
    pub fn copy_tbps(&self) -> f64 {
        self.bytes / self.copy_us / 1e6
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Durations (µs) of the profiled events of `kind` whose name contains `name`.
fn durations(events: &[Event], kind: EventKind, name: &str) -> Vec<f64> {
    events
        .iter()
        .filter(|e| e.kind == kind && e.name.contains(name))
        .map(|e| (e.end_ns - e.start_ns) as f64 / 1e3)
        .collect()
}

/// A copy of `bytes` bytes moved (`bytes / 2` read and written), the median of [`CALLS`], µs.
fn copy_us(device: Device, bytes: f64) -> Result<f64> {
    let n = (bytes / 2.0) as i64;
    let src = Tensor::f_zeros([n], (Kind::Uint8, device))?;
    let mut dst = Tensor::f_empty([n], (Kind::Uint8, device))?;
    dst.f_copy_(&src)?;
    let profile = kernel_profile::profiled(device, CALLS, || dst.f_copy_(&src).map(drop).map_err(Into::into))?;
    Ok(median(durations(profile.events(), EventKind::Memcpy, "")))
}

/// The fused LayerNorm's forward and backward at [rows, cols] with dropout `p`, each beside a
/// copy of its bytes.
pub fn norm(device: Device, rows: i64, cols: i64, p: f64) -> Result<Vec<Floor>> {
    tch::manual_seed(0);
    let vs = nn::VarStore::new(device);
    let config = NormConfig { kind: NormKind::Layer, kernels: Kernels::Own, bias: true, ..Default::default() };
    let ln = layer_norm(vs.root(), vec![cols], config);
    let res = Tensor::f_randn([rows, cols], (Kind::Float, device))?.set_requires_grad(true);
    let branch = Tensor::f_randn([rows, cols], (Kind::BFloat16, device))?.set_requires_grad(true);
    let dy = Tensor::f_randn([rows, cols], (Kind::Float, device))?;
    let dx = Tensor::f_randn([rows, cols], (Kind::Float, device))?;
    let step = || -> Result<()> {
        let (x, y) = {
            let _autocast = Autocast::new(Kind::BFloat16, false)?;
            ln.f_forward_residual(&res, &branch, p, true)?
        };
        let loss = y.f_to_kind(Kind::Float)?.f_mul(&dy)?.f_sum(Kind::Float)? + x.f_mul(&dx)?.f_sum(Kind::Float)?;
        Tensor::f_run_backward(&[&loss], &[&res, &branch], false, false)?;
        Ok(())
    };
    for _ in 0..3 {
        step()?;
    }
    let profile = kernel_profile::profiled(device, CALLS, step)?;
    let values = (rows * cols) as f64;
    let mut floors = Vec::new();
    for (pass, name, per_value) in [("forward", "tcg_norm_fwd", 12.0), ("backward", "tcg_norm_bwd", 16.0)] {
        let bytes = values * per_value;
        let us = median(durations(profile.events(), EventKind::Kernel, name));
        floors.push(Floor { pass, rows, cols, bytes, us, copy_us: copy_us(device, bytes)? });
    }
    Ok(floors)
}

/// The floors as a markdown table, each kernel's TB/s also as a share of `peak_tbps`.
pub fn report(named: &[(String, Vec<Floor>)], peak_tbps: f64) -> String {
    use std::fmt::Write as _;
    let mut s = format!(
        "| row | kernel | shape | MB moved | µs | TB/s | copy of those bytes: µs | TB/s | kernel / copy | kernel's share of {peak_tbps} TB/s |\n|---|---|---|---:|---:|---:|---:|---:|---:|---:|\n"
    );
    for (row, floors) in named {
        for f in floors {
            let _ = writeln!(
                s,
                "| {row} | norm {} | [{}, {}] | {:.1} | {:.1} | {:.2} | {:.1} | {:.2} | {:.2} | {:.0}% |",
                f.pass,
                f.rows,
                f.cols,
                f.bytes / 1e6,
                f.us,
                f.tbps(),
                f.copy_us,
                f.copy_tbps(),
                f.us / f.copy_us,
                100.0 * f.tbps() / peak_tbps
            );
        }
    }
    s
}
