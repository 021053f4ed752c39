//! Parameter groups, learning-rate handles, and the group bookkeeping (layout, state names,
//! validation) that [`super::Adam`] and [`super::Sgd`] share.

use crate::error::{Error, Result};
use crate::scalar::{cpu_f64, cpu_i64};
use std::collections::HashMap;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tch::{nn::VarStore, Device, Kind, Tensor};

/// Named parameters, in order.
pub type NamedParams = Vec<(String, Tensor)>;

/// A parameter group: parameters with the hyper-parameters they share (`C` is
/// [`super::AdamConfig`] or [`super::SgdConfig`]).
#[derive(Debug)]
pub struct ParamGroup<C> {
    /// The group's parameters, named (the names key the optimizer's state in checkpoints).
    pub params: NamedParams,
    /// The group's hyper-parameters (learning rate included).
    pub config: C,
}

impl<C> ParamGroup<C> {
    /// A group of `params` with `config`.
    pub fn new(params: NamedParams, config: C) -> Self {
        ParamGroup { params, config }
    }
}

fn same_tensor(a: &Tensor, b: &Tensor) -> bool {
    a.data_ptr() == b.data_ptr() && a.size() == b.size()
}

/// The trainable variables of `vs`, named, grouped by tch's group index
/// (`nn::Path::set_group`), groups in index order and names sorted within each.
pub fn var_store_groups(vs: &VarStore) -> Vec<NamedParams> {
    let named = vs.variables();
    let vars = vs.variables_.lock().unwrap_or_else(|p| p.into_inner());
    let mut by_group: std::collections::BTreeMap<usize, NamedParams> = Default::default();
    for var in &vars.trainable_variables {
        let name = named.iter().find(|(_, t)| same_tensor(t, &var.tensor)).map(|(n, _)| n.clone());
        let name = name.unwrap_or_else(|| format!("param{}", by_group.values().map(Vec::len).sum::<usize>()));
        by_group.entry(var.group).or_default().push((name, var.tensor.shallow_clone()));
    }
    by_group
        .into_values()
        .map(|mut g| {
            g.sort_by(|a, b| a.0.cmp(&b.0));
            g
        })
        .collect()
}

/// The two sides of [`split_params`]: the parameters a rule matched and the rest, names sorted.
#[derive(Debug)]
pub struct Split {
    /// The parameters the rule said `true` of.
    pub matching: NamedParams,
    /// The others.
    pub rest: NamedParams,
}

/// Splits the trainable variables of `vs` by a rule, names sorted. The sides are named, so a
/// call site says which group is which (for nanoGPT's decay rule, [`decay_groups`] is one call).
///
/// ```
/// use tch::{nn, Device};
/// use tch_cuda_graphs::optim::{split_params, Split};
/// let vs = nn::VarStore::new(Device::Cpu);
/// let _l = nn::linear(vs.root() / "l1", 4, 4, Default::default());
/// let Split { matching: biases, rest: weights } = split_params(&vs, |name, _| name.ends_with("bias"));
/// assert_eq!((biases[0].0.as_str(), weights[0].0.as_str()), ("l1.bias", "l1.weight"));
/// ```
pub fn split_params(vs: &VarStore, rule: impl Fn(&str, &Tensor) -> bool) -> Split {
    let mut all: NamedParams = var_store_groups(vs).into_iter().flatten().collect();
    all.sort_by(|a, b| a.0.cmp(&b.0));
    let (matching, rest) = all.into_iter().partition(|(n, t)| rule(n, t));
    Split { matching, rest }
}

