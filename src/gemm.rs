//! How the crate's GEMMs choose their algorithm: cuBLASLt's heuristic (the default) or timing.
//!
//! The crate's own path of the linear layer ([`crate::linear::Linear`]), of the MLP
//! ([`crate::mlp`]) and of the chunked loss ([`crate::loss::f_linear_cross_entropy`]) runs its
//! GEMMs through cuBLASLt. Each GEMM shape's algorithm is chosen once, on its first call, and kept
//! for the process:
//! - [`GemmChoice::Heuristic`] (the default): cuBLASLt's heuristic's first. Every process makes
//!   the same choice on the same GPU, library and shapes, so results repeat bit for bit.
//! - [`GemmChoice::Timed`]: the fastest of the heuristic's first 32 candidates, each timed on
//!   the shape's first call outside a stream capture (into scratch outputs; the call's own
//!   outputs are written once, by the chosen algorithm). A candidate replaces the heuristic's
//!   first only when 3% faster. As with PyTorch's `torch.backends.cudnn.benchmark = True`, two
//!   processes may choose differently and so differ in their results' last bits; within one
//!   process the eager and the captured calls of a shape run the same algorithm. A shape first
//!   met under a capture keeps the heuristic's first: run a step eagerly before capturing it
//!   (as [`crate::TrainStep`]'s warm-up does) so that the choice is timed.
//!
//! The choice is the process's, as cuDNN's benchmark flag is PyTorch's: set it once, before the
//! first step. Setting it forgets the choices made so far.
//!
//! One GEMM leaves cuBLASLt whatever the choice: a float32 weight gradient of at least 2^23
//! values (a vocabulary's head) from bf16 operands runs in the crate's CUTLASS kernel on sm_90,
//! where cuBLASLt's heuristic's kernel is slower (docs/kernels.md). It is the same kernel in every
//! process.
//!
//! ```no_run
//! # fn main() -> tch_cuda_graphs::Result<()> {
//! use tch_cuda_graphs::gemm::{self, GemmChoice};
//! gemm::f_set_choice(GemmChoice::Timed)?;
//! // ... build the model and the step; the warm-up times each GEMM shape once
//! let shapes = gemm::f_shapes()?;
//! println!("{} GEMM shapes, {} timed", shapes.chosen, shapes.timed);
//! # Ok(()) }
//! ```
//!
//! # Choices kept in a file
//!
//! As PyTorch's TunableOp keeps its tunings (`torch.cuda.tunable.write_file` / `read_file`),
//! [`f_write_file`] writes the current device's choices (every shape met, timed or not) and
//! [`f_read_file`] takes a file's choices back, so that later processes run the algorithms an
//! earlier one timed: the same bits in every process that reads the file, and no timing on the
//! shapes it holds. The file starts with validator lines (the GPU's name, cuBLASLt's and
//! libtorch's versions); a file written for another of them is refused
//! ([`Error::GemmFile`](crate::Error::GemmFile)), as TunableOp rejects one. Each algorithm read
//! is checked by cuBLASLt on its shape's first call, and a shape it refuses chooses as the
//! process's choice says. Set the choice first: setting it forgets what was read.
//!
//! ```no_run
//! # fn main() -> tch_cuda_graphs::Result<()> {
//! use tch_cuda_graphs::{gemm::{self, GemmChoice}, Error};
//! gemm::f_set_choice(GemmChoice::Timed)?; // shapes the file does not hold are timed
//! match gemm::f_read_file("gemm_choices.csv") {
//!     Ok(n) => println!("{n} GEMM shapes from the file"),
//!     Err(Error::GemmFile { source: Some(e), .. }) if e.kind() == std::io::ErrorKind::NotFound => {}
//!     Err(e) => return Err(e),
//! }
//! // ... build the model and the step: its warm-up meets every GEMM shape once
//! gemm::f_write_file("gemm_choices.csv")?;
//! # Ok(()) }
//! ```

use std::fmt::Write as _;
use std::path::Path;

