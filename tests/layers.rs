//! The crate's layering, checked on the source: only the safe layer over the shim (`src/sys/`)
//! writes `unsafe` or names the raw declarations, and no lower module imports a higher one of
//! the two that matter here (`sys` imports no policy module, `error` imports nothing of the
//! crate).

use std::fs;
use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The code lines of a file (comment lines dropped; enough for these checks).
fn code_lines(path: &Path) -> Vec<(usize, String)> {
    fs::read_to_string(path)
        .unwrap()
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim_start().starts_with("//"))
        .map(|(i, l)| (i + 1, l.to_owned()))
        .collect()
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

#[test]
fn only_the_safe_layer_writes_unsafe() {
    let (src, sys) = (src(), src().join("sys"));
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    assert!(files.len() > 30, "found only {} source files under {}", files.len(), src.display());
    let mut offenders = Vec::new();
    let mut in_sys = 0;
    for f in &files {
        let lines = code_lines(f);
        if f.starts_with(&sys) {
            in_sys += lines.iter().filter(|(_, l)| l.contains("unsafe")).count();
            continue;
        }
        for (n, l) in lines {
            if l.contains("unsafe") || l.contains("sys::ffi") || l.contains("ffi::tcg_") {
                offenders.push(format!("{}:{n}: {}", f.display(), l.trim()));
            }
        }
    }
    println!("`unsafe` lines in src/sys: {in_sys}; elsewhere: {}", offenders.len());
    assert!(in_sys > 0, "the check found no `unsafe` in src/sys at all: it is not looking at the right files");
    assert!(offenders.is_empty(), "`unsafe` or raw shim calls outside src/sys:\n{}", offenders.join("\n"));
}

#[test]
fn the_safe_layer_imports_no_policy_module() {
    let mut files = Vec::new();
    rust_files(&src().join("sys"), &mut files);
    let allowed = ["crate::error", "crate::sys", "crate::NodeKinds", "crate::MemoryStats", "crate::memory::PoolBlock"];
    let mut offenders = Vec::new();
    for f in &files {
        for (n, l) in code_lines(f) {
            let mut rest = l.as_str();
            while let Some(at) = rest.find("crate::") {
                let path = &rest[at..];
                if !allowed.iter().any(|a| path.starts_with(a)) {
                    offenders.push(format!("{}:{n}: {}", f.display(), l.trim()));
                    break;
                }
                rest = &rest[at + 7..];
            }
        }
    }
    println!("{} files of src/sys checked", files.len());
    assert!(files.len() >= 14, "found only {} files in src/sys", files.len());
    assert!(offenders.is_empty(), "src/sys reaches above itself:\n{}", offenders.join("\n"));
}
