// Every kernel of the crate's own fat binaries, as X-macro lists: the one place where a kernel or
// a dtype is added. The *_kernels.cu files define their extern "C" kernels by expanding these
// lists, own_kernels.cpp loads every name they give, and the launchers build the same names
// (own_kernels.h's *_kernel functions) and ask the same lists which dtypes are built.
//
// A dtype is named by its at::ScalarType enumerator (Float, Double, BFloat16, Half): the kernel
// names carry it as spelled there (`tcg_ce_fwd_BFloat16`), host code reads it back as
// `at::ScalarType::NAME`, and device code maps it to its CUDA type with TCG_CUDA_TYPE (or the
// optimizers' ATen types, optim_kernels.cu). Plain preprocessor: included by nvcc and by the host
// compiler alike.
#pragma once

// Adam / AdamW and SGD (optim_kernels.cu), per parameter dtype T:
//   tcg_adam_<T>_<adam|adamw>_<amsgrad 0|1>, tcg_sgd_<T>_<depth 2|3> (3: with momentum buffers).
#define TCG_OPTIM_TYPES(X) X(Float) X(Double) X(Half) X(BFloat16)

// The fused normalizations (norm_kernels.cu), per (branch dtype B, output dtype Y) and row width
// class V (4: rows up to 512 wide; 8: up to 1024): tcg_norm_<fwd|bwd>_<B>_<Y>_v<V>. In the
// backward Y is the output gradient's dtype.
#define TCG_NORM_TYPES(X)                                                           \
  X(Float, Float) X(Float, BFloat16) X(Float, Half) X(BFloat16, Float)              \
  X(BFloat16, BFloat16) X(BFloat16, Half) X(Half, Float) X(Half, BFloat16) X(Half, Half)
#define TCG_NORM_VECS(X, B, Y) X(B, Y, 3) X(B, Y, 4) X(B, Y, 6) X(B, Y, 8)

// The fused cross-entropy (loss_kernels.cu), per logits dtype T: tcg_ce_<fwd|scale>_<T>.
#define TCG_LOSS_TYPES(X) X(Float) X(BFloat16) X(Half)

// Rotary embeddings (rotary_kernels.cu), per dtype T of q and k: tcg_rotary_<T>.
#define TCG_ROTARY_TYPES(X) X(Float) X(BFloat16) X(Half)

// SwiGLU (swiglu_kernels.cu), per dtype T: tcg_swiglu_<fwd|bwd>_<T>.
#define TCG_SWIGLU_TYPES(X) X(Float) X(BFloat16) X(Half)

// The embedding's backward (embedding_kernels.cu), per weight dtype T: tcg_embedding_bwd_<T>
// (after a sort of the ids) and tcg_embedding_scan_<T> (a small vocabulary, no sort).
#define TCG_EMBEDDING_TYPES(X) X(Float) X(BFloat16) X(Half)

// Bias + GELU (gelu_kernels.cu), per dtype T and form (erf: exact; tanh: the approximation):
// tcg_gelu_<fwd|bwd>_<T>_<erf|tanh>.
#define TCG_GELU_TYPES(X) X(Float) X(BFloat16) X(Half)
#define TCG_GELU_FORMS(X, T) X(T, erf, false) X(T, tanh, true)

// The linear layer's split (linear_kernels.cu), per dtype T of its output: tcg_split_bwd_<T>
// (the pieces' gradients packed, the bias gradient summed per block).
#define TCG_SPLIT_TYPES(X) X(BFloat16) X(Half)

// Kernels of one instance each, with the fat binary (its *_kernels.cu) that holds each: the norms',
// the loss's and GELU's finishing kernels, the loss's count, the conditional nodes' setter
// (cond_kernels.cuh, built into optim_kernels.cu's binary), the step's scalars (clipping's
// factor, a learning-rate schedule), clipping's norms (float32 gradients), the sum of a weight
// gradient's slices and the split's bias gradient's finish.
#define TCG_SINGLE_KERNELS(X)                                                                 \
  X(tcg_norm_finish, norm) X(tcg_ce_finish, loss) X(tcg_ce_count, loss) X(tcg_gelu_finish, gelu) \
      X(tcg_cond_set, optim) X(tcg_clip_coef, optim) X(tcg_lr_schedule, optim)                  \
          X(tcg_grad_norm_chunks, optim) X(tcg_grad_norm_finish, optim)                           \
              X(tcg_wgrad_slices_sum, linear) X(tcg_split_finish, linear)

// The CUDA type of a dtype name, for the kernels that read memory through vec_io.cuh.
#define TCG_CUDA_TYPE(NAME) TCG_CUDA_TYPE_##NAME
#define TCG_CUDA_TYPE_Float float
#define TCG_CUDA_TYPE_BFloat16 __nv_bfloat16
#define TCG_CUDA_TYPE_Half __half
