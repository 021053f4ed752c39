// Gradient buckets for data parallel training (DDP-style), fed by autograd hooks.
//
// Parameters are grouped, in reverse order (the order backward produces their gradients), into
// buckets of about `bucket_bytes`. Each parameter gets a post-accumulate-grad hook (the C++ form
// of Tensor.register_post_accumulate_grad_hook). While the buckets are armed, the hook marks its
// gradient ready; a bucket whose gradients are all ready is packed into its flat buffer (one
// kernel, on the stream backward runs on) and all-reduced (average) asynchronously: c10d's NCCL
// stream waits for the pack, so the all-reduce overlaps the rest of backward. Buckets launch in
// index order on every rank (NCCL needs the same order everywhere). finish() launches what is
// left on the current stream, makes the current stream wait for the buckets launched by hooks
// (the join) and unpacks. Under stream
// capture the fork (NCCL stream waits on an event of the capture stream) and the join are
// recorded into the graph like everything else.
#include "dist.h"

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
  bool launched = false;
  c10::intrusive_ptr<c10d::Work> work;
};

struct State {
  std::mutex mu;
  tcg_pg* pg;  // kept alive by the Rust owner for longer than this state (see GradAllReduce)
  std::vector<at::Tensor> params;
  std::vector<size_t> bucket_of;
  std::vector<bool> seen;
  std::vector<Bucket> buckets;
  size_t next = 0;  // the first bucket not launched yet
  bool armed = false;

  void reset() {
    for (auto& b : buckets) {
      b.pending = b.members.size();
      b.launched = false;
      b.work.reset();
    }
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

  // Packs bucket k and starts its all-reduce: from a hook, asynchronously on c10d's NCCL stream
  // (the fork; finish() joins); otherwise on the current stream (nothing left to overlap with:
  // no fork, no join, as a plain all_reduce).
  void launch(size_t k, bool async) {
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
    o.asyncOp = async;
    b.work = pg->pg->allreduce(v, o);  // null when not async
    b.launched = true;
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
    while (next < buckets.size() && buckets[next].pending == 0) launch(next++, true);
  }

  void finish() {
    std::lock_guard<std::mutex> lock(mu);
    armed = false;
    struct Reset {
      State* s;
      ~Reset() { s->reset(); }
    } reset_on_exit{this};
    while (next < buckets.size()) launch(next++, false);
    c10::AutoGradMode no_grad(false);
    for (auto& b : buckets) {
      if (b.work) b.work->wait();  // the join: the current stream waits, the host does not
      b.work.reset();
      if (!b.flat.defined()) continue;
      auto g = grads(b);
      std::vector<int64_t> sizes;
      sizes.reserve(g.size());
      for (auto& t : g) sizes.push_back(t.numel());
      auto parts = b.flat.split_with_sizes(sizes, 0);
      std::vector<at::Tensor> src;
      src.reserve(g.size());
      for (size_t j = 0; j < g.size(); ++j) src.push_back(parts[j].view(g[j].sizes()));
      at::_foreach_copy_(g, src);  // one multi-tensor kernel
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
    auto s = std::make_shared<State>();
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
    b->state->reset();
    b->state->armed = true;
  });
}

tcg_status tcg_buckets_finish(tcg_buckets* b) {
  return guard([&] { b->state->finish(); });
}

}  // extern "C"
