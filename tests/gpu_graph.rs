//! GPU tests of the core: capture, replay, pools, memory, failure paths. Each needs a CUDA
//! device (`#[ignore]` by default; `make test-gpu` or `cargo test -- --include-ignored`), and
//! fails loudly without one. Modelled on PyTorch's `test/test_cuda.py` graph tests.

mod common;

use common::cuda;
use std::error::Error as _;
use std::panic::{catch_unwind, AssertUnwindSafe};
use tch::{Device, Kind, Tensor};
use tch_cuda_graphs::testing::{fail_next, FaultPoint};
use tch_cuda_graphs::{
    capture_with_warmup, empty_cache, graph_pool_handle, memory_stats, pool_memory, synchronize, CaptureMode,
    CaptureOptions, CaptureStatus, CudaGraph, Error, MemPool, MemoryStats, PoolId, Stream, StreamGuard,
};

fn full(v: f64, n: i64, d: Device) -> Tensor {
    Tensor::full([n], v, (Kind::Float, d))
}

fn value(t: &Tensor) -> f64 {
    f64::try_from(t.mean(Kind::Double)).unwrap()
}

/// Synchronizes the current (capturing) stream: illegal during capture, CUDA invalidates it.
fn sync_current_stream(d: Device) -> tch_cuda_graphs::Result<()> {
    Stream::current(d)?.synchronize()
}

/// Synchronizes, returns cached memory, and asserts that allocated and reserved memory are back
/// at `start` (both printed); returns the figures now.
fn assert_memory_back(d: Device, start: &MemoryStats, what: &str) -> MemoryStats {
    synchronize(d).unwrap();
    empty_cache().unwrap();
    let end = memory_stats(d).unwrap();
    println!(
        "{what}: allocated {} -> {} bytes, reserved {} -> {} bytes",
        start.allocated, end.allocated, start.reserved, end.reserved
    );
    assert_eq!((end.allocated, end.reserved), (start.allocated, start.reserved), "{what}: memory is back");
    end
}

/// Eager work and a fresh capture both work: the process is healthy after a failure.
fn assert_healthy(d: Device) {
    let mut a = full(2.0, 1024, d);
    assert_eq!(value(&(&a * 3.0)), 6.0, "eager work after a failed capture");
    let mut g = CudaGraph::new().unwrap();
    let out = g.capture(CaptureOptions::default(), || Ok(a.f_mul_scalar(5.0)?)).unwrap();
    let _ = a.fill_(1.0);
    g.replay().unwrap();
    assert_eq!(value(&out), 5.0, "capture and replay after a failed capture");
    assert_eq!(Stream::current(d).unwrap().capture_status().unwrap(), CaptureStatus::None);
}

#[test]
#[ignore = "needs a CUDA device"]
fn replay_recomputes_from_new_static_input_data() {
    let d = cuda();
    let mut a = full(1.0, 1000, d);
    let b = full(2.0, 1000, d);
    let mut g = CudaGraph::new().unwrap();
    let c = g.capture(CaptureOptions::default(), || Ok(a.f_add(&b)?.f_mul_scalar(2.0)?)).unwrap();
    // Capture records: nothing ran.
    assert!(g.is_captured());
    g.replay().unwrap();
    assert_eq!(value(&c), 6.0);
    a.copy_(&full(10.0, 1000, d));
    g.replay().unwrap();
    assert_eq!(value(&c), 24.0);
    // test_graph_two_successive-like: replays are cumulative on state
    let acc = full(0.0, 16, d);
    let mut acc_in = acc.shallow_clone();
    let mut g2 = CudaGraph::new().unwrap();
    g2.capture(CaptureOptions::default(), || Ok(acc_in.f_add_scalar_(1.0).map(drop)?)).unwrap();
    for _ in 0..5 {
        g2.replay().unwrap();
    }
    assert_eq!(value(&acc), 5.0);
    g.upload().unwrap();
    g.replay().unwrap();
}

#[test]
#[ignore = "needs a CUDA device"]
fn capture_restores_the_previous_stream_not_the_default() {
    let d = cuda();
    let mine = Stream::from_pool(d).unwrap();
    let _guard = StreamGuard::new(&mine).unwrap();
    assert_eq!(Stream::current(d).unwrap(), mine);
    let a = full(1.0, 8, d);
    let mut g = CudaGraph::new().unwrap();
    let _out = g.capture(CaptureOptions::default(), || Ok(a.f_add_scalar(1.0)?)).unwrap();
    assert_eq!(Stream::current(d).unwrap(), mine, "capture must restore the stream that was current");
    // and after a failed capture too
    let r = g.reset().and_then(|()| g.capture(CaptureOptions::default(), || sync_current_stream(d)));
    assert!(matches!(r, Err(Error::CaptureInvalidated { .. })), "{r:?}");
    assert_eq!(Stream::current(d).unwrap(), mine);
}

