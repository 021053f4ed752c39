//! `csrc/layout.cpp`: the layout of the structs both sides read.
use super::c_enum;

c_enum!(tcg_layout_struct {
    TCG_LAYOUT_STREAM = 0,
    TCG_LAYOUT_POOL_ID = 1,
    TCG_LAYOUT_MEM_STATS = 2,
    TCG_LAYOUT_POOL_BLOCK = 3,
    TCG_LAYOUT_NODE_KINDS = 4,
    TCG_LAYOUT_PROF_EVENT = 5,
    TCG_LAYOUT_TENSORS = 6,
    TCG_LAYOUT_AMP_SCALING = 7,
    TCG_LAYOUT_SGD_HYPER = 8,
    TCG_LAYOUT_SGD_TENSORS = 9,
    TCG_LAYOUT_ADAM_HYPER = 10,
    TCG_LAYOUT_ADAM_TENSORS = 11,
    TCG_LAYOUT_BUCKETS_OPTIONS = 12,
    TCG_LAYOUT_BUCKET_SLOT = 13,
    TCG_LAYOUT_NORM_INPUTS = 14,
    TCG_LAYOUT_NORM_OPTIONS = 15,
    TCG_LAYOUT_LINEAR_INPUTS = 16,
    TCG_LAYOUT_ROTARY_INPUTS = 17,
    TCG_LAYOUT_MLP_INPUTS = 18,
    TCG_LAYOUT_LINEAR_CE_OPTIONS = 19,
    TCG_LAYOUT_ROTARY_QKV_INPUTS = 20,
    TCG_LAYOUT_SCHEDULE = 21,
    TCG_LAYOUT_GEMM_ENTRY = 22,
    TCG_LAYOUT_GEMM_IDENTITY = 23,
    TCG_LAYOUT_ROTARY_PROJECT_INPUTS = 24,
});

extern "C" {
    pub fn tcg_layout(
        s: tcg_layout_struct,
        size: *mut usize,
        align: *mut usize,
        offsets: *mut usize,
        cap: usize,
    ) -> usize;
}
