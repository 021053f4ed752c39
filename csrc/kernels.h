// Which kernels run: the crate's own or ATen's. The one decision every family takes (linear.cpp,
// loss.cpp, norm.cpp, optim.cpp), written once here, and the own kernels' availability (defined
// in cuda/own_kernels.cpp, or no_cuda.cpp).
#pragma once
#include "shim.h"

#include <string>

namespace tcg::kernels {

// Whether the own kernels were built into this binary.
bool built();

// Why the own kernels cannot run on CUDA device `device` (not built, or the fat binaries have no
// code this device and driver can load); empty when they can. Loads them on first use.
std::string unavailable(int device);

// Whether the own kernels run for `what` under the choice `k`: never under TCG_KERNELS_PYTORCH;
// otherwise when `why_not()` (called only then) returns "" — a check, or an attempt that runs
// them and says why it could not. Where they do not apply, TCG_KERNELS_AUTO falls back to ATen's
// and TCG_KERNELS_OWN throws TCG_UNSUPPORTED with the reason.
template <class WhyNot>
bool own(tcg_kernels k, const char* what, WhyNot&& why_not) {
  if (k == TCG_KERNELS_PYTORCH) return false;
  if (k != TCG_KERNELS_AUTO && k != TCG_KERNELS_OWN) misuse(std::string(what) + ": unknown kernel choice");
  const std::string why = why_not();
  if (why.empty()) return true;
  if (k == TCG_KERNELS_OWN) {
    throw exception(TCG_UNSUPPORTED, std::string(what) + ": the crate's own kernels do not apply: " + why);
  }
  return false;
}

}  // namespace tcg::kernels