#[test]
#[ignore = "needs a CUDA device"]
fn two_graphs_sharing_a_pool_reserve_less_than_separate_pools() {
    let d = cuda();
    let n = 8 * 1024 * 1024; // 32 MiB of floats
    let x = Tensor::randn([n], (Kind::Float, d));
    // Each graph makes large temporaries that die inside the capture, and a small output.
    let work = |x: &Tensor| -> tch_cuda_graphs::Result<Tensor> {
        let t1 = x.f_mul_scalar(2.0)?;
        let t2 = t1.f_add_scalar(1.0)?;
        let t3 = t2.f_relu()?;
        Ok(t3.f_sum(Kind::Float)?)
    };
    let measure = |shared: bool| -> i64 {
        synchronize(d).unwrap();
        empty_cache().unwrap();
        let before = memory_stats(d).unwrap().reserved;
        let mut g1 = CudaGraph::new().unwrap();
        let o1 = g1.capture(CaptureOptions::default(), || work(&x)).unwrap();
        let opts = if shared { CaptureOptions::default().pool(g1.pool().unwrap()) } else { CaptureOptions::default() };
        let mut g2 = CudaGraph::new().unwrap();
        let o2 = g2.capture(opts.empty_cache(false), || work(&x)).unwrap();
        g1.replay().unwrap();
        g2.replay().unwrap();
        assert_eq!(value(&o1), value(&o2));
        let used = memory_stats(d).unwrap().reserved - before;
        drop((g1, g2, o1, o2));
        used
    };
    let separate = measure(false);
    let shared = measure(true);
    println!("two graphs, separate pools: {separate} bytes reserved; one shared pool: {shared} bytes reserved");
    assert!(shared < separate, "a shared pool must reserve less ({shared} vs {separate})");
}

#[test]
#[ignore = "needs a CUDA device"]
fn graph_pool_memory_is_released_after_drop_and_after_reset() {
    let d = cuda();
    let x = Tensor::randn([4 * 1024 * 1024], (Kind::Float, d));
    // A first capture with this graph makes libtorch's lazily created state (generator graph
    // buffers, handles) before the baseline is taken.
    let mut g = CudaGraph::new().unwrap();
    drop(g.capture(CaptureOptions::default(), || Ok(x.f_mul_scalar(1.0)?)).unwrap());
    g.reset().unwrap();
    synchronize(d).unwrap();
    empty_cache().unwrap();
    let base = memory_stats(d).unwrap();
    let out = g.capture(CaptureOptions::default(), || Ok(x.f_mul_scalar(3.0)?.f_exp()?)).unwrap();
    let pool = g.pool().unwrap();
    let pm = pool_memory(d, pool).unwrap();
    println!("private pool: {} bytes reserved, {} allocated", pm.reserved, pm.allocated);
    assert!(pm.reserved > 0 && pm.allocated > 0);
    // reset releases the pool; the output's block returns to it when the tensor dies
    g.reset().unwrap();
    drop(out);
    empty_cache().unwrap();
    let after_reset = memory_stats(d).unwrap();
    println!("reserved: base {} after reset {}", base.reserved, after_reset.reserved);
    assert_eq!(after_reset.reserved, base.reserved, "reserved after reset");
    assert_eq!(after_reset.allocated, base.allocated, "allocated after reset");
    assert_eq!(pool_memory(d, pool).unwrap().reserved, 0);
    // the same after drop, outputs dropped first this time (the graph's own state goes too)
    let out = g.capture(CaptureOptions::default(), || Ok(x.f_mul_scalar(3.0)?)).unwrap();
    let pool = g.pool().unwrap();
    drop(out);
    drop(g);
    empty_cache().unwrap();
    let after_drop = memory_stats(d).unwrap();
    println!("reserved: after drop {}", after_drop.reserved);
    assert!(after_drop.reserved <= base.reserved, "reserved after drop");
    assert!(after_drop.allocated <= base.allocated, "allocated after drop");
    assert_eq!(pool_memory(d, pool).unwrap().reserved, 0);
}

#[test]
#[ignore = "needs a CUDA device"]
fn outputs_stay_usable_after_the_graph_is_dropped() {
    // test_graph_memory_stats_and_use_result_after_destroy_graph
    let d = cuda();
    let a = full(3.0, 1 << 20, d);
    let mut g = CudaGraph::new().unwrap();
    let out = g.capture(CaptureOptions::default(), || Ok(a.f_mul_scalar(2.0)?)).unwrap();
    g.replay().unwrap();
    drop(g);
    empty_cache().unwrap();
    assert_eq!(value(&out), 6.0);
    let more = &out + 1.0;
    assert_eq!(value(&more), 7.0);
}

#[test]
#[ignore = "needs a CUDA device"]
fn random_ops_give_new_numbers_on_each_replay() {
    // test_graph_rng_functional / test_graph_rng_distributions
    let d = cuda();
    let x = Tensor::ones([4096], (Kind::Float, d));
    let mut g = CudaGraph::new().unwrap();
    let (r, drop_out) = g
        .capture(CaptureOptions::default(), || Ok((Tensor::f_rand([4096], (Kind::Float, d))?, x.f_dropout(0.5, true)?)))
        .unwrap();
    g.replay().unwrap();
    let (r1, d1) = (r.copy(), drop_out.copy());
    g.replay().unwrap();
    let (r2, d2) = (r.copy(), drop_out.copy());
    assert!(!r1.equal(&r2), "rand must differ between replays");
    assert!(!d1.equal(&d2), "dropout masks must differ between replays");
    let m = value(&r2);
    assert!((m - 0.5).abs() < 0.05, "uniform mean {m}");
    let kept = value(&d2.ne(0.0).to_kind(Kind::Float));
    assert!((kept - 0.5).abs() < 0.05, "dropout kept fraction {kept}");
}

