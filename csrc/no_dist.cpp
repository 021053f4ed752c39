// The process-group family of tcg.h where c10d/NCCL is not built (no CUDA, or no NCCL headers):
// every entry point reports TCG_NO_CUDA.
#include "shim.h"

namespace {
tcg_status no_dist() noexcept {
  return tcg::fail(TCG_NO_CUDA,
                   "tch-cuda-graphs was built without c10d/NCCL (no CUDA, or no NCCL headers found)");
}
}  // namespace

extern "C" {
bool tcg_pg_available(void) { return false; }
tcg_status tcg_pg_new_from_env(int64_t, tcg_pg**) { return no_dist(); }
tcg_status tcg_pg_new_tcp(const char*, int, int, int, int, int64_t, tcg_pg**) { return no_dist(); }
tcg_status tcg_pg_new_file(const char*, int, int, int, int64_t, tcg_pg**) { return no_dist(); }
void tcg_pg_free(tcg_pg*) {}
tcg_status tcg_pg_info(tcg_pg*, int*, int*, int*) { return no_dist(); }
tcg_status tcg_pg_allreduce(tcg_pg*, tcg_tensor, tcg_reduce_op) { return no_dist(); }
tcg_status tcg_pg_broadcast(tcg_pg*, tcg_tensor, int) { return no_dist(); }
tcg_status tcg_pg_reduce_scatter(tcg_pg*, tcg_tensor, tcg_tensor, tcg_reduce_op) { return no_dist(); }
tcg_status tcg_pg_all_gather(tcg_pg*, tcg_tensor, tcg_tensor) { return no_dist(); }
tcg_status tcg_pg_barrier(tcg_pg*) { return no_dist(); }
tcg_status tcg_pg_wait_device(tcg_pg*, int64_t) { return no_dist(); }
tcg_status tcg_pg_abort(tcg_pg*) { return no_dist(); }
tcg_status tcg_buckets_new(tcg_pg*, tcg_tensors, const tcg_buckets_options*, tcg_buckets**) { return no_dist(); }
void tcg_buckets_free(tcg_buckets*) {}
tcg_status tcg_buckets_count(tcg_buckets*, size_t*) { return no_dist(); }
tcg_status tcg_buckets_arm(tcg_buckets*) { return no_dist(); }
tcg_status tcg_buckets_finish(tcg_buckets*) { return no_dist(); }
tcg_status tcg_buckets_launch_rest(tcg_buckets*) { return no_dist(); }
tcg_status tcg_buckets_wait_bucket(tcg_buckets*, size_t) { return no_dist(); }
tcg_status tcg_buckets_join(tcg_buckets*) { return no_dist(); }
tcg_status tcg_buckets_members(tcg_buckets*, size_t, size_t*, size_t, size_t*) { return no_dist(); }
}  // extern "C"
