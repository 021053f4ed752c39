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
// The layouts (Layout, one reduction strategy each). As views (PyTorch DDP's
// gradient_as_bucket_view): every bucket is a
// flat buffer made here, and each parameter's .grad is a view into it (at an offset aligned to
// 16 bytes, so vectorized optimizer kernels read it at full speed); backward accumulates into
// the views (AccumulateGrad adds in place into a defined gradient), the bucket is all-reduced in
// place, and nothing is packed or unpacked. The parameters are marked (tcg::keep_grad) so that
// the crate's zero_grad zeroes those gradients in place instead of setting them to none. A
// gradient found elsewhere (set to none and made again by backward, replaced by the caller) is
// copied into its view, which becomes its .grad again. Packed (the default of the Rust side:
// measured faster): backward makes fresh gradients (after a zero_grad that set them to none:
// no add, no zeroing); per bucket one pack kernel into the bucket on the side stream, the
// all-reduce, and each .grad then becomes its view of the bucket (host only: no unpack kernel;
// the replaced gradients are kept until the join, as the pack reads them on the side stream).
// Grouped (an all-reduce, uncompressed, no NCCL buffers): no bucket buffer; each bucket's gradients are all-reduced where they
// are, in one NCCL group. The collective of a buffer (one all-reduce, or a reduce-scatter and an
// all-gather in place) is the Wire's, apart from the layouts; the round (armed, arrivals,
// launches, fork and join) is State's, apart from both.
//
// Compression (bf16, PyTorch's bf16_compress_hook with an average): the bucket is cast into a
// bf16 buffer, all-reduced in bf16, and cast back into the fp32 gradients, which the optimizer
// then uses in fp32.
#include "dist.h"
#include "../bucket_plan.h"

#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <memory>
#include <mutex>

using namespace tcg;

namespace {

// tcg_bucket_buffers: where the bucket buffers come from and how NCCL knows them.
enum class Buffers { caching, nccl_mem, registered, window };

// One allocation of NCCL's allocator holding every bucket buffer, registered with the
// communicator (ncclCommRegister) or as a symmetric window (ncclCommWindowRegister, the same
// offsets on every rank). Deregistered by the bucket set's owner while the group lives; the
// memory itself is freed when the last tensor over it (a gradient view may outlive the buckets)
// goes.
struct NcclArena {
  void* comm = nullptr;
  void* handle = nullptr;  // ncclCommRegister
  void* window = nullptr;  // ncclCommWindowRegister
  at::Tensor bytes;        // uint8 over the allocation; its deleter calls ncclMemFree

