//! The GPT example's step trains as PyTorch trains, step for step: the same small GPT from the
//! same weights on the same batches (float32, dropout 0), once with the example's step
//! (`examples/gpt/trajectory.rs`) and once with PyTorch's (`benches/torch_gpt.py --trajectory`,
//! run here by the venv's Python). Every step's loss, the gradients of step 1 and the parameters
//! after step 1 are compared. On the CPU both sides run the same ATen kernels; on a GPU the
//! crate's step is the captured one.
//!
//! The Python is `$TCG_PYTHON`, else `.venv/bin/python` (what `scripts/setup.sh` makes), else
//! `python3`; it needs torch 2.11.

#[path = "../examples/gpt/data.rs"]
mod data;
#[path = "../examples/gpt/lm.rs"]
mod lm;
#[path = "../examples/gpt/model.rs"]
mod model;
#[path = "../examples/gpt/step.rs"]
mod step;
#[path = "../examples/gpt/trajectory.rs"]
mod trajectory;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use tch::{Device, Kind, Tensor};

fn python() -> PathBuf {
    if let Some(p) = std::env::var_os("TCG_PYTHON") {
        return p.into();
    }
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/python");
    if venv.exists() {
        venv
    } else {
        "python3".into()
    }
}

/// A tensor file as a map.
fn read(path: &Path) -> HashMap<String, Tensor> {
    Tensor::read_safetensors(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display())).into_iter().collect()
}

/// The largest `|a - b| / scale` over the tensors named `prefix/…`, with the name.
fn worst(
    a: &HashMap<String, Tensor>,
    b: &HashMap<String, Tensor>,
    prefix: &str,
    scale: impl Fn(&str) -> f64,
) -> (f64, String) {
    let mut out = (0.0, String::new());
    for (k, x) in a.iter().filter(|(k, _)| k.starts_with(prefix)) {
        let y = b.get(k).unwrap_or_else(|| panic!("PyTorch's side has no {k}"));
        let d = f64::try_from((x.to_kind(Kind::Double) - y.to_kind(Kind::Double)).abs().max()).unwrap();
        let rel = d / scale(k.split_once('/').unwrap().1).max(1e-30);
        if rel > out.0 {
            out = (rel, k.clone());
        }
    }
    out
}

/// Trains `config` for `steps` steps on both sides in a fresh folder and checks the figures:
/// every step's loss within `loss_tol` (relative) of PyTorch's, the gradients of step 1 within
/// `grad_tol` of the largest gradient, and each parameter after step 1 within `step_tol` of the
/// size of its own update.
fn compare(device: Device, config: model::Config, steps: usize, (loss_tol, grad_tol, step_tol): (f64, f64, f64)) {
    let dir = std::env::temp_dir().join(format!("tcg-trajectory-{}-{device:?}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let hyper = step::Hyper {
        batch: 8,
        iters: steps as u64,
        warmup: 5,
        autocast: None,
        eager: device == Device::Cpu,
        ..Default::default()
    };
    let spec = trajectory::Spec { config, hyper, steps, seed: 3 };
    // a learnable stream: each token 1 to 4 above the one before, modulo the vocabulary
    tch::manual_seed(0);
    let jumps = Tensor::randint(4, [20_000], (Kind::Int64, Device::Cpu)) + 1;
    let tokens = jumps.cumsum(0, Kind::Int64).remainder(config.vocab).to_kind(Kind::Uint8).to_device(device);
    let ours = trajectory::run(&dir, &spec, &tokens, None, device).expect("the crate's trajectory");
    let dev = if device == Device::Cpu { "cpu" } else { "cuda" };
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/torch_gpt.py");
    let out = Command::new(python())
        .arg(&script)
        .args(["--trajectory", dir.to_str().unwrap(), "--device", dev])
        .output()
        .expect("run the Python with torch (set TCG_PYTHON, or run scripts/setup.sh)");
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "torch_gpt.py --trajectory failed:\n{report}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{report}");
    let theirs = trajectory::read_torch(&dir).expect("PyTorch's trajectory");
    assert_eq!(theirs.loss.len(), steps, "PyTorch ran every step");

    let rel: Vec<f64> = ours.loss.iter().zip(&theirs.loss).map(|(a, b)| ((a - b) / b).abs()).collect();
    let (at, max_rel) = rel.iter().enumerate().fold((0, 0.0), |m, (i, &r)| if r > m.1 { (i, r) } else { m });
    println!(
        "{steps} steps on {dev}: loss {:.6} -> {:.6} (PyTorch {:.6} -> {:.6}); largest relative loss difference {max_rel:.3e} at step {}",
        ours.loss[0],
        ours.loss[steps - 1],
        theirs.loss[0],
        theirs.loss[steps - 1],
        at + 1
    );
    let (c, t, init) = (
        read(&dir.join("crate.safetensors")),
        read(&dir.join("torch.safetensors")),
        read(&dir.join("init.safetensors")),
    );
    let grad_scale =
        t.iter().filter(|(k, _)| k.starts_with("grad@1/")).map(|(_, g)| f64::try_from(g.abs().max()).unwrap());
    let grad_scale = grad_scale.fold(0.0, f64::max);
    let grads = worst(&c, &t, "grad@1/", |_| grad_scale);
    // each parameter against the size of its own first update (PyTorch's)
    let update = |n: &str| f64::try_from((&t[&format!("param@1/{n}")] - &init[n]).abs().max()).unwrap();
    let params = worst(&c, &t, "param@1/", update);
    println!(
        "step 1: gradients within {:.3e} of the largest ({}); parameters within {:.3e} of their update ({})",
        grads.0, grads.1, params.0, params.1
    );
    let _ = std::fs::remove_dir_all(&dir);
    assert!(max_rel <= loss_tol, "step {}: loss {} against PyTorch's {}", at + 1, ours.loss[at], theirs.loss[at]);
    assert!(grads.0 <= grad_tol, "the gradients of step 1 differ in {}", grads.1);
    assert!(params.0 <= step_tol, "the first update differs in {} (weight decay, schedule or optimizer)", params.1);
}

/// On the CPU, a 2-layer GPT over 50 steps: both sides run the same ATen kernels in float32, so
/// they agree to float32 rounding (the global gradient norm sums the parameters in another order).
#[test]
fn the_gpt_step_trains_as_pytorch_step_for_step_on_the_cpu() {
    let config = model::Config { dropout: 0.0, ..model::Config::tiny(96) };
    compare(Device::Cpu, config, 50, (1e-5, 1e-6, 1e-3));
}

/// On a GPU, the captured step of a 2-layer, 128-wide GPT over 50 steps against PyTorch's eager
/// step, float32 (TF32 off on both sides), dropout 0.
#[test]
#[ignore = "needs a CUDA device"]
fn the_captured_gpt_step_trains_as_pytorch_step_for_step_on_a_gpu() {
    assert!(tch_cuda_graphs::cuda_is_available(), "this test needs a CUDA device");
    let config =
        model::Config { vocab: 96, block: 64, layers: 2, heads: 4, embd: 128, dropout: 0.0, ..model::Config::tiny(96) };
    compare(Device::Cuda(0), config, 50, (1e-4, 1e-5, 1e-2));
}
