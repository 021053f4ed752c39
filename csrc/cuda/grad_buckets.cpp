// Gradient buckets for data parallel training (DDP-style), fed by autograd hooks.
//
// Parameters are grouped, in reverse order (the order backward produces their gradients), into
// buckets of about `bucket_bytes`. Each parameter gets a post-accumulate-grad hook (the C++ form
// of Tensor.register_post_accumulate_grad_hook). While the buckets are armed, the hook marks its
// gradient ready; once a bucket's gradients are all ready, a side stream of the bucket set waits
// for the stream backward runs on (the fork) and does the whole bucket there: pack (one kernel),
// all-reduce (average; c10d with asyncOp = false runs it on the current stream, here the side
// stream), unpack (one multi-tensor kernel). So the all-reduce, the pack and the unpack overlap
// the rest of backward. Buckets launch in index order on every rank (NCCL needs the same order
// everywhere), all on the one side stream (so this communicator's operations never run on two
// streams at once). finish() launches what is left, and makes the current stream wait for the
// side stream (the join). Not armed, finish() does every bucket on the current stream: no fork,
// no join. Under stream capture the fork and the join are recorded into the graph like
// everything else.
#include "dist.h"

#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <memory>
#include <mutex>

using namespace tcg;

namespace {

struct Bucket {
  std::vector<size_t> members;  // parameter indices, in the flat buffer's order
  int64_t numel = 0;
  at::Tensor flat;              // undefined for a one-parameter bucket (its gradient is reduced in place)
  size_t pending = 0;           // gradients not yet ready in this round
};

struct State {
  std::mutex mu;
  tcg_pg* pg;  // kept alive by the Rust owner for longer than this state (see GradAllReduce)
  std::vector<at::Tensor> params;
  std::vector<size_t> bucket_of;
  std::vector<bool> seen;
  std::vector<Bucket> buckets;
  size_t next = 0;      // the first bucket not launched yet
  bool armed = false;
  bool forked = false;  // this round put work on the side stream: finish() joins
  c10::cuda::CUDAStream side;
  at::cuda::CUDAEvent fork_ev, join_ev;  // timing off

  explicit State(c10::cuda::CUDAStream s) : side(s) {}

  void reset() {
    for (auto& b : buckets) b.pending = b.members.size();
    std::fill(seen.begin(), seen.end(), false);
    next = 0;
  }

  std::vector<at::Tensor> grads(const Bucket& b) {
    std::vector<at::Tensor> g;
    g.reserve(b.members.size());
    for (size_t i : b.members) {
      const at::Tensor& grad = params[i].grad();
      if (!grad.defined()) {
        misuse("GradAllReduce: parameter #" + std::to_string(i) +
               " has no gradient (run backward first; every parameter must take part in the loss)");
      }
      g.push_back(grad);
    }
    return g;
  }

  // Pack, all-reduce (average), unpack bucket k on the current stream.
  void reduce(size_t k) {
    Bucket& b = buckets[k];
    c10::AutoGradMode no_grad(false);
    auto g = grads(b);
    at::Tensor buf;
    if (!b.flat.defined()) {
      if (!g[0].is_contiguous()) misuse("GradAllReduce: a non-contiguous gradient");
      buf = g[0];
    } else {
      std::vector<at::Tensor> views;
      views.reserve(g.size());
      for (auto& t : g) views.push_back(t.reshape({-1}));
      at::cat_out(b.flat, views, 0);  // one kernel
      buf = b.flat;
    }
    check_collective(pg, buf);
    std::vector<at::Tensor> v{buf};
    c10d::AllreduceOptions o;
    o.reduceOp = c10d::ReduceOp(c10d::ReduceOp::AVG);
    o.asyncOp = false;  // on the current stream; no Work
    auto w = pg->pg->allreduce(v, o);
    if (w) w->wait();
    if (!b.flat.defined()) return;
    std::vector<int64_t> sizes;
    sizes.reserve(g.size());
    for (auto& t : g) sizes.push_back(t.numel());
    auto parts = b.flat.split_with_sizes(sizes, 0);
    std::vector<at::Tensor> src;
    src.reserve(g.size());
    for (size_t j = 0; j < g.size(); ++j) src.push_back(parts[j].view(g[j].sizes()));
    at::_foreach_copy_(g, src);  // one multi-tensor kernel
  }

  // Bucket k on the side stream, after what the current stream has queued (its gradients).
  void reduce_on_side(size_t k) {
    fork_ev.record(at::cuda::getCurrentCUDAStream(pg->device));
    fork_ev.block(side);
    forked = true;
    c10::cuda::CUDAStreamGuard on_side(side);
    reduce(k);
  }

  // Called by the hook of parameter i once its gradient is accumulated.
  void ready(size_t i) {
    std::lock_guard<std::mutex> lock(mu);
    if (!armed) return;
    if (seen[i]) {
      armed = false;
      misuse("GradAllReduce: parameter #" + std::to_string(i) +
             " got a gradient twice while armed (two backward passes in one step): arm() before each "
             "backward and all_reduce() after it");
    }
    seen[i] = true;
    --buckets[bucket_of[i]].pending;
    while (next < buckets.size() && buckets[next].pending == 0) reduce_on_side(next++);
  }

