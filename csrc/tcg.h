// tch-cuda-graphs C shim: a C API over libtorch's CUDA graph, stream, allocator and fused
// optimizer functions. The contract:
// - Every function that can fail returns a tcg_status; on failure a message is kept in a
//   thread-local slot that tcg_error_take_last() hands over (and clears) exactly once. No C++
//   exception leaves any function (tcg::guard in shim.h catches all of them).
// - Four kinds of function return something else and cannot fail: the *_free functions (void;
//   each takes a handle the caller owns and frees it exactly once), tcg_error_take_last /
//   tcg_string_free (the message and its release), the build queries that answer a bool
//   (tcg_device_built_with_cuda, tcg_kernels_built, tcg_pg_available), and tcg_layout.
// - A handle returned through an out pointer on TCG_OK is owned by the caller until its *_free.
// - Types: enumerations are typed enums (passed as an int), flags are `bool`, hyper-parameters
//   and tensor lists are structs; src/sys/layout.rs checks every struct against tcg_layout.
// Naming: each function is tcg_<family>_<what>; each owning family has a matching *_free. One
// section below per file that defines functions (`// ---- FILE`), in the families this table
// gives it (tests/docs.rs checks the two agree):
//   file                   families                   built
//   error.cpp              error, string, testing     always
//   kernels.cpp            kernels                    always
//   gemm.cpp               gemm                       always
//   optim.cpp              optim, grads, lr           always
//   norm.cpp               norm                       always
//   shadow.cpp             shadows                    always
//   linear.cpp             linear                     always
//   loss.cpp               loss                       always
//   rotary.cpp             rotary                     always
//   swiglu.cpp             swiglu                     always
//   embedding.cpp          embedding                  always
//   gelu.cpp               gelu                       always
//   mlp.cpp                mlp                        always
//   autograd.cpp           autograd                   always
//   amp.cpp                autocast, scaler           always
//   watch.cpp              watch                      always
//   feed.cpp               feed                       always
//   cuda/device.cpp        device, stream, event      with CUDA
//   cuda/graph.cpp         graph                      with CUDA
//   cuda/graphed.cpp       graphed                    with CUDA
//   profiler.cpp           profile                    always
//   cuda/conditional.cpp   cond                       with CUDA
//   cuda/memory.cpp        memory, pool               with CUDA
//   cuda/dist.cpp          pg                         with CUDA and NCCL headers
//   cuda/grad_buckets.cpp  buckets                    with CUDA and NCCL headers
//   bucket_plan.cpp        buckets                    always
//   layout.cpp             layout                     always
// The CUDA families as TCG_NO_CUDA stubs: no_cuda.cpp (builds without CUDA), no_dist.cpp (no
// c10d/NCCL).
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  TCG_OK = 0,
  TCG_ERROR = 1,                // libtorch or CUDA error; message in tcg_error_take_last()
  TCG_NO_CUDA = 2,              // built without CUDA, or no CUDA device
  TCG_CAPTURE_INVALIDATED = 3,  // the stream capture was invalidated (e.g. a sync during capture)
  TCG_MISUSE = 4,               // an API used out of order (replay before capture, ...)
  TCG_OUT_OF_MEMORY = 5,        // c10::OutOfMemoryError (or cudaErrorMemoryAllocation)
  TCG_STALE = 6,                // a watched tensor no longer has the storage it had
  TCG_DIST = 7,                 // c10d reported an error (c10::DistError: store, network, NCCL)
  TCG_DIST_TIMEOUT = 8,         // tcg_pg_wait_device gave up: no progress within the timeout
  TCG_UNSUPPORTED = 9,          // not available in this build or on this device (own kernels)
} tcg_status;

// tch's C_tensor: a pointer to a heap-allocated at::Tensor.
typedef void* tcg_tensor;
// A list of tensor handles the callee reads (data may be NULL when len is 0).
typedef struct {
  const tcg_tensor* data;
  size_t len;
} tcg_tensors;
// The c10::ScalarType codes this API names.
typedef enum { TCG_DTYPE_HALF = 5, TCG_DTYPE_FLOAT = 6, TCG_DTYPE_BFLOAT16 = 15 } tcg_dtype;
typedef struct tcg_graph tcg_graph;
typedef struct tcg_stream_guard tcg_stream_guard;
typedef struct tcg_pool_hold tcg_pool_hold;
typedef struct tcg_watch tcg_watch;
typedef struct tcg_event tcg_event;
typedef struct tcg_autocast_guard tcg_autocast_guard;
typedef struct tcg_pg tcg_pg;
typedef struct tcg_buckets tcg_buckets;
typedef struct tcg_graphed tcg_graphed;
typedef struct tcg_cond tcg_cond;
typedef struct tcg_profile tcg_profile;

// A CUDA stream as c10::Stream::pack3() gives it: plain data, no ownership.
typedef struct {
  int64_t id;
  int8_t device_index;
  int8_t device_type;
} tcg_stream;

typedef struct {
  uint64_t first;
  uint64_t second;
} tcg_pool_id;

// The caching allocator's figures for one device (bytes; the current and peak of each).
typedef struct {
  int64_t allocated, allocated_peak;
  int64_t reserved, reserved_peak;
  int64_t active;
  int64_t alloc_retries, ooms;
} tcg_mem_stats;

// One block of a pool's segment (c10::CachingDeviceAllocator's SegmentInfo / BlockInfo).
typedef struct {
  uint64_t segment;    // the segment's device address
  uint64_t segment_size;
  uint64_t offset;     // of the block within its segment
  uint64_t size;       // the block's (rounded) size
  uint64_t requested;  // what was asked for (allocated blocks)
  bool allocated;      // held by a tensor (or by a graph's capture), not free in the pool
  bool large;          // the segment belongs to the large-block pool
} tcg_pool_block;

// Node counts of a captured graph by cudaGraphNodeType; types this shim does not name
// (semaphores, conditionals, types newer than the headers) are counted in `other`.
typedef struct {
  size_t kernel, memcpy, memset, host, graph, empty, event, mem_alloc_free, other;
} tcg_node_kinds;

// cudaStreamCaptureMode: how strictly CUDA refuses unsafe calls while a stream captures.
typedef enum { TCG_CAPTURE_MODE_GLOBAL = 0, TCG_CAPTURE_MODE_THREAD_LOCAL = 1, TCG_CAPTURE_MODE_RELAXED = 2 } tcg_capture_mode;
// cudaStreamCaptureStatus.
typedef enum { TCG_CAPTURE_STATUS_NONE = 0, TCG_CAPTURE_STATUS_ACTIVE = 1, TCG_CAPTURE_STATUS_INVALIDATED = 2 } tcg_capture_status;
// A conditional node: IF (body runs when the condition is non-zero), WHILE, IF_NOT (when zero).
typedef enum { TCG_COND_IF = 0, TCG_COND_WHILE = 1, TCG_COND_IF_NOT = 2 } tcg_cond_kind;

// ---------------------------------------------------------------- error.cpp
// Returns a malloc'ed copy of this thread's last message (NULL if none) and clears it.
char* tcg_error_take_last(void);
void tcg_string_free(char* s);
// Fault injection for tests: the next time this thread reaches `point` ("graph_instantiate"),
// the shim fails there as if libtorch had thrown. NULL clears it.
tcg_status tcg_testing_fail_next(const char* point);

// ---------------------------------------------------------------- kernels.cpp (CPU and CUDA)
// Which kernels a call of the optimizer, norm, linear or loss families runs: ATen's, the crate's
// own where they apply (each family states where; ATen's otherwise), or the crate's own only
// (TCG_UNSUPPORTED, with the reason and nothing done, where they do not apply). The decision is
// tcg::kernels::own (kernels.h); each call says through *ran_own which ran.
typedef enum { TCG_KERNELS_PYTORCH = 0, TCG_KERNELS_AUTO = 1, TCG_KERNELS_OWN = 2 } tcg_kernels;
// Whether the own kernels were built into this binary.
bool tcg_kernels_built(void);
// TCG_OK if the own kernels can run on CUDA device `device` (loading them there on first
// call); TCG_UNSUPPORTED with the reason as message if not; TCG_NO_CUDA without CUDA.
tcg_status tcg_kernels_check(int device);

