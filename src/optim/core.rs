//! What [`super::Adam`] and [`super::Sgd`] share: the groups, the per-parameter state by field
//! (names, checkpoints), the launch plan (one fused launch per group and dtype, over the
//! parameters that have a gradient) and the choice of kernels. Each algorithm keeps only its
//! hyper-parameters, its fields and its FFI call.

use super::groups::{copy_state, param_key};
use super::{Groups, HyperParams, KernelPath, Kernels};
use crate::error::{Error, Result};
use crate::sys::kernels::RawKernels;
use std::collections::HashMap;
use tch::{Device, Kind, Tensor};

/// One per-parameter state field (`exp_avg`, `momentum_buffer`, ...): a tensor or none per
/// parameter.
pub(crate) struct Field {
    pub(crate) name: &'static str,
    /// Made by the first step, so a checkpoint may bring it where this optimizer has none yet
    /// (SGD's momentum buffers); other fields exist from the start or never.
    pub(crate) lazy: bool,
    pub(crate) tensors: Vec<Option<Tensor>>,
}

/// One fused launch: parameters of one group and one dtype that have a gradient.
pub(crate) struct Launch {
    pub(crate) group: usize,
    /// Indices into the flat parameter list.
    pub(crate) idx: Vec<usize>,
    /// Their gradients, in the same order.
    pub(crate) grads: Vec<Tensor>,
}

pub(crate) struct Core<C> {
    pub(crate) groups: Groups<C>,
    pub(crate) fields: Vec<Field>,
    kernels: Kernels,
    /// What the launches of the last step ran: (own, PyTorch's).
    last: (usize, usize),
    /// The own Adam kernel's arrival counters (int32 zeros, one per parameter), made with the
    /// optimizer on a CUDA device (never inside a capture).
    arrivals: Option<Tensor>,
}

impl<C: std::fmt::Debug> std::fmt::Debug for Core<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Optimizer").field("groups", &self.groups).field("kernels", &self.kernels).finish()
    }
}

impl<C: HyperParams> Core<C> {
    pub(crate) fn new(groups: Groups<C>) -> Result<Self> {
        let device = groups.device();
        let arrivals = match device {
            Device::Cuda(_) => {
                // Loads the own kernels on the device now, outside any capture (the answer is
                // kept; a step asks again and gets it). Where they cannot load, the steps run
                // PyTorch's kernels: not an error here.
                let _ = crate::kernels::own_kernels_available(device);
                Some(Tensor::f_zeros([groups.params.len() as i64], (Kind::Int, device))?)
            }
            _ => None,
        };
        Ok(Core { groups, fields: Vec::new(), kernels: Kernels::Auto, last: (0, 0), arrivals })
    }

    /// Adds a field made by `make(i)` for each parameter `i` (None: the parameter has none).
    pub(crate) fn add_field(
        &mut self,
        name: &'static str,
        lazy: bool,
        make: impl Fn(&Tensor, &C) -> Result<Option<Tensor>>,
    ) -> Result<()> {
        let mut tensors = Vec::with_capacity(self.groups.params.len());
        for g in &self.groups.groups {
            for i in g.range.clone() {
                tensors.push(make(&self.groups.params[i], &g.config)?);
            }
        }
        self.fields.push(Field { name, lazy, tensors });
        Ok(())
    }

    /// The launches of one step: for each group, its parameters that have a gradient (and are
    /// in `only`, when given: indices into the flat parameter list), by dtype (first-seen order).
    /// `grads`, when given, are the gradients to use instead of the parameters' `.grad` (one per
    /// parameter, flat order).
    pub(crate) fn launches(&self, only: Option<&[usize]>, grads: Option<&[Tensor]>) -> Result<Vec<Launch>> {
        if let Some(g) = grads {
            if g.len() != self.groups.params.len() {
                return Err(Error::Misuse(format!(
                    "optimizer: {} gradients for {} parameters",
                    g.len(),
                    self.groups.params.len()
                )));
            }
        }
        let keep = match only {
            None => None,
            Some(idx) => {
                let mut keep = vec![false; self.groups.params.len()];
                for &i in idx {
                    *keep.get_mut(i).ok_or_else(|| {
                        Error::Misuse(format!(
                            "step_only: no parameter #{i} (the optimizer has {})",
                            self.groups.params.len()
                        ))
                    })? = true;
                }
                Some(keep)
            }
        };
        let mut out = Vec::new();
        for (g, group) in self.groups.groups.iter().enumerate() {
            let mut by_kind: Vec<(Kind, Launch)> = Vec::new();
            for i in group.range.clone() {
                if keep.as_ref().is_some_and(|k| !k[i]) {
                    continue;
                }
                let grad = match grads {
                    Some(g) => g[i].shallow_clone(),
                    None => self.groups.params[i].f_grad()?,
                };
                if !grad.defined() {
                    continue;
                }
                let kind = self.groups.params[i].kind();
                let at = match by_kind.iter().position(|(k, _)| *k == kind) {
                    Some(at) => at,
                    None => {
                        by_kind.push((kind, Launch { group: g, idx: Vec::new(), grads: Vec::new() }));
                        by_kind.len() - 1
                    }
                };
                by_kind[at].1.idx.push(i);
                by_kind[at].1.grads.push(grad);
            }
            out.extend(by_kind.into_iter().map(|(_, l)| l));
        }
        Ok(out)
    }

