//! The README and the guide in `docs/` against the repository: every path they name exists, the
//! README's layout table covers every file, every guide page's Rust blocks are compiled as doc
//! tests (listed in `src/lib.rs`), and neither speaks of how the work was organized. Runs from
//! the package root (where cargo runs tests), no GPU.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

/// The top-level folders and files a path named in the docs may start with.
const ROOTS: &[&str] = &["src/", "csrc/", "tests/", "benches/", "examples/", "scripts/", "docs/", ".ci/", ".cargo/"];
const ROOT_FILES: &[&str] =
    &["Makefile", "build.rs", "Cargo.toml", "Cargo.lock", "rustfmt.toml", ".gitignore", "README.md"];

/// Words about how the work was done rather than about the crate (whole words, any case).
const PROCESS_WORDS: &[&str] = &[
    "session",
    "sessions",
    "lent",
    "withheld",
    "missed",
    "budget",
    "device time",
    "closing note",
    "earlier run",
    "earlier runs",
    "targets:",
    "target:",
    // a workplace's staging folders, which users never have (spelled apart so that this list
    // is not itself a reference to them)
    concat!("..", "/shared"),
    concat!(".gpu", "/"),
    "sharded-optimizer-experiment",
];

/// The README and every page of the guide, with their text.
fn documents() -> Vec<(PathBuf, String)> {
    let mut docs = vec![PathBuf::from("README.md")];
    let mut pages: Vec<PathBuf> = fs::read_dir("docs")
        .expect("docs/ (run from the package root)")
        .map(|e| e.expect("a docs/ entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    pages.sort();
    assert!(pages.len() >= 5, "the guide has its pages: {pages:?}");
    docs.extend(pages);
    docs.into_iter().map(|p| (p.clone(), fs::read_to_string(&p).expect("readable"))).collect()
}

/// Text between backticks, and the targets of Markdown links.
fn code_spans_and_links(text: &str) -> (Vec<String>, Vec<String>) {
    let spans = text.split('`').skip(1).step_by(2).map(str::to_owned).collect();
    let links = text
        .split("](")
        .skip(1)
        .filter_map(|rest| rest.split(')').next())
        .map(|t| t.split_whitespace().next().unwrap_or("").to_owned())
        .collect();
    (spans, links)
}

/// A word of a code span that names a file or folder of the repository.
fn repo_path(word: &str) -> Option<&str> {
    let w = word.trim_end_matches([',', ';', '.', ')', ':']).trim_start_matches('(');
    let w = w.split(['#', ':']).next().unwrap_or(w);
    let named = ROOTS.iter().any(|r| w.starts_with(r)) || ROOT_FILES.contains(&w);
    let pattern = w.contains(['*', '{', '<', '$']);
    (named && !pattern).then_some(w)
}

#[test]
fn every_path_the_readme_and_the_guide_name_exists() {
    let mut missing = Vec::new();
    let mut checked = 0;
    for (doc, text) in documents() {
        let (spans, links) = code_spans_and_links(&text);
        for word in spans.iter().flat_map(|s| s.split_whitespace()) {
            if let Some(p) = repo_path(word) {
                checked += 1;
                if !Path::new(p).exists() {
                    missing.push(format!("{}: `{p}`", doc.display()));
                }
            }
        }
        let base = doc.parent().unwrap_or(Path::new(""));
        for link in links {
            if link.is_empty() || link.starts_with('#') || link.contains("://") || link.starts_with("mailto:") {
                continue;
            }
            checked += 1;
            let target = base.join(link.split('#').next().unwrap_or(&link));
            if !target.exists() {
                missing.push(format!("{}: link {link}", doc.display()));
            }
        }
    }
    println!("{checked} paths and links checked");
    assert!(checked > 50, "the check found the paths ({checked})");
    assert!(missing.is_empty(), "named but not in the repository:\n{}", missing.join("\n"));
}

#[test]
fn the_readme_and_the_guide_speak_of_the_crate() {
    let mut found = Vec::new();
    for (doc, text) in documents() {
        for (n, line) in text.lines().enumerate() {
            let lower = line.to_lowercase();
            for word in PROCESS_WORDS {
                let hit = lower.match_indices(word).any(|(i, _)| {
                    let before = lower[..i].chars().next_back();
                    let after = lower[i + word.len()..].chars().next();
                    let alpha = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_');
                    !alpha(before) && !alpha(after)
                });
                if hit {
                    found.push(format!("{}:{}: {word:?} in {line}", doc.display(), n + 1));
                }
            }
        }
    }
    assert!(found.is_empty(), "words about the work, not the crate:\n{}", found.join("\n"));
}

/// Every file of the checkout that git does not ignore (`git ls-files`, tracked and untracked,
/// `.gitignore` and `.git/info/exclude` honoured); without git, every file but the folders that
/// `.gitignore` names at the top and `.git`.
fn checkout_files() -> Vec<String> {
    let listed = std::process::Command::new("git")
        .args(["ls-files", "--cached", "--others", "--exclude-standard"])
        .output()
        .ok()
        .filter(|o| o.status.success() && !o.stdout.is_empty());
    if let Some(out) = listed {
        return String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|f| Path::new(f).exists()) // a file deleted but not yet committed
            .map(str::to_owned)
            .collect();
    }
    let ignored: BTreeSet<String> = fs::read_to_string(".gitignore")
        .expect(".gitignore")
        .lines()
        .map(|l| l.trim().trim_matches('/').to_owned())
        .filter(|l| !l.is_empty())
        .chain([".git".to_owned()])
        .collect();
    let mut files = Vec::new();
    let mut todo = vec![PathBuf::from(".")];
    while let Some(dir) = todo.pop() {
        for entry in fs::read_dir(&dir).expect("a readable folder") {
            let path = entry.expect("an entry").path();
            let rel = path.strip_prefix(".").expect("under the root").to_string_lossy().into_owned();
            if dir == Path::new(".") && ignored.contains(&rel) {
                continue;
            }
            if path.is_dir() {
                todo.push(path);
            } else {
                files.push(rel);
            }
        }
    }
    files
}

/// Whether a layout entry names `file`: the file itself, a folder (`dir/`) holding it, or a
/// pattern with one `*` (`tests/gpu_*.rs`).
fn covers(entry: &str, file: &str) -> bool {
    match entry.split_once('*') {
        Some((head, tail)) => file.len() >= head.len() + tail.len() && file.starts_with(head) && file.ends_with(tail),
        None => file == entry || (entry.ends_with('/') && file.starts_with(entry)),
    }
}

#[test]
fn the_readme_layout_covers_every_file() {
    let readme = fs::read_to_string("README.md").expect("README.md");
    let layout = readme.split("\n## Layout").nth(1).expect("a Layout section");
    let layout = layout.split("\n## ").next().unwrap_or(layout);
    let named: Vec<String> = layout
        .lines()
        .filter(|l| l.starts_with("| `"))
        .flat_map(|l| {
            let first = l.split('|').nth(1).unwrap_or("");
            code_spans_and_links(first).0
        })
        .collect();
    assert!(named.len() > 30, "the layout names the files ({})", named.len());
    let uncovered: Vec<String> = checkout_files().into_iter().filter(|f| !named.iter().any(|n| covers(n, f))).collect();
    assert!(uncovered.is_empty(), "files the README's layout does not name:\n{}", uncovered.join("\n"));
}

#[test]
fn every_guide_page_is_compiled_as_doc_tests() {
    let lib = fs::read_to_string("src/lib.rs").expect("src/lib.rs");
    let pages: Vec<PathBuf> = documents().into_iter().map(|(p, _)| p).collect();
    for page in pages {
        let include = format!("include_str!(\"../{}\")", page.display());
        assert!(lib.contains(&include), "src/lib.rs compiles the Rust blocks of {} ({include})", page.display());
    }
}

/// The lines of an example of `examples/from_tch/`, its module docs left out.
fn code_lines(name: &str) -> Vec<String> {
    let text = fs::read_to_string(format!("examples/from_tch/{name}.rs")).expect("an example of examples/from_tch");
    text.lines().filter(|l| !l.starts_with("//!")).map(str::to_owned).collect()
}

/// The lines removed from `a` and added in `b` (a longest-common-subsequence diff), each sorted.
fn line_diff(a: &[String], b: &[String]) -> (Vec<String>, Vec<String>) {
    let (n, m) = (a.len(), b.len());
    let mut lcs = vec![vec![0usize; m + 1]; n + 1];
    for i in (0..n).rev() {
        for j in (0..m).rev() {
            lcs[i][j] = if a[i] == b[j] { lcs[i + 1][j + 1] + 1 } else { lcs[i + 1][j].max(lcs[i][j + 1]) };
        }
    }
    let (mut i, mut j, mut removed, mut added) = (0, 0, Vec::new(), Vec::new());
    while i < n || j < m {
        if i < n && j < m && a[i] == b[j] {
            (i, j) = (i + 1, j + 1);
        } else if j < m && (i == n || lcs[i][j + 1] >= lcs[i + 1][j]) {
            added.push(b[j].clone());
            j += 1;
        } else {
            removed.push(a[i].clone());
            i += 1;
        }
    }
    removed.sort();
    added.sort();
    (removed, added)
}

/// The `-` and `+` lines of the ```diff block of docs/adopting.md that follows `marker`, each
/// sorted.
fn guide_diff(marker: &str) -> (Vec<String>, Vec<String>) {
    let page = fs::read_to_string("docs/adopting.md").expect("docs/adopting.md");
    let at = page.find(marker).unwrap_or_else(|| panic!("docs/adopting.md has no {marker:?}"));
    let block = page[at..].split("```diff\n").nth(1).and_then(|b| b.split("\n```").next()).expect("a diff block");
    let (mut removed, mut added) = (Vec::new(), Vec::new());
    for line in block.lines() {
        if let Some(l) = line.strip_prefix('-') {
            removed.push(l.to_owned());
        } else if let Some(l) = line.strip_prefix('+') {
            added.push(l.to_owned());
        }
    }
    removed.sort();
    added.sort();
    (removed, added)
}

/// A plain tch GPT takes the crate's captured step by a diff of at most 15 lines (removed and
/// added together), and the crate's fused layers by at most 25 more; the guide shows exactly
/// those diffs.
#[test]
fn a_plain_tch_gpt_adopts_the_crate_in_small_diffs() {
    let (plain, captured, fused) = (code_lines("plain"), code_lines("captured"), code_lines("fused"));
    for (what, a, b, most, marker) in [
        ("capture the step", &plain, &captured, 15, "<!-- diff: plain -> captured -->"),
        ("swap in the fused layers", &captured, &fused, 25, "<!-- diff: captured -> fused -->"),
    ] {
        let (removed, added) = line_diff(a, b);
        println!("{what}: -{} +{} lines ({} in all)", removed.len(), added.len(), removed.len() + added.len());
        assert!(removed.len() + added.len() <= most, "{what}: more than {most} lines changed");
        assert_eq!(guide_diff(marker), (removed, added), "docs/adopting.md shows the diff to {what}");
    }
}

/// csrc/tcg.h's table of files and families against its sections: every section's file is in
/// the table and exists, every function a section declares is of a family the table gives that
/// file, and every file of the table has its section.
#[test]
fn the_shim_header_names_each_file_and_family() {
    let header = fs::read_to_string("csrc/tcg.h").expect("csrc/tcg.h");
    let table_start = header.find("//   file ").expect("the header's table of files");
    let mut table: Vec<(String, Vec<String>)> = Vec::new();
    for line in header[table_start..].lines().skip(1) {
        let Some(row) = line.strip_prefix("//   ") else { break };
        let mut cols = row.split("  ").map(str::trim).filter(|c| !c.is_empty());
        let file = cols.next().expect("a file").to_owned();
        let families = cols.next().expect("its families").split(", ").map(str::to_owned).collect();
        table.push((file, families));
    }
    assert!(table.len() >= 15, "the table has its rows: {table:?}");
    let mut seen = BTreeSet::new();
    for section in header.split("\n// ----------").skip(1) {
        let file = section.trim_start_matches('-').split_whitespace().next().expect("a section's file").to_owned();
        let families = &table
            .iter()
            .find(|(f, _)| *f == file)
            .unwrap_or_else(|| panic!("section {file} is not in the header's table"))
            .1;
        assert!(Path::new("csrc").join(&file).exists(), "csrc/{file} exists");
        let mut rest = section;
        while let Some(at) = rest.find("tcg_") {
            let name: String = rest[at..].chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
            rest = &rest[at + name.len()..];
            if !rest.trim_start().starts_with('(') || name.starts_with("tcg_status") {
                continue; // a type or a mention, not a declaration
            }
            assert!(
                families.iter().any(|f| name == format!("tcg_{f}") || name.starts_with(&format!("tcg_{f}_"))),
                "{name} (in section {file}) is of none of its families {families:?}"
            );
        }
        seen.insert(file);
    }
    for (file, _) in &table {
        assert!(seen.contains(file), "the table names {file}, which has no section");
    }
}

/// `src/sys/mod.rs`'s table of the safe layer's files: one row per file of `src/sys/`, each
/// naming shim files that exist.
#[test]
fn the_safe_layers_table_names_each_file() {
    let text = fs::read_to_string("src/sys/mod.rs").expect("src/sys/mod.rs");
    let rows: Vec<&str> = text.lines().filter_map(|l| l.strip_prefix("//! | `")).collect();
    let mut files: Vec<String> = fs::read_dir("src/sys")
        .expect("src/sys")
        .map(|e| e.expect("an entry").file_name().to_string_lossy().into_owned())
        .filter(|f| f.ends_with(".rs") && f != "mod.rs")
        .collect();
    files.sort();
    for f in &files {
        let row =
            rows.iter().find(|r| r.starts_with(&format!("{f}`"))).unwrap_or_else(|| panic!("no row for src/sys/{f}"));
        for shim in row.split('`').skip(2).step_by(2).filter(|p| p.starts_with("csrc/")) {
            assert!(Path::new(shim).exists(), "src/sys/mod.rs names {shim}, which does not exist");
        }
    }
    assert_eq!(rows.len(), files.len(), "one row per file: {files:?}");
}