  void finish() {
    std::lock_guard<std::mutex> lock(mu);
    armed = false;
    struct Reset {
      State* s;
      ~Reset() {
        s->reset();
        s->forked = false;
      }
    } reset_on_exit{this};
    // The rest: on the side stream if this round used it (one stream per communicator), else
    // here. Then the join.
    while (next < buckets.size()) {
      if (forked) {
        reduce_on_side(next++);
      } else {
        reduce(next++);
      }
    }
    if (forked) {
      join_ev.record(side);
      join_ev.block(at::cuda::getCurrentCUDAStream(pg->device));
    }
  }
};

struct Hook : torch::autograd::PostAccumulateGradHook {
  std::weak_ptr<State> state;
  size_t index;
  Hook(std::weak_ptr<State> s, size_t i) : state(std::move(s)), index(i) {}
  void operator()(const at::Tensor&) override {
    if (auto s = state.lock()) s->ready(index);
  }
};

}  // namespace

struct tcg_buckets {
  std::shared_ptr<State> state;
};

extern "C" {

tcg_status tcg_buckets_new(tcg_pg* pg, tcg_tensor* params, size_t n, int64_t bucket_bytes, tcg_buckets** out) {
  return guard([&] {
    if (pg == nullptr) misuse("null process group");
    if (n == 0) misuse("GradAllReduce: no parameters");
    c10::cuda::CUDAGuard on_device(pg->device);
    auto s = std::make_shared<State>(at::cuda::getStreamFromPool(false, pg->device));
    s->pg = pg;
    s->params = tensor_list(params, n);
    const auto kind = s->params[0].scalar_type();
    for (size_t i = 0; i < n; ++i) {
      const auto& p = s->params[i];
      check_collective(pg, p);
      if (p.scalar_type() != kind) misuse("GradAllReduce: parameters of more than one dtype");
      if (!p.is_leaf() || !p.requires_grad()) misuse("GradAllReduce: parameter #" + std::to_string(i) + " is not a leaf that requires grad");
      if (torch::autograd::impl::post_acc_grad_hooks(p) != nullptr) {
        misuse("GradAllReduce: parameter #" + std::to_string(i) +
               " already has a post-accumulate-grad hook (is it in another GradAllReduce?)");
      }
    }
    const int64_t elt = static_cast<int64_t>(c10::elementSize(kind));
    const int64_t cap = std::max<int64_t>(bucket_bytes, 1);
    s->bucket_of.assign(n, 0);
    s->seen.assign(n, false);
    for (size_t r = n; r-- > 0;) {  // reverse: the order backward produces gradients
      const int64_t numel = s->params[r].numel();
      if (s->buckets.empty() || (!s->buckets.back().members.empty() && (s->buckets.back().numel + numel) * elt > cap)) {
        s->buckets.emplace_back();
      }
      auto& b = s->buckets.back();
      b.members.push_back(r);
      b.numel += numel;
      s->bucket_of[r] = s->buckets.size() - 1;
    }
    for (auto& b : s->buckets) {
      if (b.members.size() > 1) b.flat = at::zeros({b.numel}, s->params[0].options().requires_grad(false));
    }
    s->reset();
    for (size_t i = 0; i < n; ++i) {
      torch::autograd::impl::set_post_acc_grad_hooks(s->params[i], std::make_unique<Hook>(s, i));
    }
    *out = new tcg_buckets{std::move(s)};
  });
}

void tcg_buckets_free(tcg_buckets* b) {
  if (b == nullptr) return;
  try {
    for (auto& p : b->state->params) {
      auto& h = torch::autograd::impl::post_acc_grad_hooks(p);
      if (h != nullptr && dynamic_cast<Hook*>(h.get()) != nullptr) h.reset();
    }
  } catch (...) {
    // the hooks hold only a weak reference: left behind, they do nothing
  }
  try {
    delete b;
  } catch (...) {
  }
}

tcg_status tcg_buckets_count(tcg_buckets* b, size_t* out) {
  return guard([&] { *out = b->state->buckets.size(); });
}

tcg_status tcg_buckets_arm(tcg_buckets* b) {
  return guard([&] {
    std::lock_guard<std::mutex> lock(b->state->mu);
    if (b->state->forked) {
      // a round that a failed step left half done: order the side stream's work before what
      // follows (an eager failure leaves it queued; a failed capture has been torn down)
      b->state->forked = false;
      if (c10::cuda::currentStreamCaptureStatusMayInitCtx() == c10::cuda::CaptureStatus::None) {
        b->state->join_ev.record(b->state->side);
        b->state->join_ev.block(at::cuda::getCurrentCUDAStream(b->state->pg->device));
      }
    }
    b->state->reset();
    b->state->armed = true;
  });
}

tcg_status tcg_buckets_finish(tcg_buckets* b) {
  return guard([&] { b->state->finish(); });
}

}  // extern "C"
