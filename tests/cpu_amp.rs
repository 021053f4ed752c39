//! Mixed precision without a GPU (CI, both shim builds): the GradScaler's numerics on the CPU
//! against plain (unscaled) training, inf/NaN skipping, backoff and growth, unscale + clip, the
//! scaler's checkpoint state; optimizers over parameters of several dtypes; the autocast guard
//! restoring state.

mod common;

use common::{cpu_batches, max_param_diff, mse, twin_mlps};
use tch::{Device, Kind, Tensor};
use tch_cuda_graphs::amp::{Autocast, GradScaler, ScalerConfig};
use tch_cuda_graphs::optim::{Adam, AdamConfig, Optimizer, Sgd, SgdConfig};
use tch_cuda_graphs::{clip_grad_norm, Error};

const D: i64 = 8;
const O: i64 = 2;

fn value(t: &Tensor) -> f64 {
    f64::try_from(t).unwrap()
}

/// With a power-of-two scale, scaled training is unscaled training exactly.
#[test]
fn scaled_steps_equal_unscaled_steps() {
    for sgd in [false, true] {
        let batches = cpu_batches(50, &[16; 30], D, O);
        let (vs_a, a, vs_b, b) = twin_mlps(Device::Cpu, D, 16, O);
        let make = |vs: &tch::nn::VarStore| -> Box<dyn Optimizer> {
            if sgd {
                Box::new(Sgd::new(vs, SgdConfig::default().lr(0.05).momentum(0.9)).unwrap())
            } else {
                Box::new(Adam::new(vs, AdamConfig::adamw().lr(1e-2)).unwrap())
            }
        };
        let (mut opt_a, mut opt_b) = (make(&vs_a), make(&vs_b));
        let mut scaler = GradScaler::new(Device::Cpu).unwrap();
        for (x, y) in &batches {
            opt_a.zero_grad().unwrap();
            scaler.scale(&mse(&a, x, y)).unwrap().backward();
            scaler.step(opt_a.as_mut()).unwrap();
            scaler.update().unwrap();
            opt_b.zero_grad().unwrap();
            mse(&b, x, y).backward();
            opt_b.step().unwrap();
        }
        let diff = max_param_diff(&vs_a, &vs_b);
        println!(
            "{}: 30 steps scaled by 2^16 vs unscaled (CPU): max param diff {diff:e}",
            if sgd { "SGD" } else { "AdamW" }
        );
        assert_eq!(diff, 0.0);
        assert_eq!(value(scaler.scale_tensor()), 65536.0);
        assert_eq!(value(scaler.growth_tracker()), 30.0);
    }
}

/// An inf batch skips the update (parameters and step counts unchanged), halves the scale and
/// resets the tracker; clean steps go on, and the scale doubles after the growth interval.
/// `skip_with_if_node` changes nothing outside a capture (the kernels' flag skips).
#[test]
fn an_inf_batch_is_skipped_and_the_scale_backs_off_then_grows() {
    inf_batch_run(false);
    inf_batch_run(true);
}

fn inf_batch_run(if_node: bool) {
    let (vs, model, _, _) = twin_mlps(Device::Cpu, D, 16, O);
    let mut opt = Adam::new(&vs, AdamConfig::default().lr(1e-2)).unwrap();
    let config = ScalerConfig { growth_interval: 3, ..ScalerConfig::default() };
    let mut scaler = GradScaler::with_config(Device::Cpu, config).unwrap().skip_with_if_node(if_node);
    let batches = cpu_batches(51, &[16; 8], D, O);
    let step = |x: &Tensor, y: &Tensor, opt: &mut Adam, scaler: &mut GradScaler| {
        opt.zero_grad().unwrap();
        scaler.scale(&mse(&model, x, y)).unwrap().backward();
        scaler.step(opt).unwrap();
        scaler.update().unwrap();
    };
    step(&batches[0].0, &batches[0].1, &mut opt, &mut scaler);
    let params: Vec<Tensor> = vs.trainable_variables().iter().map(|t| t.copy()).collect();
    let steps: Vec<f64> = (0..6).map(|i| value(opt.step_tensor(i).unwrap())).collect();
    let bad_x = batches[1].0.copy();
    let _ = bad_x.get(0).get(0).fill_(f64::INFINITY);
    step(&bad_x, &batches[1].1, &mut opt, &mut scaler);
    assert_eq!(value(scaler.found_inf()), 1.0);
    for (before, after) in params.iter().zip(vs.trainable_variables()) {
        assert!(before.equal(&after), "an inf step must leave parameters bit-identical");
    }
    let steps_after: Vec<f64> = (0..6).map(|i| value(opt.step_tensor(i).unwrap())).collect();
    assert_eq!(steps, steps_after, "a skipped step does not count");
    assert_eq!(value(scaler.scale_tensor()), 32768.0, "backoff halves the scale");
    assert_eq!(value(scaler.growth_tracker()), 0.0);
    for (x, y) in &batches[2..5] {
        step(x, y, &mut opt, &mut scaler);
    }
    assert_eq!(value(scaler.scale_tensor()), 65536.0, "3 clean steps: the scale doubles");
    assert!(vs.trainable_variables().iter().zip(&params).any(|(a, b)| !a.equal(b)), "training goes on");
    println!(
        "skip_with_if_node({if_node}): inf batch: params unchanged, step counts {steps:?} unchanged, scale 65536 -> \
         32768; 3 clean steps: scale {}",
        value(scaler.scale_tensor())
    );
}

