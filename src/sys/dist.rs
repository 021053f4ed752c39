//! `csrc/cuda/dist.cpp` (process groups over c10d/NCCL) and `csrc/cuda/grad_buckets.cpp`
//! (gradient buckets fed by autograd hooks).

use super::{check, error::c_string, ffi, non_null, tensor_ptr, tensor_ptrs};
use crate::error::{Error, Result};
use std::ptr::NonNull;
use std::sync::Arc;
use tch::Tensor;

/// How an all-reduce combines, as the shim takes it.
pub(crate) use ffi::tcg_reduce_op as RawReduceOp;
/// A bucket set's modes, as the shim takes them.
pub(crate) use ffi::{
    tcg_bucket_buffers as RawBucketBuffers, tcg_bucket_collective as RawBucketCollective,
    tcg_bucket_compression as RawBucketCompression, tcg_bucket_layout as RawBucketLayout,
};
/// How gradient buckets are laid out and reduced (`tcg_buckets_options`).
pub(crate) type BucketsOptions = ffi::tcg_buckets_options;

/// Whether this build has c10d/NCCL.
pub(crate) fn available() -> bool {
    // SAFETY: no arguments, no preconditions.
    unsafe { ffi::tcg_pg_available() }
}

/// Where a process group's rendezvous is.
#[derive(Debug)]
pub(crate) enum Rendezvous<'a> {
    /// torchrun's environment.
    Env,
    /// A TCP store hosted by rank 0.
    Tcp { host: &'a str, port: u16 },
    /// A file store.
    File { path: &'a str },
}

/// A NCCL process group, shut down on drop.
#[derive(Debug)]
pub(crate) struct PgHandle(NonNull<ffi::tcg_pg>);

// SAFETY: c10d::ProcessGroupNCCL is built to be called from any thread (PyTorch calls it from
// Python threads and its own watchdog thread; its state is behind its own mutexes).
unsafe impl Send for PgHandle {}
// SAFETY: as above; `&self` methods only issue collectives, which c10d serializes internally.
// Ordering collectives the same way on every rank stays the caller's job, as in PyTorch.
unsafe impl Sync for PgHandle {}

impl PgHandle {
    /// A group; `coordinates` (rank, size, device index) for the explicit rendezvous kinds.
    pub(crate) fn new(at: Rendezvous<'_>, coordinates: (i32, i32, i32), timeout_ms: i64) -> Result<Self> {
        let (rank, size, dev) = coordinates;
        let mut raw = std::ptr::null_mut();
        match at {
            // SAFETY: `raw` is a valid out pointer; on success it holds a group we own.
            Rendezvous::Env => check(unsafe { ffi::tcg_pg_new_from_env(timeout_ms, &mut raw) })?,
            Rendezvous::Tcp { host, port } => {
                let host = c_string(host, "the host")?;
                // SAFETY: `host` is NUL-terminated and outlives the call; `raw` a valid out pointer.
                check(unsafe {
                    ffi::tcg_pg_new_tcp(host.as_ptr(), i32::from(port), rank, size, dev, timeout_ms, &mut raw)
                })?
            }
            Rendezvous::File { path } => {
                let path = c_string(path, "the file store path")?;
                // SAFETY: `path` is NUL-terminated and outlives the call; `raw` a valid out pointer.
                check(unsafe { ffi::tcg_pg_new_file(path.as_ptr(), rank, size, dev, timeout_ms, &mut raw) })?
            }
        }
        non_null(raw, "process group").map(PgHandle)
    }

    /// (rank, world size, device index).
    pub(crate) fn info(&self) -> Result<(i32, i32, i32)> {
        let (mut rank, mut size, mut device) = (0, 0, 0);
        // SAFETY: the handle is live; three valid out pointers.
        check(unsafe { ffi::tcg_pg_info(self.0.as_ptr(), &mut rank, &mut size, &mut device) })?;
        Ok((rank, size, device))
    }

    pub(crate) fn all_reduce(&self, t: &Tensor, op: RawReduceOp) -> Result<()> {
        // SAFETY: the handle is live; `t` is a live handle for the call.
        check(unsafe { ffi::tcg_pg_allreduce(self.0.as_ptr(), tensor_ptr(t), op) })
    }

    pub(crate) fn broadcast(&self, t: &Tensor, root: i32) -> Result<()> {
        // SAFETY: the handle is live; `t` is a live handle for the call.
        check(unsafe { ffi::tcg_pg_broadcast(self.0.as_ptr(), tensor_ptr(t), root) })
    }

    pub(crate) fn reduce_scatter(&self, output: &Tensor, input: &Tensor, op: RawReduceOp) -> Result<()> {
        // SAFETY: the handle is live; `output` and `input` are live handles for the call.
        check(unsafe { ffi::tcg_pg_reduce_scatter(self.0.as_ptr(), tensor_ptr(output), tensor_ptr(input), op) })
    }

    pub(crate) fn all_gather(&self, output: &Tensor, input: &Tensor) -> Result<()> {
        // SAFETY: the handle is live; `output` and `input` are live handles for the call.
        check(unsafe { ffi::tcg_pg_all_gather(self.0.as_ptr(), tensor_ptr(output), tensor_ptr(input)) })
    }

    pub(crate) fn barrier(&self) -> Result<()> {
        // SAFETY: the handle is live.
        check(unsafe { ffi::tcg_pg_barrier(self.0.as_ptr()) })
    }

    pub(crate) fn wait_device(&self, timeout_ms: i64) -> Result<()> {
        // SAFETY: the handle is live.
        check(unsafe { ffi::tcg_pg_wait_device(self.0.as_ptr(), timeout_ms) })
    }

    pub(crate) fn abort(&self) -> Result<()> {
        // SAFETY: the handle is live.
        check(unsafe { ffi::tcg_pg_abort(self.0.as_ptr()) })
    }
}

impl Drop for PgHandle {
    fn drop(&mut self) {
        // SAFETY: the pointer came from a tcg_pg_new_* call and is freed exactly once, here; the
        // shim shuts the group down and never throws.
        unsafe { ffi::tcg_pg_free(self.0.as_ptr()) }
    }
}

/// The shim's gradient buckets over a group they keep alive; their hooks are removed on drop.
#[derive(Debug)]
pub(crate) struct BucketsHandle {
    /// Freed first: fields drop in declaration order, the group after the buckets.
    raw: NonNull<ffi::tcg_buckets>,
    _pg: Arc<PgHandle>,
}

// SAFETY: the shim's bucket state is behind its own mutex (the hooks run on autograd's device
// threads, the methods on the caller's); the hooks hold only a weak reference to it. Every
// method that changes it takes `&mut self`, and the group is Send + Sync.
unsafe impl Send for BucketsHandle {}

impl BucketsHandle {
    /// Buckets over `params`, with a gradient hook on each.
    pub(crate) fn new(pg: Arc<PgHandle>, params: &[Tensor], options: &BucketsOptions) -> Result<Self> {
        let ptrs = tensor_ptrs(params);
        let mut raw = std::ptr::null_mut();
        // SAFETY: the group is live (the handle keeps it); `ptrs` are live handles for the call
        // (the shim copies the tensors); `options` and `raw` are valid pointers.
        check(unsafe { ffi::tcg_buckets_new(pg.0.as_ptr(), ffi::tcg_tensors::of(&ptrs), options, &mut raw) })?;
        Ok(BucketsHandle { raw: non_null(raw, "gradient buckets")?, _pg: pg })
    }

    pub(crate) fn count(&self) -> Result<usize> {
        let mut n = 0usize;
        // SAFETY: the handle is live; `n` is a valid out pointer.
        check(unsafe { ffi::tcg_buckets_count(self.raw.as_ptr(), &mut n) })?;
        Ok(n)
    }

    /// Arms the hooks for the next backward pass.
    pub(crate) fn arm(&mut self) -> Result<()> {
        // SAFETY: the handle is live (owned by self).
        check(unsafe { ffi::tcg_buckets_arm(self.raw.as_ptr()) })
    }

    /// Reduces what is left and makes the current stream wait for every bucket.
    pub(crate) fn finish(&mut self) -> Result<()> {
        // SAFETY: the handle is live (owned by self); its group is alive (held by self).
        check(unsafe { ffi::tcg_buckets_finish(self.raw.as_ptr()) })
    }

    /// Launches what is left, then for each bucket in order makes the current stream wait for
    /// its reduction and calls `after(k)`; the side stream is joined on every path out.
    pub(crate) fn finish_each(&mut self, mut after: impl FnMut(usize) -> Result<()>) -> Result<()> {
        let n = self.count()?;
        // SAFETY: the handle is live (owned by self); its group is alive (held by self).
        check(unsafe { ffi::tcg_buckets_launch_rest(self.raw.as_ptr()) })?;
        struct Join<'a>(&'a BucketsHandle);
        impl Drop for Join<'_> {
            fn drop(&mut self) {
                // SAFETY: the buckets outlive this guard (it borrows them). An error here leaves
                // the round reset; the next arm() orders what remains.
                let _ = unsafe { ffi::tcg_buckets_join(self.0.raw.as_ptr()) };
            }
        }
        let join = Join(self);
        for k in 0..n {
            // SAFETY: the handle is live; `k` < the bucket count, and every bucket is launched.
            check(unsafe { ffi::tcg_buckets_wait_bucket(join.0.raw.as_ptr(), k) })?;
            after(k)?;
        }
        Ok(())
    }

    /// The indices (into the parameters the buckets were made from) of bucket `k`'s members.
    pub(crate) fn members(&self, k: usize) -> Result<Vec<usize>> {
        let mut n = 0usize;
        // SAFETY: the handle is live; a null buffer of capacity 0 only asks for the count.
        check(unsafe { ffi::tcg_buckets_members(self.raw.as_ptr(), k, std::ptr::null_mut(), 0, &mut n) })?;
        let mut out = vec![0usize; n];
        let mut written = 0usize;
        // SAFETY: `out` has room for `n` entries, the capacity passed.
        check(unsafe { ffi::tcg_buckets_members(self.raw.as_ptr(), k, out.as_mut_ptr(), n, &mut written) })?;
        if written != n {
            return Err(Error::Libtorch(format!("bucket {k}: members changed from {n} to {written}")));
        }
        Ok(out)
    }
}