    /// Handles of the parameters `idx`.
    pub(crate) fn params_at(&self, idx: &[usize]) -> Vec<&Tensor> {
        idx.iter().map(|&i| &self.groups.params[i]).collect()
    }

    /// Handles of field `f` of the parameters `idx`, each of which must have it.
    pub(crate) fn field_at(&self, f: usize, idx: &[usize]) -> Result<Vec<&Tensor>> {
        let field = &self.fields[f];
        idx.iter()
            .map(|&i| {
                field.tensors[i]
                    .as_ref()
                    .ok_or_else(|| Error::Libtorch(format!("optimizer state `{}` missing", field.name)))
            })
            .collect()
    }

    /// The kernels argument of the shim's calls.
    pub(crate) fn kernels_arg(&self) -> RawKernels {
        self.kernels.raw()
    }

    pub(crate) fn arrivals(&self) -> Option<&Tensor> {
        self.arrivals.as_ref()
    }

    pub(crate) fn begin_step(&mut self) {
        self.last = (0, 0);
    }

    pub(crate) fn record(&mut self, ran_own: bool) {
        if ran_own {
            self.last.0 += 1
        } else {
            self.last.1 += 1
        }
    }

    pub(crate) fn kernels(&self) -> Kernels {
        self.kernels
    }

    pub(crate) fn set_kernels(&mut self, kernels: Kernels) -> Result<()> {
        if kernels == Kernels::Own {
            crate::kernels::own_kernels_available(self.groups.device())?;
        }
        self.kernels = kernels;
        Ok(())
    }

    pub(crate) fn last_path(&self) -> Option<KernelPath> {
        KernelPath::of_counts(self.last.0, self.last.1)
    }

    /// The state: the group part, then each parameter's fields that exist.
    pub(crate) fn state(&self) -> Result<Vec<(String, Tensor)>> {
        let mut out = Vec::new();
        self.groups.state(&mut out)?;
        for (i, name) in self.groups.names.iter().enumerate() {
            for f in &self.fields {
                if let Some(t) = &f.tensors[i] {
                    out.push((param_key(name, f.name), t.f_detach()?));
                }
            }
        }
        Ok(out)
    }

    /// Loads a state: every field that exists here must be in it (a captured step cannot go
    /// back); a lazy field that does not exist yet is made from it; all checked first.
    pub(crate) fn load_state(&mut self, state: &HashMap<String, Tensor>) -> Result<()> {
        self.groups.check_state(state, |i| {
            let p = &self.groups.params[i];
            self.fields
                .iter()
                .filter_map(|f| match &f.tensors[i] {
                    Some(t) => Some((f.name, t.size(), t.kind(), true)),
                    None if f.lazy => Some((f.name, p.size(), p.kind(), false)),
                    None => None,
                })
                .collect()
        })?;
        let device = self.groups.device();
        for (i, name) in self.groups.names.iter().enumerate() {
            for f in &mut self.fields {
                match (&f.tensors[i], state.get(&param_key(name, f.name))) {
                    (Some(t), Some(saved)) => copy_state(t, saved)?,
                    // a fresh tensor of our own, on our device (the saved one may be shared)
                    (None, Some(saved)) if f.lazy => {
                        f.tensors[i] = Some(saved.f_detach()?.f_to_device(device)?.copy());
                    }
                    _ => {}
                }
            }
        }
        self.groups.load_state(state)
    }
}
