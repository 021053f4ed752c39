//! The examples' and benchmarks' command lines, as a person types them: `--help` prints the
//! usage and exits 0, a wrong argument prints the usage on stderr and exits 2. Runs without a GPU
//! (none of them touches the device before its arguments are read). The benchmarks' test is
//! `#[ignore]`d because `cargo test` does not build benchmarks: `make test` runs it after
//! `cargo bench --no-run`.

use std::path::PathBuf;
use std::process::Command;

/// The example binary `name`, built by `cargo test` beside the test binaries (or laid out beside
/// this one as `example-NAME` by `scripts/gpu.sh`). Panics if it is not there.
fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let dir = exe.parent().expect("its folder");
    let candidates = [dir.join("..").join("examples").join(name), dir.join(format!("example-{name}"))];
    candidates
        .iter()
        .find(|p| p.is_file())
        .cloned()
        .unwrap_or_else(|| panic!("no example binary {name} in {candidates:?}"))
}

/// The benchmark binary `name`: laid out beside this one as `bench-NAME` by `scripts/gpu.sh`, or
/// the newest `NAME-<hash>` that `cargo bench --no-run` left beside the test binaries. Panics if
/// there is none.
fn bench(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let dir = exe.parent().expect("its folder");
    let laid_out = dir.join(format!("bench-{name}"));
    if laid_out.is_file() {
        return laid_out;
    }
    let prefix = format!("{name}-");
    let built = std::fs::read_dir(dir)
        .expect("the test binaries' folder")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name().and_then(|n| n.to_str()).and_then(|n| n.strip_prefix(&prefix)).is_some_and(|hash| {
                hash.len() == 16 && hash.chars().all(|c| c.is_ascii_hexdigit()) && p.extension().is_none()
            })
        })
        .max_by_key(|p| p.metadata().and_then(|m| m.modified()).ok());
    built.unwrap_or_else(|| panic!("no benchmark binary {name} in {}: run `cargo bench --no-run` first", dir.display()))
}

/// `--help` and `-h` print a usage starting `usage: ` and exit 0.
fn answers_help(name: &str, exe: &PathBuf) {
    for flag in ["--help", "-h"] {
        let out = Command::new(exe).arg(flag).output().expect("run the binary");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(0), "{name} {flag}: {out:?}");
        assert!(stdout.starts_with("usage: "), "{name} {flag} prints its usage: {stdout}");
    }
}

/// `args` print the usage on stderr, nothing on stdout, and exit 2.
fn refuses(name: &str, exe: &PathBuf, args: &[&str]) {
    let out = Command::new(exe).args(args).output().expect("run the binary");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{name} {args:?}: {out:?}");
    assert!(stderr.contains("usage: "), "{name} {args:?} prints the usage on stderr: {stderr}");
    assert!(out.stdout.is_empty(), "{name} {args:?}: nothing on stdout");
}

#[test]
#[ignore = "needs the benchmark binaries: cargo bench --no-run (make test builds them)"]
fn benchmarks_answer_help_and_wrong_arguments() {
    for (name, bad) in [
        ("step", &["--steps", "many"][..]),
        ("graphed", &["--rows", "1:2"][..]),
        ("control", &["--blocks", "many"][..]),
        ("ddp", &["-x"][..]),
        ("gpt", &["--rows", "nothing"][..]),
        ("llama", &["--rows", "nothing"][..]),
    ] {
        let exe = bench(name);
        answers_help(name, &exe);
        refuses(name, &exe, &["--bogus"]);
        refuses(name, &exe, bad);
    }
}

#[test]
fn examples_answer_help_with_their_usage_and_exit_0() {
    for name in ["train", "train_ddp", "gpt"] {
        answers_help(name, &example(name));
    }
}

#[test]
fn examples_answer_a_wrong_argument_with_the_usage_and_exit_2() {
    for (name, args) in [
        ("train", &["--bogus"][..]),
        ("train", &["--epochs", "many"][..]),
        ("train", &["--precision", "fp8"][..]),
        ("train_ddp", &["--bogus"][..]),
        ("gpt", &["--bogus"][..]),
        ("gpt", &["--accum", "0"][..]),
    ] {
        refuses(name, &example(name), args);
    }
}