  NcclArena() = default;
  NcclArena(const NcclArena&) = delete;
  NcclArena& operator=(const NcclArena&) = delete;
  ~NcclArena() {
    const auto& api = NcclApi::get();
    if (handle != nullptr && api.comm_deregister != nullptr) api.comm_deregister(comm, handle);
    if (window != nullptr && api.window_deregister != nullptr) api.window_deregister(comm, window);
  }
};

// The communicator of `pg` on its device, made by a one-element all-reduce if c10d has not made
// it yet (c10d makes communicators at the first collective).
void* nccl_comm(tcg_pg* pg) {
  void* comm = reinterpret_cast<void*>(pg->pg->getCommPtr());
  if (comm == nullptr) {
    settle_before_eager_collective(pg);
    auto t = at::zeros({1}, at::TensorOptions().device(at::Device(at::kCUDA, pg->device)));
    std::vector<at::Tensor> v{t};
    c10d::AllreduceOptions o;
    o.asyncOp = false;
    auto w = pg->pg->allreduce(v, o);
    if (w) w->wait();
    at::cuda::getCurrentCUDAStream(pg->device).synchronize();
    comm = reinterpret_cast<void*>(pg->pg->getCommPtr());
  }
  if (comm == nullptr) throw exception(TCG_DIST, "GradAllReduce: the process group has no NCCL communicator");
  return comm;
}

// `total` bytes from NCCL's allocator on the group's device, registered as `mode` says.
std::unique_ptr<NcclArena> make_arena(tcg_pg* pg, size_t total, Buffers mode) {
  const auto& api = NcclApi::get();
  if (api.mem_alloc == nullptr || api.mem_free == nullptr || api.comm_register == nullptr ||
      api.window_register == nullptr) {
    throw exception(TCG_DIST, "GradAllReduce: this NCCL has no ncclMemAlloc / ncclCommWindowRegister (NCCL >= 2.27 needed)");
  }
  auto arena = std::make_unique<NcclArena>();
  void* ptr = nullptr;
  api.check(api.mem_alloc(&ptr, total), "GradAllReduce: ncclMemAlloc");
  auto free_fn = api.mem_free;
  arena->bytes = at::from_blob(
      ptr, {static_cast<int64_t>(total)}, [free_fn](void* p) { free_fn(p); },
      at::TensorOptions().dtype(at::kByte).device(at::Device(at::kCUDA, pg->device)));
  if (mode == Buffers::registered || mode == Buffers::window) {
    arena->comm = nccl_comm(pg);
    if (mode == Buffers::registered) {
      api.check(api.comm_register(arena->comm, ptr, total, &arena->handle), "GradAllReduce: ncclCommRegister");
    } else {
      api.check(api.window_register(arena->comm, ptr, total, &arena->window, 1 /* NCCL_WIN_COLL_SYMMETRIC */),
                "GradAllReduce: ncclCommWindowRegister");
    }
  }
  return arena;
}

struct Bucket {
  std::vector<size_t> members;   // parameter indices, in the flat buffer's order
  std::vector<int64_t> offsets;  // each member's offset in the flat buffer (elements)
  int64_t numel = 0;             // the flat buffer's length, padding included
  int64_t used = 0;              // the members' elements and their alignment padding
  at::Tensor flat;               // views, reduce-scatter, NCCL buffers: always; packed: several members
                                 // (never grouped)
  at::Tensor low;                // the bf16 buffer of a compressed bucket
  size_t pending = 0;            // gradients not yet ready in this round
  at::cuda::CUDAEvent done;      // recorded on the side stream after its all-reduce (timing off)
};

// How a bucket's gradients reach the wire: each layout is one strategy (State::reduce picks it).
enum class Layout {
  views,    // every .grad a view into its bucket's flat buffer, reduced in place
  packed,   // gradients packed into the bucket (one cat), reduced, each .grad made its view
  grouped,  // no bucket buffer: the gradients reduced where they are, in one NCCL group
};

// The collective of one buffer: the average over the group, by one all-reduce or by a
// reduce-scatter and an all-gather in place (the collective), through a bf16 copy if compressed.
struct Wire {
  tcg_pg* pg = nullptr;
  tcg_bucket_collective collective = TCG_BUCKET_COLLECTIVE_ALL_REDUCE;
  tcg_bucket_compression compression = TCG_BUCKET_COMPRESSION_NONE;

  bool compressed() const { return compression == TCG_BUCKET_COMPRESSION_BF16; }

  // Averages `buf` on the current stream; `low`: the bucket's bf16 buffer when compressed.
  void average(const at::Tensor& buf, const at::Tensor& low) const {
    at::Tensor wire = buf;
    if (compressed()) {
      low.copy_(buf.view({-1}));  // one cast kernel (buf: the flat buffer, or a lone gradient)
      wire = low;
    }
    check_collective(pg, wire);
    if (collective == TCG_BUCKET_COLLECTIVE_REDUCE_SCATTER_ALL_GATHER) {
      // in place: this rank's chunk gets the average of everyone's chunk, then every chunk is
      // gathered back (by copy engines where NCCL has them for a zero-CTA policy and a window)
      const int64_t part = wire.numel() / pg->size;
      at::Tensor flat = wire.view({-1});
      at::Tensor mine = flat.narrow(0, pg->rank * part, part);
      c10d::ReduceScatterOptions ro;
      ro.reduceOp = c10d::ReduceOp(c10d::ReduceOp::AVG);
      ro.asyncOp = false;
      auto w = pg->pg->_reduce_scatter_base(mine, flat, ro);
      if (w) w->wait();
      c10d::AllgatherOptions ao;
      ao.asyncOp = false;
      w = pg->pg->_allgather_base(flat, mine, ao);
      if (w) w->wait();
    } else {
      std::vector<at::Tensor> v{wire};
      c10d::AllreduceOptions o;
      o.reduceOp = c10d::ReduceOp(c10d::ReduceOp::AVG);
      o.asyncOp = false;  // on the current stream; no Work
      auto w = pg->pg->allreduce(v, o);
      if (w) w->wait();
    }
    if (compressed()) buf.view({-1}).copy_(low);  // back into fp32
  }

