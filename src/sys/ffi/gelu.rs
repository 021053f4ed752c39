//! `csrc/gelu.cpp`: bias + GELU on the crate's kernels.
use super::{c_enum, tcg_kernels, tcg_status, tcg_tensor};

c_enum!(tcg_gelu_form { TCG_GELU_ERF = 0, TCG_GELU_TANH = 1 });

extern "C" {
    pub fn tcg_gelu(
        x: tcg_tensor,
        bias: tcg_tensor,
        form: tcg_gelu_form,
        kernels: tcg_kernels,
        out: *mut tcg_tensor,
        ran_own: *mut bool,
    ) -> tcg_status;
}
