//! The corpus: real text with no internet at run time. The Python sources of the installed torch
//! package (about 2,100 files, 44 MB), read as characters: newline and printable ASCII, 96
//! symbols; other bytes are dropped. Prepared once into `train.bin` and `val.bin` (one byte per
//! token, the last tenth of the text for validation) under a cache folder.
#![allow(dead_code)]

use anyhow::{ensure, Context, Result};
use std::path::{Path, PathBuf};
use tch::{Device, Kind, Tensor};

/// Newline and the printable ASCII characters.
pub const VOCAB: i64 = 96;

/// The token of a byte, if it is in the vocabulary.
pub fn encode(b: u8) -> Option<u8> {
    match b {
        b'\n' => Some(0),
        32..=126 => Some(b - 31),
        _ => None,
    }
}

/// The character of a token.
pub fn decode(t: i64) -> char {
    if t <= 0 {
        '\n'
    } else {
        char::from((t as u8).saturating_add(31).min(126))
    }
}

/// Every `.py` file under `dir`, sorted (the corpus is the same on every machine with the same
/// torch).
fn python_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for entry in std::fs::read_dir(&d).with_context(|| format!("reading {}", d.display()))? {
            let path = entry?.path();
            if path.is_dir() {
                todo.push(path);
            } else if path.extension().is_some_and(|e| e == "py") {
                files.push(path);
            }
        }
    }
    files.sort();
    Ok(files)
}

/// The corpus's train and validation tokens, as 1-D uint8 tensors on the CPU.
pub struct Corpus {
    pub train: Tensor,
    pub val: Tensor,
}

impl Corpus {
    /// Reads `cache/{train,val}.bin`, or makes them from the Python files under `source`.
    pub fn prepare(source: &Path, cache: &Path) -> Result<Corpus> {
        let (train, val) = (cache.join("train.bin"), cache.join("val.bin"));
        if !(train.is_file() && val.is_file()) {
            let files = python_files(source)?;
            ensure!(!files.is_empty(), "no .py files under {} (give --data-dir)", source.display());
            let mut tokens = Vec::new();
            for f in &files {
                tokens.extend(std::fs::read(f)?.into_iter().filter_map(encode));
                tokens.push(0);
            }
            let split = tokens.len() * 9 / 10;
            std::fs::create_dir_all(cache)?;
            std::fs::write(&train, &tokens[..split])?;
            std::fs::write(&val, &tokens[split..])?;
        }
        let load = |p: &Path| -> Result<Tensor> {
            let bytes = std::fs::read(p).with_context(|| format!("reading {}", p.display()))?;
            Ok(Tensor::from_slice(&bytes))
        };
        Ok(Corpus { train: load(&train)?, val: load(&val)? })
    }
}

/// `batch` random windows of `block + 1` tokens of `data` (uint8, on its device): inputs and
/// the next-token targets, int64, `[batch, block]` each. Uses the global generator of `data`'s
/// device; no host sync where `data` lives on the GPU.
pub fn batch(data: &Tensor, batch: i64, block: i64) -> Result<(Tensor, Tensor)> {
    let device = data.device();
    let n = data.size()[0];
    ensure!(n > block + 1, "a corpus of {n} tokens is shorter than a block of {block}");
    let starts = Tensor::f_randint(n - block - 1, [batch, 1], (Kind::Int64, device))?;
    let idx = starts.f_add(&Tensor::f_arange(block + 1, (Kind::Int64, device))?)?;
    let windows = data.f_take(&idx)?.f_to_kind(Kind::Int64)?;
    Ok((windows.f_narrow(1, 0, block)?, windows.f_narrow(1, 1, block)?))
}

/// Where the tokens of `source` are kept: `target/gpt-data/<source, '/' as '_'>`.
pub fn cache_dir(source: &Path) -> PathBuf {
    let name: String =
        source.to_string_lossy().chars().map(|c| if c.is_ascii_alphanumeric() || c == '.' { c } else { '_' }).collect();
    PathBuf::from("target/gpt-data").join(name)
}

/// The default corpus folder: the torch package the set-up installed (`.venv/torch`).
pub fn default_source() -> PathBuf {
    PathBuf::from(".venv/torch")
}

/// Moves the corpus to `device` (40 MB of uint8 tokens: batches are then cut on the device).
pub fn to_device(c: &Corpus, device: Device) -> Result<Corpus> {
    Ok(Corpus { train: c.train.f_to(device)?, val: c.val.f_to(device)? })
}
