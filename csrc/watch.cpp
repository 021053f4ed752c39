// Tensor watches: a captured graph reads and writes fixed addresses, so a tensor whose storage
// was replaced after capture (set_data, a dtype change, a resize) leaves the graph working on
// freed or foreign memory. A watch records each tensor's data pointer, dtype and shape, keeps
// the tensor alive, and checks all of them in one call (a few nanoseconds per tensor).
#include "shim.h"

#include <sstream>

namespace {

struct entry {
  at::Tensor tensor;
  // Raw view of `tensor`'s impl: stable while `tensor` holds it (set_data, set_ and resize_
  // change the impl in place, never replace it), so the check reads it without refcounting.
  const c10::TensorImpl* impl;
  bool has_storage;
  const void* data;
  int64_t offset;
  caffe2::TypeMeta dtype;
  std::vector<int64_t> sizes;
};

const void* data_of(const at::Tensor& t) {
  return t.defined() && t.has_storage() ? t.const_data_ptr() : nullptr;
}

// The hot path: inline accessors only (no checks that throw, no refcount traffic).
bool unchanged(const entry& e) {
  const c10::TensorImpl* impl = e.impl;
  if (impl->has_storage() != e.has_storage) return false;
  if (e.has_storage && (impl->unsafe_storage().data() != e.data || impl->storage_offset() != e.offset)) {
    return false;
  }
  return impl->dtype() == e.dtype && impl->sizes() == c10::IntArrayRef(e.sizes);
}

std::string describe_change(const entry& e) {
  const at::Tensor& t = e.tensor;
  std::ostringstream s;
  if (!t.defined()) {
    s << "it is no longer defined";
  } else if (t.dtype() != e.dtype) {
    s << "its dtype changed from " << e.dtype.name() << " to " << t.dtype().name();
  } else if (t.sizes() != c10::IntArrayRef(e.sizes)) {
    s << "its shape changed from " << c10::IntArrayRef(e.sizes) << " to " << t.sizes();
  } else {
    s << "its storage was replaced (data pointer " << e.data << " -> " << data_of(t) << ", offset "
      << e.offset << " -> " << (t.has_storage() ? t.storage_offset() : 0) << ")";
  }
  return s.str();
}

}  // namespace

struct tcg_watch {
  std::vector<entry> entries;
};

extern "C" {

tcg_status tcg_watch_storage_nbytes(tcg_tensor t, size_t* out) {
  return tcg::guard([&] {
    const auto& x = tcg::tensor_ref(t);
    *out = x.defined() && x.has_storage() ? x.storage().nbytes() : 0;
  });
}

tcg_status tcg_watch_new(tcg_watch** out) {
  return tcg::guard([&] { *out = new tcg_watch(); });
}

void tcg_watch_free(tcg_watch* w) {
  try {
    delete w;
  } catch (...) {
  }
}

tcg_status tcg_watch_refresh(tcg_watch* w) {
  return tcg::guard([&] {
    for (auto& e : w->entries) {
      const at::Tensor& t = e.tensor;
      e.has_storage = t.has_storage();
      e.data = e.has_storage ? t.unsafeGetTensorImpl()->unsafe_storage().data() : nullptr;
      e.offset = e.has_storage ? t.storage_offset() : 0;
      e.dtype = t.dtype();
      e.sizes = t.sizes().vec();
    }
  });
}

tcg_status tcg_watch_add(tcg_watch* w, tcg_tensor* ts, size_t n) {
  return tcg::guard([&] {
    std::vector<entry> added;
    added.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      const at::Tensor& t = tcg::tensor_ref(ts[i]);
      if (!t.defined()) tcg::misuse("watch: tensor #" + std::to_string(i) + " is undefined");
      bool storage = t.has_storage();
      added.push_back(entry{t, t.unsafeGetTensorImpl(), storage,
                            storage ? t.unsafeGetTensorImpl()->unsafe_storage().data() : nullptr,
                            storage ? t.storage_offset() : 0, t.dtype(), t.sizes().vec()});
    }
    w->entries.insert(w->entries.end(), std::make_move_iterator(added.begin()),
                      std::make_move_iterator(added.end()));
  });
}

tcg_status tcg_watch_check(tcg_watch* w, size_t* index) {
  return tcg::guard([&] {
    const auto& es = w->entries;
    for (size_t i = 0; i < es.size(); ++i) {
      const entry& e = es[i];
      if (unchanged(e)) continue;
      *index = i;
      throw tcg::exception(TCG_STALE, describe_change(e));
    }
  });
}

}  // extern "C"
