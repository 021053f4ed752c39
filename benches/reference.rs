//! What the benchmarks share around their command line and PyTorch's side: the Python that runs
//! the PyTorch scripts (the venv's, made by `scripts/setup.sh`, or `$TCG_PYTHON`), a check that it
//! has torch before anything is measured, the exits for a usage error or a missing GPU, and the
//! crate's steps measured again with their GEMMs' algorithms timed.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// The Python that runs PyTorch's side: `$TCG_PYTHON`, else `.venv/bin/python` (from the
/// package root, where cargo runs benchmarks).
pub fn python() -> PathBuf {
    match std::env::var_os("TCG_PYTHON") {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => PathBuf::from(".venv/bin/python"),
    }
}

/// Ok when [`python`] imports torch 2.11 with CUDA; otherwise why not, in a sentence that says
/// what to do.
pub fn check_torch() -> Result<(), String> {
    let py = python();
    let out = Command::new(&py)
        .args(["-c", "import torch; print(torch.__version__, torch.cuda.is_available())"])
        .output()
        .map_err(|e| {
            format!("{} is not runnable ({e}): run `bash scripts/setup.sh`, or set TCG_PYTHON", py.display())
        })?;
    let text = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let last = err.lines().last().unwrap_or("");
        return Err(format!(
            "{} cannot import torch ({last}): run `bash scripts/setup.sh`, or set TCG_PYTHON",
            py.display()
        ));
    }
    match text.split_once(' ') {
        Some((v, "True")) if v.starts_with("2.11.") => Ok(()),
        Some((v, "True")) => Err(format!("{} has torch {v}; PyTorch's side is measured with 2.11", py.display())),
        _ => Err(format!("{} has torch without a CUDA device ({text})", py.display())),
    }
}

/// Runs `script` with `args` under [`python`] and returns its standard output.
pub fn run(script: &str, args: &[String]) -> Result<String, String> {
    let py = python();
    let out =
        Command::new(&py).arg(script).args(args).output().map_err(|e| format!("{} not runnable: {e}", py.display()))?;
    if !out.status.success() {
        return Err(format!("{script} failed: {}", String::from_utf8_lossy(&out.stderr)));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Before measuring: exits 1 when PyTorch's side is wanted and cannot run (rather than printing
/// half a table).
pub fn require_torch(bench: &str) {
    if let Err(why) = check_torch() {
        eprintln!("bench {bench}: PyTorch's side cannot run: {why}. (--no-torch measures this crate alone.)");
        std::process::exit(1);
    }
}

/// A `--rows` value: the names, each one of `all` (else the error names them).
pub fn parse_rows(value: &str, all: &[&str]) -> Result<Vec<String>, lexopt::Error> {
    let rows: Vec<String> = value.split(',').map(str::to_owned).collect();
    match rows.iter().find(|r| !all.contains(&r.as_str())) {
        Some(bad) => Err(format!("--rows: no row {bad:?} (rows: {})", all.join(", ")).into()),
        None => Ok(rows),
    }
}

/// PyTorch's side of a language model's bench: `script --rows ROWS --iters N [EXTRA...]` under
/// [`python`], its standard output; exits 1 with the reason when it fails (rather than printing
/// half a table).
pub fn run_rows_or_exit(bench: &str, script: &str, rows: &[String], iters: usize, extra: &[String]) -> String {
    let mut args = vec!["--rows".into(), rows.join(","), "--iters".into(), iters.to_string()];
    args.extend_from_slice(extra);
    run(script, &args).unwrap_or_else(|e| {
        eprintln!("bench {bench}: PyTorch's side failed: {e}");
        std::process::exit(1)
    })
}

/// Exits 1 with a message when there is no CUDA device: every benchmark compares GPU modes.
pub fn require_cuda(bench: &str) {
    if !tch_cuda_graphs::cuda_is_available() {
        eprintln!("bench {bench}: no CUDA device; nothing to measure (the benchmark compares GPU modes)");
        std::process::exit(1);
    }
}

/// The parsed command line, or the exit its parser asked for: `Ok(None)` (`--help`) prints the
/// usage and exits 0, an error prints it with the usage on stderr and exits 2.
pub fn args_or_exit<T>(bench: &str, parsed: Result<Option<T>, lexopt::Error>, usage: &str) -> T {
    match parsed {
        Ok(Some(args)) => args,
        Ok(None) => {
            println!("{usage}");
            std::process::exit(0)
        }
        Err(e) => usage_error(bench, e, usage),
    }
}

/// A command-line error: the message and the usage on stderr, exit 2.
pub fn usage_error(bench: &str, err: impl std::fmt::Display, usage: &str) -> ! {
    eprintln!("bench {bench}: {err}\n{usage}");
    std::process::exit(2)
}

/// Runs `measure` with the crate's GEMMs' algorithms timed (`gemm::GemmChoice::Timed`): the
/// choices first read from `file` where it exists (those shapes are not timed again), and
/// written to it after; then the heuristic's choice is put back.
pub fn with_timed_gemms<T>(file: Option<&str>, measure: impl FnOnce() -> T) -> tch_cuda_graphs::Result<T> {
    use tch_cuda_graphs::gemm::{self, GemmChoice};
    gemm::f_set_choice(GemmChoice::Timed)?;
    if let Some(f) = file.filter(|f| Path::new(f).exists()) {
        println!("  GEMM choices read from {f}: {} shapes", gemm::f_read_file(f)?);
    }
    let out = measure();
    println!("  GEMM shapes {:?}", gemm::f_shapes()?);
    if let Some(f) = file {
        println!("  GEMM choices written to {f}: {} shapes", gemm::f_write_file(f)?);
    }
    gemm::f_set_choice(GemmChoice::Heuristic)?;
    Ok(out)
}
