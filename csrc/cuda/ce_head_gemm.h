// A language model's head and its cross-entropy with the exponentials taken in the head's GEMM,
// built on CUTLASS (ce_head_gemm.cu, compiled by nvcc where build.rs finds CUTLASS's headers:
// TCG_CUTLASS_GEMMS is then defined, as for gelu_gemm.h): the plain-data interface that
// loss_own.cpp (host compiler) calls. bf16 operands, float32 accumulation, sm_90 (H100, H200).
//
// What it computes, for hidden states h [rows, c], the head's weight w [vocab, c] and targets
// (row-major tensors; log2e = 1 / ln 2; tiles: kTile columns of the logits, T of them):
//   forward:  e [rows, vocab] = 2^(x · log2e - k), x = bf16(h · wᵀ) (the logits as a bf16 GEMM
//             rounds them) and k = ceil(max of the row's x in the tile · log2e), an integer per
//             (row, tile); stats [T, rows] = (k, Σ e over the tile) (float2). The logits are not
//             written: e takes their place, each exponential taken once.
//   rows:     per row, K = max k, L = log2 Σ_v 2^(x_v · log2e) (from the tiles' sums), the row's
//             loss L · ln 2 - x[target] (x[target] from a dot product of h's row and w's, rounded
//             to bf16 as the logits are); fac [T, fac_rows] = 2^(k - K) (bf16, exact powers of
//             two); f [rows] = inv_count · 2^(K - L); e at the target made e - 2^(L - k) (so that
//             f · fac · e there is inv_count · (p - 1)); xs [rows, c] = bf16(f · h). Ignored rows
//             (and targets out of range) get f = 0 and keep their e.
//   input gradient:  dh [rows, c] = f ⊙ ((e ⊙ fac) · w)  (bf16; fac applied to e as the GEMM
//             loads it, f to the float32 product): the loss's gradient for a loss gradient of 1.
//   weight gradient: dw [vocab, c] = (e ⊙ fac)ᵀ · xs  (float32).
// So (e ⊙ fac) · f is inv_count · (softmax - onehot), the gradient of the mean loss with respect
// to the logits, formed where the backward GEMMs read it and never written.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace tcg::ce_head_gemm {

// Columns of logits per tile of the forward (the stats' and factors' granularity).
constexpr int kTile = 128;

// Tiles of a row of `vocab` logits.
constexpr int32_t tiles(int32_t vocab) { return (vocab + kTile - 1) / kTile; }
// Rows of the factors' table for `rows` rows (padded so that the GEMMs' last tiles read inside it).
constexpr int32_t fac_rows(int32_t rows) { return (rows + kTile - 1) / kTile * kTile; }

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
  void* e;                  // [rows, vocab] bf16: the target's value rewritten
  void* fac;                // [tiles, fac_rows] bf16, written (the padding rows: 0)
  float* f;                 // [rows], written
  void* xs;                 // [rows, c] bf16, written
  float* row_loss;          // [rows], written (0 where ignored, NaN where out of range)
  int32_t rows, vocab, c;
};

struct InputGrad {
  const void* e;    // [rows, vocab] bf16
  const void* fac;  // [tiles, fac_rows] bf16
  const void* w;    // [vocab, c] bf16
  const float* f;   // [rows]
  void* dh;         // [rows, c] bf16, written
  int32_t rows, vocab, c;
};

struct WeightGrad {
  const void* e;    // [rows, vocab] bf16
  const void* fac;  // [tiles, fac_rows] bf16
  const void* xs;   // [rows, c] bf16
  float* dw;        // [vocab, c] float32, written
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
cudaError_t weight_grad(const WeightGrad& a, int sm_count, cudaStream_t stream);

}  // namespace tcg::ce_head_gemm
