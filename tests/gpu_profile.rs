//! The profiler on the GPU: CUPTI sees the kernels inside graph replays, one by one, and the
//! Chrome trace holds them. Needs a CUDA device (`#[ignore]` by default) and fails loudly
//! without one.

mod common;

use common::cuda;
use tch::{Kind, Tensor};
use tch_cuda_graphs::profiler::{EventKind, Profiler};
use tch_cuda_graphs::{synchronize, CaptureOptions, CudaGraph};

#[test]
#[ignore = "needs a CUDA device"]
fn the_profiler_sees_every_kernel_inside_graph_replays() {
    let d = cuda();
    let mut x = Tensor::ones([1 << 16], (Kind::Float, d));
    let mut g = CudaGraph::new().unwrap();
    g.capture(CaptureOptions::default(), || {
        let _ = x.f_mul_scalar_(1.0)?; // three kernels
        let _ = x.f_add_scalar_(1.0)?;
        let _ = x.f_sub_scalar_(1.0)?;
        Ok(())
    })
    .unwrap();
    g.replay().unwrap(); // the first replay uploads; leave it out of the profile
    synchronize(d).unwrap();
    let prof = Profiler::start().unwrap();
    for _ in 0..5 {
        g.replay().unwrap();
    }
    synchronize(d).unwrap();
    let profile = prof.stop().unwrap();
    let s = profile.summary();
    let kernels: Vec<&str> =
        profile.events().iter().filter(|e| e.kind == EventKind::Kernel).map(|e| e.name.as_str()).collect();
    println!(
        "5 replays of a 3-kernel graph: {} kernels profiled, GPU busy {:.1} µs over a span of {:.1} µs, {} stream(s); \
         first: {:?}",
        s.kernels,
        s.busy_us,
        s.span_us,
        s.streams.len(),
        kernels.first()
    );
    assert_eq!(s.kernels, 15, "every kernel of every replay");
    assert!(s.busy_us > 0.0 && s.busy_us <= s.span_us);
    assert_eq!((s.nccl_us, s.overlap_us), (0.0, 0.0));
    let path = std::env::temp_dir().join(format!("tcg-gpu-profile-{}.json", std::process::id()));
    profile.save_chrome_trace(&path).unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    let _ = std::fs::remove_file(&path);
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    let in_trace =
        json["traceEvents"].as_array().unwrap().iter().filter(|e| e["cat"].as_str() == Some("kernel")).count();
    println!("Chrome trace: {} bytes, {in_trace} kernel events", text.len());
    assert_eq!(in_trace, 15);
}
