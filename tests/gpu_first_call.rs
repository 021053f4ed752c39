//! Each allocator entry point as the very first CUDA call of a process (PyTorch's
//! `torch.cuda.memory_stats()` initializes CUDA lazily; so must this crate). The test runs this
//! binary again once per entry point, in a fresh process that makes no other CUDA call first.
//! Needs a CUDA device (`#[ignore]` by default) and fails loudly without one.

use std::process::Command;
use tch::Device;
use tch_cuda_graphs::{empty_cache, graph_pool_handle, memory_stats, pool_memory, reset_peak_stats, Error, PoolId};

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
    let exe = std::env::current_exe().unwrap();
    for name in ["memory_stats", "reset_peak_stats", "pool_memory", "empty_cache", "graph_pool_handle"] {
        let out = Command::new(&exe)
            .args(["--exact", "allocator_entry_points_work_as_the_first_cuda_call", "--include-ignored", "--nocapture"])
            .env(CHILD, name)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let line = stdout.lines().find(|l| l.contains("CHILD-OK")).map(str::to_owned);
        println!("{name}: {}", line.as_deref().unwrap_or("(no result)"));
        assert!(
            out.status.success() && line.is_some(),
            "{name} as the first CUDA call of a process failed:\n{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