use crate::error::{Error, Result};
use crate::sys::gemm::{self as sys, GemmEntry, RawGemmChoice};

/// How a GEMM shape's algorithm is chosen (see the [module](self)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum GemmChoice {
    /// cuBLASLt's heuristic's first: the same in every process (the default).
    #[default]
    Heuristic,
    /// The fastest of the heuristic's first 32, timed on the shape's first eager call.
    Timed,
}

impl GemmChoice {
    fn raw(self) -> RawGemmChoice {
        match self {
            GemmChoice::Heuristic => RawGemmChoice::TCG_GEMM_HEURISTIC,
            GemmChoice::Timed => RawGemmChoice::TCG_GEMM_TIMED,
        }
    }
}

/// How many GEMM shapes have their algorithm chosen ([`f_shapes`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GemmShapes {
    /// Shapes with an algorithm chosen since the process began or the choice was last set.
    pub chosen: usize,
    /// Of those, the ones chosen by timing.
    pub timed: usize,
    /// Of those, the ones whose algorithm came from a file ([`f_read_file`]).
    pub from_file: usize,
}

/// Sets how GEMM shapes choose their algorithm, for the whole process, and forgets the choices
/// made so far (each shape chooses again on its next call).
pub fn f_set_choice(choice: GemmChoice) -> Result<()> {
    sys::set_choice(choice.raw())
}

/// [`f_set_choice`], panicking on an error.
pub fn set_choice(choice: GemmChoice) {
    f_set_choice(choice).unwrap_or_else(|e| panic!("{e}"))
}

/// The process's choice.
pub fn f_choice() -> Result<GemmChoice> {
    Ok(if sys::choice()? == RawGemmChoice::TCG_GEMM_TIMED { GemmChoice::Timed } else { GemmChoice::Heuristic })
}

/// How many GEMM shapes have their algorithm chosen, and how many of them by timing (none without
/// CUDA).
pub fn f_shapes() -> Result<GemmShapes> {
    let (chosen, timed, from_file) = sys::shapes()?;
    Ok(GemmShapes {
        chosen: chosen.max(0) as usize,
        timed: timed.max(0) as usize,
        from_file: from_file.max(0) as usize,
    })
}

/// The first line of a file of choices.
const HEADER: &str = "# tch-cuda-graphs GEMM choices, format 1";

/// The validator lines a file must hold to be read on this device: `Validator,NAME,VALUE`.
fn validators() -> Result<Vec<(String, String)>> {
    let (device, cublaslt, torch) = sys::identity()?;
    Ok(vec![("device".into(), device), ("cublaslt".into(), cublaslt.to_string()), ("torch".into(), torch.to_string())])
}

/// Writes the current device's GEMM choices (every shape met so far, and those read from a file
/// and not yet met) to `path`, replacing it; returns how many shapes it holds. See the
/// [module](self#choices-kept-in-a-file).
pub fn f_write_file(path: impl AsRef<Path>) -> Result<usize> {
    let path = path.as_ref();
    let entries = sys::export()?;
    let mut text = format!("{HEADER}\n");
    for (name, value) in validators()? {
        let _ = writeln!(text, "Validator,{name},{value}");
    }
    for e in &entries {
        let key: Vec<String> = e.key.iter().map(i64::to_string).collect();
        let algo: Vec<String> = e.algo.iter().map(|w| format!("{w:016x}")).collect();
        let _ =
            writeln!(text, "Gemm,{},{},{}", key.join(" "), algo.join(" "), if e.timed { "timed" } else { "heuristic" });
    }
    std::fs::write(path, text).map_err(|e| io_error(path, "cannot be written", e))?;
    Ok(entries.len())
}

/// [`f_write_file`], panicking on an error.
pub fn write_file(path: impl AsRef<Path>) -> usize {
    f_write_file(path).unwrap_or_else(|e| panic!("{e}"))
}