// ---------------------------------------------------------------- gemm.cpp (CPU and CUDA)
// How the crate's cuBLASLt GEMMs (the linear layer's forward, input- and weight-gradient GEMMs,
// the MLP's, the chunked loss's) choose their algorithm, for the whole process.
// TCG_GEMM_HEURISTIC (the default): cuBLASLt's heuristic's first, the same in every process.
// TCG_GEMM_TIMED: the fastest of the heuristic's first 32 candidates, timed (into scratch
// outputs) on a GEMM shape's first call outside a stream capture, kept for the shape's later
// calls; a shape first met under capture keeps the heuristic's first. A candidate replaces the
// heuristic's first only when 3% faster. As with torch.backends.cudnn.benchmark, two processes
// may choose differently, and so differ in their results' last bits; one process's eager and
// captured calls run the same algorithm.
typedef enum { TCG_GEMM_HEURISTIC = 0, TCG_GEMM_TIMED = 1 } tcg_gemm_choice;
// Sets the choice and forgets the choices made for each shape and those read from a file (the
// next call chooses again).
tcg_status tcg_gemm_set_choice(tcg_gemm_choice choice);
tcg_status tcg_gemm_get_choice(tcg_gemm_choice* out);
// How many GEMM shapes have their algorithm chosen, and how many of those were timed.
tcg_status tcg_gemm_shapes(int64_t* chosen, int64_t* timed, int64_t* from_file);

// One GEMM shape's chosen algorithm as a file of choices holds it: what makes two calls the same
// GEMM (operands' shapes, layouts, dtypes and alignments, the epilogue, beta; the device left
// out), cuBLASLt's algorithm (its 64 opaque bytes, which cuBLASLt documents as serializable for
// the same library version), and whether it was chosen by timing.
#define TCG_GEMM_KEY_LEN 30
typedef struct {
  int64_t key[TCG_GEMM_KEY_LEN];
  uint64_t algo[8];
  bool timed;
} tcg_gemm_entry;
// What a file of choices is valid for: the current device's name, cuBLASLt's version
// (cublasLtGetVersion) and libtorch's (major * 10000 + minor * 100 + patch). TCG_NO_CUDA
// without CUDA.
typedef struct {
  char device[256];
  int64_t cublaslt_version;
  int64_t torch_version;
} tcg_gemm_identity;
tcg_status tcg_gemm_get_identity(tcg_gemm_identity* out);
// The current device's chosen shapes (those read from a file and not yet met included): the first
// `cap` into `out` (NULL with cap 0 counts), *n how many there are.
tcg_status tcg_gemm_export(tcg_gemm_entry* out, int64_t cap, int64_t* n);
// Takes `n` entries as the current device's choices, replacing the choices made for those shapes.
// Each is checked (cublasLtMatmulAlgoCheck, with the call's own descriptors) on its shape's next
// call; one cuBLASLt refuses is dropped and that shape chooses as the process's choice says.
// TCG_NO_CUDA without CUDA.
tcg_status tcg_gemm_import(const tcg_gemm_entry* in, int64_t n);

// ---------------------------------------------------------------- optim.cpp (CPU and CUDA)
// The own kernels apply to CUDA tensors of float32/64/16/bfloat16, contiguous, grads like their
// params, the kernels loadable on the device.
// How an optimizer step scales the gradients it reads: NULL, or 0-d float32 tensors the kernel
// divides the grads by (grad_scale, AMP) and skips the step on (found_inf, non-zero: inf/NaN
// seen), or multiplies them by as it reads them (clip_coef: global-norm clipping folded into the
// update; Adam only, not with grad_scale; the gradients in memory are left as they are).
typedef struct {
  tcg_tensor grad_scale;
  tcg_tensor found_inf;
  tcg_tensor clip_coef;
} tcg_amp_scaling;
// PyTorch's torch.optim.SGD hyper-parameters (the learning rate is a tensor, passed apart).
typedef struct {
  double weight_decay, momentum, dampening;
  bool nesterov, maximize;
} tcg_sgd_hyper;
// params, grads: n each; momentum_buffers: none (momentum 0) or n.
typedef struct {
  tcg_tensors params, grads, momentum_buffers;
} tcg_sgd_tensors;
// torch.optim.Adam / AdamW (adamw: decoupled weight decay).
typedef struct {
  double beta1, beta2, weight_decay, eps;
  bool adamw, amsgrad, maximize;
} tcg_adam_hyper;
// n of each; max_exp_avg_sqs: n with amsgrad, none without. steps: one 0-d float tensor per
// parameter.
typedef struct {
  tcg_tensors params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps;
} tcg_adam_tensors;
// One fused SGD step (torch.optim.SGD(fused=True)). `lr`: a tensor (device or CPU).
// is_first_step: the momentum buffers were just made (the kernel initialises them).
// *ran_own: whether the own kernels ran (else ATen's did).
tcg_status tcg_optim_sgd(const tcg_sgd_tensors* t, tcg_tensor lr, const tcg_sgd_hyper* h,
                         bool is_first_step, tcg_amp_scaling amp, tcg_kernels kernels, bool* ran_own);
// One fused Adam/AdamW step. Each step counter goes up by one before the update unless
// found_inf is set (a skipped step does not count), as PyTorch's fused Adam does (ATen's path:
// one _foreach_add_ before, one _foreach_sub_ of found_inf after; the own kernel in place).
// arrivals: an int32 tensor of zeros on the device (NULL: own kernels not tried) and slots[k]
// its element for parameter k, the own kernel's per-tensor counters (back to zero after each
// launch). While a set of weight shadows is read on this thread (tcg_shadows_activate), the own
// kernel stores each updated float32 parameter to its shadow too. The own kernels bump the
// versions of the tensors they update, as ATen's in-place ops do.
tcg_status tcg_optim_adam(const tcg_adam_tensors* t, tcg_tensor lr, const tcg_adam_hyper* h,
                          tcg_amp_scaling amp, tcg_kernels kernels, tcg_tensor arrivals,
                          const size_t* slots, bool* ran_own);
// Sets every tensor's .grad to undefined (PyTorch's zero_grad(set_to_none=True)), except the
// gradients that are views into gradient buckets (cuda/grad_buckets.cpp): zeroed in place.
tcg_status tcg_grads_set_to_none(tcg_tensors params);
// Zeroes every defined .grad in place, one _foreach_zero_ (zero_grad(set_to_none=False)).
tcg_status tcg_grads_zero(tcg_tensors params);
// Global-norm clipping on the device: total = ||(||g_i||_p)_i||_p; g_i *= min(1, max/(total+1e-6)).
// Returns the total norm as a new 0-d tensor; no host sync. `kernels`: PYTORCH computes the norms
// and the factor with ATen's operators (PyTorch's clip_grad_norm_), AUTO and OWN with the own
// kernels where they apply (float32 L2 norms; the same values bit for bit) and ATen's elsewhere.
tcg_status tcg_grads_clip_norm(tcg_tensors grads, double max_norm, double norm_type, tcg_kernels kernels,
                               tcg_tensor* total_out);
// The same norm and factor, min(1, max/(total+1e-6)), without clipping: for clip_coef above.
tcg_status tcg_grads_clip_coef(tcg_tensors grads, double max_norm, double norm_type, tcg_kernels kernels,
                               tcg_tensor* total_out, tcg_tensor* coef_out);
