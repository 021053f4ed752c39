// The launch parameters of the crate's SwiGLU kernels: the one layout that the kernels
// (csrc/cuda/swiglu_kernels.cu, compiled by nvcc into a fat binary) and their launcher
// (csrc/cuda/swiglu_own.cpp, host compiler) share. Plain data, each kernel's only argument.
//
// What they compute, h [rows, 2F] the fused projection's output, gate = h[:, :F], up = h[:, F:]
// (fp32 math, read and written in h's dtype; the exponential and the divisions the hardware's
// approximations):
//   forward:  s = gate / (1 + exp(-gate)),  out = s · up                       [rows, F]
//   backward: sig = 1 / (1 + exp(-gate)),
//             dgate = (dout · up) · sig · (1 + gate · (1 − sig)),  dup = dout · s
//             written as dh = [dgate | dup]                                    [rows, 2F]
#pragma once
#include <stdint.h>

namespace tcg::swiglu {

constexpr int kThreads = 256;

// The threads that cover one row of F values, 4 each: whole warps, at most a block (a block holds
// kThreads / lanes rows at a time). The kernels' layout and the launcher's grid, in one place.
constexpr int64_t lanes_for(int64_t f) {
  const int64_t whole = (f / 4 + 31) / 32 * 32;
  return whole < kThreads ? whole : kThreads;
}

struct Forward {
  const void* h;  // [rows, 2F]
  void* out;      // [rows, F]
  int64_t rows;
  int64_t f;      // F, a multiple of 4
};

struct Backward {
  const void* h;     // [rows, 2F]
  const void* dout;  // [rows, F]
  void* dh;          // [rows, 2F]
  int64_t rows;
  int64_t f;
};

}  // namespace tcg::swiglu
