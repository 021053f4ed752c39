// How the crate's cuBLASLt GEMMs choose their algorithm (tcg.h's gemm family): the process-wide
// choice (gemm.cpp) and the choices made per GEMM shape (cuda/lt_matmul.cpp; no_cuda.cpp: none).
#pragma once
#include "shim.h"

#include <cstdint>
#include <vector>

namespace tcg::gemm {

// The process-wide choice (TCG_GEMM_HEURISTIC until set).
tcg_gemm_choice choice();
void set_choice(tcg_gemm_choice c);

// The GEMM shapes with an algorithm chosen, how many of them by timing, how many from a file.
struct Shapes {
  int64_t chosen, timed, from_file;
};
Shapes shapes();
// Forgets every choice made and every one read from a file (the next call of each shape chooses
// again).
void forget();

// What a file of choices is valid for (tcg.h's tcg_gemm_identity); throws TCG_NO_CUDA without
// CUDA.
tcg_gemm_identity identity();
// The current device's choices, those read and not yet met included.
std::vector<tcg_gemm_entry> export_choices();
// Takes entries as the current device's choices (checked on each shape's next call); throws
// TCG_NO_CUDA without CUDA.
void import_choices(const tcg_gemm_entry* in, int64_t n);

}  // namespace tcg::gemm
