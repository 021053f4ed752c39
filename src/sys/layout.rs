//! The layout of every struct that crosses the C boundary, checked against the C compiler's
//! (`csrc/layout.cpp`): size, alignment, and each field's offset in declaration order. The
//! checks run as unit tests, on every build (CPU builds included); this module is compiled for
//! them only.

use super::ffi;

/// C's layout of `s`: (size, alignment, field offsets).
fn c_layout(s: ffi::tcg_layout_struct) -> (usize, usize, Vec<usize>) {
    let (mut size, mut align) = (0usize, 0usize);
    let mut offsets = vec![0usize; 16];
    // SAFETY: valid out pointers; `offsets` has room for the capacity passed.
    let n = unsafe { ffi::tcg_layout(s, &mut size, &mut align, offsets.as_mut_ptr(), offsets.len()) };
    offsets.truncate(n);
    (size, align, offsets)
}

mod tests {
    use super::{c_layout, ffi};
    use std::mem::{align_of, offset_of, size_of};

    /// Asserts the Rust layout of `$t` (fields in C's declaration order) equals C's for `$s`.
    macro_rules! same_layout {
        ($s:ident, $t:ty, [$($f:ident),+ $(,)?]) => {{
            let (size, align, offsets) = c_layout(ffi::tcg_layout_struct::$s);
            let rust = vec![$(offset_of!($t, $f)),+];
            println!("{}: C size {size} align {align} offsets {offsets:?}; Rust {} {} {rust:?}", stringify!($s), size_of::<$t>(), align_of::<$t>());
            assert_eq!((size, align), (size_of::<$t>(), align_of::<$t>()), "{}: size and alignment", stringify!($s));
            assert_eq!(offsets, rust, "{}: field offsets", stringify!($s));
        }};
    }

    #[test]
    fn every_shared_struct_has_the_c_layout() {
        same_layout!(TCG_LAYOUT_STREAM, ffi::tcg_stream, [id, device_index, device_type]);
        same_layout!(TCG_LAYOUT_POOL_ID, ffi::tcg_pool_id, [first, second]);
        same_layout!(
            TCG_LAYOUT_MEM_STATS,
            ffi::tcg_mem_stats,
            [allocated, allocated_peak, reserved, reserved_peak, active, alloc_retries, ooms]
        );
        same_layout!(
            TCG_LAYOUT_POOL_BLOCK,
            ffi::tcg_pool_block,
            [segment, segment_size, offset, size, requested, allocated, large]
        );
        same_layout!(
            TCG_LAYOUT_NODE_KINDS,
            ffi::tcg_node_kinds,
            [kernel, memcpy, memset, host, graph, empty, event, mem_alloc_free, other]
        );
        same_layout!(TCG_LAYOUT_PROF_EVENT, ffi::tcg_prof_event, [start_ns, end_ns, stream, device, kind]);
        same_layout!(TCG_LAYOUT_TENSORS, ffi::tcg_tensors, [data, len]);
        same_layout!(TCG_LAYOUT_AMP_SCALING, ffi::tcg_amp_scaling, [grad_scale, found_inf, clip_coef]);
        same_layout!(TCG_LAYOUT_SGD_HYPER, ffi::tcg_sgd_hyper, [weight_decay, momentum, dampening, nesterov, maximize]);
        same_layout!(TCG_LAYOUT_SGD_TENSORS, ffi::tcg_sgd_tensors, [params, grads, momentum_buffers]);
        same_layout!(
            TCG_LAYOUT_ADAM_HYPER,
            ffi::tcg_adam_hyper,
            [beta1, beta2, weight_decay, eps, adamw, amsgrad, maximize]
        );
        same_layout!(
            TCG_LAYOUT_ADAM_TENSORS,
            ffi::tcg_adam_tensors,
            [params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps]
        );
        same_layout!(
            TCG_LAYOUT_BUCKETS_OPTIONS,
            ffi::tcg_buckets_options,
            [bucket_bytes, first_bucket_bytes, layout, collective, compression, buffers, high_priority]
        );
        same_layout!(TCG_LAYOUT_BUCKET_SLOT, ffi::tcg_bucket_slot, [bucket, offset]);
        same_layout!(TCG_LAYOUT_NORM_INPUTS, ffi::tcg_norm_inputs, [res, branch, weight, bias, branch_bias]);
        same_layout!(TCG_LAYOUT_NORM_OPTIONS, ffi::tcg_norm_options, [eps, dropout, kind, out, train]);
        same_layout!(TCG_LAYOUT_LINEAR_INPUTS, ffi::tcg_linear_inputs, [x, weight, bias, weight_grad_to]);
        same_layout!(TCG_LAYOUT_ROTARY_INPUTS, ffi::tcg_rotary_inputs, [q, k, cos, sin, offset]);
        same_layout!(
            TCG_LAYOUT_ROTARY_QKV_INPUTS,
            ffi::tcg_rotary_qkv_inputs,
            [qkv, cos, sin, offset, heads, kv_heads]
        );
        same_layout!(
            TCG_LAYOUT_ROTARY_PROJECT_INPUTS,
            ffi::tcg_rotary_project_inputs,
            [x, weight, bias, cos, sin, cos_gemm, sin_gemm, heads, kv_heads]
        );
        same_layout!(TCG_LAYOUT_LINEAR_CE_OPTIONS, ffi::tcg_linear_ce_options, [ignore_index, chunk_rows, wgrad]);
        same_layout!(TCG_LAYOUT_MLP_INPUTS, ffi::tcg_mlp_inputs, [x, fc_weight, fc_bias, proj_weight, proj_bias]);
        same_layout!(TCG_LAYOUT_SCHEDULE, ffi::tcg_schedule, [kind, warmup, total, min_factor, step_size, gamma]);
        same_layout!(TCG_LAYOUT_GEMM_ENTRY, ffi::tcg_gemm_entry, [key, algo, timed]);
        same_layout!(TCG_LAYOUT_GEMM_IDENTITY, ffi::tcg_gemm_identity, [device, cublaslt_version, torch_version]);
    }

    #[test]
    fn an_unknown_struct_has_no_fields() {
        let (size, _, offsets) = c_layout(ffi::tcg_layout_struct(1000));
        assert_eq!((size, offsets.len()), (0, 0));
    }
}
