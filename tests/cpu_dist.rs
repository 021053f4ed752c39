//! Process groups without a GPU: a rank that never joins ends the others' set-up with an error
//! within the timeout (the store's), never a hang. In a build without c10d/NCCL every entry
//! point says `NoCuda` instead.

mod common;

use common::free_port;
use std::time::{Duration, Instant};
use tch::Device;
use tch_cuda_graphs::dist::ProcessGroup;
use tch_cuda_graphs::Error;

const TIMEOUT: Duration = Duration::from_secs(2);

/// Makes a group as `rank` of 2 where the other rank never comes; returns the error and how
/// long it took.
fn alone(rank: usize) -> (Error, Duration) {
    let start = Instant::now();
    let got = ProcessGroup::new_tcp("127.0.0.1", free_port(), rank, 2, Device::Cuda(0), TIMEOUT);
    let err = got.expect_err("a group of 2 with one rank cannot form");
    (err, start.elapsed())
}

#[test]
fn a_rank_that_never_joins_gives_an_error_within_the_timeout() {
    for rank in [0, 1] {
        let (err, took) = alone(rank);
        println!("rank {rank} alone: {took:.2?} (timeout {TIMEOUT:?}): {err}");
        if ProcessGroup::available() {
            // rank 0 hosts the store and waits for the other; rank 1 finds no store
            assert!(matches!(err, Error::Distributed(_)), "rank {rank}: expected Error::Distributed, got {err:?}");
            // c10d rounds the server's wait up to whole seconds and retries a client's connect with a
            // randomized delay: bounded, but not to the millisecond
            assert!(took < TIMEOUT * 5, "rank {rank}: the error took {took:?}");
        } else {
            assert!(matches!(err, Error::NoCuda(_)), "a build without c10d/NCCL: expected NoCuda, got {err:?}");
        }
    }
}

/// Outside torchrun (no RANK/WORLD_SIZE), a process group from the environment is a clear error;
/// explicit coordinates (TCP or file store) are checked before any store is made; without
/// c10d/NCCL every entry point says NoCuda.
#[test]
fn a_process_group_needs_torchrun_or_coordinates() {
    assert!(std::env::var("RANK").is_err(), "run the CPU tests outside torchrun");
    let r = ProcessGroup::from_env(std::time::Duration::from_secs(1));
    match (&r, ProcessGroup::available()) {
        (Err(Error::Misuse(msg)), true) => assert!(msg.contains("RANK"), "{msg}"),
        (Err(Error::NoCuda(_)), false) => {}
        other => panic!("expected Misuse (no RANK) or NoCuda, got {:?}", other.0.as_ref().map(|_| ())),
    }
    let bad = ProcessGroup::new_tcp("127.0.0.1", 29999, 3, 2, Device::Cuda(0), std::time::Duration::from_secs(1));
    assert!(matches!(bad, Err(Error::Misuse(_)) | Err(Error::NoCuda(_))), "rank 3 of 2");
    let cpu = ProcessGroup::new_tcp("127.0.0.1", 29999, 0, 1, Device::Cpu, std::time::Duration::from_secs(1));
    assert!(matches!(cpu, Err(Error::Misuse(_))));
    let file = std::env::temp_dir().join("tcg-cpu-test-file-store");
    let bad = ProcessGroup::new_file(&file, 2, 2, Device::Cuda(0), std::time::Duration::from_secs(1));
    assert!(matches!(bad, Err(Error::Misuse(_))), "rank 2 of 2 over a file store: {bad:?}");
    let cpu = ProcessGroup::new_file(&file, 0, 1, Device::Cpu, std::time::Duration::from_secs(1));
    assert!(matches!(cpu, Err(Error::Misuse(_))), "a CPU device: {cpu:?}");
}