// Value clipping in place: each g_i clamped to [-clip, clip] (PyTorch's clip_grad_value_, foreach).
tcg_status tcg_grads_clip_value(tcg_tensors grads, double clip);
// A learning-rate schedule as the own kernel computes it (src/schedule.rs's built-in schedules).
typedef enum { TCG_SCHEDULE_WARMUP_COSINE = 0, TCG_SCHEDULE_LINEAR_WARMUP = 1, TCG_SCHEDULE_STEP_DECAY = 2 } tcg_schedule_kind;
typedef struct {
  tcg_schedule_kind kind;
  double warmup, total, min_factor;  // WARMUP_COSINE; LINEAR_WARMUP reads warmup
  double step_size, gamma;           // STEP_DECAY
} tcg_schedule;
// One schedule step in one launch of the own kernel, on the current stream: step (a 0-d float64
// counter) += 1, then lrs[i] (0-d float32) = bases[i] * factor(step), bases holding lrs.len values.
// *ran_own false, nothing done, where the kernel does not apply (a CPU counter, no own kernels,
// more groups than one launch sets, tensors unlike these): the caller computes the rates itself.
tcg_status tcg_lr_schedule_step(tcg_tensor step, const tcg_schedule* schedule, tcg_tensors lrs, const double* bases,
                                bool* ran_own);

// ---------------------------------------------------------------- norm.cpp (CPU and CUDA)
// LayerNorm or RMSNorm over the last dimension, after an optional residual add through dropout:
//   x = res + dropout(branch + branch_bias, p)  (when a branch is given; p applied only when
//                                    train; branch_bias [D], the bias of the linear layer that
//                                    made the branch, when given; without res, x is
//                                    dropout(branch + branch_bias, p): the stream's start)
//   y = norm(x) * weight + bias       (RMSNorm: no mean subtracted, no bias)
// One autograd node: gradients flow to res, branch, branch_bias, weight and bias, from both x
// and y.
typedef enum { TCG_NORM_LAYER = 0, TCG_NORM_RMS = 1 } tcg_norm_kind;
// y's dtype: TCG_NORM_OUT_AUTOCAST: the CUDA autocast dtype while autocast is on (what a
// following matmul would cast to), else res's (the branch's without res); TCG_NORM_OUT_INPUT:
// res's (ATen's layer_norm under autocast gives float32).
typedef enum { TCG_NORM_OUT_AUTOCAST = 0, TCG_NORM_OUT_INPUT = 1 } tcg_norm_out;
// res, branch, weight, bias, branch_bias: NULL for none (res or branch needed; branch_bias needs
// a branch).
typedef struct {
  tcg_tensor res, branch, weight, bias, branch_bias;
} tcg_norm_inputs;
typedef struct {
  double eps, dropout;
  tcg_norm_kind kind;
  tcg_norm_out out;
  bool train;
} tcg_norm_options;
// *out_res: x, a new handle (NULL without a branch: x is res); *out_y: y. kernels:
// TCG_KERNELS_AUTO runs the crate's fused kernels where they apply (a CUDA float32 res (or
// branch, without res), its last
// dimension a multiple of 4 up to 1024, contiguous float32/bfloat16/float16 tensors, float32
// weight, bias and branch_bias), ATen's operators otherwise (the same semantics, ATen's dropout masks);
// TCG_KERNELS_PYTORCH always ATen's; TCG_KERNELS_OWN: TCG_UNSUPPORTED, with the reason, where the
// fused kernels do not apply. *ran_own: whether they ran.
tcg_status tcg_norm_forward(const tcg_norm_inputs* in, const tcg_norm_options* o, tcg_kernels kernels,
                            tcg_tensor* out_res, tcg_tensor* out_y, bool* ran_own);

// ---------------------------------------------------------------- shadow.cpp (CPU and CUDA)
// Weight shadows: a low-precision copy of float32 CUDA parameters, written by the own Adam kernel
// as it updates them or copied where stale, and
// read instead of autocast's cast at each use (autocast's own cache must be off in a graph).
// A set of shadows is owned by its handle (there is no registry): tcg_linear_forward reads the
// set active on its thread.
typedef struct tcg_shadows tcg_shadows;
// A set of shadows of `dtype` (TCG_DTYPE_HALF or TCG_DTYPE_BFLOAT16) for the float32 CUDA tensors
// among `params` (the others are skipped), made now (refused inside a capture); the set holds
// the parameters. *count: how many got one.
tcg_status tcg_shadows_new(tcg_tensors params, tcg_dtype dtype, tcg_shadows** out, size_t* count);
void tcg_shadows_free(tcg_shadows* s);
// Copies each parameter of `s` whose shadow is stale into it: one multi-tensor copy per device, on
// the current stream (capturable: a capture copies on every replay what was stale at capture).
// A shadow is stale when its parameter's version (or data pointer) is not the one it was last
// copied or written at.
tcg_status tcg_shadows_refresh(tcg_shadows* s);
// *count: how many shadows of `s` are stale now (what tcg_shadows_refresh would copy).
tcg_status tcg_shadows_stale(tcg_shadows* s, size_t* count);
// Keeps in `s` only the shadows a layer asked for since it was made (tcg_linear_forward and the
// layers that read shadows, while `s` was active under autocast): the others are no longer
// refreshed, written by the own Adam, or read; their memory stays with the set (a graph
// captured before may still write it). *count: how many shadows are left. Not while `s` is read.
tcg_status tcg_shadows_keep_asked(tcg_shadows* s, size_t* count);
// Makes `s` (NULL: none) the set tcg_linear_forward reads on this thread; *previous: the set it
// replaces, as a new handle the caller owns (NULL: none). While a set is active and CUDA autocast
// is on, tcg_linear_forward reads the shadows of weight and bias instead of casting them (on
// ATen's path the gradient reaches the float32 parameter as through the cast), and fails with
// TCG_MISUSE when the set's dtype is not autocast's. A freed handle's set lives on while active.
tcg_status tcg_shadows_activate(tcg_shadows* s, tcg_shadows** previous);

// ---------------------------------------------------------------- linear.cpp (CPU and CUDA)
// A linear layer, y = x · weightᵀ + bias (bias NULL: none), reading weight shadows (above), whose backward (on the crate's path) computes the bias gradient in the
// weight-gradient GEMM (cuBLASLt's BGRADB epilogue) instead of a separate reduction.
// The weight gradient of a 16-bit step: TCG_WEIGHT_GRAD_ROUNDED: computed in the compute dtype
// and cast to the parameter's, as under autocast; TCG_WEIGHT_GRAD_FP32: the GEMM writes the
// float32 gradient directly (Megatron's main_grad: one rounding fewer, no cast kernel).
typedef enum { TCG_WEIGHT_GRAD_ROUNDED = 0, TCG_WEIGHT_GRAD_FP32 = 1 } tcg_weight_grad;
// weight_grad_to (NULL: none): where the weight's gradient goes instead of to `weight`, the tie
// tensor tcg_embedding made for the same weight (a head tied to a token embedding): on the
// crate's path the weight-gradient GEMM's result is that tensor's gradient, and the embedding's
// backward adds its rows into it in place. ATen's path ignores it (the gradient reaches
// `weight`). tcg_linear_split takes none (TCG_MISUSE).
typedef struct {
  tcg_tensor x, weight, bias, weight_grad_to;
} tcg_linear_inputs;
// *out: y, a new tensor. kernels: TCG_KERNELS_AUTO takes the crate's path where it applies (CUDA
// tensors, a 16-bit compute dtype: CUDA autocast's, or x's and weight's when both are bfloat16
// or float16; a 2-d weight, float32 or of the compute dtype, and a matching 1-d bias), ATen's
// at::linear otherwise; TCG_KERNELS_PYTORCH always ATen's (then wgrad is ignored: ATen rounds);
// TCG_KERNELS_OWN: TCG_UNSUPPORTED, with the reason, where the crate's path does not apply.
// *ran_own: whether it was taken. The forward is at::linear on the same operands either way.
tcg_status tcg_linear_forward(const tcg_linear_inputs* in, tcg_weight_grad wgrad, tcg_kernels kernels,
                              tcg_tensor* out, bool* ran_own);
