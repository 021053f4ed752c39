//! Checkpoints: the model's variables, the optimizer's state and extra tensors (a schedule's
//! step count, the epoch) in one safetensors file (tch reads and writes it).
//!
//! Names in the file: `model/{variable}`, `optim/{state}` ([`Optimizer::state`]), `extra/{name}`.
//! [`load`] validates everything against the model and optimizer first (names, shapes, dtypes,
//! group layout) and only then writes, in place: a checkpoint of another model, or a corrupt
//! file, is an error and changes nothing; and since nothing is reallocated, loading into a
//! step that is already captured works (its graphs keep their addresses).

use crate::error::{Error, Result};
use crate::optim::Optimizer;
use std::collections::HashMap;
use std::path::Path;
use tch::{nn::VarStore, Device, Tensor};

const MODEL: &str = "model/";
const OPTIM: &str = "optim/";
const EXTRA: &str = "extra/";

fn to_cpu(t: &Tensor) -> Result<Tensor> {
    Ok(t.f_detach()?.f_to_device(Device::Cpu)?.f_contiguous()?)
}

/// Writes `vs`'s variables, `opt`'s state and `extra` to `path` (safetensors). The file is
/// written beside `path` and renamed over it, so a crash never leaves half a checkpoint.
///
/// ```no_run
/// # fn main() -> tch_cuda_graphs::Result<()> {
/// use tch::{nn, Device, Tensor};
/// use tch_cuda_graphs::{checkpoint, optim::{Adam, AdamConfig}};
/// let vs = nn::VarStore::new(Device::Cuda(0));
/// let _l = nn::linear(vs.root(), 4, 4, Default::default());
/// let mut opt = Adam::new(&vs, AdamConfig::default())?;
/// let epoch = Tensor::from(3i64);
/// checkpoint::save("ckpt.safetensors", &vs, &opt, &[("epoch", &epoch)])?;
/// let extra = checkpoint::load("ckpt.safetensors", &vs, &mut opt)?;
/// assert_eq!(extra["epoch"].int64_value(&[]), 3);
/// # Ok(()) }
/// ```
pub fn save(path: impl AsRef<Path>, vs: &VarStore, opt: &dyn Optimizer, extra: &[(&str, &Tensor)]) -> Result<()> {
    save_state(path, vs, &opt.state()?, extra)
}

/// [`save`] with the optimizer's state given ([`Optimizer::state`]): for a state that every rank
/// must take part in making (a [`crate::dist::ShardedAdam`]'s is gathered from all of them)
/// while one rank writes.
pub fn save_state(
    path: impl AsRef<Path>,
    vs: &VarStore,
    state: &[(String, Tensor)],
    extra: &[(&str, &Tensor)],
) -> Result<()> {
    let path = path.as_ref();
    let mut named: Vec<(String, Tensor)> = Vec::new();
    let mut vars: Vec<(String, Tensor)> = vs.variables().into_iter().collect();
    vars.sort_by(|a, b| a.0.cmp(&b.0));
    for (n, t) in vars {
        named.push((format!("{MODEL}{n}"), to_cpu(&t)?));
    }
    for (n, t) in state {
        named.push((format!("{OPTIM}{n}"), to_cpu(t)?));
    }
    for (n, t) in extra {
        named.push((format!("{EXTRA}{n}"), to_cpu(t)?));
    }
    let file_err = |source| Error::CheckpointFile { path: path.display().to_string(), source };
    let tmp = path.with_extension("safetensors.tmp");
    Tensor::write_safetensors(&named, &tmp).map_err(file_err)?;
    std::fs::rename(&tmp, path).map_err(|e| file_err(tch::TchError::Io(e)))?;
    Ok(())
}

/// Loads a checkpoint written by [`save`] into `vs` and `opt`, in place, after checking that it
/// fits them ([`Error::Checkpoint`] otherwise, [`Error::CheckpointFile`] for an unreadable
/// file; either way nothing changed). Returns the extra tensors by name.
pub fn load(path: impl AsRef<Path>, vs: &VarStore, opt: &mut dyn Optimizer) -> Result<HashMap<String, Tensor>> {
    let path = path.as_ref();
    let tensors = Tensor::read_safetensors(path)
        .map_err(|source| Error::CheckpointFile { path: path.display().to_string(), source })?;
    let (mut model, mut optim, mut extra) = (HashMap::new(), HashMap::new(), HashMap::new());
    for (name, t) in tensors {
        if let Some(n) = name.strip_prefix(MODEL) {
            model.insert(n.to_owned(), t);
        } else if let Some(n) = name.strip_prefix(OPTIM) {
            optim.insert(n.to_owned(), t);
        } else if let Some(n) = name.strip_prefix(EXTRA) {
            extra.insert(n.to_owned(), t);
        } else {
            return Err(Error::Checkpoint(format!("`{name}` is not a model, optimizer or extra entry")));
        }
    }
    // 1. the model: the same variables, shapes and dtypes
    let vars = vs.variables();
    if let Some(n) = model.keys().find(|n| !vars.contains_key(*n)) {
        return Err(Error::Checkpoint(format!("variable `{n}` is not in this model (a checkpoint of another model?)")));
    }
    for (n, v) in &vars {
        let saved = model.get(n).ok_or_else(|| Error::Checkpoint(format!("variable `{n}` is missing")))?;
        if saved.size() != v.size() || saved.kind() != v.kind() {
            return Err(Error::Checkpoint(format!(
                "variable `{n}` is {:?} {:?} in the checkpoint, {:?} {:?} here",
                saved.size(),
                saved.kind(),
                v.size(),
                v.kind()
            )));
        }
    }
    // 2. the optimizer checks its part, and writes it only if it all fits
    opt.load_state(&optim)?;
    // 3. the model, in place
    let _no_grad = tch::no_grad_guard();
    for (n, v) in &vars {
        v.shallow_clone().f_copy_(&model[n])?;
    }
    Ok(extra)
}
