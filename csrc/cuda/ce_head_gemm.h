// A language model's head and its cross-entropy with the exponentials taken in the head's GEMM,
// built on CUTLASS (ce_head_gemm.cu, compiled by nvcc where build.rs finds CUTLASS's headers:
// TCG_CUTLASS_GEMMS is then defined, as for gelu_gemm.h): the plain-data interface that
// loss_own.cpp (host compiler) calls. bf16 operands, float32 accumulation, sm_90 (H100, H200).
//
// What it computes, for hidden states h [rows, c], the head's weight w [vocab, c] and targets
// (row-major tensors; log2e = 1 / ln 2; tiles: kTile columns of the logits, T of them):
//   forward:  e [rows, vocab] = 2^(x · log2e - k), x = bf16(h · wᵀ) (the logits as a bf16 GEMM
//             rounds them) and k an integer per (row, tile): 0 where the ceiling of the row's
//             largest x · log2e in the tile lies in a window around 0 (ce_head_gemm.cu), else that
//             ceiling; stats [T, rows] = (k, Σ e over the tile) (float2). The logits are not
//             written: e takes their place, each exponential taken once.
//   rows:     per row, K = max k, L = log2 Σ_v 2^(x_v · log2e) (from the tiles' sums), the row's
//             loss L · ln 2 - x[target] (x[target] from a dot product of h's row and w's, rounded
//             to bf16 as the logits are); a row whose tiles' k differ has their e multiplied by
//             2^(k - K) in place (exact powers of two), so that every row's e is 2^(x · log2e - K);
//             f [rows] = inv_count · 2^(K - L); e at the target made e - 2^(L - K) (so that f · e
//             there is inv_count · (p - 1)); xs [rows, c] = bf16(f · h). Ignored rows (and targets
//             out of range) get f = 0 and keep their e.
//   input gradient:  dh [rows, c] = f ⊙ (e · w)  (bf16; f applied to the float32 product): the
//             loss's gradient for a loss gradient of 1.
//   weight gradient: dw [vocab, c] = eᵀ · xs, a plain GEMM (wgrad_gemm.h's, or cuBLASLt's).
// So f · e is inv_count · (softmax - onehot), the gradient of the mean loss with respect to the
// logits, formed where the backward GEMMs read it and never written. Within the window, which
// holds a language model's logits in practice, a row's tiles share k = 0 and the rows' pass
// leaves e as the GEMM wrote it.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace tcg::ce_head_gemm {

// Columns of logits per tile of the forward (the stats' and factors' granularity).
constexpr int kTile = 128;

// Tiles of a row of `vocab` logits.
constexpr int32_t tiles(int32_t vocab) { return (vocab + kTile - 1) / kTile; }

struct Forward {
  const void* h;  // [rows, c] bf16
  const void* w;  // [vocab, c] bf16
  void* e;        // [rows, vocab] bf16, written
  void* stats;    // [tiles(vocab), rows] float2, written
  int32_t rows, vocab, c;
};

struct Rows {
  const void* stats;        // [tiles, rows] float2
  const int64_t* targets;   // [rows]
  int64_t ignore_index;
  const float* inv_count;   // 0-d: 1 / rows not ignored
  const void* h;            // [rows, c] bf16
  const void* w;            // [vocab, c] bf16
  void* e;                  // [rows, vocab] bf16: rescaled to K where needed, the target's value rewritten
  float* f;                 // [rows], written
  void* xs;                 // [rows, c] bf16, written
  float* row_loss;          // [rows], written (0 where ignored, NaN where out of range)
  int32_t rows, vocab, c;
};

struct InputGrad {
  const void* e;    // [rows, vocab] bf16
  const void* w;    // [vocab, c] bf16
  const float* f;   // [rows]
  void* dh;         // [rows, c] bf16, written
  int32_t rows, vocab, c;
};

// Loads the kernels on the current device and sets their shared memory (as gelu_gemm.h's). "" or
// why they cannot run.
const char* prepare();
// "" where the kernels take these sizes and operands (vocab and c multiples of 8, h and w 16-byte
// aligned; a null pointer passes), else why not.
const char* unsupported(int32_t rows, int32_t vocab, int32_t c, const void* h, const void* w);
// Each launches on `stream`; cudaSuccess or the launch's error.
cudaError_t forward(const Forward& a, int sm_count, cudaStream_t stream);
cudaError_t rows_pass(const Rows& a, cudaStream_t stream);
cudaError_t input_grad(const InputGrad& a, int sm_count, cudaStream_t stream);

}  // namespace tcg::ce_head_gemm
