//! The benchmarks' timing method: the median over blocks of `BLOCK` steps of (block time /
//! `BLOCK`), after `WARMUP` steps, the device synchronized before and after each block
//! (`torch_reference.py`'s `time_steps` is the same on PyTorch's side).
#![allow(dead_code)]

use std::time::Instant;
use tch::Device;
use tch_cuda_graphs::{synchronize, Result};

pub const BLOCK: usize = 50;
pub const WARMUP: usize = 20;

pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// Median µs per step of `step(i)` over at least `steps` steps.
pub fn time_steps(device: Device, steps: usize, mut step: impl FnMut(usize)) -> f64 {
    for i in 0..WARMUP {
        step(i);
    }
    let mut per_step = Vec::new();
    let mut i = 0;
    for _ in 0..steps.div_ceil(BLOCK) {
        synchronize(device).unwrap();
        let t = Instant::now();
        for _ in 0..BLOCK {
            step(i);
            i += 1;
        }
        synchronize(device).unwrap();
        per_step.push(t.elapsed().as_secs_f64() * 1e6 / BLOCK as f64);
    }
    median(per_step)
}

/// Median ms per call of `f` over blocks of 10 calls, after 10 warmup calls.
pub fn median_ms(device: Device, iters: usize, mut f: impl FnMut(usize) -> Result<()>) -> Result<f64> {
    for i in 0..10 {
        f(i)?;
    }
    let mut i = 10;
    synchronize(device)?;
    let per = (0..(iters / 10).max(1)).map(|_| block_ms(device, &mut i, &mut f)).collect::<Result<Vec<f64>>>()?;
    Ok(median(per))
}

/// Median ms per call of `f` over blocks of 10 calls, timed for `measure` after `warmup` of calls
/// (each at least one block), and the timed window: a step measured at the state it holds in a
/// long run (at the GPU's power limit, after its first seconds of power averaged under the limit).
pub fn steady_ms(
    device: Device,
    warmup: std::time::Duration,
    measure: std::time::Duration,
    mut f: impl FnMut(usize) -> Result<()>,
) -> Result<(f64, Instant, Instant)> {
    let mut i = 0;
    let start = Instant::now();
    while i == 0 || start.elapsed() < warmup {
        block_ms(device, &mut i, &mut f)?;
    }
    let from = Instant::now();
    let mut per = Vec::new();
    while per.is_empty() || from.elapsed() < measure {
        per.push(block_ms(device, &mut i, &mut f)?);
    }
    Ok((median(per), from, Instant::now()))
}

/// One block of 10 calls of `f` (from call `*i` on), the device synchronized after it: ms per
/// call, the device having been synchronized before by the caller or the block before.
fn block_ms(device: Device, i: &mut usize, f: &mut impl FnMut(usize) -> Result<()>) -> Result<f64> {
    let t = Instant::now();
    for _ in 0..10 {
        f(*i)?;
        *i += 1;
    }
    synchronize(device)?;
    Ok(t.elapsed().as_secs_f64() * 1e3 / 10.0)
}
