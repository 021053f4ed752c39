// The layout of every struct that crosses the C boundary, as this compiler lays it out, so the
// Rust side can check its #[repr(C)] declarations field by field (src/sys/layout.rs), and the
// size of every enum the API passes (the Rust side declares each as a C int).
#include "shim.h"

#include <cstddef>

static_assert(sizeof(tcg_status) == sizeof(int), "tcg_status is passed as an int");
static_assert(sizeof(tcg_capture_mode) == sizeof(int), "tcg_capture_mode is passed as an int");
static_assert(sizeof(tcg_capture_status) == sizeof(int), "tcg_capture_status is passed as an int");
static_assert(sizeof(tcg_cond_kind) == sizeof(int), "tcg_cond_kind is passed as an int");
static_assert(sizeof(tcg_kernels) == sizeof(int), "tcg_kernels is passed as an int");
static_assert(sizeof(tcg_dtype) == sizeof(int), "tcg_dtype is passed as an int");
static_assert(sizeof(tcg_prof_kind) == sizeof(int32_t), "tcg_prof_kind is read as an int32");
static_assert(sizeof(tcg_reduce_op) == sizeof(int), "tcg_reduce_op is passed as an int");
static_assert(sizeof(tcg_bucket_layout) == sizeof(int), "tcg_bucket_layout is passed as an int");
static_assert(sizeof(tcg_bucket_collective) == sizeof(int), "tcg_bucket_collective is passed as an int");
static_assert(sizeof(tcg_bucket_compression) == sizeof(int), "tcg_bucket_compression is passed as an int");
static_assert(sizeof(tcg_bucket_buffers) == sizeof(int), "tcg_bucket_buffers is passed as an int");
static_assert(sizeof(tcg_layout_struct) == sizeof(int), "tcg_layout_struct is passed as an int");
static_assert(sizeof(tcg_norm_kind) == sizeof(int), "tcg_norm_kind is passed as an int");
static_assert(sizeof(tcg_norm_out) == sizeof(int), "tcg_norm_out is passed as an int");
static_assert(sizeof(tcg_weight_grad) == sizeof(int), "tcg_weight_grad is passed as an int");
static_assert(sizeof(tcg_rotary_layout) == sizeof(int), "tcg_rotary_layout is passed as an int");

namespace {

struct layout_writer {
  size_t* offsets;
  size_t cap;
  size_t n = 0;
  void field(size_t offset) {
    if (n < cap) offsets[n] = offset;
    ++n;
  }
};

#define TCG_FIELD(T, f) w.field(offsetof(T, f))

}  // namespace