/// unscale + clip + step equals clipping unscaled gradients.
#[test]
fn unscale_then_clip_equals_clipping_plain_gradients() {
    let batches = cpu_batches(52, &[16; 10], D, O);
    let (vs_a, a, vs_b, b) = twin_mlps(Device::Cpu, D, 16, O);
    let mut opt_a = Adam::new(&vs_a, AdamConfig::default().lr(1e-2)).unwrap();
    let mut opt_b = Adam::new(&vs_b, AdamConfig::default().lr(1e-2)).unwrap();
    let mut scaler = GradScaler::new(Device::Cpu).unwrap();
    for (x, y) in &batches {
        opt_a.zero_grad().unwrap();
        scaler.scale(&mse(&a, x, y)).unwrap().backward();
        scaler.unscale(&opt_a).unwrap();
        let _ = clip_grad_norm(opt_a.params(), 0.05, 2.0).unwrap();
        scaler.step(&mut opt_a).unwrap();
        scaler.update().unwrap();
        opt_b.zero_grad().unwrap();
        mse(&b, x, y).backward();
        let _ = clip_grad_norm(opt_b.params(), 0.05, 2.0).unwrap();
        opt_b.step().unwrap();
    }
    let diff = max_param_diff(&vs_a, &vs_b);
    println!("unscale + clip + step vs clip + step (CPU): max param diff {diff:e}");
    assert_eq!(diff, 0.0);
}

#[test]
fn scaler_state_round_trips_and_bad_configs_are_refused() {
    let mut a =
        GradScaler::with_config(Device::Cpu, ScalerConfig { init_scale: 128.0, ..ScalerConfig::default() }).unwrap();
    let _ = a.scale_tensor().shallow_clone().fill_(4.0);
    let state: std::collections::HashMap<String, Tensor> = a.state().into_iter().collect();
    let mut b = GradScaler::new(Device::Cpu).unwrap();
    b.load_state(&state).unwrap();
    assert_eq!(value(b.scale_tensor()), 4.0);
    assert!(matches!(b.load_state(&Default::default()), Err(Error::Checkpoint(_))));
    assert!(matches!(
        GradScaler::with_config(Device::Cpu, ScalerConfig { backoff_factor: 2.0, ..ScalerConfig::default() }),
        Err(Error::Misuse(_))
    ));
    a.update().unwrap();
}

/// Parameters of several dtypes: one fused launch per dtype, each updated as it would be alone.
#[test]
fn optimizers_take_parameters_of_several_dtypes() {
    tch::manual_seed(53);
    let w32 = Tensor::randn([4, 4], (Kind::Float, Device::Cpu)).set_requires_grad(true);
    let w64 = Tensor::randn([3], (Kind::Double, Device::Cpu)).set_requires_grad(true);
    let (a32, a64) = (w32.detach().copy().set_requires_grad(true), w64.detach().copy().set_requires_grad(true));
    let mut mixed =
        Adam::from_params(vec![w32.shallow_clone(), w64.shallow_clone()], AdamConfig::default().lr(1e-2)).unwrap();
    let mut only32 = Adam::from_params(vec![a32.shallow_clone()], AdamConfig::default().lr(1e-2)).unwrap();
    let mut only64 = Adam::from_params(vec![a64.shallow_clone()], AdamConfig::default().lr(1e-2)).unwrap();
    for _ in 0..5 {
        mixed.zero_grad().unwrap();
        (w32.sum(Kind::Float) * 2.0 + w64.pow_tensor_scalar(2).sum(Kind::Double).to_kind(Kind::Float)).backward();
        mixed.step().unwrap();
        only32.zero_grad().unwrap();
        only64.zero_grad().unwrap();
        (a32.sum(Kind::Float) * 2.0 + a64.pow_tensor_scalar(2).sum(Kind::Double).to_kind(Kind::Float)).backward();
        only32.step().unwrap();
        only64.step().unwrap();
    }
    assert!(w32.equal(&a32) && w64.equal(&a64), "mixed-dtype Adam equals one Adam per dtype");
    assert_eq!(w64.kind(), Kind::Double);
}

/// The autocast guard turns CUDA autocast on and restores the previous state on drop (state
/// only: it needs no device).
#[test]
fn the_autocast_guard_restores_the_previous_state() {
    let before = Autocast::state().unwrap();
    assert!(!before.enabled);
    {
        let _outer = Autocast::new(Kind::BFloat16, false).unwrap();
        let s = Autocast::state().unwrap();
        assert!(s.enabled && !s.cache && s.dtype == Kind::BFloat16, "{s:?}");
        {
            let _inner = Autocast::new(Kind::Half, true).unwrap();
            let s = Autocast::state().unwrap();
            assert!(s.enabled && s.cache && s.dtype == Kind::Half, "{s:?}");
        }
        let s = Autocast::state().unwrap();
        assert!(s.enabled && !s.cache && s.dtype == Kind::BFloat16, "inner restored {s:?}");
    }
    assert_eq!(Autocast::state().unwrap(), before);
    // a panic inside restores too
    let r = std::panic::catch_unwind(|| {
        let _g = Autocast::new(Kind::Half, false).unwrap();
        panic!("inside autocast");
    });
    assert!(r.is_err());
    assert_eq!(Autocast::state().unwrap(), before);
    assert!(matches!(Autocast::new(Kind::Float, false), Err(Error::Misuse(_))));
}