// The most pieces tcg_linear_split makes.
#define TCG_LINEAR_MAX_PARTS 8
// y = x · weightᵀ + bias as tcg_linear_forward computes it, split into `parts` (1 to
// TCG_LINEAR_MAX_PARTS) equal pieces along its last dimension: outs[0..parts) get new tensors,
// views of y (as at::split). On the crate's path the bias is added in the GEMM's epilogue and
// the backward packs the pieces' gradients into y's in one kernel that also sums the bias
// gradient (no concatenation, and no pass of the weight-gradient GEMM's epilogue for the bias);
// it is taken where tcg_linear_forward's is and the output is bfloat16 or float16, at most 4
// pieces of a width that is a multiple of 8. kernels and *ran_own as tcg_linear_forward's.
// TCG_MISUSE where the weight's out is not a multiple of `parts`.
tcg_status tcg_linear_split(const tcg_linear_inputs* in, int64_t parts, tcg_weight_grad wgrad, tcg_kernels kernels,
                            tcg_tensor* outs, bool* ran_own);

// ---------------------------------------------------------------- loss.cpp (CPU and CUDA)
// The mean cross-entropy of logits [rows, classes] against int64 targets [rows] (rows whose
// target is ignore_index not counted), as ATen's cross_entropy_loss with mean reduction; *out: a
// new 0-d float32 tensor, differentiable in the logits. kernels: TCG_KERNELS_AUTO runs the crate's
// fused kernels where they apply (contiguous CUDA float32/bfloat16/float16 logits: one read of
// the logits, which in grad mode also writes their gradient for a loss gradient of 1, scaled on
// the device by the backward where it is not 1 (a second backward is refused); the logits'
// dtype, fp32 math; an out-of-range target gives a NaN loss rather than a device assert), ATen's operators otherwise; TCG_KERNELS_PYTORCH always
// ATen's; TCG_KERNELS_OWN: TCG_UNSUPPORTED, with the reason, where the fused kernels do not
// apply. *ran_own: whether they ran.
tcg_status tcg_loss_cross_entropy(tcg_tensor logits, tcg_tensor targets, int64_t ignore_index, tcg_kernels kernels,
                             tcg_tensor* out, bool* ran_own);
// The mean cross-entropy of the logits h · weightᵀ against targets without all the logits in
// memory at once (a language model's head and its loss, Liger-Kernel's FusedLinearCrossEntropy):
// h [.., C], weight [V, C] (read through its shadow, as tcg_linear_forward reads it), int64
// targets (h's rows, any shape). On the crate's path (the linear family's conditions, fused loss
// kernels for the compute dtype) it runs chunk_rows rows at a time (0: as many as 256 MiB of
// logits hold): the chunk's GEMM, the fused kernel writing the chunk's gradient over its logits
// (in grad mode), and the chunk's share of h's and the weight's gradients (wgrad: as
// tcg_linear_forward's); the backward scales them by the loss's gradient on the device (a second
// backward is refused). Elsewhere ATen's linear and cross_entropy_loss. kernels: the loss
// family's rules. Shapes that do not match, a negative chunk_rows: TCG_MISUSE. *out: a new 0-d
// float32 tensor; *ran_own: whether the crate's path ran.
// method: TCG_LINEAR_CE_CHUNKED the chunks above; TCG_LINEAR_CE_EXP_IN_HEAD the exponentials
// taken in the head GEMM's epilogue and the gradient formed by the backward GEMMs reading them
// (cuda/ce_head_gemm.h: bf16, sm_90, CUTLASS's; the whole [rows, classes] of bf16 exponentials
// held through the call), the chunks where it does not apply. chunk_rows: the chunks' only.
typedef enum { TCG_LINEAR_CE_CHUNKED = 0, TCG_LINEAR_CE_EXP_IN_HEAD = 1 } tcg_linear_ce_method;
typedef struct {
  int64_t ignore_index;
  int64_t chunk_rows;
  tcg_weight_grad wgrad;
  tcg_linear_ce_method method;
} tcg_linear_ce_options;
tcg_status tcg_loss_linear_cross_entropy(tcg_tensor h, tcg_tensor weight, tcg_tensor targets,
                                         const tcg_linear_ce_options* options, tcg_kernels kernels, tcg_tensor* out,
                                         bool* ran_own);

// ---------------------------------------------------------------- rotary.cpp (CPU and CUDA)
// Rotary position embeddings on q [B, T, H, D] and k [B, T, KV, D] (one floating dtype, any
// strides), from the tables cos and sin [positions, D/2] float32 on their device, at positions
// offset (+ the 0-d int64 device tensor `offset`, when not NULL: read at run time, so a
// captured decode step moves on) + t. Pairs (2i, 2i+1) for TCG_ROTARY_INTERLEAVED (Meta's
// Llama), (i, i + D/2) for TCG_ROTARY_HALF_SPLIT (GPT-NeoX, Hugging Face's Llama). *q_out and
// *k_out: new contiguous tensors of q's and k's shapes and dtype, differentiable in q and k. An
// odd D, other dtypes or devices, or (host offset) positions past the table: TCG_MISUSE; with a
// device offset, positions past the table give NaN. kernels as the loss family's: the crate's
// kernel (q and k in one launch each way, fp32 math; D a multiple of 8) or ATen's element-wise
// composition in fp32. *ran_own: whether the kernel ran.
typedef enum { TCG_ROTARY_INTERLEAVED = 0, TCG_ROTARY_HALF_SPLIT = 1 } tcg_rotary_layout;
typedef struct {
  tcg_tensor q, k, cos, sin, offset;
} tcg_rotary_inputs;
tcg_status tcg_rotary_apply(const tcg_rotary_inputs* inputs, int64_t offset, tcg_rotary_layout layout, tcg_kernels kernels,
                            tcg_tensor* q_out, tcg_tensor* k_out, bool* ran_own);
// The same from a fused projection's output qkv [B, T, heads + 2 kv_heads, D] (q | k | v along
// the head dimension, last dimension contiguous): *q_out and *k_out rotated as above, *v_out
// v, all differentiable in qkv. On the crate's kernel q, k and v are new contiguous tensors
// made in one launch (v copied), and the backward writes qkv's gradient in one launch, where
// autograd would concatenate dq, dk and dv; ATen's composition returns v as a view of qkv.
typedef struct {
  tcg_tensor qkv, cos, sin, offset;
  int64_t heads, kv_heads;
} tcg_rotary_qkv_inputs;
tcg_status tcg_rotary_apply_qkv(const tcg_rotary_qkv_inputs* inputs, int64_t offset, tcg_rotary_layout layout,
                                tcg_kernels kernels, tcg_tensor* q_out, tcg_tensor* k_out, tcg_tensor* v_out,
                                bool* ran_own);
// The projection and the rotation in one autograd node: qkv = x [B, T, C] · weightᵀ (+ bias),
// weight [(heads + 2 kv_heads) · D, C], read as [B, T, heads + 2 kv_heads, D], then q and k
// rotated as above (positions from the host offset on). On the crate's path (linear.cpp's
// conditions, D a multiple of 8 and the rotary kernel built for the compute dtype) the GEMM
// writes qkv, the kernel rotates q and k in place (or the GEMM's epilogue does, below), and
// *q_out, *k_out and *v_out are views of qkv (no copy of v); the backward packs the three
// gradients with the rotation transposed in one launch, then runs the linear layer's backward
// (wgrad: its weight-gradient mode). Where that path does not take the inputs under
// TCG_KERNELS_AUTO, or under TCG_KERNELS_PYTORCH, nothing runs: TCG_OK with the outputs NULL and
// *ran_own false (the caller composes the linear layer and tcg_rotary_apply_qkv); under
// TCG_KERNELS_OWN that is an error. Shapes that do not fit, or the misuses above: TCG_MISUSE.
// cos_gemm and sin_gemm (NULL: none): the tables with each row's angles permuted as
// tcg_rotary_permuted_table makes them; with them, bf16, interleaved pairs, a head dimension of
// 64 and no bias, the rotation runs in the GEMM's epilogue (CUTLASS's, sm_90) and no pass of its
// own reads the projection.
typedef struct {
  tcg_tensor x, weight, bias, cos, sin, cos_gemm, sin_gemm;
  int64_t heads, kv_heads;
} tcg_rotary_project_inputs;
tcg_status tcg_rotary_project_qkv(const tcg_rotary_project_inputs* inputs, int64_t offset, tcg_rotary_layout layout,
                                  tcg_weight_grad wgrad, tcg_kernels kernels, tcg_tensor* q_out, tcg_tensor* k_out,
                                  tcg_tensor* v_out, bool* ran_own);
