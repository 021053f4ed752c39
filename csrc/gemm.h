// How the crate's cuBLASLt GEMMs choose their algorithm (tcg.h's gemm family): the process-wide
// choice (gemm.cpp) and the choices made per GEMM shape (cuda/lt_matmul.cpp; no_cuda.cpp: none).
#pragma once
#include "shim.h"

#include <cstdint>

namespace tcg::gemm {

// The process-wide choice (TCG_GEMM_HEURISTIC until set).
tcg_gemm_choice choice();
void set_choice(tcg_gemm_choice c);

// The GEMM shapes with an algorithm chosen, and how many of them by timing.
struct Shapes {
  int64_t chosen, timed;
};
Shapes shapes();
// Forgets every choice made (the next call of each shape chooses again).
void forget();

}  // namespace tcg::gemm
