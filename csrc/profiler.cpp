// A profiler over libtorch's Kineto (CUPTI for the GPU): start, N steps, stop; the events as
// plain records and a Chrome trace. CUPTI reports the kernels inside CUDA graph launches, so
// replays are seen kernel by kernel. Kineto's state is per process for the GPU and per thread
// for CPU ops: one profiler at a time, stopped on the thread that started it. See tcg.h.
#include "shim.h"

#include <ATen/Context.h>
#include <kineto/ActivityType.h>
#include <torch/csrc/autograd/profiler_kineto.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <set>

using tcg::guard;
using tcg::misuse;

namespace {
std::atomic<bool> active{false};

tcg_prof_kind kind_of(uint8_t activity) {
  switch (static_cast<libkineto::ActivityType>(activity)) {
    case libkineto::ActivityType::CONCURRENT_KERNEL: return TCG_PROF_KERNEL;
    case libkineto::ActivityType::GPU_MEMCPY: return TCG_PROF_MEMCPY;
    case libkineto::ActivityType::GPU_MEMSET: return TCG_PROF_MEMSET;
    case libkineto::ActivityType::CPU_OP: return TCG_PROF_CPU_OP;
    case libkineto::ActivityType::CUDA_RUNTIME:
    case libkineto::ActivityType::CUDA_DRIVER: return TCG_PROF_RUNTIME;
    default: return TCG_PROF_OTHER;
  }
}
}  // namespace

struct tcg_profile {
  std::unique_ptr<torch::autograd::profiler::ProfilerResult> result;
  std::vector<tcg_prof_event> events;
  std::vector<std::string> names;
};

extern "C" {

tcg_status tcg_profile_start(bool cuda) {
  return guard([&] {
    bool expected = false;
    if (!active.compare_exchange_strong(expected, true)) {
      misuse("a profiler is already running in this process (one at a time)");
    }
    try {
      namespace impl = torch::profiler::impl;
      impl::ProfilerConfig config(impl::ProfilerState::KINETO);
      std::set<impl::ActivityType> acts{impl::ActivityType::CPU};
      if (cuda && at::hasCUDA()) acts.insert(impl::ActivityType::CUDA);
      torch::autograd::profiler::prepareProfiler(config, acts);
      torch::autograd::profiler::enableProfiler(config, acts);
    } catch (...) {
      active = false;
      throw;
    }
  });
}

tcg_status tcg_profile_stop(tcg_profile** out) {
  return guard([&] {
    if (out != nullptr) *out = nullptr;
    if (!active) misuse("no profiler is running");
    struct Done {
      ~Done() { active = false; }
    } done;
    auto p = std::make_unique<tcg_profile>();
    p->result = torch::autograd::profiler::disableProfiler();
    if (!p->result) throw tcg::exception(TCG_ERROR, "the profiler returned no result");
    for (const auto& e : p->result->events()) {
      tcg_prof_event r{};
      r.kind = kind_of(e.activityType());
      r.device = e.deviceIndex();
      r.stream = e.deviceResourceId();
      r.start_ns = e.startNs();
      r.end_ns = e.endNs();
      p->events.push_back(r);
      p->names.push_back(e.name());
    }
    if (out != nullptr) *out = p.release();
  });
}

void tcg_profile_free(tcg_profile* p) {
  try {
    delete p;
  } catch (...) {
  }
}

tcg_status tcg_profile_len(tcg_profile* p, size_t* n) {
  return guard([&] { *n = p->events.size(); });
}

tcg_status tcg_profile_event(tcg_profile* p, size_t i, tcg_prof_event* out, char** name) {
  return guard([&] {
    *name = nullptr;
    if (i >= p->events.size()) misuse("profile event index out of range");
    *out = p->events[i];
    const std::string& s = p->names[i];
    char* c = static_cast<char*>(std::malloc(s.size() + 1));
    if (c == nullptr) throw std::bad_alloc();
    std::memcpy(c, s.c_str(), s.size() + 1);
    *name = c;
  });
}

tcg_status tcg_profile_save(tcg_profile* p, const char* path) {
  return guard([&] {
    if (path == nullptr) misuse("null path");
    p->result->save(path);
  });
}

}  // extern "C"
