//! Stale graphs: the tensors a step watches (their storage checked before every run) and the
//! recapture that accepts their new storage.

use crate::error::Result;
use tch::{nn::VarStore, Tensor};

use super::record::{put_to_work, Installed};
use super::{Recaptured, TrainStep};

impl<'a, S: 'a> TrainStep<'a, S> {
    /// Captures every graph of the step again, on what its tensors are now, after a watched
    /// tensor's storage was replaced (a parameter's `set_data`, a reloaded buffer: the runs that
    /// returned [`crate::Error::StaleGraph`]), and accepts the new storage from here on. Each new
    /// capture updates the old graph's executable in place where CUDA allows it
    /// ([`crate::CudaGraph::update_from`]: the same kernels on other addresses), which costs less
    /// than instantiating; otherwise the new graph replaces the old one. Nothing trains: like a
    /// capture, it only records. The replaced tensors must keep their shapes and dtypes (the
    /// optimizer's state was made for them). Shapes without a graph yet (still warming up)
    /// and the eager fallback only accept the new storage.
    ///
    /// ```no_run
    /// # fn main() -> tch_cuda_graphs::Result<()> {
    /// # use tch::{nn, Device, Kind, Tensor};
    /// # use tch_cuda_graphs::{Error, StepOptions, TrainStep};
    /// # let vs = nn::VarStore::new(Device::Cuda(0));
    /// # let x = Tensor::zeros([1], (Kind::Float, Device::Cuda(0)));
    /// # let mut step = TrainStep::new(&[("x", &x)], StepOptions::default(), |_| Ok(vec![]))?;
    /// match step.run(&[&x]) {
    ///     Err(Error::StaleGraph { .. }) => {
    ///         let r = step.recapture()?;
    ///         println!("{} graphs updated in place, {} replaced", r.updated, r.replaced);
    ///         step.run(&[&x])?;
    ///     }
    ///     other => drop(other?),
    /// }
    /// # Ok(()) }
    /// ```
    pub fn recapture(&mut self) -> Result<Recaptured> {
        let mut report = Recaptured::default();
        if self.graphed {
            for j in 0..self.shapes.len() {
                if self.shapes[j].graph.is_none() {
                    continue;
                }
                let (graph, outputs) = self.record_entry(j, true)?;
                let entry = &mut self.shapes[j];
                match put_to_work(entry.graph.as_mut(), graph)? {
                    Installed::Updated => {
                        report.updated += 1;
                        self.updates += 1;
                    }
                    Installed::New(graph) => {
                        entry.graph = Some(graph);
                        report.replaced += 1;
                    }
                }
                entry.outputs = outputs;
            }
        }
        self.watch.refresh()?;
        for entry in &mut self.shapes {
            entry.watch.refresh()?;
        }
        Ok(report)
    }

    /// Keeps `tensors` alive as long as the step and checks before every run that each still
    /// has the storage, dtype and shape it has now (see "Stale graphs" above). Call it right
    /// after [`new`](Self::new), with tensors the step uses.
    pub fn watch<'t>(&mut self, tensors: impl IntoIterator<Item = (&'t str, &'t Tensor)>) -> Result<()> {
        let (names, tensors): (Vec<String>, Vec<&Tensor>) =
            tensors.into_iter().map(|(n, t)| (format!("tensor `{n}`"), t)).unzip();
        self.watch.add(names, tensors)
    }

    /// [`watch`](Self::watch) every variable of `vs` (the model's parameters and buffers), named
    /// as in the VarStore.
    ///
    /// ```no_run
    /// # fn main() -> tch_cuda_graphs::Result<()> {
    /// # use tch::{nn, Device, Kind, Tensor};
    /// # use tch_cuda_graphs::{StepOptions, TrainStep};
    /// # let vs = nn::VarStore::new(Device::Cuda(0));
    /// # let x = Tensor::zeros([1], (Kind::Float, Device::Cuda(0)));
    /// let mut step = TrainStep::new(&[("x", &x)], StepOptions::default(), |_| Ok(vec![]))?;
    /// step.watch_vars(&vs)?;
    /// # Ok(()) }
    /// ```
    pub fn watch_vars(&mut self, vs: &VarStore) -> Result<()> {
        let mut vars: Vec<(String, Tensor)> = vs.variables().into_iter().collect();
        vars.sort_by(|a, b| a.0.cmp(&b.0));
        let names = vars.iter().map(|(n, _)| format!("parameter `{n}`"));
        self.watch.add(names, vars.iter().map(|(_, t)| t))
    }
}