// A table [positions, D/2] (D a multiple of 8) with each row's angles in the order the projection's
// GEMM holds the pairs: angle i at (i mod 4) · D/8 + i / 4. *out: a new contiguous tensor.
// Anything else: TCG_MISUSE.
tcg_status tcg_rotary_permuted_table(tcg_tensor table, tcg_tensor* out);

// ---------------------------------------------------------------- swiglu.cpp (CPU and CUDA)
// SwiGLU of the fused projection h [.., 2F] = [gate | up]: *out = silu(gate) · up [.., F], a new
// tensor of h's dtype, differentiable in h. The crate's kernels (one pass each way, fp32 math,
// the gradient written as one [dgate | dup]; contiguous CUDA float32/bfloat16/float16, F a
// multiple of 4) or ATen's silu and mul, as kernels says (the loss family's rules). An odd last
// dimension: TCG_MISUSE. *ran_own: whether the kernels ran.
tcg_status tcg_swiglu(tcg_tensor h, tcg_kernels kernels, tcg_tensor* out, bool* ran_own);

// ---------------------------------------------------------------- embedding.cpp (CPU and CUDA)
// weight[indices]: the rows of weight [num_embeddings, embedding_dim] that int64 or int32
// `indices` name (ATen's gather), row padding_idx getting no gradient (negative: none; ATen's
// convention). On the crate's path (TCG_KERNELS_AUTO: a CUDA weight of float32, bfloat16 or
// float16, contiguous and 16-byte aligned, a width that is a multiple of 4, the indices on its
// device) the backward sorts the indices (ATen's stable sort of 32-bit ids) and one kernel writes
// every row of the weight's gradient, each the sum of its positions' output gradients in
// a fixed order (the same every run: no atomics), with no zero-fill pass. ATen's
// at::embedding otherwise. *out: a new tensor; *ran_own: whether the crate's path ran. An index
// outside the weight fails as ATen's gather fails. tie (NULL: not asked for): on the crate's path
// in grad mode with a weight that requires grad, *tie gets a new tensor, an alias of the weight
// that is the same autograd node's second output: a tied head passes it as its linear layer's
// weight_grad_to, and the backward then adds the embedding's rows into the head's weight
// gradient in place (rows no index names untouched), where autograd would add two
// [num_embeddings, embedding_dim] gradients; NULL otherwise.
tcg_status tcg_embedding(tcg_tensor weight, tcg_tensor indices, int64_t padding_idx, tcg_kernels kernels,
                         tcg_tensor* out, tcg_tensor* tie, bool* ran_own);

// ---------------------------------------------------------------- gelu.cpp (CPU and CUDA)
// GELU of x [.., F] plus an optional bias [F] (NULL: none; the bias of the linear layer that made
// x, run without it): *out = gelu(x + bias), a new tensor of x's dtype, differentiable in x and
// bias. TCG_GELU_ERF: the exact form (nn.GELU()); TCG_GELU_TANH: the tanh approximation
// (nn.GELU(approximate="tanh")). The crate's kernels (one pass each way, fp32 math, the bias
// gradient summed in the backward's pass; contiguous CUDA float32/bfloat16/float16 x, F a
// multiple of 4, a float32 bias) or ATen's add and gelu in the promoted dtype, cast to x's, as
// kernels says (the loss family's rules). A bias of another width or device, or integer
// tensors: TCG_MISUSE. *ran_own: whether the kernels ran.
typedef enum { TCG_GELU_ERF = 0, TCG_GELU_TANH = 1 } tcg_gelu_form;
tcg_status tcg_gelu(tcg_tensor x, tcg_tensor bias, tcg_gelu_form form, tcg_kernels kernels, tcg_tensor* out,
                    bool* ran_own);

// ---------------------------------------------------------------- mlp.cpp (CPU and CUDA)
// A two-layer MLP with GELU between, y = proj(gelu(fc(x))), GELU's `form` (TCG_GELU_ERF: the
// exact one; TCG_GELU_TANH: the tanh approximation): x [.., C], fc_weight [H, C], fc_bias [H]
// (NULL: none), proj_weight [C', H], proj_bias [C'] (NULL: none); *out: y [.., C'], a new tensor.
// Reads weight shadows, as tcg_linear_forward does. On the crate's path (the linear family's
// conditions for both layers, H a multiple of 8) fc's GEMM adds its bias and applies the GELU in
// its epilogue, and the backward's GEMM through proj applies GELU's derivative, so no GELU kernel
// runs: the tanh form in cuBLASLt's GELU_AUX_BIAS and DGELU epilogues (GELU's input kept; fc's
// weight-gradient GEMM summing its bias gradient, BGRADB), the exact form in CUTLASS's
// (csrc/cuda/gelu_gemm.h: bf16, sm_90, where the build found CUTLASS; GELU's derivative kept,
// in float16; its backward GEMM sums fc's bias gradient); wgrad as tcg_linear_forward's. Elsewhere ATen's linear, gelu,
// linear. kernels: the linear family's rules. A weight or bias of the wrong shape: TCG_MISUSE.
// *ran_own: whether the crate's path was taken.
typedef struct {
  tcg_tensor x, fc_weight, fc_bias, proj_weight, proj_bias;
} tcg_mlp_inputs;
tcg_status tcg_mlp_gelu(const tcg_mlp_inputs* in, tcg_gelu_form form, tcg_weight_grad wgrad, tcg_kernels kernels,
                        tcg_tensor* out, bool* ran_own);
// The SwiGLU MLP, proj(silu(gate) · up) with [gate | up] = fc(x): fc_weight [2F, C], proj_weight
// [C', F], biases as tcg_mlp_gelu's; *out: y [.., C'], a new tensor. Reads weight shadows. On the
// crate's path (the linear family's conditions for both layers, F a multiple of 4, SwiGLU's
// kernels there) one autograd node runs fc's GEMM, SwiGLU's forward kernel and proj's GEMM, and in
// the backward proj's input-gradient GEMM with SwiGLU's backward in its epilogue (CUTLASS's,
// csrc/cuda/swiglu_gemm.h: bf16, sm_90, where the build found CUTLASS; elsewhere the GEMM and
// SwiGLU's backward kernel). Elsewhere ATen's linear, silu and mul, linear. wgrad and kernels as
// tcg_mlp_gelu's; fc's out odd or a weight of the wrong shape: TCG_MISUSE.
tcg_status tcg_mlp_swiglu(const tcg_mlp_inputs* in, tcg_weight_grad wgrad, tcg_kernels kernels, tcg_tensor* out,
                          bool* ran_own);

// ---------------------------------------------------------------- autograd.cpp (CPU and CUDA)
// torch::autograd::grad(outputs, inputs, grad_outputs, retain_graph, create_graph, allow_unused).
// grad_outputs: n_out tensors, or NULL for none (ones; scalar outputs only). out: n_in slots,
// each a new tensor handle, or NULL where allow_unused and the input was not used. .grad
// fields are not touched.
tcg_status tcg_autograd_grad(tcg_tensor* outputs, size_t n_out, tcg_tensor* inputs, size_t n_in,
                             tcg_tensor* grad_outputs, bool retain_graph, bool create_graph,
                             bool allow_unused, tcg_tensor* out);

