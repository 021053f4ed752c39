//! Each allocator entry point as the very first CUDA call of a process (PyTorch's
//! `torch.cuda.memory_stats()` initializes CUDA lazily; so must this crate). The test runs this
//! binary again once per entry point, in a fresh process that makes no other CUDA call first.
//! Needs a CUDA device (`#[ignore]` by default) and fails loudly without one.

use std::process::Command;
use tch::Device;
use tch_cuda_graphs::{
    empty_cache, graph_pool_handle, memory_stats, pool_memory, reset_peak_stats, CaptureOptions, CudaGraph, Error,
    PoolId,
};

const CHILD: &str = "TCG_FIRST_CALL";

/// In a child process: makes exactly one call, the one named by $TCG_FIRST_CALL.
fn first_call(name: &str) -> Result<String, Error> {
    let d = Device::Cuda(0);
    match name {
        "memory_stats" => memory_stats(d).map(|s| format!("{s:?}")),
        "reset_peak_stats" => reset_peak_stats(d).map(|()| "ok".into()),
        "pool_memory" => pool_memory(d, PoolId::PRIVATE).map(|p| format!("{p:?}")),
        "empty_cache" => empty_cache().map(|()| "ok".into()),
        "graph_pool_handle" => graph_pool_handle().map(|p| format!("{p:?}")),
        other => panic!("unknown entry point {other}"),
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn allocator_entry_points_work_as_the_first_cuda_call() {
    if let Ok(name) = std::env::var(CHILD) {
        // the child: nothing before this call touches CUDA
        match first_call(&name) {
            Ok(v) => println!("CHILD-OK {name}: {v}"),
            Err(e) => panic!("{name} as the first CUDA call failed: {e:?}"),
        }
        return;
    }
    assert!(tch::Cuda::is_available(), "this test needs a CUDA device, and none is available");
    for name in ["memory_stats", "reset_peak_stats", "pool_memory", "empty_cache", "graph_pool_handle"] {
        in_a_fresh_process("allocator_entry_points_work_as_the_first_cuda_call", CHILD, name);
    }
}

/// Runs test `test` of this binary again in a new process with `var=value`, and requires it to
/// exit 0 having printed its `CHILD-OK` line (a child that ran no test prints none).
fn in_a_fresh_process(test: &str, var: &str, value: &str) {
    let exe = std::env::current_exe().unwrap();
    let out = Command::new(&exe)
        .args(["--exact", test, "--include-ignored", "--nocapture"])
        .env(var, value)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().find(|l| l.contains("CHILD-OK")).map(str::to_owned);
    println!("{value}: {}", line.as_deref().unwrap_or("(no result)"));
    assert!(
        out.status.success() && line.is_some(),
        "{test} with {var}={value} failed in its own process:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The process's first cuBLAS call inside a capture, with no warmup: `cublasCreate` cannot run
/// while a stream captures, so the crate makes the cuBLAS and cuBLASLt handles (and their
/// workspaces) for the capture stream before the capture begins. Runs in a fresh process.
const FIRST_MATMUL: &str = "TCG_FIRST_MATMUL";

fn capture_first_matmul() -> Result<f64, Error> {
    let d = Device::Cuda(0);
    let a = tch::Tensor::ones([64, 64], (tch::Kind::Float, d));
    let b = tch::Tensor::ones([64, 64], (tch::Kind::Float, d)) * 2.0;
    let mut graph = CudaGraph::new()?;
    let out = graph.capture(CaptureOptions::default(), || Ok(a.matmul(&b)))?;
    graph.replay()?;
    let linear = tch::Tensor::ones([64, 512], (tch::Kind::Float, d));
    let biased = graph_linear(&linear, d)?;
    // every element of ones(64x64) @ (2 * ones(64x64)) is 64 * 2 = 128
    let max_err = (&out - 128.0).abs().max().double_value(&[]) + biased;
    Ok(max_err)
}

/// A second capture in the same process, of `addmm` (cuBLASLt with a bias epilogue on recent
/// GPUs), also without warmup: the cuBLASLt handle and workspace exist already. Returns its error.
fn graph_linear(x: &tch::Tensor, d: Device) -> Result<f64, Error> {
    let w = tch::Tensor::ones([8, 512], (tch::Kind::Float, d));
    let bias = tch::Tensor::ones([8], (tch::Kind::Float, d));
    let mut graph = CudaGraph::new()?;
    let out = graph.capture(CaptureOptions::default(), || Ok(x.linear(&w, Some(&bias))))?;
    graph.replay()?;
    Ok((&out - 513.0).abs().max().double_value(&[]))
}

#[test]
#[ignore = "needs a CUDA device"]
fn a_capture_whose_matmul_is_the_processs_first_cublas_call_works() {
    if std::env::var(FIRST_MATMUL).is_ok() {
        match capture_first_matmul() {
            Ok(err) => {
                assert_eq!(err, 0.0, "replayed matmul differs from the exact result by {err}");
                println!("CHILD-OK first matmul captured raw, max error {err}");
            }
            Err(e) => panic!("capturing the first matmul of the process failed: {e:?}"),
        }
        return;
    }
    assert!(tch::Cuda::is_available(), "this test needs a CUDA device, and none is available");
    in_a_fresh_process("a_capture_whose_matmul_is_the_processs_first_cublas_call_works", FIRST_MATMUL, "1");
}