  // Averages every tensor where it is, in one NCCL group (one kernel).
  void average_grouped(std::vector<at::Tensor>& ts) const {
    for (auto& t : ts) {
      if (!t.is_contiguous()) misuse("GradAllReduce: a non-contiguous gradient");
      check_collective(pg, t);
    }
    c10d::AllreduceCoalescedOptions o;
    o.reduceOp = c10d::ReduceOp(c10d::ReduceOp::AVG);
    o.asyncOp = false;
    auto w = pg->pg->allreduce_coalesced(ts, o);
    if (w) w->wait();
  }
};

// The bucket set: the layout's state, and the round (armed, which gradients arrived, which
// buckets are launched, whether the side stream was used) that the hooks drive.
struct State {
  std::mutex mu;
  std::unique_ptr<NcclArena> arena;  // NCCL's buffers (declared first: destroyed last)
  tcg_pg* pg;  // kept alive by the Rust owner for longer than this state (see GradAllReduce)
  std::vector<at::Tensor> params;
  std::vector<at::Tensor> views;    // each parameter's view of its bucket (where it has one)
  std::vector<at::Tensor> retired;  // packed: gradients replaced by their views, until the join
  std::vector<size_t> bucket_of;
  std::vector<bool> seen;
  std::vector<Bucket> buckets;
  Layout layout = Layout::packed;
  Wire wire;
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

  // Bucket k on the current stream, by the layout's strategy.
  void reduce(size_t k) {
    Bucket& b = buckets[k];
    c10::AutoGradMode no_grad(false);
    switch (layout) {
      case Layout::views: return reduce_views(b);
      case Layout::grouped: return reduce_grouped(b);
      case Layout::packed: return reduce_packed(b);
    }
  }

  // Views: each gradient back in its view if it went elsewhere, the bucket averaged in place.
  void reduce_views(Bucket& b) {
    for (size_t i : b.members) rebind(i);
    wire.average(b.flat, b.low);
  }

  // Grouped: no bucket buffer; every gradient averaged in place, in one NCCL group.
  void reduce_grouped(Bucket& b) {
    auto g = grads(b);
    wire.average_grouped(g);
  }

  // Packed: a lone gradient is averaged where it is. Otherwise what is not in the bucket yet is
  // packed (one cat kernel when nothing is: the usual case, the gradients made by backward),
  // averaged, then each gradient becomes its view of the bucket: no unpack kernel. A gradient
  // already there (last step's view, accumulated into in place) stays.
  void reduce_packed(Bucket& b) {
    auto g = grads(b);
    if (!b.flat.defined()) {
      if (!g[0].is_contiguous()) misuse("GradAllReduce: a non-contiguous gradient");
      wire.average(g[0], b.low);
      return;
    }
    std::vector<at::Tensor> views_in;
    std::vector<size_t> moved;  // members whose gradient is not their view
    views_in.reserve(g.size());
    for (size_t j = 0; j < g.size(); ++j) {
      views_in.push_back(g[j].reshape({-1}));
      if (!g[j].is_same(views[b.members[j]])) moved.push_back(j);
    }
    if (moved.size() == g.size()) {
      at::Tensor packed = b.flat.narrow(0, 0, b.used);  // without the reduce-scatter's padding
      at::cat_out(packed, views_in, 0);                   // one kernel
    } else {
      for (size_t j : moved) views[b.members[j]].copy_(g[j]);
    }
    wire.average(b.flat, b.low);
    for (size_t j : moved) {
      // the old gradient is read by the pack on this (side) stream: kept until the join
      retired.push_back(g[j]);
      params[b.members[j]].mutable_grad() = views[b.members[j]];
    }
  }

  // Bucket k on the side stream, after what the current stream has queued (its gradients).
  void reduce_on_side(size_t k) {
    fork_ev.record(at::cuda::getCurrentCUDAStream(pg->device));
    fork_ev.block(side);
    forked = true;
    c10::cuda::CUDAStreamGuard on_side(side);
    reduce(k);
    buckets[k].done.record(side);
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
    if (layout == Layout::views) rebind(i);
    --buckets[bucket_of[i]].pending;
    while (next < buckets.size() && buckets[next].pending == 0) reduce_on_side(next++);
  }

  // Launches the buckets not launched yet: on the side stream if this round used it (one
  // stream per communicator), else here; disarms. On error the round is reset (not joined).
  void launch_rest() {
    armed = false;
    try {
      while (next < buckets.size()) {
        if (forked) {
          reduce_on_side(next++);
        } else {
          reduce(next);
          buckets[next++].done.record(at::cuda::getCurrentCUDAStream(pg->device));
        }
      }
    } catch (...) {
      reset();
      forked = false;
      throw;
    }
  }

