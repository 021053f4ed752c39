// The launch parameters of the training step's scalar kernels (optim_kernels.cu): global-norm
// clipping's factor from the norm, and a learning-rate schedule's step. Each is one thread's work
// that ATen's operators spread over several launches (four for the factor, about twenty for a
// warmup + cosine schedule of two groups); the kernels compute what those operators compute, in
// the same order and the same rounding. Plain data, each kernel's only argument; shared by the
// kernels and their launcher (optim_own.cpp).
#pragma once
#include <stdint.h>

namespace tcg::optim {

// coef = min(max_norm / (total + 1e-6), 1) as clipping's ATen operators round it:
// clamp_max(reciprocal(total + 1e-6) · max_norm, 1), in float32, NaN kept.
struct ClipCoef {
  const float* total;  // 0-d float32
  float* coef;         // 0-d float32
  float max_norm;
};

// The schedules the kernel knows (schedule.rs's WarmupCosine, LinearWarmup, StepDecay).
enum ScheduleKind : int32_t { kWarmupCosine = 0, kLinearWarmup = 1, kStepDecay = 2 };

// The most parameter groups one launch sets.
constexpr int kMaxScheduleGroups = 16;

// step += 1 (a 0-d float64 counter), then lr[g] = float(base[g] · factor(step)) for each group,
// the factor computed in float64 exactly as schedule.rs's `Schedule::factor` computes it on the
// host (the same operations in the same order, none contracted), the device's cos and pow aside.
struct LrSchedule {
  double* step;
  float* lr[kMaxScheduleGroups];
  double base[kMaxScheduleGroups];
  int32_t groups;
  int32_t kind;  // ScheduleKind
  double warmup, total, min_factor;  // WarmupCosine; LinearWarmup: warmup
  double step_size, gamma;           // StepDecay
};

}  // namespace tcg::optim