impl Drop for BucketsHandle {
    fn drop(&mut self) {
        // SAFETY: the pointer came from tcg_buckets_new and is freed exactly once, here; the group
        // it uses is still alive (`_pg` drops after this). The shim never throws.
        unsafe { ffi::tcg_buckets_free(self.raw.as_ptr()) }
    }
}

/// Each parameter's place in the buckets (bucket, offset in elements), and each bucket's flat
/// length.
pub(crate) type Layout = (Vec<(usize, i64)>, Vec<i64>);

/// The bucket layout the shim makes for parameters of `numels` elements of `element_bytes`
/// each over `world` ranks.
pub(crate) fn plan_buckets(numels: &[i64], element_bytes: i64, options: &BucketsOptions, world: i32) -> Result<Layout> {
    let mut slots = vec![ffi::tcg_bucket_slot::default(); numels.len()];
    let mut lengths: Vec<i64> = Vec::new();
    loop {
        let mut n = 0usize;
        // SAFETY: `numels` and `slots` have numels.len() entries; `lengths` has room for the
        // capacity passed; `options` and `n` are valid pointers.
        check(unsafe {
            ffi::tcg_buckets_plan(
                numels.as_ptr(),
                numels.len(),
                element_bytes,
                options,
                world,
                slots.as_mut_ptr(),
                lengths.as_mut_ptr(),
                lengths.len(),
                &mut n,
            )
        })?;
        if n <= lengths.len() {
            lengths.truncate(n);
            return Ok((slots.iter().map(|s| (s.bucket, s.offset)).collect(), lengths));
        }
        lengths = vec![0; n]; // sized now: ask again
    }
}