extern "C" {

// Long by nature: a table, one case per struct.
size_t tcg_layout(tcg_layout_struct s, size_t* size, size_t* align, size_t* offsets, size_t cap) {
  layout_writer w{offsets, cap};
  *size = 0;
  *align = 0;
  auto set = [&](size_t sz, size_t al) {
    *size = sz;
    *align = al;
  };
  switch (s) {
    case TCG_LAYOUT_STREAM:
      set(sizeof(tcg_stream), alignof(tcg_stream));
      TCG_FIELD(tcg_stream, id);
      TCG_FIELD(tcg_stream, device_index);
      TCG_FIELD(tcg_stream, device_type);
      break;
    case TCG_LAYOUT_POOL_ID:
      set(sizeof(tcg_pool_id), alignof(tcg_pool_id));
      TCG_FIELD(tcg_pool_id, first);
      TCG_FIELD(tcg_pool_id, second);
      break;
    case TCG_LAYOUT_MEM_STATS:
      set(sizeof(tcg_mem_stats), alignof(tcg_mem_stats));
      TCG_FIELD(tcg_mem_stats, allocated);
      TCG_FIELD(tcg_mem_stats, allocated_peak);
      TCG_FIELD(tcg_mem_stats, reserved);
      TCG_FIELD(tcg_mem_stats, reserved_peak);
      TCG_FIELD(tcg_mem_stats, active);
      TCG_FIELD(tcg_mem_stats, alloc_retries);
      TCG_FIELD(tcg_mem_stats, ooms);
      break;
    case TCG_LAYOUT_POOL_BLOCK:
      set(sizeof(tcg_pool_block), alignof(tcg_pool_block));
      TCG_FIELD(tcg_pool_block, segment);
      TCG_FIELD(tcg_pool_block, segment_size);
      TCG_FIELD(tcg_pool_block, offset);
      TCG_FIELD(tcg_pool_block, size);
      TCG_FIELD(tcg_pool_block, requested);
      TCG_FIELD(tcg_pool_block, allocated);
      TCG_FIELD(tcg_pool_block, large);
      break;
    case TCG_LAYOUT_NODE_KINDS:
      set(sizeof(tcg_node_kinds), alignof(tcg_node_kinds));
      TCG_FIELD(tcg_node_kinds, kernel);
      TCG_FIELD(tcg_node_kinds, memcpy);
      TCG_FIELD(tcg_node_kinds, memset);
      TCG_FIELD(tcg_node_kinds, host);
      TCG_FIELD(tcg_node_kinds, graph);
      TCG_FIELD(tcg_node_kinds, empty);
      TCG_FIELD(tcg_node_kinds, event);
      TCG_FIELD(tcg_node_kinds, mem_alloc_free);
      TCG_FIELD(tcg_node_kinds, other);
      break;
    case TCG_LAYOUT_PROF_EVENT:
      set(sizeof(tcg_prof_event), alignof(tcg_prof_event));
      TCG_FIELD(tcg_prof_event, start_ns);
      TCG_FIELD(tcg_prof_event, end_ns);
      TCG_FIELD(tcg_prof_event, stream);
      TCG_FIELD(tcg_prof_event, device);
      TCG_FIELD(tcg_prof_event, kind);
      break;
    case TCG_LAYOUT_TENSORS:
      set(sizeof(tcg_tensors), alignof(tcg_tensors));
      TCG_FIELD(tcg_tensors, data);
      TCG_FIELD(tcg_tensors, len);
      break;
    case TCG_LAYOUT_AMP_SCALING:
      set(sizeof(tcg_amp_scaling), alignof(tcg_amp_scaling));
      TCG_FIELD(tcg_amp_scaling, grad_scale);
      TCG_FIELD(tcg_amp_scaling, found_inf);
      TCG_FIELD(tcg_amp_scaling, clip_coef);
      break;
    case TCG_LAYOUT_SGD_HYPER:
      set(sizeof(tcg_sgd_hyper), alignof(tcg_sgd_hyper));
      TCG_FIELD(tcg_sgd_hyper, weight_decay);
      TCG_FIELD(tcg_sgd_hyper, momentum);
      TCG_FIELD(tcg_sgd_hyper, dampening);
      TCG_FIELD(tcg_sgd_hyper, nesterov);
      TCG_FIELD(tcg_sgd_hyper, maximize);
      break;
    case TCG_LAYOUT_SGD_TENSORS:
      set(sizeof(tcg_sgd_tensors), alignof(tcg_sgd_tensors));
      TCG_FIELD(tcg_sgd_tensors, params);
      TCG_FIELD(tcg_sgd_tensors, grads);
      TCG_FIELD(tcg_sgd_tensors, momentum_buffers);
      break;
    case TCG_LAYOUT_ADAM_HYPER:
      set(sizeof(tcg_adam_hyper), alignof(tcg_adam_hyper));
      TCG_FIELD(tcg_adam_hyper, beta1);
      TCG_FIELD(tcg_adam_hyper, beta2);
      TCG_FIELD(tcg_adam_hyper, weight_decay);
      TCG_FIELD(tcg_adam_hyper, eps);
      TCG_FIELD(tcg_adam_hyper, adamw);
      TCG_FIELD(tcg_adam_hyper, amsgrad);
      TCG_FIELD(tcg_adam_hyper, maximize);
      break;
    case TCG_LAYOUT_ADAM_TENSORS:
      set(sizeof(tcg_adam_tensors), alignof(tcg_adam_tensors));
      TCG_FIELD(tcg_adam_tensors, params);
      TCG_FIELD(tcg_adam_tensors, grads);
      TCG_FIELD(tcg_adam_tensors, exp_avgs);
      TCG_FIELD(tcg_adam_tensors, exp_avg_sqs);
      TCG_FIELD(tcg_adam_tensors, max_exp_avg_sqs);
      TCG_FIELD(tcg_adam_tensors, steps);
      break;
    case TCG_LAYOUT_BUCKETS_OPTIONS:
      set(sizeof(tcg_buckets_options), alignof(tcg_buckets_options));
      TCG_FIELD(tcg_buckets_options, bucket_bytes);
      TCG_FIELD(tcg_buckets_options, first_bucket_bytes);
      TCG_FIELD(tcg_buckets_options, layout);
      TCG_FIELD(tcg_buckets_options, collective);
      TCG_FIELD(tcg_buckets_options, compression);
      TCG_FIELD(tcg_buckets_options, buffers);
      TCG_FIELD(tcg_buckets_options, high_priority);
      break;
    case TCG_LAYOUT_BUCKET_SLOT:
      set(sizeof(tcg_bucket_slot), alignof(tcg_bucket_slot));
      TCG_FIELD(tcg_bucket_slot, bucket);
      TCG_FIELD(tcg_bucket_slot, offset);
      break;
    case TCG_LAYOUT_NORM_INPUTS:
      set(sizeof(tcg_norm_inputs), alignof(tcg_norm_inputs));
      TCG_FIELD(tcg_norm_inputs, res);
      TCG_FIELD(tcg_norm_inputs, branch);
      TCG_FIELD(tcg_norm_inputs, weight);
      TCG_FIELD(tcg_norm_inputs, bias);
      TCG_FIELD(tcg_norm_inputs, branch_bias);
      break;
    case TCG_LAYOUT_NORM_OPTIONS:
      set(sizeof(tcg_norm_options), alignof(tcg_norm_options));
      TCG_FIELD(tcg_norm_options, eps);
      TCG_FIELD(tcg_norm_options, dropout);
      TCG_FIELD(tcg_norm_options, kind);
      TCG_FIELD(tcg_norm_options, out);
      TCG_FIELD(tcg_norm_options, train);
      break;
    case TCG_LAYOUT_LINEAR_INPUTS:
      set(sizeof(tcg_linear_inputs), alignof(tcg_linear_inputs));
      TCG_FIELD(tcg_linear_inputs, x);
      TCG_FIELD(tcg_linear_inputs, weight);
      TCG_FIELD(tcg_linear_inputs, bias);
      TCG_FIELD(tcg_linear_inputs, weight_grad_to);
      break;
    case TCG_LAYOUT_ROTARY_INPUTS:
      set(sizeof(tcg_rotary_inputs), alignof(tcg_rotary_inputs));
      TCG_FIELD(tcg_rotary_inputs, q);
      TCG_FIELD(tcg_rotary_inputs, k);
      TCG_FIELD(tcg_rotary_inputs, cos);
      TCG_FIELD(tcg_rotary_inputs, sin);
      TCG_FIELD(tcg_rotary_inputs, offset);
      break;
    case TCG_LAYOUT_ROTARY_QKV_INPUTS:
      set(sizeof(tcg_rotary_qkv_inputs), alignof(tcg_rotary_qkv_inputs));
      TCG_FIELD(tcg_rotary_qkv_inputs, qkv);
      TCG_FIELD(tcg_rotary_qkv_inputs, cos);
      TCG_FIELD(tcg_rotary_qkv_inputs, sin);
      TCG_FIELD(tcg_rotary_qkv_inputs, offset);
      TCG_FIELD(tcg_rotary_qkv_inputs, heads);
      TCG_FIELD(tcg_rotary_qkv_inputs, kv_heads);
      break;
    case TCG_LAYOUT_ROTARY_PROJECT_INPUTS:
      set(sizeof(tcg_rotary_project_inputs), alignof(tcg_rotary_project_inputs));
      TCG_FIELD(tcg_rotary_project_inputs, x);
      TCG_FIELD(tcg_rotary_project_inputs, weight);
      TCG_FIELD(tcg_rotary_project_inputs, bias);
      TCG_FIELD(tcg_rotary_project_inputs, cos);
      TCG_FIELD(tcg_rotary_project_inputs, sin);
      TCG_FIELD(tcg_rotary_project_inputs, cos_gemm);
      TCG_FIELD(tcg_rotary_project_inputs, sin_gemm);
      TCG_FIELD(tcg_rotary_project_inputs, heads);
      TCG_FIELD(tcg_rotary_project_inputs, kv_heads);
      break;
    case TCG_LAYOUT_SCHEDULE:
      set(sizeof(tcg_schedule), alignof(tcg_schedule));
      TCG_FIELD(tcg_schedule, kind);
      TCG_FIELD(tcg_schedule, warmup);
      TCG_FIELD(tcg_schedule, total);
      TCG_FIELD(tcg_schedule, min_factor);
      TCG_FIELD(tcg_schedule, step_size);
      TCG_FIELD(tcg_schedule, gamma);
      break;
    case TCG_LAYOUT_MLP_INPUTS:
      set(sizeof(tcg_mlp_inputs), alignof(tcg_mlp_inputs));
      TCG_FIELD(tcg_mlp_inputs, x);
      TCG_FIELD(tcg_mlp_inputs, fc_weight);
      TCG_FIELD(tcg_mlp_inputs, fc_bias);
      TCG_FIELD(tcg_mlp_inputs, proj_weight);
      TCG_FIELD(tcg_mlp_inputs, proj_bias);
      break;
    case TCG_LAYOUT_GEMM_ENTRY:
      set(sizeof(tcg_gemm_entry), alignof(tcg_gemm_entry));
      TCG_FIELD(tcg_gemm_entry, key);
      TCG_FIELD(tcg_gemm_entry, algo);
      TCG_FIELD(tcg_gemm_entry, timed);
      break;
    case TCG_LAYOUT_GEMM_IDENTITY:
      set(sizeof(tcg_gemm_identity), alignof(tcg_gemm_identity));
      TCG_FIELD(tcg_gemm_identity, device);
      TCG_FIELD(tcg_gemm_identity, cublaslt_version);
      TCG_FIELD(tcg_gemm_identity, torch_version);
      break;
    case TCG_LAYOUT_LINEAR_CE_OPTIONS:
      set(sizeof(tcg_linear_ce_options), alignof(tcg_linear_ce_options));
      TCG_FIELD(tcg_linear_ce_options, ignore_index);
      TCG_FIELD(tcg_linear_ce_options, chunk_rows);
      TCG_FIELD(tcg_linear_ce_options, wgrad);
      break;
  }
  return w.n;
}

}  // extern "C"
