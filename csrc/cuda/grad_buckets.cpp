// Gradient buckets for data parallel training (DDP-style), fed by autograd hooks.
//
// Parameters are grouped, in reverse order (the order backward produces their gradients), into
// buckets of about `bucket_bytes`. Each parameter gets a post-accumulate-grad hook (the C++ form
// of Tensor.register_post_accumulate_grad_hook). While the buckets are armed, the hook marks its
// gradient ready; once a bucket's gradients are all ready, a side stream of the bucket set waits
// for the stream backward runs on (the fork) and all-reduces the bucket there (average; c10d
// with asyncOp = false runs it on the current stream, here the side stream), overlapping the
// rest of backward. Buckets launch in index order on every rank (NCCL needs the same order
// everywhere), all on the one side stream (so this communicator's operations never run on two
// streams at once). finish() launches what is left, and makes the current stream wait for the
// side stream (the join). Not armed, finish() does every bucket on the current stream: no fork,
// no join. Under stream capture the fork and the join are recorded into the graph.
//
// Two layouts. As views (PyTorch DDP's gradient_as_bucket_view; as_views): every bucket is a
// flat buffer made here, and each parameter's .grad is a view into it (at an offset aligned to
// 16 bytes, so vectorized optimizer kernels read it at full speed); backward accumulates into
// the views (AccumulateGrad adds in place into a defined gradient), the bucket is all-reduced in
// place, and nothing is packed or unpacked. The parameters are marked (tcg::keep_grad) so that
// the crate's zero_grad zeroes those gradients in place instead of setting them to none. A
// gradient found elsewhere (set to none and made again by backward, replaced by the caller) is
// copied into its view, which becomes its .grad again. Packed (the default of the Rust side:
// measured as fast or faster): gradients live where backward puts them; per bucket one pack
// kernel, the all-reduce, one unpack kernel, all on the side stream.
//
// Compression (bf16, PyTorch's bf16_compress_hook with an average): the bucket is cast into a
// bf16 buffer, all-reduced in bf16, and cast back into the fp32 gradients, which the optimizer
// then uses in fp32.
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
  std::vector<size_t> members;   // parameter indices, in the flat buffer's order
  std::vector<int64_t> offsets;  // each member's offset in the flat buffer (elements)
  int64_t numel = 0;             // the flat buffer's length, padding included
  at::Tensor flat;               // views: always; packed: only for several members
  at::Tensor low;                // the bf16 buffer of a compressed bucket
  size_t pending = 0;            // gradients not yet ready in this round
};

struct State {
  std::mutex mu;
  tcg_pg* pg;  // kept alive by the Rust owner for longer than this state (see GradAllReduce)
  std::vector<at::Tensor> params;
  std::vector<at::Tensor> views;  // views layout: each parameter's gradient view
  std::vector<size_t> bucket_of;
  std::vector<bool> seen;
  std::vector<Bucket> buckets;
  bool as_views = true;
  bool compress = false;
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

  const at::Tensor& grad_of(size_t i) {
    const at::Tensor& grad = params[i].grad();
    if (!grad.defined()) {
      misuse("GradAllReduce: parameter #" + std::to_string(i) +
             " has no gradient (run backward first; every parameter must take part in the loss)");
    }
    return grad;
  }

  // Views layout: makes parameter i's .grad its view again if something put it elsewhere (set
  // to none and made again by backward, replaced by the caller), copying the values into it.
  void rebind(size_t i) {
    const at::Tensor& grad = grad_of(i);
    const at::Tensor& view = views[i];
    if (grad.is_same(view)) return;
    if (grad.sizes() != view.sizes() || grad.scalar_type() != view.scalar_type()) {
      misuse("GradAllReduce: parameter #" + std::to_string(i) + "'s gradient changed shape or dtype");
    }
    c10::AutoGradMode no_grad(false);
    view.copy_(grad);
    params[i].mutable_grad() = view;
  }

  std::vector<at::Tensor> grads(const Bucket& b) {
    std::vector<at::Tensor> g;
    g.reserve(b.members.size());
    for (size_t i : b.members) g.push_back(grad_of(i));
    return g;
  }

