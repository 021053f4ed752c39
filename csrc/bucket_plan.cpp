// tcg_buckets_plan: the bucket layout of bucket_plan.h for given parameter sizes, in every build
// (no CUDA needed), so the layout is tested on the CPU. See tcg.h.
#include "bucket_plan.h"

#include "shim.h"

extern "C" {

tcg_status tcg_buckets_plan(const int64_t* numels, size_t n, int64_t element_bytes, const tcg_buckets_options* o,
                            int world, tcg_bucket_slot* slots, int64_t* bucket_numels, size_t cap, size_t* n_buckets) {
  return tcg::guard([&] {
    if (numels == nullptr && n != 0) tcg::misuse("bucket plan: null sizes");
    if (element_bytes <= 0 || world <= 0) tcg::misuse("bucket plan: element size and world size must be positive");
    if (o == nullptr) tcg::misuse("bucket plan: null options");
    const std::string why = tcg::buckets::invalid(*o);
    if (!why.empty()) tcg::misuse("GradAllReduce: " + why);
    tcg::buckets::Rules rules;
    rules.element_bytes = element_bytes;
    rules.bucket_bytes = o->bucket_bytes;
    rules.first_bucket_bytes = o->first_bucket_bytes;
    rules.aligned = o->layout == TCG_BUCKET_LAYOUT_VIEWS;
    rules.padded = o->collective == TCG_BUCKET_COLLECTIVE_REDUCE_SCATTER_ALL_GATHER;
    rules.world = world;
    std::vector<size_t> bucket_of;
    auto planned = tcg::buckets::plan(std::vector<int64_t>(numels, numels + n), rules, &bucket_of);
    *n_buckets = planned.size();
    for (size_t k = 0; k < planned.size(); ++k) {
      if (k < cap) bucket_numels[k] = planned[k].numel;
      for (size_t j = 0; j < planned[k].members.size(); ++j) {
        slots[planned[k].members[j]] = tcg_bucket_slot{k, planned[k].offsets[j]};
      }
    }
  });
}

}  // extern "C"