/// nanoGPT's (and PyTorch's usual) weight-decay groups of `vs`'s trainable variables: every
/// tensor of two or more dimensions (matrices, embeddings) with `decay`, the others (biases,
/// norm weights) with `no_decay`, in that order; names sorted within each group.
///
/// ```
/// use tch::{nn, Device};
/// use tch_cuda_graphs::optim::{decay_groups, Adam, AdamConfig};
/// let vs = nn::VarStore::new(Device::Cpu);
/// let _l = nn::linear(vs.root() / "l1", 4, 4, Default::default());
/// let cfg = AdamConfig::adamw().lr(1e-3).weight_decay(0.1);
/// let groups = decay_groups(&vs, cfg, cfg.weight_decay(0.0));
/// assert_eq!((groups[0].params[0].0.as_str(), groups[1].params[0].0.as_str()), ("l1.weight", "l1.bias"));
/// let opt = Adam::with_groups(groups)?;
/// # let _ = opt; Ok::<(), tch_cuda_graphs::Error>(())
/// ```
pub fn decay_groups<C>(vs: &VarStore, decay: C, no_decay: C) -> Vec<ParamGroup<C>> {
    let Split { matching, rest } = split_params(vs, |_, t| t.dim() >= 2);
    vec![ParamGroup::new(matching, decay), ParamGroup::new(rest, no_decay)]
}

/// A learning rate: a 0-d float32 tensor on the parameters' device that fused kernels (and
/// captured steps) read on every launch, with a host mirror of its value. Clones share both,
/// so a handle taken before the optimizer moved into a step closure still sets its rate.
/// Setting fills the tensor with an eager op on the current stream: ordered with replays, no
/// host sync.
///
/// ```
/// use tch::{nn, Device};
/// use tch_cuda_graphs::optim::{Adam, AdamConfig, Optimizer};
/// let vs = nn::VarStore::new(Device::Cpu);
/// let _l = nn::linear(vs.root(), 4, 4, Default::default());
/// let opt = Adam::new(&vs, AdamConfig::default().lr(1e-3))?;
/// let lr = opt.lr_handles().remove(0); // Clone + Send: keep it, move `opt` into a step
/// lr.set(5e-4)?;
/// assert_eq!(opt.lr(), 5e-4);
/// # Ok::<(), tch_cuda_graphs::Error>(())
/// ```
#[derive(Debug)]
pub struct LrHandle {
    tensor: Tensor,
    value: Arc<AtomicU64>,
}

impl Clone for LrHandle {
    fn clone(&self) -> Self {
        LrHandle { tensor: self.tensor.shallow_clone(), value: Arc::clone(&self.value) }
    }
}

impl LrHandle {
    pub(crate) fn new(lr: f64, device: Device) -> Result<Self> {
        check_hparam("lr", lr, lr >= 0.0)?;
        Ok(LrHandle {
            tensor: Tensor::f_full([], lr, (Kind::Float, device))?,
            value: Arc::new(AtomicU64::new(lr.to_bits())),
        })
    }

    /// Sets the rate (fills the device tensor; updates the mirror).
    pub fn set(&self, lr: f64) -> Result<()> {
        check_hparam("lr", lr, lr >= 0.0)?;
        let _ = self.tensor.shallow_clone().f_fill_tensor_(&cpu_f64(lr)?)?;
        self.value.store(lr.to_bits(), Ordering::Relaxed);
        Ok(())
    }

    /// The rate last set from the host (a mirror: a device-side schedule writing the tensor
    /// inside a graph does not update it).
    pub fn get(&self) -> f64 {
        f64::from_bits(self.value.load(Ordering::Relaxed))
    }

    /// The device tensor the fused kernels read.
    pub fn tensor(&self) -> &Tensor {
        &self.tensor
    }
}

pub(crate) fn check_hparam(name: &str, value: f64, ok: bool) -> Result<()> {
    if ok && value.is_finite() {
        Ok(())
    } else {
        Err(Error::Misuse(format!("invalid {name}: {value}")))
    }
}

/// One saved hyper-parameter of a config: its name in checkpoints, how to read it, how to write
/// it. A config lists all of them in one table, so what is saved and what is restored cannot
/// drift apart.
pub(crate) struct HyperField<C: 'static> {
    pub(crate) name: &'static str,
    pub(crate) get: fn(&C) -> f64,
    pub(crate) set: fn(&mut C, f64),
}

/// What the group bookkeeping needs of a config: its learning rate, a validity check, and its
/// other hyper-parameters (saved in checkpoints and restored from them).
pub(crate) trait HyperParams: Clone + 'static {
    /// Every hyper-parameter besides the learning rate that a checkpoint holds.
    const FIELDS: &'static [HyperField<Self>];
    fn lr(&self) -> f64;
    fn validate(&self) -> Result<()>;
    /// The fields' names and values.
    fn named(&self) -> Vec<(&'static str, f64)> {
        Self::FIELDS.iter().map(|f| (f.name, (f.get)(self))).collect()
    }
}