  // All-reduces `buf` (average) on the current stream; through the bf16 buffer if compressed.
  void all_reduce(Bucket& b, const at::Tensor& buf) {
    at::Tensor wire = buf;
    if (compress) {
      b.low.copy_(buf.view({-1}));  // one cast kernel (buf: the flat buffer, or a lone gradient)
      wire = b.low;
    }
    check_collective(pg, wire);
    std::vector<at::Tensor> v{wire};
    c10d::AllreduceOptions o;
    o.reduceOp = c10d::ReduceOp(c10d::ReduceOp::AVG);
    o.asyncOp = false;  // on the current stream; no Work
    auto w = pg->pg->allreduce(v, o);
    if (w) w->wait();
    if (compress) buf.view({-1}).copy_(b.low);  // back into fp32
  }

  // Bucket k on the current stream: in place (views), or pack, all-reduce, unpack.
  void reduce(size_t k) {
    Bucket& b = buckets[k];
    c10::AutoGradMode no_grad(false);
    if (as_views) {
      for (size_t i : b.members) rebind(i);
      all_reduce(b, b.flat);
      return;
    }
    auto g = grads(b);
    if (!b.flat.defined()) {
      if (!g[0].is_contiguous()) misuse("GradAllReduce: a non-contiguous gradient");
      all_reduce(b, g[0]);
      return;
    }
    std::vector<at::Tensor> views_in;
    views_in.reserve(g.size());
    for (auto& t : g) views_in.push_back(t.reshape({-1}));
    at::cat_out(b.flat, views_in, 0);  // one kernel
    all_reduce(b, b.flat);
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
    // views: a gradient made elsewhere is copied into its view here, on backward's stream, so
    // the bucket's all-reduce on the side stream (which waits for this stream) sees it
    if (as_views) rebind(i);
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

tcg_status tcg_buckets_new(tcg_pg* pg, tcg_tensor* params, size_t n, int64_t bucket_bytes, int as_views, int compress,
                           tcg_buckets** out) {
  return guard([&] {
    if (pg == nullptr) misuse("null process group");
    if (n == 0) misuse("GradAllReduce: no parameters");
    c10::cuda::CUDAGuard on_device(pg->device);
    auto s = std::make_shared<State>(at::cuda::getStreamFromPool(false, pg->device));
    s->pg = pg;
    s->params = tensor_list(params, n);
    s->as_views = as_views != 0;
    s->compress = compress != 0;
    const auto kind = s->params[0].scalar_type();
    if (s->compress && kind != at::kFloat) misuse("GradAllReduce: bf16 compression needs float32 gradients");
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
    const int64_t align = std::max<int64_t>(16 / elt, 1);  // elements per 16 bytes
    s->bucket_of.assign(n, 0);
    s->seen.assign(n, false);
    for (size_t r = n; r-- > 0;) {  // reverse: the order backward produces gradients
      const int64_t numel = s->params[r].numel();
      if (s->buckets.empty() || (!s->buckets.back().members.empty() && (s->buckets.back().numel + numel) * elt > cap)) {
        s->buckets.emplace_back();
      }
      auto& b = s->buckets.back();
      // views: each member starts 16-byte aligned; packed: back to back (cat's layout)
      const int64_t at = s->as_views ? (b.numel + align - 1) / align * align : b.numel;
      b.members.push_back(r);
      b.offsets.push_back(at);
      b.numel = at + numel;
      s->bucket_of[r] = s->buckets.size() - 1;
    }
    const auto opts = s->params[0].options().requires_grad(false);
    for (auto& b : s->buckets) {
      if (s->as_views || b.members.size() > 1) b.flat = at::zeros({b.numel}, opts);
      if (s->compress) b.low = at::zeros({b.numel}, opts.dtype(at::kBFloat16));
    }
    if (s->as_views) {
      c10::AutoGradMode no_grad(false);
      s->views.resize(n);
      for (auto& b : s->buckets) {
        for (size_t j = 0; j < b.members.size(); ++j) {
          const size_t i = b.members[j];
          auto& p = s->params[i];
          s->views[i] = b.flat.narrow(0, b.offsets[j], p.numel()).view(p.sizes());
          if (p.grad().defined()) s->views[i].copy_(p.grad());  // keep a gradient already there
          p.mutable_grad() = s->views[i];
        }
      }
      for (auto& p : s->params) keep_grad(p, true);
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
      // the gradients stay valid views of the buckets (the views keep them alive); zero_grad
      // may set them to none again
      if (b->state->as_views) keep_grad(p, false);
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
