// Weight shadows as the other translation units see them (defined in shadow.cpp).
#pragma once
#include <ATen/ATen.h>

namespace tcg::shadow {

// The shadow of `param` in the CUDA autocast dtype while shadows are read on this thread and
// CUDA autocast is on (undefined otherwise, or when it has none). A plain tensor, outside
// autograd: its gradient is the caller's to route to `param`.
at::Tensor lookup(const at::Tensor& param);

// What a linear layer reads for `param`: its shadow through an autograd node whose backward
// casts the gradient back to the parameter's dtype (as autocast's cast would), or the
// parameter itself when it has no shadow to read (autocast then casts it).
at::Tensor read(const at::Tensor& param);

// The shadows of `params` in the set read on this thread, one per parameter (undefined where it
// has none); empty when none has one or no set is read.
std::vector<at::Tensor> of(const std::vector<at::Tensor>& params);

// Records that the shadows of `params` (in the set read on this thread) now hold the parameters'
// current versions: an update wrote both.
void written(const std::vector<at::Tensor>& params);

}  // namespace tcg::shadow