/// Reads the GEMM choices of a file [`f_write_file`] wrote into the current device's, replacing
/// the choices made for the shapes it holds; returns how many it holds. A file written for
/// another GPU, cuBLASLt or libtorch, or not such a file, is refused as a whole
/// ([`Error::GemmFile`]). See the [module](self#choices-kept-in-a-file).
pub fn f_read_file(path: impl AsRef<Path>) -> Result<usize> {
    let path = path.as_ref();
    let refuse = |reason: String| Error::GemmFile { path: path.display().to_string(), reason, source: None };
    let text = std::fs::read_to_string(path).map_err(|e| io_error(path, "cannot be read", e))?;
    let mut lines = text.lines().enumerate();
    if lines.next().map(|(_, l)| l) != Some(HEADER) {
        return Err(refuse(format!("not a file of GEMM choices (its first line is not `{HEADER}`)")));
    }
    let mut found = Vec::new();
    let mut entries = Vec::new();
    for (i, line) in lines {
        let fields: Vec<&str> = line.splitn(3, ',').collect();
        match fields.as_slice() {
            ["Validator", name, value] => found.push((name.to_string(), value.to_string())),
            ["Gemm", ..] => {
                entries.push(parse_entry(line).ok_or_else(|| refuse(format!("line {} is not a GEMM choice", i + 1)))?)
            }
            [""] => {}
            _ => return Err(refuse(format!("line {} is neither a validator nor a GEMM choice", i + 1))),
        }
    }
    for (name, value) in validators()? {
        match found.iter().find(|(n, _)| *n == name) {
            Some((_, v)) if *v == value => {}
            Some((_, v)) => return Err(refuse(format!("written for {name} `{v}`; this process has `{value}`"))),
            None => return Err(refuse(format!("it has no `{name}` validator"))),
        }
    }
    sys::import(&entries)?;
    Ok(entries.len())
}

/// The file's I/O error as [`Error::GemmFile`].
fn io_error(path: &Path, reason: &str, source: std::io::Error) -> Error {
    Error::GemmFile { path: path.display().to_string(), reason: reason.into(), source: Some(source) }
}

/// [`f_read_file`], panicking on an error.
pub fn read_file(path: impl AsRef<Path>) -> usize {
    f_read_file(path).unwrap_or_else(|e| panic!("{e}"))
}

/// One `Gemm,KEY,ALGO,HOW` line: KEY the key's integers (`TCG_GEMM_KEY_LEN`), ALGO 8 hexadecimal
/// words, HOW `timed` or `heuristic`.
fn parse_entry(line: &str) -> Option<GemmEntry> {
    let fields: Vec<&str> = line.split(',').collect();
    let [_, key, algo, how] = fields.as_slice() else { return None };
    let key: Vec<i64> = key.split(' ').map(str::parse).collect::<std::result::Result<_, _>>().ok()?;
    let algo: Vec<u64> =
        algo.split(' ').map(|w| u64::from_str_radix(w, 16)).collect::<std::result::Result<_, _>>().ok()?;
    let timed = match *how {
        "timed" => true,
        "heuristic" => false,
        _ => return None,
    };
    Some(GemmEntry { key: key.try_into().ok()?, algo: algo.try_into().ok()?, timed })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_choice_line_parses_back_and_a_broken_one_does_not() {
        let mut key = GemmEntry::default().key;
        key[3] = -7;
        key[29] = 12288;
        let algo = [1u64, 2, 3, u64::MAX, 0, 0, 0, 0xdead_beef];
        let keys: Vec<String> = key.iter().map(i64::to_string).collect();
        let words: Vec<String> = algo.iter().map(|w| format!("{w:016x}")).collect();
        let line = format!("Gemm,{},{},timed", keys.join(" "), words.join(" "));
        assert_eq!(parse_entry(&line), Some(GemmEntry { key, algo, timed: true }));
        assert_eq!(parse_entry(&line.replace("timed", "fast")), None);
        assert_eq!(parse_entry(&line.replacen(" 0 ", " x ", 1)), None);
        let short = format!("Gemm,{},{},heuristic", keys[..29].join(" "), words.join(" "));
        assert_eq!(parse_entry(&short), None);
    }
}
