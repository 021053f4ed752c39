//! Process groups without a GPU: a rank that never joins ends the others' set-up with an error
//! within the timeout (the store's), never a hang. In a build without c10d/NCCL every entry
//! point says `NoCuda` instead. And the gradient buckets' layout, which needs no GPU.

mod common;

use common::free_port;
use std::time::{Duration, Instant};
use tch::Device;
use tch_cuda_graphs::dist::{BucketConfig, BucketLayout, Collective, ProcessGroup, Wire};
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

/// (members, offsets, flat length) of each bucket.
fn layout(config: BucketConfig, numels: &[i64], kind: tch::Kind, world: usize) -> Vec<(Vec<usize>, Vec<i64>, i64)> {
    let plan = config.plan(numels, kind, world).expect("a plan");
    let got: Vec<_> = plan.buckets.into_iter().map(|b| (b.members, b.offsets, b.numel)).collect();
    println!("{numels:?} over {world}: {got:?}");
    got
}

#[test]
fn buckets_fill_in_reverse_order_up_to_their_size() {
    let packed = BucketConfig { bucket_bytes: 1024, ..Default::default() };
    // 300 floats (1200 bytes) do not fit in 1024 but get a bucket of their own; 100 + 100 do
    assert_eq!(
        layout(packed, &[100, 100, 300], tch::Kind::Float, 1),
        vec![(vec![2], vec![0], 300), (vec![1, 0], vec![0, 100], 200)]
    );
    // the first bucket may be smaller, so that the first all-reduce starts early
    assert_eq!(
        layout(BucketConfig { first_bucket_bytes: Some(400), ..packed }, &[50, 50, 50, 50], tch::Kind::Float, 1),
        vec![(vec![3, 2], vec![0, 50], 100), (vec![1, 0], vec![0, 50], 100)]
    );
    // bf16 elements are 2 bytes: twice as many fit
    assert_eq!(layout(packed, &[100, 100, 300], tch::Kind::BFloat16, 1).len(), 1);
}

#[test]
fn views_start_16_byte_aligned_and_split_buckets_divide_evenly() {
    let config = BucketConfig { bucket_bytes: 1 << 20, ..Default::default() };
    let views = BucketConfig { layout: BucketLayout::Views(Wire::default()), ..config };
    // packed: back to back
    assert_eq!(layout(config, &[3, 5], tch::Kind::Float, 1), vec![(vec![1, 0], vec![0, 5], 8)]);
    // views: the second member at 8 floats (32 bytes), not 5
    assert_eq!(layout(views, &[3, 5], tch::Kind::Float, 1), vec![(vec![1, 0], vec![0, 8], 11)]);
    // reduce-scatter + all-gather over 2 ranks: a multiple of 2 × 4 floats
    let rs = Wire { collective: Collective::ReduceScatterAllGather, ..Default::default() };
    let split = BucketConfig { layout: BucketLayout::Views(rs), ..config };
    assert_eq!(layout(split, &[3, 5], tch::Kind::Float, 2), vec![(vec![1, 0], vec![0, 8], 16)]);
    assert_eq!(layout(split, &[3, 5], tch::Kind::Float, 3)[0].2, 12);
}

#[test]
fn a_plan_refuses_an_empty_world() {
    let got = BucketConfig::default().plan(&[4], tch::Kind::Float, 0);
    assert!(matches!(got, Err(Error::Misuse(_))), "{got:?}");
}

/// ZeRO-1's shard plan: for several layouts and 1 to 8 ranks, every parameter value lies in
/// exactly one rank's shard, once, at its flat offset; offsets and shards are aligned; the
/// shards are equal and cover the flat buffer; a rank past the last holds nothing.
#[test]
fn the_shard_plan_covers_every_value_once() {
    use tch_cuda_graphs::dist::ShardPlan;
    let layouts: [&[i64]; 5] = [&[10, 3, 7], &[1], &[0, 5, 0], &[1961, 53, 2809, 53, 583, 11], &[65536, 1, 65535, 7]];
    let mut checked = 0;
    for numels in layouts {
        for world in 1..=8 {
            for align in [1, 4, 16] {
                let plan = ShardPlan::new(numels, world, align).expect("a plan");
                assert_eq!(plan.shard_len() % align, 0);
                assert_eq!(plan.flat_len(), plan.shard_len() * world as i64);
                let mut seen: Vec<Vec<u8>> = numels.iter().map(|&n| vec![0; n as usize]).collect();
                for rank in 0..world {
                    let mut end = 0;
                    for p in plan.pieces(rank) {
                        assert_eq!(plan.offset(p.param) % align, 0, "aligned offset");
                        assert!(
                            p.shard_offset >= end && p.shard_offset + p.len <= plan.shard_len(),
                            "inside the shard, in order"
                        );
                        assert_eq!(plan.offset(p.param) + p.start, rank as i64 * plan.shard_len() + p.shard_offset);
                        end = p.shard_offset + p.len;
                        for v in &mut seen[p.param][p.start as usize..(p.start + p.len) as usize] {
                            *v += 1;
                        }
                    }
                }
                assert!(
                    seen.iter().flatten().all(|&v| v == 1),
                    "{numels:?} on {world} ranks: each value in one shard once"
                );
                assert!(plan.pieces(world).is_empty());
                checked += 1;
            }
        }
    }
    println!("{checked} plans: every value in exactly one shard");
    assert!(matches!(ShardPlan::new(&[4], 0, 4), Err(Error::Misuse(_))));
    assert!(matches!(ShardPlan::new(&[-1], 2, 4), Err(Error::Misuse(_))));
}
