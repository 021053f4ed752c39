//! Using the crate from another crate, as the README says: a throwaway binary crate that depends
//! on this one by path, with the README's three-line `build.rs`, is built and run with `cargo
//! run` and no `LD_LIBRARY_PATH`: its binary finds libtorch through the rpath that the build
//! script took from `DEP_TCH_CUDA_GRAPHS_SHIM_LIB_DIR`. The throwaway crate lives under
//! `target/`, builds the shim without CUDA (faster; the linking is what is tested) into a target
//! folder of its own, and uses this repository's `Cargo.lock`.

use std::path::Path;
use std::process::Command;

const BUILD_RS: &str = r#"fn main() {
    if let Ok(dir) = std::env::var("DEP_TCH_CUDA_GRAPHS_SHIM_LIB_DIR") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
    }
}
"#;

const MAIN_RS: &str = r#"use tch::{nn, nn::Module, Device, Kind, Tensor};
use tch_cuda_graphs::{optim::{Adam, AdamConfig, Optimizer}, StepOptions, TrainStep};

fn main() -> tch_cuda_graphs::Result<()> {
    let vs = nn::VarStore::new(Device::Cpu);
    let model = nn::linear(vs.root(), 4, 1, Default::default());
    let x = Tensor::ones([8, 4], (Kind::Float, Device::Cpu));
    let opt = Adam::new(&vs, AdamConfig::default())?;
    let mut step = TrainStep::with_state(opt, &[("x", &x)], StepOptions::default(), |opt, inp| {
        opt.zero_grad()?;
        let loss = model.forward(&inp[0]).f_square()?.f_mean(None)?;
        loss.f_backward()?;
        opt.step()?;
        Ok(vec![loss.detach()])
    })?;
    let loss = f64::try_from(&step.run(&[&x])?[0])?;
    println!("dependent crate ran a step: loss {loss:.4}");
    Ok(())
}
"#;

#[test]
fn a_dependent_crate_runs_with_cargo_run_and_no_library_path() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = root.join("target/dependent-crate");
    std::fs::create_dir_all(dir.join("src")).unwrap();
    let manifest = format!(
        "[package]\nname = \"tcg-dependent\"\nversion = \"0.0.0\"\nedition = \"2024\"\npublish = false\n\n\
         [dependencies]\ntch-cuda-graphs = {{ path = {:?} }}\ntch = \"=0.24.0\"\n\n[workspace]\n",
        root.display().to_string()
    );
    std::fs::write(dir.join("Cargo.toml"), manifest).unwrap();
    std::fs::write(dir.join("build.rs"), BUILD_RS).unwrap();
    std::fs::write(dir.join("src/main.rs"), MAIN_RS).unwrap();
    std::fs::copy(root.join("Cargo.lock"), dir.join("Cargo.lock")).unwrap();
    // LIBTORCH as this repository's .cargo/config.toml gives it (a dependent sets its own)
    let libtorch =
        std::env::var_os("LIBTORCH").map(std::path::PathBuf::from).unwrap_or_else(|| root.join(".venv/torch"));
    let libtorch = if libtorch.is_relative() { root.join(libtorch) } else { libtorch };
    let out = Command::new(env!("CARGO"))
        .args(["run", "--release", "--quiet"])
        .current_dir(&dir)
        .env("LIBTORCH", &libtorch)
        .env("TCH_CUDA_GRAPHS_NO_CUDA", "1")
        .env("CARGO_TARGET_DIR", root.join("target/dependent-target"))
        .env_remove("LD_LIBRARY_PATH")
        .env_remove("CARGO_MANIFEST_DIR")
        .output()
        .expect("run cargo");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    println!("{stdout}");
    assert!(out.status.success(), "the dependent crate failed ({:?}):\n{stderr}", out.status);
    assert!(stdout.contains("dependent crate ran a step"), "its binary ran: {stdout}");
}