pub(crate) struct GroupState<C> {
    pub(crate) range: Range<usize>,
    pub(crate) lr: LrHandle,
    pub(crate) config: C,
}

/// Parameters of all groups in one flat list (group `g` is `groups[g].range`), their names, and
/// each group's learning rate and config.
pub(crate) struct Groups<C> {
    pub(crate) names: Vec<String>,
    pub(crate) params: Vec<Tensor>,
    pub(crate) groups: Vec<GroupState<C>>,
}

impl<C: std::fmt::Debug> std::fmt::Debug for Groups<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.groups.iter().map(|g| (&self.names[g.range.clone()], g.lr.get(), &g.config)))
            .finish()
    }
}

/// The state names a parameter's field and a group's field get.
pub(crate) fn param_key(name: &str, field: &str) -> String {
    format!("{name}.{field}")
}
fn group_key(g: usize, field: &str) -> String {
    format!("group.{g}.{field}")
}

fn scalar_value(t: &Tensor) -> Result<f64> {
    Ok(f64::try_from(t)?)
}

impl<C: HyperParams> Groups<C> {
    pub(crate) fn build(groups: Vec<ParamGroup<C>>) -> Result<Self> {
        let mut names = Vec::new();
        let mut params: Vec<Tensor> = Vec::new();
        let mut states = Vec::new();
        let device = groups.iter().flat_map(|g| g.params.first()).map(|(_, t)| t.device()).next();
        let device = device.ok_or_else(|| Error::Misuse("optimizer: no trainable parameters".into()))?;
        for group in groups {
            group.config.validate()?;
            let start = params.len();
            for (name, p) in group.params {
                if p.device() != device {
                    return Err(Error::Misuse(format!(
                        "optimizer: parameters live on several devices ({device:?} and {:?} for `{name}`); use one optimizer per device",
                        p.device()
                    )));
                }
                if names.contains(&name) {
                    return Err(Error::Misuse(format!("optimizer: parameter `{name}` is in two groups")));
                }
                names.push(name);
                params.push(p.shallow_clone());
            }
            let lr = LrHandle::new(group.config.lr(), device)?;
            states.push(GroupState { range: start..params.len(), lr, config: group.config });
        }
        if params.is_empty() {
            return Err(Error::Misuse("optimizer: no trainable parameters".into()));
        }
        Ok(Groups { names, params, groups: states })
    }

    /// One group per tch group of `vs`, each with `config`.
    pub(crate) fn from_var_store(vs: &VarStore, config: C) -> Result<Self> {
        Self::build(var_store_groups(vs).into_iter().map(|p| ParamGroup::new(p, config.clone())).collect())
    }

    /// One group of unnamed parameters (`param0`, `param1`, ...).
    pub(crate) fn from_params(params: Vec<Tensor>, config: C) -> Result<Self> {
        let named = params.into_iter().enumerate().map(|(i, t)| (format!("param{i}"), t)).collect();
        Self::build(vec![ParamGroup::new(named, config)])
    }

    pub(crate) fn device(&self) -> Device {
        self.params[0].device()
    }

    pub(crate) fn lr_handles(&self) -> Vec<LrHandle> {
        self.groups.iter().map(|g| g.lr.clone()).collect()
    }

    /// The group part of the state: each parameter's group index and each group's learning
    /// rate and hyper-parameters.
    pub(crate) fn state(&self, out: &mut Vec<(String, Tensor)>) -> Result<()> {
        for (g, group) in self.groups.iter().enumerate() {
            out.push((group_key(g, "lr"), group.lr.tensor().f_detach()?.f_to_kind(Kind::Double)?));
            for (name, v) in group.config.named() {
                out.push((group_key(g, name), cpu_f64(v)?));
            }
            for i in group.range.clone() {
                out.push((param_key(&self.names[i], "group"), cpu_i64(g as i64)?));
            }
        }
        Ok(())
    }

