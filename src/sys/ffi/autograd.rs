//! `csrc/autograd.cpp` (autograd::grad) and `csrc/cuda/graphed.cpp` (graphed callables).
use super::{tcg_graph, tcg_status, tcg_tensor};

#[repr(C)]
pub struct tcg_graphed {
    _private: [u8; 0],
}

extern "C" {
    pub fn tcg_autograd_grad(
        outputs: *const tcg_tensor,
        n_out: usize,
        inputs: *const tcg_tensor,
        n_in: usize,
        grad_outputs: *const tcg_tensor,
        retain_graph: bool,
        create_graph: bool,
        allow_unused: bool,
        out: *mut tcg_tensor,
    ) -> tcg_status;

    pub fn tcg_graphed_new(
        fwd: *mut tcg_graph,
        bwd: *mut tcg_graph,
        surface: *const tcg_tensor,
        n_surface: usize,
        n_user: usize,
        outputs: *const tcg_tensor,
        n_out: usize,
        grad_outputs: *const tcg_tensor,
        grad_inputs: *const tcg_tensor,
        out: *mut *mut tcg_graphed,
    ) -> tcg_status;
    pub fn tcg_graphed_free(g: *mut tcg_graphed);
    pub fn tcg_graphed_apply(
        g: *mut tcg_graphed,
        inputs: *const tcg_tensor,
        n: usize,
        out: *mut tcg_tensor,
        n_out: usize,
    ) -> tcg_status;
}