#[test]
#[ignore = "needs a CUDA device"]
fn a_sync_during_capture_is_capture_invalidated_and_the_process_recovers() {
    let d = cuda();
    let a = full(1.0, 64, d);
    // a stream sync inside the closure: CUDA invalidates the capture
    let mut g = CudaGraph::new().unwrap();
    let r = g.capture(CaptureOptions::default(), || {
        let _s = a.f_sum(Kind::Float)?;
        sync_current_stream(d)
    });
    match &r {
        Err(Error::CaptureInvalidated { source }) => println!("stream sync during capture: {r:?} (source {source:?})"),
        other => panic!("expected CaptureInvalidated, got {other:?}"),
    }
    assert!(!g.is_captured());
    assert_healthy(d);
    // .item() (tch's double_value): whatever libtorch makes of it, the capture fails and is
    // torn down; CaptureInvalidated if CUDA invalidated it, the closure's Error::Torch if
    // libtorch refused before CUDA saw it
    let r = g.capture(CaptureOptions::default(), || Ok(a.f_sum(Kind::Float)?.f_double_value(&[])?));
    match &r {
        Err(Error::CaptureInvalidated { source }) => println!(".item() during capture: invalidated, source {source:?}"),
        Err(Error::Torch(e)) => println!(".item() during capture: refused by libtorch: {e}"),
        other => panic!("expected CaptureInvalidated or Torch, got {other:?}"),
    }
    assert!(!g.is_captured());
    assert_healthy(d);
    // f_to(Cpu) and f64::try_from (a copy to pageable CPU memory): libtorch refuses the copy
    // before CUDA sees it, so the capture is not invalidated: the closure's error comes back
    // unchanged (classified by the stream's status, not the message), and the capture is gone.
    for (what, r) in [
        ("f_to(Cpu)", g.capture(CaptureOptions::default(), || Ok(a.f_to(Device::Cpu)?)).map(drop)),
        (
            "f64::try_from",
            g.capture(CaptureOptions::default(), || Ok(f64::try_from(&a.f_sum(Kind::Float)?)?)).map(drop),
        ),
    ] {
        match &r {
            Err(Error::Torch(e)) => {
                println!("{what} during capture (refused by libtorch): {}", e.to_string().lines().next().unwrap_or(""))
            }
            other => panic!("{what}: expected the closure's Error::Torch, got {other:?}"),
        }
        assert!(!g.is_captured());
        assert_healthy(d);
    }
    assert!(!g.is_captured());
    assert_healthy(d);
    // .to(Device::Cpu): tch panics inside the closure; the panic resumes after the clean-up
    let caught = catch_unwind(AssertUnwindSafe(|| g.capture(CaptureOptions::default(), || Ok(a.to(Device::Cpu)))));
    assert!(caught.is_err(), "a panic in the closure resumes");
    assert_eq!(Stream::current(d).unwrap(), Stream::default_stream(d).unwrap(), "stream restored after a panic");
    assert_healthy(d);
    let r = Tensor::f_randn([16], (Kind::Float, d));
    assert!(r.is_ok(), "random ops after a failed capture: {r:?}");
    // the same graph captures fine afterwards
    let out = g.capture(CaptureOptions::default(), || Ok(a.f_add_scalar(1.0)?)).unwrap();
    g.replay().unwrap();
    assert_eq!(value(&out), 2.0);
    // relaxed and thread-local modes behave the same for a sync on the capturing stream
    for mode in [CaptureMode::ThreadLocal, CaptureMode::Relaxed] {
        let mut g = CudaGraph::new().unwrap();
        let r = g.capture(CaptureOptions::default().mode(mode), || sync_current_stream(d));
        assert!(matches!(r, Err(Error::CaptureInvalidated { .. })), "{mode:?}: {r:?}");
        assert_healthy(d);
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn a_panic_in_the_closure_ends_the_capture_and_the_process_recovers() {
    let d = cuda();
    let a = full(1.0, 64, d);
    let mut g = CudaGraph::new().unwrap();
    let caught = catch_unwind(AssertUnwindSafe(|| {
        let _ = g.capture(CaptureOptions::default(), || -> tch_cuda_graphs::Result<Tensor> {
            let _t = a.f_mul_scalar(2.0)?;
            panic!("user bug inside the closure");
        });
    }));
    let payload = caught.expect_err("a panic that did not invalidate the capture must resume");
    assert_eq!(payload.downcast_ref::<&str>().copied(), Some("user bug inside the closure"));
    assert!(!g.is_captured());
    assert_eq!(Stream::current(d).unwrap(), Stream::default_stream(d).unwrap(), "stream restored after a panic");
    assert_healthy(d);
    let out = g.capture(CaptureOptions::default(), || Ok(a.f_add_scalar(2.0)?)).unwrap();
    g.replay().unwrap();
    assert_eq!(value(&out), 3.0);
}

#[test]
#[ignore = "needs a CUDA device"]
fn capture_with_warmup_runs_the_closure_n_plus_one_times() {
    let d = cuda();
    let mut x = Tensor::randn([128, 128], (Kind::Float, d));
    let mut calls = 0;
    let (mut g, y) = capture_with_warmup(3, CaptureOptions::default(), || {
        calls += 1;
        Ok(x.f_matmul(&x)?.f_relu()?)
    })
    .unwrap();
    assert_eq!(calls, 4);
    x.copy_(&Tensor::randn([128, 128], (Kind::Float, d)));
    g.replay().unwrap();
    let want = x.matmul(&x).relu();
    assert!(y.allclose(&want, 1e-5, 1e-5, false), "replay must compute from the new input");
}

#[test]
#[ignore = "needs a CUDA device"]
fn a_graph_moved_to_another_thread_replays() {
    let d = cuda();
    let a = full(1.0, 256, d);
    let mut g = CudaGraph::new().unwrap();
    let out = g.capture(CaptureOptions::default(), || Ok(a.f_mul_scalar(4.0)?)).unwrap();
    let mut a2 = a.shallow_clone();
    let out2 = out.shallow_clone();
    let handle = std::thread::spawn(move || {
        let _ = a2.fill_(2.0);
        g.replay().unwrap();
        value(&out2)
    });
    assert_eq!(handle.join().unwrap(), 8.0);
}

#[test]
#[ignore = "needs a CUDA device"]
fn node_count_node_kinds_and_debug_dump_of_a_kept_graph() {
    let d = cuda();
    let a = full(1.0, 256, d);
    let mut g = CudaGraph::with_keep_graph(true).unwrap();
    let _out = g.capture(CaptureOptions::default(), || Ok(a.f_mul_scalar(2.0)?.f_add_scalar(1.0)?.f_exp()?)).unwrap();
    let n = g.node_count().unwrap();
    let kinds = g.node_kinds().unwrap();
    println!("kept graph: {n} nodes, {kinds:?}");
    assert_eq!(kinds.total(), n);
    assert!(kinds.kernel >= 3, "three element-wise kernels: {kinds:?}");
    let path = std::env::temp_dir().join(format!("tcg-dump-{}.dot", std::process::id()));
    g.debug_dump(&path).unwrap();
    let dot = std::fs::read_to_string(&path).unwrap();
    assert!(dot.contains("digraph"), "DOT output");
    let _ = std::fs::remove_file(&path);
    g.instantiate().unwrap();
    g.replay().unwrap();
    // not kept: node queries are misuse
    let mut h = CudaGraph::new().unwrap();
    let _o = h.capture(CaptureOptions::default(), || Ok(a.f_add_scalar(1.0)?)).unwrap();
    assert!(matches!(h.node_count(), Err(Error::Misuse(_))));
    assert!(matches!(h.debug_dump(&path), Err(Error::Misuse(_))));
}

#[test]
#[ignore = "needs a CUDA device"]
fn misuse_is_an_error_not_a_crash() {
    let d = cuda();
    let a = full(1.0, 16, d);
    let mut g = CudaGraph::new().unwrap();
    assert!(matches!(g.replay(), Err(Error::Misuse(_))), "replay before capture");
    assert!(matches!(g.upload(), Err(Error::Misuse(_))));
    assert!(matches!(g.pool(), Err(Error::Misuse(_))));
    assert!(matches!(g.capture_end(), Err(Error::Misuse(_))), "capture_end without capture_begin");
    // capture_begin on the default stream is refused by the shim
    assert!(matches!(g.capture_begin(PoolId::PRIVATE, CaptureMode::Global), Err(Error::Misuse(_))));
    let _out = g.capture(CaptureOptions::default(), || Ok(a.f_add_scalar(1.0)?)).unwrap();
    let again = g.capture(CaptureOptions::default(), || Ok(a.f_add_scalar(1.0)?));
    assert!(matches!(again, Err(Error::Misuse(_))), "capture twice: {again:?}");
    g.replay().unwrap();
    // low-level begin/end on a side stream, then abort
    let side = Stream::from_pool(d).unwrap();
    let mut h = CudaGraph::new().unwrap();
    {
        let _s = StreamGuard::new(&side).unwrap();
        h.capture_begin(PoolId::PRIVATE, CaptureMode::Global).unwrap();
        assert!(matches!(h.capture_begin(PoolId::PRIVATE, CaptureMode::Global), Err(Error::Misuse(_))));
        assert!(matches!(h.replay(), Err(Error::Misuse(_))));
        assert!(matches!(h.reset(), Err(Error::Misuse(_))));
        let _t = a.f_mul_scalar(3.0).unwrap();
        assert!(!h.capture_abort().unwrap(), "an active capture is not invalidated");
    }
    assert_healthy(d);
}

#[test]
#[ignore = "needs a CUDA device"]
fn reset_and_recapture_the_same_graph() {
    let d = cuda();
    let a = full(1.0, 64, d);
    let mut g = CudaGraph::new().unwrap();
    let o1 = g.capture(CaptureOptions::default(), || Ok(a.f_add_scalar(1.0)?)).unwrap();
    g.replay().unwrap();
    assert_eq!(value(&o1), 2.0);
    g.reset().unwrap();
    assert!(!g.is_captured());
    assert!(matches!(g.replay(), Err(Error::Misuse(_))));
    let o2 = g.capture(CaptureOptions::default(), || Ok(a.f_mul_scalar(10.0)?)).unwrap();
    g.replay().unwrap();
    assert_eq!(value(&o2), 10.0);
    assert_eq!(value(&o1), 2.0, "the first capture's output keeps its last value");
}

#[test]
#[ignore = "needs a CUDA device"]
fn a_hundred_failed_captures_leave_memory_where_it_started() {
    let d = cuda();
    let a = Tensor::randn([1 << 20], (Kind::Float, d));
    // one failed capture first, so lazily created state (handles, generator) is already there
    let mut g = CudaGraph::new().unwrap();
    let _ = g.capture(CaptureOptions::default(), || Ok(f64::try_from(&a.f_mul_scalar(2.0)?.f_sum(Kind::Float)?)?));
    synchronize(d).unwrap();
    empty_cache().unwrap();
    let start = memory_stats(d).unwrap();
    for i in 0..100 {
        let r = g.capture(CaptureOptions::default(), || {
            let big = a.f_mul_scalar(2.0)?; // allocated in the capture's pool
            let s = big.f_sum(Kind::Float)?;
            if i % 2 == 0 {
                sync_current_stream(d)?; // invalidates
                Ok(f64::try_from(&s)?)
            } else {
                Err(Error::Misuse("the closure gave up".into())) // plain error
            }
        });
        assert!(r.is_err());
    }
    assert_memory_back(d, &start, "100 failed captures");
    assert_healthy(d);
}

#[test]
#[ignore = "needs a CUDA device"]
fn graph_pool_handle_and_mempool_ids_work_as_capture_pools() {
    let d = cuda();
    let a = full(1.0, 1 << 16, d);
    let handle = graph_pool_handle().unwrap();
    assert!(!handle.is_private());
    let mut g1 = CudaGraph::new().unwrap();
    let o1 = g1.capture(CaptureOptions::default().pool(handle), || Ok(a.f_add_scalar(1.0)?)).unwrap();
    assert_eq!(g1.pool().unwrap(), handle);
    let mp = MemPool::new().unwrap();
    let id = mp.id();
    let before = mp.use_count().unwrap();
    let mut g2 = CudaGraph::new().unwrap();
    let o2 = g2.capture(CaptureOptions::default().pool(id), || Ok(a.f_add_scalar(2.0)?)).unwrap();
    assert_eq!(mp.use_count().unwrap(), before + 1, "a capture holds a reference to the MemPool");
    g1.replay().unwrap();
    g2.replay().unwrap();
    assert_eq!((value(&o1), value(&o2)), (2.0, 3.0));
    drop(mp); // the graph keeps the pool's memory alive
    g2.replay().unwrap();
    assert_eq!(value(&o2), 3.0);
}

/// An allocation beyond the device's memory inside a capture is Error::OutOfMemory (told by the
/// allocator's OOM counter, not the message), the capture is torn down, and memory comes back.
#[test]
#[ignore = "needs a CUDA device"]
fn out_of_memory_during_capture_is_reported_and_cleaned_up() {
    let d = cuda();
    let a = full(1.0, 1 << 20, d);
    let mut g = CudaGraph::new().unwrap();
    let _ = g.capture(CaptureOptions::default(), || Ok(a.f_mul_scalar(2.0)?)).unwrap();
    g.reset().unwrap();
    synchronize(d).unwrap();
    empty_cache().unwrap();
    let start = memory_stats(d).unwrap();
    for _ in 0..3 {
        let r = g.capture(CaptureOptions::default(), || {
            let _small = a.f_mul_scalar(3.0)?; // something already in the capture's pool
            Ok(Tensor::f_empty([1i64 << 40], (Kind::Float, d))?) // 4 TiB
        });
        match &r {
            Err(Error::OutOfMemory { source }) => {
                assert!(matches!(**source, Error::Torch(_)), "{source:?}");
            }
            other => panic!("expected OutOfMemory, got {other:?}"),
        }
        assert!(!g.is_captured());
    }
    let end = assert_memory_back(d, &start, "3 OOM captures");
    println!("OOMs counted {} -> {}", start.ooms, end.ooms);
    assert_eq!(end.ooms, start.ooms + 3);
    assert_healthy(d);
    // and in the warmup of capture_with_warmup
    let r = capture_with_warmup(1, CaptureOptions::default(), || Ok(Tensor::f_empty([1i64 << 40], (Kind::Float, d))?));
    assert!(matches!(r, Err(Error::OutOfMemory { .. })), "{r:?}");
    assert_healthy(d);
}

/// A failure after libtorch's capture_end made the cudaGraph_t (injected before instantiation)
/// destroys the graph in the teardown (libtorch's reset() then warns about nothing: before the
/// fix it was handed a nulled graph_ and warned, leaking the real one), returns the pool, and
/// leaves the graph ready to capture again. Kept and not-kept graphs alike, 50 times each.
#[test]
#[ignore = "needs a CUDA device"]
fn a_failure_after_the_graph_exists_tears_it_down() {
    let d = cuda();
    let a = Tensor::randn([1 << 20], (Kind::Float, d));
    for keep in [false, true] {
        let mut g = CudaGraph::with_keep_graph(keep).unwrap();
        let _ = g.capture(CaptureOptions::default(), || Ok(a.f_mul_scalar(2.0)?)).unwrap();
        g.reset().unwrap();
        synchronize(d).unwrap();
        empty_cache().unwrap();
        let start = memory_stats(d).unwrap();
        for _ in 0..50 {
            fail_next(Some(FaultPoint::GraphInstantiate)).unwrap();
            let r = g.capture(CaptureOptions::default(), || Ok(a.f_mul_scalar(2.0)?.f_exp()?));
            match &r {
                Err(Error::Libtorch(msg)) => {
                    assert!(msg.contains("injected"), "{msg}");
                    assert!(!msg.contains("warned"), "the teardown made libtorch warn: {msg}");
                }
                other => panic!("keep_graph={keep}: expected the injected Libtorch error, got {other:?}"),
            }
            assert!(!g.is_captured());
        }
        assert_memory_back(d, &start, &format!("keep_graph={keep}: 50 failures after the graph existed"));
        let out = g.capture(CaptureOptions::default(), || Ok(a.f_mul_scalar(0.0)?.f_add_scalar(4.0)?)).unwrap();
        g.replay().unwrap();
        assert_eq!(value(&out), 4.0);
    }
    fail_next(None).unwrap();
    assert_healthy(d);
}

/// A capture started inside a captured closure is refused (it would record into the outer
/// capture, or deadlock on the capture lock); the outer capture then fails cleanly.
#[test]
#[ignore = "needs a CUDA device"]
fn a_capture_inside_a_capture_is_refused() {
    let d = cuda();
    let a = full(1.0, 64, d);
    let mut outer = CudaGraph::new().unwrap();
    let r = outer.capture(CaptureOptions::default(), || {
        let mut inner = CudaGraph::new()?;
        inner.capture(CaptureOptions::default(), || Ok(a.f_add_scalar(1.0)?))
    });
    match &r {
        Err(Error::Misuse(msg)) => println!("nested capture: {msg}"),
        other => panic!("expected Misuse, got {other:?}"),
    }
    let r = capture_with_warmup(1, CaptureOptions::default(), || {
        capture_with_warmup(0, CaptureOptions::default(), || Ok(a.f_add_scalar(1.0)?)).map(drop)
    });
    assert!(matches!(r, Err(Error::Misuse(_))), "nested in warmup: {r:?}");
    assert_healthy(d);
}

/// Several threads capturing at once on one device: the capture lock makes each warmup and
/// capture run alone on the capture stream, so every graph holds exactly its own work. (Each
/// thread prepares its data and reference before a barrier and checks after another, so that
/// between them only the captures run.)
#[test]
#[ignore = "needs a CUDA device"]
fn concurrent_captures_on_one_device_each_get_their_own_work() {
    let d = cuda();
    let n = 4;
    let start = std::sync::Arc::new(std::sync::Barrier::new(n));
    let done = std::sync::Arc::new(std::sync::Barrier::new(n));
    let threads: Vec<_> = (1..=n)
        .map(|k| {
            let (start, done) = (start.clone(), done.clone());
            std::thread::spawn(move || {
                let x = Tensor::randn([256, 256], (Kind::Float, d)) / 16.0;
                let work = |x: &Tensor| -> tch_cuda_graphs::Result<Tensor> {
                    // enough kernels that unlocked captures would interleave
                    let mut t = x.f_mul_scalar(k as f64)?;
                    for _ in 0..20 {
                        t = t.f_matmul(x)?.f_tanh()?;
                    }
                    Ok(t)
                };
                let want = work(&x).unwrap();
                synchronize(d).unwrap();
                start.wait();
                let mut runs = 0;
                let captured = capture_with_warmup(3, CaptureOptions::default(), || {
                    runs += 1;
                    work(&x)
                });
                done.wait();
                let (mut g, y) = captured.unwrap();
                for _ in 0..3 {
                    g.replay().unwrap();
                }
                synchronize(d).unwrap();
                let diff = f64::try_from((&y - &want).abs().max()).unwrap();
                (k, runs, diff)
            })
        })
        .collect();
    for t in threads {
        let (k, runs, diff) = t.join().expect("a capturing thread failed");
        println!("thread {k}: {runs} runs of its closure, max |replay - eager| = {diff:e}");
        assert_eq!(runs, 4);
        assert!(diff <= 1e-5, "thread {k}: its graph does not compute its own work ({diff})");
    }
}

/// retain keeps what the graph reads alive after the caller's handles are gone: the replay
/// still reads the retained input, not memory the allocator gave to someone else.
#[test]
#[ignore = "needs a CUDA device"]
fn retained_inputs_outlive_their_handles() {
    let d = cuda();
    let n = 1 << 20;
    let x = full(3.0, n, d);
    let mut g = CudaGraph::new().unwrap();
    let y = g.capture(CaptureOptions::default(), || Ok(x.f_mul_scalar(2.0)?)).unwrap();
    g.retain(x); // the only handle of the input is now the graph's
                 // allocate and fill as much as the input's block: without retain, the allocator would hand
                 // the freed block out again and the replay would read 7.0s
    let others: Vec<Tensor> = (0..8).map(|_| full(7.0, n, d)).collect();
    g.replay().unwrap();
    assert_eq!(value(&y), 6.0);
    drop(others);
    g.reset().unwrap(); // releases what was retained
}

/// Sets its flag when dropped.
struct DropFlag(std::sync::Arc<std::sync::atomic::AtomicBool>);

impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

/// What captured work hands to `retain_in_capture` lives as long as the graph (the way a
/// process group outlives the graphs holding its NCCL kernels); outside a capture, and in a
/// capture that fails, it is dropped at once.
#[test]
#[ignore = "needs a CUDA device"]
fn retain_in_capture_ties_an_object_to_the_graph_being_recorded() {
    use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
    use std::sync::Arc;
    let d = cuda();
    let x = full(1.0, 8, d);
    let outside = Arc::new(AtomicBool::new(false));
    assert!(!tch_cuda_graphs::retain_in_capture(d, DropFlag(outside.clone())), "no capture under way");
    assert!(outside.load(SeqCst), "dropped at once outside a capture");
    let kept = Arc::new(AtomicBool::new(false));
    let mut g = CudaGraph::new().unwrap();
    let y = g
        .capture(CaptureOptions::default(), || {
            assert!(tch_cuda_graphs::retain_in_capture(d, DropFlag(kept.clone())));
            Ok(x.f_add_scalar(1.0)?)
        })
        .unwrap();
    g.replay().unwrap();
    assert_eq!(value(&y), 2.0);
    assert!(!kept.load(SeqCst), "alive while the graph is");
    drop(g);
    assert!(kept.load(SeqCst), "dropped with the graph");
    let failed = Arc::new(AtomicBool::new(false));
    let mut g = CudaGraph::new().unwrap();
    let r = g.capture(CaptureOptions::default(), || {
        tch_cuda_graphs::retain_in_capture(d, DropFlag(failed.clone()));
        Err::<(), _>(Error::Misuse("stop".into()))
    });
    assert!(r.is_err());
    assert!(failed.load(SeqCst), "a failed capture keeps nothing");
}

/// Errors keep what caused them: CaptureInvalidated's source is the closure's error.
#[test]
#[ignore = "needs a CUDA device"]
fn capture_errors_keep_their_source() {
    let d = cuda();
    let a = full(1.0, 8, d);
    let mut g = CudaGraph::new().unwrap();
    let err = g.capture(CaptureOptions::default(), || Ok(a.f_sum(Kind::Float)?.f_double_value(&[])?)).unwrap_err();
    // walk the chain: the closure's TchError is in it, whatever wraps it
    let mut chain = vec![format!("{err}")];
    let mut found = false;
    let mut cur: Option<&(dyn std::error::Error + 'static)> = err.source();
    while let Some(e) = cur {
        chain.push(e.to_string().lines().next().unwrap_or("").to_owned());
        found |= e.downcast_ref::<tch::TchError>().is_some();
        cur = e.source();
    }
    println!("error chain: {}", chain.join(" <- "));
    assert!(found, "the TchError is reachable through source(): {err:?}");
}

/// A shared pool id stays usable after every graph captured into it is gone (issue: the next
/// capture tripped `use_count > 0` in libtorch's caching host allocator). Each way in: the
/// default capture (empty caches first, as torch.cuda.graph), without emptying the caches, and
/// held by a MemPool; three rounds each, every replay right, memory back where it was.
#[test]
#[ignore = "needs a CUDA device"]
fn a_pool_is_captured_into_again_after_its_last_graph_is_gone() {
    let d = cuda();
    let a = full(1.0, 1 << 20, d);
    let two = Tensor::from_slice(&[2.0f64]).reshape([0i64; 0]);
    synchronize(d).unwrap();
    empty_cache().unwrap();
    let start = memory_stats(d).unwrap();
    let held = MemPool::on(d).unwrap();
    for (what, pool, empty) in [
        ("graph_pool_handle, caches emptied", graph_pool_handle().unwrap(), true),
        ("graph_pool_handle, caches kept", graph_pool_handle().unwrap(), false),
        ("held by a MemPool, caches kept", held.id(), false),
    ] {
        for round in 0..3 {
            let mut g = CudaGraph::new().unwrap();
            let options = CaptureOptions::default().pool(pool).empty_cache(empty);
            let out = g
                .capture(options, || Ok(a.f_mul(&two)?))
                .unwrap_or_else(|e| panic!("{what}, round {round}: capture into a pool whose graphs are gone: {e:?}"));
            g.replay().unwrap();
            assert_eq!(value(&out), 2.0, "{what}, round {round}");
            drop(out);
            drop(g); // the last graph of the pool
        }
        println!("{what}: captured 3 times into one pool, each after the last graph was gone: ok");
    }
    assert!(held.use_count().unwrap() >= 1);
    drop(held);
    assert_memory_back(d, &start, "three pools, three rounds each");
    assert_healthy(d);
}

/// A pool whose holders are all gone while a tensor allocated in it lives cannot be held or
/// captured into again: Error::Misuse, nothing started, the process healthy; once the tensor is
/// gone, the same id works again.
#[test]
#[ignore = "needs a CUDA device"]
fn a_released_pool_with_live_tensors_is_refused_until_they_are_gone() {
    let d = cuda();
    let a = full(1.0, 1 << 20, d);
    let pool = graph_pool_handle().unwrap();
    let mut g = CudaGraph::new().unwrap();
    let out = g.capture(CaptureOptions::default().pool(pool), || Ok(a.f_add_scalar(1.0)?)).unwrap();
    g.replay().unwrap();
    drop(g); // the pool is now freeable, but `out` lives in it
    let r = MemPool::hold(d, pool);
    assert!(matches!(r, Err(Error::Misuse(_))), "{r:?}");
    let mut g = CudaGraph::new().unwrap();
    let r = g.capture(CaptureOptions::default().pool(pool).empty_cache(false), || Ok(a.f_add_scalar(2.0)?));
    match &r {
        Err(Error::Misuse(m)) => println!("capture into a released pool with a live tensor: Misuse: {m}"),
        other => panic!("expected Misuse, got {other:?}"),
    }
    assert!(!g.is_captured());
    assert_eq!(value(&out), 2.0, "the live tensor is untouched");
    assert_healthy(d);
    drop(out);
    let held = MemPool::hold(d, pool).expect("the pool opens again once its tensors are gone");
    let out = g.capture(CaptureOptions::default().pool(held.id()), || Ok(a.f_add_scalar(3.0)?)).unwrap();
    g.replay().unwrap();
    assert_eq!(value(&out), 4.0);
}

/// The crate's own ops take no tch `Scalar`, whose failure panics (tch 0.24): under a capture
/// that a sync invalidated, a device schedule's step (inside the closure, as used in training
/// steps) returns Err, and the capture is CaptureInvalidated. A scalar op of tch's own panics
/// there, which is why (the documented workaround, a 0-d tensor, returns Err).
#[test]
#[ignore = "needs a CUDA device"]
fn ops_under_an_invalidated_capture_fail_without_panicking() {
    use tch_cuda_graphs::optim::{Adam, AdamConfig, Optimizer};
    use tch_cuda_graphs::schedule::{DeviceLrScheduler, StepDecay, WarmupCosine};
    let d = cuda();
    let vs = tch::nn::VarStore::new(d);
    let _w = vs.root().var("w", &[4], tch::nn::Init::Const(1.0));
    let opt = Adam::new(&vs, AdamConfig::default()).unwrap();
    let mut cosine =
        DeviceLrScheduler::new(WarmupCosine { warmup: 2, total: 10, min_factor: 0.1 }, opt.lr_handles()).unwrap();
    let mut decay = DeviceLrScheduler::new(StepDecay { step_size: 2, gamma: 0.5 }, opt.lr_handles()).unwrap();
    let a = full(1.0, 64, d);
    let mut g = CudaGraph::new().unwrap();
    let mut step_cosine = || cosine.step();
    let mut step_decay = || decay.step();
    let schedules: [(&str, &mut dyn FnMut() -> tch_cuda_graphs::Result<()>); 2] =
        [("WarmupCosine", &mut step_cosine), ("StepDecay", &mut step_decay)];
    for (what, sched) in schedules {
        let r = g.capture(CaptureOptions::default(), || {
            let _ = sync_current_stream(d); // invalidates the capture
            sched() // every op fails now
        });
        assert!(matches!(r, Err(Error::CaptureInvalidated { .. })), "{what}: {r:?}");
        assert_healthy(d);
    }
    // tch's own scalar op panics there; the 0-d tensor form returns Err
    let two = Tensor::from_slice(&[2.0f64]).reshape([0i64; 0]);
    let r = g.capture(CaptureOptions::default(), || {
        let _ = sync_current_stream(d);
        Ok(a.f_mul(&two)?)
    });
    assert!(matches!(r, Err(Error::CaptureInvalidated { .. })), "{r:?}");
    let panicked = catch_unwind(AssertUnwindSafe(|| {
        g.capture(CaptureOptions::default(), || {
            let _ = sync_current_stream(d);
            Ok(a.f_mul_scalar(2.0)?)
        })
    }));
    println!("tch's f_mul_scalar under an invalidated capture panics: {}", panicked.is_err());
    assert!(panicked.is_err(), "tch 0.24's scalar ops panic on failure (if this changed, update the docs)");
    assert_healthy(d);
}

/// cudaGraphExecUpdate: a capture of the same work on other tensors replaces a graph's work in
/// its executable; another topology is refused with nothing changed; misuse is an error; memory
/// is back where it was once the graphs are gone.
#[test]
#[ignore = "needs a CUDA device"]
fn update_from_takes_over_a_capture_of_the_same_topology_and_refuses_another() {
    let d = cuda();
    let opts = CaptureOptions::default().device(d);
    let work = |t: &Tensor| -> tch_cuda_graphs::Result<Tensor> { Ok(t.f_mul_scalar(2.0)?.f_relu()?) };
    // warm the kernels once, so that nothing lazy lands in the figures
    drop(work(&full(1.0, 1024, d)).unwrap());
    synchronize(d).unwrap();
    empty_cache().unwrap();
    let start = memory_stats(d).unwrap();
    {
        let (a, b) = (full(1.0, 1024, d), full(1.0, 1024, d));
        let mut g = CudaGraph::new().unwrap();
        let ya = g.capture(opts, || work(&a)).unwrap();
        let mut next = CudaGraph::with_keep_graph(true).unwrap();
        let yb = next.capture(opts, || work(&b)).unwrap();
        assert!(g.update_from(&mut next).expect("update"), "same kernels on other addresses update");
        assert!(!next.is_captured(), "the other graph's capture moved into this one");
        let mut b = b;
        let _ = b.fill_(3.0);
        g.replay().unwrap();
        println!(
            "after the update, one replay: the other capture's output {} (this one's kept {})",
            value(&yb),
            value(&ya)
        );
        assert_eq!((value(&yb), value(&ya)), (6.0, 0.0), "the executable now runs the other capture's work");
        // another topology: refused, nothing changed
        let mut other = CudaGraph::with_keep_graph(true).unwrap();
        let yc = other.capture(opts, || Ok(work(&a)?.f_sin()?)).unwrap();
        assert!(!g.update_from(&mut other).expect("a refused update is not an error"));
        assert!(other.is_captured() && g.is_captured(), "a refused update changes nothing");
        let _ = b.fill_(4.0);
        g.replay().unwrap();
        other.replay().unwrap();
        assert_eq!(value(&yb), 8.0);
        assert!((value(&yc) - 2f64.sin()).abs() < 1e-6);
        // misuse: a graph that does not keep its cudaGraph_t, an empty one, itself through a reset
        let mut unkept = CudaGraph::new().unwrap();
        let _y = unkept.capture(opts, || work(&a)).unwrap();
        let e = g.update_from(&mut unkept).expect_err("the other graph must keep its graph");
        println!("{e}");
        assert!(matches!(e, Error::Misuse(_)), "{e:?}");
        let mut empty = CudaGraph::with_keep_graph(true).unwrap();
        assert!(matches!(g.update_from(&mut empty), Err(Error::Misuse(_))));
        // the emptied graph captures again
        let _again = next.capture(opts, || work(&a)).unwrap();
        next.replay().unwrap();
    }
    assert_memory_back(d, &start, "update_from, graphs and outputs dropped");
    assert_healthy(d);
}

/// RNG: after an update, the executable draws with the adopted capture's offsets: a replay equals
/// the same op run eagerly from the same seed, and random ops work once the graphs are gone.
#[test]
#[ignore = "needs a CUDA device"]
fn update_from_carries_the_rng_state_of_the_adopted_capture() {
    let d = cuda();
    let opts = CaptureOptions::default().device(d);
    let (x1, x2) = (Tensor::ones([4096], (Kind::Float, d)), Tensor::ones([4096], (Kind::Float, d)) * 3.0);
    let mut g = CudaGraph::new().unwrap();
    let _y1 = g.capture(opts, || Ok(x1.f_dropout(0.5, true)?)).unwrap();
    let mut next = CudaGraph::with_keep_graph(true).unwrap();
    let y2 = next.capture(opts, || Ok(x2.f_dropout(0.5, true)?)).unwrap();
    assert!(g.update_from(&mut next).unwrap());
    tch::manual_seed(11);
    g.replay().unwrap();
    let replayed = y2.copy();
    tch::manual_seed(11);
    let eager = x2.dropout(0.5, true);
    let diff = f64::try_from((&replayed - &eager).abs().max()).unwrap();
    println!("dropout replayed through the updated executable vs eager from the same seed: {diff:e}");
    assert_eq!(diff, 0.0);
    drop(g);
    drop(next);
    let r = Tensor::rand([16], (Kind::Float, d));
    assert!(f64::try_from(r.sum(Kind::Double)).unwrap().is_finite(), "random ops work after the graphs are gone");
}