// ---------------------------------------------------------------- amp.cpp (CPU and CUDA)
// Turns CUDA autocast on with `dtype` (TCG_DTYPE_HALF or TCG_DTYPE_BFLOAT16) and the weight-cast
// cache on or off, as torch.autocast's __enter__ does; freeing the guard restores the previous
// state (and clears the cast cache when leaving the outermost autocast region). Thread-local:
// free it on the thread that made it.
tcg_status tcg_autocast_guard_new(tcg_dtype dtype, bool cache, tcg_autocast_guard** out);
// Turns CUDA autocast off until freed (for backward: PyTorch runs it outside the autocast region).
tcg_status tcg_autocast_suspend_new(tcg_autocast_guard** out);
void tcg_autocast_guard_free(tcg_autocast_guard* g);
// CUDA autocast's state on this thread (dtype: any c10::ScalarType code).
tcg_status tcg_autocast_state(bool* enabled, tcg_dtype* dtype, bool* cache);
// found_inf (0-d f32) is set to 1 if any grad has an inf/NaN; grads are multiplied by inv_scale.
tcg_status tcg_scaler_check_unscale(tcg_tensors grads, tcg_tensor found_inf, tcg_tensor inv_scale);
// PyTorch's GradScaler.update, on the device.
tcg_status tcg_scaler_update(tcg_tensor scale, tcg_tensor growth_tracker, tcg_tensor found_inf,
                             double growth, double backoff, int64_t interval);

// ---------------------------------------------------------------- watch.cpp (CPU and CUDA)
// A watch holds references to tensors and what their storage was when added (data pointer,
// dtype, shape). tcg_watch_check returns TCG_STALE, with the first changed tensor's position
// in *index, when any of them changed since (set_data, a dtype change, a resize).
tcg_status tcg_watch_new(tcg_watch** out);
// Bytes of the storage `t` views (0 for an undefined tensor or one without storage): more than
// the tensor's own bytes when it is a view into a larger buffer.
tcg_status tcg_watch_storage_nbytes(tcg_tensor t, size_t* out);
void tcg_watch_free(tcg_watch* w);
tcg_status tcg_watch_add(tcg_watch* w, tcg_tensor* ts, size_t n);
tcg_status tcg_watch_check(tcg_watch* w, size_t* index);
// Records what every watched tensor's storage, dtype and shape are now (after a recapture).
tcg_status tcg_watch_refresh(tcg_watch* w);

// ---------------------------------------------------------------- feed.cpp (CPU and CUDA)
// dst.copy_(src, non_blocking): from pinned host memory (or device to device) the copy is queued
// on the current stream and the host does not wait.
tcg_status tcg_feed_copy(tcg_tensor dst, tcg_tensor src, bool non_blocking);
// Whether a CPU tensor is in page-locked memory; a page-locked copy of a CPU tensor (new handle).
tcg_status tcg_feed_is_pinned(tcg_tensor t, bool* out);
tcg_status tcg_feed_pin(tcg_tensor t, tcg_tensor* out);

// ---------------------------------------------------------------- cuda/device.cpp
bool tcg_device_built_with_cuda(void);
tcg_status tcg_device_count(int* out);
tcg_status tcg_device_current(int* out);
tcg_status tcg_device_synchronize(int device);
tcg_status tcg_stream_from_pool(int device, bool high_priority, tcg_stream* out);
tcg_status tcg_stream_current(int device, tcg_stream* out);
tcg_status tcg_stream_default(int device, tcg_stream* out);
tcg_status tcg_stream_synchronize(tcg_stream s);
// `waiter` waits (on the device) for all work queued so far on `waitee`.
tcg_status tcg_stream_wait_stream(tcg_stream waiter, tcg_stream waitee);
tcg_status tcg_stream_capture_status(tcg_stream s, tcg_capture_status* out);
// Makes `s` (and its device) current; tcg_stream_guard_free restores what was current before.
tcg_status tcg_stream_guard_new(tcg_stream s, tcg_stream_guard** out);
void tcg_stream_guard_free(tcg_stream_guard* g);
// Events (cudaEventDisableTiming) for ordering streams without host syncs.
tcg_status tcg_event_new(int device, tcg_event** out);
void tcg_event_free(tcg_event* e);
tcg_status tcg_event_record(tcg_event* e, tcg_stream s);
// The stream waits (on the device) for the event's last record.
tcg_status tcg_stream_wait_event(tcg_stream s, tcg_event* e);
// The host waits for the event's last record.
tcg_status tcg_event_synchronize(tcg_event* e);

// ---------------------------------------------------------------- cuda/graph.cpp
tcg_status tcg_graph_new(bool keep_graph, tcg_graph** out);
void tcg_graph_free(tcg_graph* g);
// Captures the current stream (not the default one) into g; pool {0,0}: a private pool. The
// calling thread's cuBLAS and cuBLASLt handles and their workspaces for that stream are made
// first, outside the capture (cublasCreate cannot run inside one).
tcg_status tcg_graph_capture_begin(tcg_graph* g, tcg_pool_id pool, tcg_capture_mode mode);
// Ends the capture and instantiates the graph. On any failure the capture is torn down
// completely (stream capture ended, allocator routing ended, pool reference released, graph
// and executable destroyed) before the status returns.
tcg_status tcg_graph_capture_end(tcg_graph* g);
// Tears down a capture that is under way without keeping anything (error/panic paths).
// *was_invalidated tells whether CUDA had already invalidated it.
tcg_status tcg_graph_capture_abort(tcg_graph* g, bool* was_invalidated);
tcg_status tcg_graph_instantiate(tcg_graph* g);
tcg_status tcg_graph_replay(tcg_graph* g);
tcg_status tcg_graph_upload(tcg_graph* g);
// Makes g's executable run other's captured work (cudaGraphExecUpdate), instead of
// instantiating other: other must keep its cudaGraph_t and be captured on g's device; g is
// instantiated first if it was not. Updated (*updated true): g takes over other's capture (graph,
// pool reference, RNG states) and other is reset (empty, its old capture released with g's old
// one). Not updated (*result the cudaGraphExecUpdateResult: 2 topology changed, 3 node type
// changed, 5 parameters changed, ...): nothing changed.
tcg_status tcg_graph_update_from(tcg_graph* g, tcg_graph* other, bool* updated, int* result);
tcg_status tcg_graph_reset(tcg_graph* g);
tcg_status tcg_graph_pool(tcg_graph* g, tcg_pool_id* out);
tcg_status tcg_graph_debug_dump(tcg_graph* g, const char* path);
tcg_status tcg_graph_node_count(tcg_graph* g, size_t* out);
tcg_status tcg_graph_node_kinds(tcg_graph* g, tcg_node_kinds* out);

// ---------------------------------------------------------------- cuda/graphed.cpp
// One graphed callable (PyTorch's make_graphed_callables): the static tensors of a callable whose
// forward was captured into `fwd` and whose backward (autograd::grad of the outputs that
// require grad, with respect to the surface entries that do) into `bwd` (NULL if no output
// requires grad). surface: n_surface static inputs, the n_user user args first, then the
// parameters. outputs: n_out static outputs. grad_outputs: n_out entries, the static incoming
// gradient of each output that requires grad, NULL for the others. grad_inputs: n_surface
// entries, the static gradient of each surface entry, NULL where none. The graphs stay the
// caller's: keep them alive and untouched until tcg_graphed_free, which cuts the tie (a
// backward that runs later, through an autograd node still alive, fails with TCG_MISUSE).
tcg_status tcg_graphed_new(tcg_graph* fwd, tcg_graph* bwd, tcg_tensor* surface, size_t n_surface,
                           size_t n_user, tcg_tensor* outputs, size_t n_out, tcg_tensor* grad_outputs,
                           tcg_tensor* grad_inputs, tcg_graphed** out);