  // Makes the current stream wait for the side stream (if this round used it); a new round.
  void join() {
    if (forked) {
      join_ev.record(side);
      join_ev.block(at::cuda::getCurrentCUDAStream(pg->device));
    }
    // freed on the current stream, after the side stream's reads of them (the join)
    retired.clear();
    reset();
    forked = false;
  }

  void finish() {
    std::lock_guard<std::mutex> lock(mu);
    launch_rest();
    join();
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

namespace {

Buffers buffers_of(tcg_bucket_buffers m) {
  switch (m) {
    case TCG_BUCKET_BUFFERS_CACHING: return Buffers::caching;
    case TCG_BUCKET_BUFFERS_NCCL_MEM: return Buffers::nccl_mem;
    case TCG_BUCKET_BUFFERS_NCCL_REGISTERED: return Buffers::registered;
    case TCG_BUCKET_BUFFERS_NCCL_WINDOW: return Buffers::window;
  }
  misuse("GradAllReduce: unknown bucket buffers " + std::to_string(static_cast<int>(m)));
}

Layout layout_of(tcg_bucket_layout l) {
  switch (l) {
    case TCG_BUCKET_LAYOUT_PACKED: return Layout::packed;
    case TCG_BUCKET_LAYOUT_VIEWS: return Layout::views;
    case TCG_BUCKET_LAYOUT_GROUPED: return Layout::grouped;
  }
  misuse("GradAllReduce: unknown bucket layout " + std::to_string(static_cast<int>(l)));
}

// Every parameter a leaf that requires grad, of one dtype, on the group's device, without a
// hook of another GradAllReduce; bf16 compression of float32 gradients only.
void check_params(const State& s) {
  const auto kind = s.params[0].scalar_type();
  if (s.wire.compressed() && kind != at::kFloat) misuse("GradAllReduce: bf16 compression needs float32 gradients");
  for (size_t i = 0; i < s.params.size(); ++i) {
    const auto& p = s.params[i];
    check_collective(s.pg, p);
    if (p.scalar_type() != kind) misuse("GradAllReduce: parameters of more than one dtype");
    if (!p.is_leaf() || !p.requires_grad()) misuse("GradAllReduce: parameter #" + std::to_string(i) + " is not a leaf that requires grad");
    if (torch::autograd::impl::post_acc_grad_hooks(p) != nullptr) {
      misuse("GradAllReduce: parameter #" + std::to_string(i) +
             " already has a post-accumulate-grad hook (is it in another GradAllReduce?)");
    }
  }
}

// The layout of bucket_plan.h (members, offsets, lengths), tested on the CPU through
// tcg_buckets_plan.
void plan_buckets(State& s, int64_t bucket_bytes, int64_t first_bucket_bytes) {
  std::vector<int64_t> numels;
  for (const auto& p : s.params) numels.push_back(p.numel());
  buckets::Rules rules;
  rules.element_bytes = static_cast<int64_t>(c10::elementSize(s.params[0].scalar_type()));
  rules.bucket_bytes = bucket_bytes;
  rules.first_bucket_bytes = first_bucket_bytes;
  rules.aligned = s.layout == Layout::views;
  rules.padded = s.wire.collective == TCG_BUCKET_COLLECTIVE_REDUCE_SCATTER_ALL_GATHER;
  rules.world = s.pg->size;
  for (auto& planned : buckets::plan(numels, rules, &s.bucket_of)) {
    auto& b = s.buckets.emplace_back();
    b.members = std::move(planned.members);
    b.offsets = std::move(planned.offsets);
    b.numel = planned.numel;
    b.used = planned.used;
  }
  s.seen.assign(s.params.size(), false);
}

// The flat (and bf16) buffers of the buckets: from the caching allocator, or all in one
// allocation of NCCL's allocator.
void allocate_buffers(State& s, Buffers mode) {
  const auto opts = s.params[0].options().requires_grad(false);
  const int64_t elt = static_cast<int64_t>(c10::elementSize(s.params[0].scalar_type()));
  if (mode == Buffers::caching) {
    for (auto& b : s.buckets) {
      if (s.layout != Layout::grouped && (s.layout == Layout::views || s.wire.collective == TCG_BUCKET_COLLECTIVE_REDUCE_SCATTER_ALL_GATHER || b.members.size() > 1)) b.flat = at::zeros({b.numel}, opts);
      if (s.wire.compressed()) b.low = at::zeros({b.numel}, opts.dtype(at::kBFloat16));
    }
    return;
  }
  // every buffer in one allocation of NCCL's allocator, each at a 256-byte aligned offset
  // (the same on every rank: the same parameters give the same layout); every bucket gets
  // a flat buffer there, so every all-reduce uses NCCL's memory
  auto round = [](int64_t bytes) { return (bytes + 255) / 256 * 256; };
  int64_t total = 0;
  for (auto& b : s.buckets) total += round(b.numel * elt) + (s.wire.compressed() ? round(b.numel * 2) : 0);
  s.arena = make_arena(s.pg, static_cast<size_t>(std::max<int64_t>(total, 256)), mode);
  int64_t at = 0;
  for (auto& b : s.buckets) {
    b.flat = s.arena->bytes.narrow(0, at, b.numel * elt).view(opts.dtype().toScalarType()).zero_();
    at += round(b.numel * elt);
    if (s.wire.compressed()) {
      b.low = s.arena->bytes.narrow(0, at, b.numel * 2).view(at::kBFloat16).zero_();
      at += round(b.numel * 2);
    }
  }
}

// Each member's view of its bucket's flat buffer; as views, each parameter's .grad becomes it
// (keeping a gradient already there).
void attach_views(State& s) {
  c10::AutoGradMode no_grad(false);
  s.views.resize(s.params.size());
  for (auto& b : s.buckets) {
    if (!b.flat.defined()) continue;  // packed, one member: reduced where it is
    for (size_t j = 0; j < b.members.size(); ++j) {
      const size_t i = b.members[j];
      auto& p = s.params[i];
      s.views[i] = b.flat.narrow(0, b.offsets[j], p.numel()).view(p.sizes());
      if (s.layout != Layout::views) continue;
      if (p.grad().defined()) s.views[i].copy_(p.grad());
      p.mutable_grad() = s.views[i];
    }
  }
  if (s.layout == Layout::views) {
    for (auto& p : s.params) keep_grad(p, true);
  }
}

}  // namespace

extern "C" {

tcg_status tcg_buckets_new(tcg_pg* pg, tcg_tensors params, const tcg_buckets_options* o, tcg_buckets** out) {
  return guard([&] {
    if (pg == nullptr) misuse("null process group");
    if (params.len == 0) misuse("GradAllReduce: no parameters");
    if (o == nullptr) misuse("GradAllReduce: null options");
    const std::string why = buckets::invalid(*o);
    if (!why.empty()) misuse("GradAllReduce: " + why);
    const Buffers mode = buffers_of(o->buffers);
    c10::cuda::CUDAGuard on_device(pg->device);
    if (mode != Buffers::caching && c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None) {
      misuse("GradAllReduce: NCCL buffers are registered collectively: make the buckets outside a capture");
    }
    auto s = std::make_shared<State>(at::cuda::getStreamFromPool(o->high_priority, pg->device));
    s->pg = pg;
    s->params = tensor_list(params);
    s->layout = layout_of(o->layout);
    s->wire = Wire{pg, o->collective, o->compression};
    check_params(*s);
    plan_buckets(*s, o->bucket_bytes, o->first_bucket_bytes);
    allocate_buffers(*s, mode);
    attach_views(*s);
    s->reset();
    for (size_t i = 0; i < s->params.size(); ++i) {
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
      if (b->state->layout == Layout::views) keep_grad(p, false);
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

tcg_status tcg_buckets_launch_rest(tcg_buckets* b) {
  return guard([&] {
    std::lock_guard<std::mutex> lock(b->state->mu);
    b->state->launch_rest();
  });
}

tcg_status tcg_buckets_wait_bucket(tcg_buckets* b, size_t k) {
  return guard([&] {
    State& s = *b->state;
    std::lock_guard<std::mutex> lock(s.mu);
    if (k >= s.buckets.size()) misuse("GradAllReduce: no bucket #" + std::to_string(k));
    if (k >= s.next) misuse("GradAllReduce: bucket #" + std::to_string(k) + " was not launched (launch_rest first)");
    s.buckets[k].done.block(at::cuda::getCurrentCUDAStream(s.pg->device));
  });
}

tcg_status tcg_buckets_join(tcg_buckets* b) {
  return guard([&] {
    std::lock_guard<std::mutex> lock(b->state->mu);
    b->state->join();
  });
}

tcg_status tcg_buckets_members(tcg_buckets* b, size_t k, size_t* out, size_t cap, size_t* n) {
  return guard([&] {
    const State& s = *b->state;
    if (k >= s.buckets.size()) misuse("GradAllReduce: no bucket #" + std::to_string(k));
    const auto& m = s.buckets[k].members;
    *n = m.size();
    for (size_t j = 0; j < m.size() && j < cap; ++j) out[j] = m[j];
  });
}

}  // extern "C"
