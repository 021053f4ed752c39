//! The step's shape cache: one entry (static inputs, outputs, graph) per batch shape, found by
//! shape, bounded by [`super::StepOptions::max_graphs`] with least-recently-used eviction, and
//! the declared shapes captured largest first.

use crate::error::{Error, Result};
use crate::feed::Stager;
use crate::graph::CudaGraph;
use crate::watch::TensorWatch;
use tch::Tensor;

use super::TrainStep;

/// The static inputs, outputs and graph of one batch shape.
pub(super) struct ShapeEntry {
    pub(super) shape: Vec<Vec<i64>>,
    pub(super) inputs: Vec<Tensor>,
    pub(super) outputs: Vec<Tensor>,
    pub(super) graph: Option<CudaGraph>,
    /// Eager (warmup) steps run for this shape so far.
    pub(super) warmed: usize,
    pub(super) last_used: u64,
    /// The static inputs' storage.
    pub(super) watch: TensorWatch,
    /// Made by the first CPU batch of this shape.
    pub(super) stager: Option<Stager>,
    /// Declared up front ([`TrainStep::declare_shapes`]): captured only after every larger
    /// declared shape already seen, and never dropped while it waits.
    pub(super) declared: bool,
}

impl ShapeEntry {
    /// Elements of all static inputs: the order declared shapes are captured in (largest first).
    pub(super) fn numel(&self) -> i64 {
        self.shape.iter().map(|s| s.iter().product::<i64>()).sum()
    }
}
impl<S> TrainStep<'_, S> {
    /// The entry of `shape`, made if new; past the bound on shapes still warming up, the least
    /// recently used of those goes first (see [`crate::StepOptions::max_graphs`]).
    pub(super) fn entry_for(&mut self, shape: Vec<Vec<i64>>) -> Result<usize> {
        if let Some(i) = self.shapes.iter().position(|e| e.shape == shape) {
            return Ok(i);
        }
        let warming = self.shapes.iter().filter(|e| e.graph.is_none() && !e.declared).count();
        if warming >= self.options.max_graphs {
            if let Some(j) = self.lru(false) {
                self.evict(j, 0);
            }
        }
        self.push_entry(shape, None)
    }

    /// The least recently used entry with (`captured`) or without a graph; declared shapes
    /// waiting for their capture are never chosen.
    pub(super) fn lru(&self, captured: bool) -> Option<usize> {
        let candidate = |e: &ShapeEntry| e.graph.is_some() == captured && (captured || !e.declared);
        self.shapes.iter().enumerate().filter(|(_, e)| candidate(e)).min_by_key(|(_, e)| e.last_used).map(|(j, _)| j)
    }

    /// Drops entry `j` (its graph, static inputs, outputs, staging buffers); returns where the
    /// entry at index `i` is now.
    pub(super) fn evict(&mut self, j: usize, i: usize) -> usize {
        let entry = self.shapes.remove(j);
        if let Some(graph) = entry.graph {
            self.spare = Some(graph); // its executable serves the next capture (capture_entry)
        }
        if self.current > j {
            self.current -= 1;
        } else if self.current == j {
            self.current = 0; // its outputs are gone; the next run sets it
        }
        if i > j {
            i - 1
        } else {
            i
        }
    }

    pub(super) fn push_entry(&mut self, shape: Vec<Vec<i64>>, inputs: Option<Vec<Tensor>>) -> Result<usize> {
        let inputs = match inputs {
            Some(t) => t,
            None => shape
                .iter()
                .zip(&self.kinds)
                .map(|(s, &k)| Ok(Tensor::f_empty(s.as_slice(), (k, self.device))?))
                .collect::<Result<Vec<_>>>()?,
        };
        let mut watch = TensorWatch::new()?;
        watch.add(self.names.iter().map(|n| format!("static input `{n}`")), &inputs)?;
        let declared = self.declared.contains(&shape);
        self.shapes.push(ShapeEntry {
            shape,
            inputs,
            outputs: Vec::new(),
            graph: None,
            warmed: 0,
            last_used: 0,
            watch,
            stager: None,
            declared,
        });
        Ok(self.shapes.len() - 1)
    }

    /// Whether declared entry `i` must wait (run eagerly) for a larger declared shape that has
    /// been seen (warmed up at least once) but not captured yet.
    pub(super) fn waits_for_larger(&self, i: usize) -> bool {
        let e = &self.shapes[i];
        e.declared
            && self.shapes.iter().any(|o| o.declared && o.graph.is_none() && o.warmed > 0 && o.numel() > e.numel())
    }

    /// Declares batch shapes the step will see (each: one shape per static input), so that
    /// their graphs are captured largest first into the step's pool: later captures then fit
    /// into the memory earlier ones freed (see `docs/train-step.md`, "Several shapes, one pool"). Use it
    /// where the shapes are known: the buckets of [`crate::Buckets`], an epoch's ragged last
    /// batch.
    ///
    /// Every shape still gets its own eager warmup (its first [`crate::StepOptions::warmup`] batches)
    /// before its capture, as in PyTorch, and its static inputs are made when it first comes:
    /// declaring changes the order of captures and nothing else. A declared shape that is
    /// warmed up while a larger declared shape that has already come has no graph yet keeps
    /// running eagerly (real steps, just not graphed) until that one is captured; a larger shape
    /// that has not come yet is not waited for. So declare shapes that recur: one that comes
    /// once and never again keeps the smaller ones eager. Declared shapes are never dropped
    /// while they wait; once captured they are evicted like any other graph. At most [`crate::StepOptions::max_graphs`] shapes may be
    /// declared ([`Error::Misuse`] otherwise, and for a shape whose count or ranks do not match
    /// the static inputs). Eager steps only check the shapes.
    ///
    /// ```no_run
    /// # fn main() -> tch_cuda_graphs::Result<()> {
    /// # use tch::{Device, Kind, Tensor};
    /// # use tch_cuda_graphs::{StepOptions, TrainStep};
    /// # let x = Tensor::zeros([64, 32], (Kind::Float, Device::Cuda(0)));
    /// # let y = Tensor::zeros([64, 4], (Kind::Float, Device::Cuda(0)));
    /// let mut step = TrainStep::new(&[("x", &x), ("y", &y)], StepOptions::default(), |_| Ok(vec![]))?;
    /// // sequences padded to buckets of 128, 256 and 512 tokens, batches of 16
    /// step.declare_shapes(&[vec![vec![16, 512], vec![16, 512]], vec![vec![16, 256], vec![16, 256]], vec![vec![16, 128], vec![16, 128]]])?;
    /// # Ok(()) }
    /// ```
    pub fn declare_shapes(&mut self, shapes: &[Vec<Vec<i64>>]) -> Result<()> {
        for shape in shapes {
            let ranks_ok = shape.len() == self.names.len() && shape.iter().zip(&self.ranks).all(|(s, &r)| s.len() == r);
            if !ranks_ok || shape.iter().flatten().any(|&d| d < 0) {
                return Err(Error::Misuse(format!(
                    "declared shape {shape:?} does not fit the static inputs ({} of ranks {:?})",
                    self.names.join(", "),
                    self.ranks
                )));
            }
        }
        let mut all = self.declared.clone();
        for shape in shapes {
            if !all.contains(shape) {
                all.push(shape.clone());
            }
        }
        if all.len() > self.options.max_graphs {
            return Err(Error::Misuse(format!(
                "{} shapes declared, but the step keeps at most {} graphs (StepOptions::max_graphs)",
                all.len(),
                self.options.max_graphs
            )));
        }
        for entry in self.shapes.iter_mut() {
            entry.declared |= all.contains(&entry.shape);
        }
        self.declared = all; // entries made later for these shapes are marked when made
        Ok(())
    }

    /// [`declare_shapes`](Self::declare_shapes) for batches that differ in their first
    /// dimension only: each size replaces the first dimension of every static input's shape as
    /// given to [`new`](Self::new).
    pub fn declare_batch_sizes(&mut self, sizes: &[i64]) -> Result<()> {
        let first = self.shapes.first().map(|e| e.shape.clone()).unwrap_or_default();
        if first.iter().any(|s| s.is_empty()) {
            return Err(Error::Misuse("declare_batch_sizes: a static input has rank 0 (no batch dimension)".into()));
        }
        let shapes: Vec<Vec<Vec<i64>>> = sizes
            .iter()
            .map(|&n| first.iter().map(|s| std::iter::once(n).chain(s[1..].iter().copied()).collect()).collect())
            .collect();
        self.declare_shapes(&shapes)
    }

    /// How many graphs the step holds now (one per captured shape).
    pub fn graph_count(&self) -> usize {
        self.shapes.iter().filter(|e| e.graph.is_some()).count()
    }

    /// The batch shapes the step holds static inputs for, most recently used last.
    pub fn shapes(&self) -> Vec<Vec<Vec<i64>>> {
        let mut v: Vec<&ShapeEntry> = self.shapes.iter().collect();
        v.sort_by_key(|e| e.last_used);
        v.into_iter().map(|e| e.shape.clone()).collect()
    }
}
