//! The examples' command lines, as a person types them: `--help` prints the usage and exits 0,
//! a wrong argument prints the usage on stderr and exits 2. Runs without a GPU (neither example
//! touches the device before its arguments are read).

use std::path::PathBuf;
use std::process::Command;

/// The example binary `name`, built by `cargo test` beside the test binaries (or staged beside
/// this one as `example-NAME` by the GPU runner). Panics if it is not there.
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

#[test]
fn examples_answer_help_with_their_usage_and_exit_0() {
    for name in ["train", "train_ddp"] {
        for flag in ["--help", "-h"] {
            let out = Command::new(example(name)).arg(flag).output().expect("run the example");
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert_eq!(out.status.code(), Some(0), "{name} {flag}: {out:?}");
            assert!(stdout.starts_with("usage: "), "{name} {flag} prints its usage: {stdout}");
        }
    }
}

#[test]
fn examples_answer_a_wrong_argument_with_the_usage_and_exit_2() {
    for (name, args) in [
        ("train", &["--bogus"][..]),
        ("train", &["--epochs", "many"][..]),
        ("train", &["--precision", "fp8"][..]),
        ("train_ddp", &["--bogus"][..]),
    ] {
        let out = Command::new(example(name)).args(args).output().expect("run the example");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{name} {args:?}: {out:?}");
        assert!(stderr.contains("usage: "), "{name} {args:?} prints the usage on stderr: {stderr}");
        assert!(out.stdout.is_empty(), "{name} {args:?}: nothing on stdout");
    }
}