/// `gpt --ddp` outside torchrun stops at once and says what it needs.
#[test]
fn gpt_ddp_outside_torchrun_says_it_needs_torchrun() {
    let o = Command::new(example("gpt"))
        .args(["--ddp", "--tiny", "--iters", "1"])
        .env_remove("RANK")
        .env_remove("WORLD_SIZE")
        .output()
        .expect("run the gpt example");
    let err = String::from_utf8_lossy(&o.stderr);
    println!("exit {:?}: {err}", o.status.code());
    assert_eq!(o.status.code(), Some(1), "gpt --ddp outside torchrun: {err}");
    assert!(err.contains("torchrun"), "the error does not name torchrun: {err}");
}

/// The GPT example trains its tiny model on a CPU (eagerly; on a GPU host the same command runs
/// the captured step): the loss falls below that of a uniform guess over the 96 characters,
/// evaluations land in loss.csv, a checkpoint is written, text is sampled; and a run stopped at
/// a checkpoint and resumed ends with the same checkpoint, byte for byte, and the same losses
/// as the run that went on. The corpus is this repository's own Python files.
#[test]
fn gpt_trains_a_tiny_model_and_resumes_bit_for_bit() {
    trains_a_tiny_model_and_resumes_bit_for_bit("gpt");
}

/// The same for the Llama-style model (`--arch llama`).
#[test]
fn llama_trains_a_tiny_model_and_resumes_bit_for_bit() {
    trains_a_tiny_model_and_resumes_bit_for_bit("llama");
}

fn trains_a_tiny_model_and_resumes_bit_for_bit(arch: &str) {
    let base = std::env::temp_dir().join(format!("tcg-{arch}-{}", std::process::id()));
    let run = |out: &std::path::Path, extra: &[&str]| {
        let o = Command::new(example("gpt"))
            .args([
                "--arch",
                arch,
                "--tiny",
                "--iters",
                "40",
                "--eval-every",
                "10",
                "--eval-iters",
                "2",
                "--sample",
                "40",
            ])
            .args(["--data-dir", "benches", "--out"])
            .arg(out)
            .args(extra)
            .output()
            .expect("run the gpt example");
        let stdout = String::from_utf8_lossy(&o.stdout).into_owned();
        assert_eq!(o.status.code(), Some(0), "gpt {extra:?}: {stdout}\n{}", String::from_utf8_lossy(&o.stderr));
        stdout
    };
    let (straight, resumed) = (base.join("straight"), base.join("resumed"));
    let first = run(&straight, &[]);
    assert!(first.contains("--- sampled ---"), "{first}");
    let csv = std::fs::read_to_string(straight.join("loss.csv")).expect("loss.csv");
    let rows: Vec<Vec<f64>> =
        csv.lines().skip(1).map(|l| l.split(',').map(|v| v.parse().expect("a number")).collect()).collect();
    assert_eq!(rows.len(), 4, "{csv}");
    let uniform = (96f64).ln();
    println!("tiny {arch}: val loss {:.4} after 40 iterations (uniform guess {uniform:.4})", rows[3][2]);
    assert!(rows[3][2] < uniform - 0.3, "the tiny {arch} learns: {csv}");

    let stopped = run(&resumed, &["--stop-at", "20"]);
    assert!(stopped.contains("stopped after iteration 20"), "{stopped}");
    let again = run(&resumed, &["--resume"]);
    assert!(again.contains("at iteration 20"), "{again}");
    let csv_resumed = std::fs::read_to_string(resumed.join("loss.csv")).expect("loss.csv");
    assert_eq!(csv_resumed, csv, "the resumed run's losses are the straight run's");
    let (a, b) = (std::fs::read(straight.join("ckpt.safetensors")), std::fs::read(resumed.join("ckpt.safetensors")));
    let (a, b) = (a.expect("a checkpoint"), b.expect("a checkpoint"));
    let differing = a.iter().zip(&b).filter(|(x, y)| x != y).count() + a.len().abs_diff(b.len());
    println!(
        "{arch}: checkpoints after 40 iterations, straight and resumed at 20: {} bytes, {differing} differ",
        a.len()
    );
    assert_eq!(differing, 0, "the same checkpoint byte for byte");
    let _ = std::fs::remove_dir_all(&base);
}