    /// Checks `state` against this layout: no unknown name, every required entry present with
    /// the right shape and dtype, every parameter in the same group. `fields(i)` lists parameter
    /// `i`'s own fields: (field, shape, dtype, required).
    pub(crate) fn check_state(
        &self,
        state: &HashMap<String, Tensor>,
        fields: impl Fn(usize) -> Vec<(&'static str, Vec<i64>, Kind, bool)>,
    ) -> Result<()> {
        let mut expected: HashMap<String, (Vec<i64>, Kind, bool)> = HashMap::new();
        for (g, group) in self.groups.iter().enumerate() {
            expected.insert(group_key(g, "lr"), (vec![], Kind::Double, true));
            for (name, _) in group.config.named() {
                expected.insert(group_key(g, name), (vec![], Kind::Double, true));
            }
            for i in group.range.clone() {
                expected.insert(param_key(&self.names[i], "group"), (vec![], Kind::Int64, true));
                for (field, shape, kind, required) in fields(i) {
                    expected.insert(param_key(&self.names[i], field), (shape, kind, required));
                }
            }
        }
        if let Some(k) = state.keys().find(|k| !expected.contains_key(*k)) {
            return Err(Error::Checkpoint(format!(
                "optimizer state `{k}` does not belong to this optimizer (another model, or another group layout?)"
            )));
        }
        for (k, (shape, kind, required)) in &expected {
            match state.get(k) {
                None if *required => return Err(Error::Checkpoint(format!("optimizer state `{k}` is missing"))),
                None => {}
                Some(t) if t.size() != *shape || t.kind() != *kind => {
                    return Err(Error::Checkpoint(format!(
                        "optimizer state `{k}` is {:?} {:?}, expected {shape:?} {kind:?}",
                        t.size(),
                        t.kind()
                    )))
                }
                Some(_) => {}
            }
        }
        for (g, group) in self.groups.iter().enumerate() {
            let mut config = group.config.clone();
            for f in C::FIELDS {
                (f.set)(&mut config, scalar_value(&state[&group_key(g, f.name)])?);
            }
            config.validate().map_err(|e| Error::Checkpoint(format!("group {g}'s hyper-parameters: {e}")))?;
            for i in group.range.clone() {
                let saved = state[&param_key(&self.names[i], "group")].f_int64_value(&[])?;
                if saved != g as i64 {
                    return Err(Error::Checkpoint(format!(
                        "parameter `{}` was in group {saved}, here it is in group {g}",
                        self.names[i]
                    )));
                }
            }
        }
        Ok(())
    }

    /// Applies the group part of a checked state: learning rates and hyper-parameters.
    pub(crate) fn load_state(&mut self, state: &HashMap<String, Tensor>) -> Result<()> {
        for (g, group) in self.groups.iter_mut().enumerate() {
            group.lr.set(scalar_value(&state[&group_key(g, "lr")])?)?;
            for f in C::FIELDS {
                (f.set)(&mut group.config, scalar_value(&state[&group_key(g, f.name)])?);
            }
        }
        Ok(())
    }
}

/// Copies a saved state tensor into `dst` in place (no autograd), after the checks passed.
pub(crate) fn copy_state(dst: &Tensor, src: &Tensor) -> Result<()> {
    let _no_grad = tch::no_grad_guard();
    dst.shallow_clone().f_copy_(src)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::HyperParams;
    use crate::optim::{AdamConfig, SgdConfig};

    /// Each field's setter writes what its getter reads, and no two fields share a name or a
    /// value slot (distinct values set in turn all read back).
    fn fields_round_trip<C: HyperParams>(mut config: C) {
        let value = |k: usize| 0.125 * (k + 1) as f64;
        for (k, f) in C::FIELDS.iter().enumerate() {
            (f.set)(&mut config, value(k));
        }
        for (k, f) in C::FIELDS.iter().enumerate() {
            assert_eq!((f.get)(&config), value(k), "field {}", f.name);
            assert!(C::FIELDS[..k].iter().all(|g| g.name != f.name), "{} listed twice", f.name);
        }
        assert_eq!(config.named().len(), C::FIELDS.len());
    }

    #[test]
    fn hyper_parameter_fields_round_trip() {
        fields_round_trip(AdamConfig::default());
        fields_round_trip(SgdConfig::default());
    }
}