void tcg_graphed_free(tcg_graphed* g);
// Runs it on `inputs` (n = n_surface: the user args, then the parameters): copies each user arg
// into its static input unless it is that memory, replays the forward graph on the current
// stream, and writes n_out new handles to `out`: the static outputs detached (the next call
// overwrites them). With grad mode on and an input requiring grad, the outputs that required
// grad at capture are wired into autograd through one node, whose backward copies the incoming
// gradients into the static ones, replays the backward graph on the stream of this call and
// returns the static gradients. That backward fails (TCG_MISUSE) if the forward ran again in
// between (its activations were overwritten) or under create_graph (no double backward).
tcg_status tcg_graphed_apply(tcg_graphed* g, tcg_tensor* inputs, size_t n, tcg_tensor* out, size_t n_out);

// ---------------------------------------------------------------- profiler.cpp
// One profiled event: a GPU kernel, copy or memset (device, stream), a CPU op, a runtime call.
typedef enum {
  TCG_PROF_KERNEL = 0,
  TCG_PROF_MEMCPY = 1,
  TCG_PROF_MEMSET = 2,
  TCG_PROF_CPU_OP = 3,
  TCG_PROF_RUNTIME = 4,
  TCG_PROF_OTHER = 5,
} tcg_prof_kind;
typedef struct {
  uint64_t start_ns;
  uint64_t end_ns;
  int64_t stream;  // GPU events: the stream id (Kineto's resource id)
  int32_t device;  // GPU events: the device index; -1 otherwise
  int32_t kind;    // a tcg_prof_kind
} tcg_prof_event;
// Starts Kineto for CPU ops (this thread) and, when `cuda` and CUDA is there, GPU activity
// (CUPTI: every kernel, copy and memset of the process, inside graph launches too). One profiler
// at a time per process (TCG_MISUSE otherwise).
tcg_status tcg_profile_start(bool cuda);
// Stops it (on the thread that started it) and returns what it recorded (NULL `out`: discarded).
tcg_status tcg_profile_stop(tcg_profile** out);
void tcg_profile_free(tcg_profile* p);
tcg_status tcg_profile_len(tcg_profile* p, size_t* n);
// Event i and its name (malloc'ed; release with tcg_string_free).
tcg_status tcg_profile_event(tcg_profile* p, size_t i, tcg_prof_event* out, char** name);
// Writes a Chrome trace (JSON, opens in Perfetto or chrome://tracing).
tcg_status tcg_profile_save(tcg_profile* p, const char* path);

// ---------------------------------------------------------------- cuda/conditional.cpp
// Inside a capture under way on the current stream: adds an IF, IF_NOT or WHILE node whose
// condition is `cond` (one
// bool/uint8/int32/int64/float32/float64 value on the device, true when non-zero), set on the device by a kernel captured just before the node, and starts
// capturing its body on a body stream, current until tcg_cond_end; the body's allocations go to
// `body_pool` (a pool the caller holds until the graph is gone; not the capture's own). WHILE:
// `counter` and `hit` (int32 on the device) count the iterations of each launch and flag a
// stop at `max_iters`; the body runs while cond is true after each iteration, at most max_iters
// times. TCG_UNSUPPORTED without a CUDA 12.3 driver or the own kernels; TCG_MISUSE outside a
// capture. The body may hold kernels, memsets and memcopies only (no event nodes).
tcg_status tcg_cond_begin(tcg_cond_kind kind, tcg_tensor cond, tcg_pool_id body_pool, int64_t max_iters, tcg_tensor counter,
                          tcg_tensor hit, tcg_cond** out);
// Ends the body's capture (WHILE: after capturing the condition's re-evaluation) and makes the
// capturing stream current again. On failure everything begin started is undone too.
tcg_status tcg_cond_end(tcg_cond* c);
// Undoes what is still open (a body capture after an error or panic: ended and discarded,
// allocation routing ended, the capturing stream current again) and frees the handle.
void tcg_cond_free(tcg_cond* c);

// ---------------------------------------------------------------- cuda/memory.cpp
// Every function here initializes CUDA lazily (as torch.cuda.memory_stats() does), so any of
// them may be the first CUDA call of a process.
tcg_status tcg_pool_id_new(tcg_pool_id* out);
// A hold on a pool in both of libtorch's caching allocators (device memory, and pinned host
// memory, which CUDAGraph also routes to the pool during capture). Without a hold, a pool whose
// last graph is freed becomes "freeable" (use count 0) and stays so until an empty_cache erases
// it; capturing into it meanwhile trips libtorch's `use_count > 0` internal asserts. `device` -1
// means the current device; `pool` {0, 0} means a fresh id (graph_pool_handle). Holding an id
// that is freeable is tried again after emptying both caches of it; if tensors of the pool are
// still alive it stays freeable and this fails with TCG_MISUSE. Freeing the hold releases both
// references and, as at::cuda::MemPool does, returns the pool's cached device memory to CUDA if
// nothing else holds it. Not safe to call while a capture into the same pool is under way.
tcg_status tcg_pool_hold_new(int device, tcg_pool_id pool, tcg_pool_hold** out);
void tcg_pool_hold_free(tcg_pool_hold* p);
tcg_status tcg_pool_hold_id(tcg_pool_hold* p, tcg_pool_id* out, int* device);
// Holders of the pool in the device allocator (this hold, graphs captured into it, ...).
tcg_status tcg_pool_hold_use_count(tcg_pool_hold* p, int* out);
tcg_status tcg_memory_stats(int device, tcg_mem_stats* out);
tcg_status tcg_memory_reset_peak(int device);
// Bytes of the caching allocator's segments owned by `pool` on `device`.
tcg_status tcg_pool_memory(int device, tcg_pool_id pool, int64_t* reserved, int64_t* allocated);
// The blocks of the segments owned by `pool` on `device`, segment by segment in address order:
// writes at most `cap` of them to `out` and the total count to `*n` (call with cap 0 to size).
tcg_status tcg_pool_blocks(int device, tcg_pool_id pool, tcg_pool_block* out, size_t cap, size_t* n);
tcg_status tcg_memory_empty_cache(void);
// The pinned host allocator's empty_cache (torch._C._host_emptyCache): frees its cached blocks
// and erases its freeable pools.
tcg_status tcg_memory_host_empty_cache(void);

// ---------------------------------------------------------------- cuda/dist.cpp
// A NCCL process group (c10d::ProcessGroupNCCL) on this rank's device. From torchrun's
// environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT; a client of torchrun's
// agent store when TORCHELASTIC_USE_AGENT_STORE is set, else rank 0 hosts the TCPStore), or
// explicit. The device is made current. Collectives make the current stream wait (no host
// wait), so they can be captured; the first collective must run eagerly (communicator set-up).
bool tcg_pg_available(void);
tcg_status tcg_pg_new_from_env(int64_t timeout_ms, tcg_pg** out);
tcg_status tcg_pg_new_tcp(const char* host, int port, int rank, int size, int device, int64_t timeout_ms,
                          tcg_pg** out);
// The same over a c10d::FileStore at `path` (a file every rank can reach; ranks must not reuse
// one across runs).
tcg_status tcg_pg_new_file(const char* path, int rank, int size, int device, int64_t timeout_ms, tcg_pg** out);
void tcg_pg_free(tcg_pg* p);
tcg_status tcg_pg_info(tcg_pg* p, int* rank, int* size, int* device);
typedef enum { TCG_REDUCE_SUM = 0, TCG_REDUCE_AVG = 1 } tcg_reduce_op;
tcg_status tcg_pg_allreduce(tcg_pg* p, tcg_tensor t, tcg_reduce_op op);
tcg_status tcg_pg_broadcast(tcg_pg* p, tcg_tensor t, int root);
// ZeRO's two collectives (NCCL's reduce-scatter and all-gather of flat buffers): `output` [n] is
// the reduction over ranks of their `input`s' slice [rank * n, (rank + 1) * n) (input [size * n]);
// all-gather's `output` [size * n] holds rank r's `input` [n] at r * n (input may be that slice of
// output: in place). Contiguous tensors of one dtype on the group's device.
tcg_status tcg_pg_reduce_scatter(tcg_pg* p, tcg_tensor output, tcg_tensor input, tcg_reduce_op op);
tcg_status tcg_pg_all_gather(tcg_pg* p, tcg_tensor output, tcg_tensor input);
tcg_status tcg_pg_barrier(tcg_pg* p);
// The host waits at most timeout_ms for the device's current stream (graph replays included:
// c10d's watchdog cannot see their NCCL kernels). On timeout: aborts the group's communicators
// (pending NCCL kernels exit; later collectives are refused) and returns TCG_DIST_TIMEOUT.
tcg_status tcg_pg_wait_device(tcg_pg* p, int64_t timeout_ms);
tcg_status tcg_pg_abort(tcg_pg* p);

// ---------------------------------------------------------------- cuda/grad_buckets.cpp
// Gradient buckets (DDP-style) over `params` (leaves of one dtype on the group's device), with a
// post-accumulate-grad hook on each; buckets of up to `bucket_bytes`, the first (the last
// parameters) up to `first_bucket_bytes` (0: the same). The layout: PACKED, a bucket's gradients
// packed into its flat buffer before its collective and each .grad then made its view; VIEWS,
// each .grad a view into its bucket's flat buffer (16-byte aligned offsets), reduced in place;
// GROUPED, no bucket buffer, a bucket's gradients all-reduced where they are in one NCCL group
// (then collective, compression and buffers must be their defaults: TCG_MISUSE otherwise). The
// collective averages a buffer: one ALL_REDUCE, or a REDUCE_SCATTER_ALL_GATHER in place.
// compression BF16: the buffer sent in bf16 (float32 grads only), cast back. buffers: the
// caching allocator's, or NCCL_MEM (ncclMemAlloc), NCCL_REGISTERED (and ncclCommRegister'ed),
// NCCL_WINDOW (and a symmetric window, ncclCommWindowRegister): collective, outside a capture.
// high_priority: the side stream is of high priority. Armed, a bucket is averaged on a side
// stream as soon as all its gradients are ready, in bucket order; finish does the rest there
// and makes the current stream wait for the side stream (no host wait), then disarms. Not
// armed, finish does every bucket on the current stream. The group must outlive the buckets.
// tcg_buckets_free removes the hooks (the gradients stay views of the buffers, which they keep
// alive).
typedef enum {
  TCG_BUCKET_LAYOUT_PACKED = 0,
  TCG_BUCKET_LAYOUT_VIEWS = 1,
  TCG_BUCKET_LAYOUT_GROUPED = 2,
} tcg_bucket_layout;
typedef enum {
  TCG_BUCKET_COLLECTIVE_ALL_REDUCE = 0,
  TCG_BUCKET_COLLECTIVE_REDUCE_SCATTER_ALL_GATHER = 1,
} tcg_bucket_collective;
typedef enum {
  TCG_BUCKET_COMPRESSION_NONE = 0,
  TCG_BUCKET_COMPRESSION_BF16 = 1,
} tcg_bucket_compression;
typedef enum {
  TCG_BUCKET_BUFFERS_CACHING = 0,
  TCG_BUCKET_BUFFERS_NCCL_MEM = 1,
  TCG_BUCKET_BUFFERS_NCCL_REGISTERED = 2,
  TCG_BUCKET_BUFFERS_NCCL_WINDOW = 3,
} tcg_bucket_buffers;
typedef struct {
  int64_t bucket_bytes, first_bucket_bytes;
  tcg_bucket_layout layout;
  tcg_bucket_collective collective;
  tcg_bucket_compression compression;
  tcg_bucket_buffers buffers;
  bool high_priority;
} tcg_buckets_options;
tcg_status tcg_buckets_new(tcg_pg* pg, tcg_tensors params, const tcg_buckets_options* options, tcg_buckets** out);
void tcg_buckets_free(tcg_buckets* b);
tcg_status tcg_buckets_count(tcg_buckets* b, size_t* out);
tcg_status tcg_buckets_arm(tcg_buckets* b);
tcg_status tcg_buckets_finish(tcg_buckets* b);
// finish in parts: launch_rest launches what is left and disarms; wait_bucket makes the current
// stream wait for bucket k's all-reduce (launched, on either stream); join makes it wait for all of them and
// starts a new round. members: bucket k's parameter indices (n of them; up to cap written).
tcg_status tcg_buckets_launch_rest(tcg_buckets* b);
tcg_status tcg_buckets_wait_bucket(tcg_buckets* b, size_t k);
tcg_status tcg_buckets_join(tcg_buckets* b);
tcg_status tcg_buckets_members(tcg_buckets* b, size_t k, size_t* out, size_t cap, size_t* n);

// ---------------------------------------------------------------- bucket_plan.cpp (all builds)
// Where a parameter lies: its bucket and its offset in the bucket's flat buffer (elements).
typedef struct {
  size_t bucket;
  int64_t offset;
} tcg_bucket_slot;
// The layout tcg_buckets_new makes for n parameters of `numels` elements of `element_bytes`
// each over `world` ranks, as `options` say (bucket_bytes, first_bucket_bytes, views, split; the
// other options do not change it): slots[i] for each parameter, the flat length of bucket k in
// bucket_numels[k] (at most `cap` written), the bucket count in *n_buckets. No GPU needed.
tcg_status tcg_buckets_plan(const int64_t* numels, size_t n, int64_t element_bytes, const tcg_buckets_options* options,
                            int world, tcg_bucket_slot* slots, int64_t* bucket_numels, size_t cap, size_t* n_buckets);

// ---------------------------------------------------------------- layout.cpp
// Every struct above that crosses the boundary, named for tcg_layout.
typedef enum {
  TCG_LAYOUT_STREAM,
  TCG_LAYOUT_POOL_ID,
  TCG_LAYOUT_MEM_STATS,
  TCG_LAYOUT_POOL_BLOCK,
  TCG_LAYOUT_NODE_KINDS,
  TCG_LAYOUT_PROF_EVENT,
  TCG_LAYOUT_TENSORS,
  TCG_LAYOUT_AMP_SCALING,
  TCG_LAYOUT_SGD_HYPER,
  TCG_LAYOUT_SGD_TENSORS,
  TCG_LAYOUT_ADAM_HYPER,
  TCG_LAYOUT_ADAM_TENSORS,
  TCG_LAYOUT_BUCKETS_OPTIONS,
  TCG_LAYOUT_BUCKET_SLOT,
  TCG_LAYOUT_NORM_INPUTS,
  TCG_LAYOUT_NORM_OPTIONS,
  TCG_LAYOUT_LINEAR_INPUTS,
  TCG_LAYOUT_ROTARY_INPUTS,
  TCG_LAYOUT_MLP_INPUTS,
  TCG_LAYOUT_LINEAR_CE_OPTIONS,
  TCG_LAYOUT_ROTARY_QKV_INPUTS,
  TCG_LAYOUT_SCHEDULE,
  TCG_LAYOUT_GEMM_ENTRY,
  TCG_LAYOUT_GEMM_IDENTITY,
  TCG_LAYOUT_ROTARY_PROJECT_INPUTS,
} tcg_layout_struct;
// The size and alignment of struct `s` as this shim was compiled, and the offsets of its fields
// in declaration order (at most `cap` written); returns the number of fields (0: unknown `s`).
// The Rust side checks its declarations against it (src/sys/layout.rs). Cannot fail.
size_t tcg_layout(tcg_layout_struct s, size_t* size, size_t* align, size_t* offsets, size_t cap);

#ifdef __cplusplus
}
#endif
