//! One call of a step's closure (its state, autocast, weight shadows), and what a capture of it
//! leaves: outputs of their own, a graph put to work in place of an old one.

use crate::amp::Autocast;
use crate::error::{Error, Result};
use crate::graph::CudaGraph;
use crate::shadow::WeightShadows;
use crate::watch::storage_nbytes;
use tch::Tensor;

use super::StepOptions;

/// Whether a step's inputs are on a CUDA device (where autocast runs and shadows are read).
pub(super) fn on_cuda(inputs: &[Tensor]) -> bool {
    inputs.first().is_some_and(|t| t.device().is_cuda())
}

/// The step closure: the state the step lends it, and the static inputs.
pub(super) type StepFn<'a, S> = Box<dyn FnMut(&mut S, &[Tensor]) -> Result<Vec<Tensor>> + 'a>;

/// One call of the step closure with its state, under autocast (cast cache off) if asked.
pub(super) fn call_step<S>(
    step_fn: &mut StepFn<'_, S>,
    state: &mut S,
    options: &StepOptions,
    shadows: Option<&WeightShadows>,
    inputs: &[Tensor],
) -> Result<Vec<Tensor>> {
    let reading = match (options.shadows, shadows) {
        (true, Some(set)) => Some(set.f_read()?),
        (true, None) if on_cuda(inputs) => {
            return Err(Error::Misuse(
                "weight_shadows(true), but the step holds no shadows: call TrainStep::shadow_parameters (or \
                 set_weight_shadows) before the first run"
                    .into(),
            ))
        }
        _ => None,
    };
    let _autocast = options.autocast.map(|dtype| Autocast::new(dtype, false)).transpose()?;
    let outputs = step_fn(state, inputs)?;
    if let (Some(set), Some(_)) = (shadows, &reading) {
        // What the body changed without writing the shadow (an update other than the crate's
        // Adam): copied now, and in a capture on every replay.
        set.f_refresh()?;
    }
    Ok(outputs)
}

/// The outputs of a captured call, each a tensor of its own: an output that views a larger
/// buffer (a 0-d loss that aliases a batch-sized buffer, a slice of an activation) would keep
/// the whole buffer allocated in the pool for as long as the graph lives, and split the pool's
/// segments for the captures after it. Such an output is cloned inside the capture (one small
/// copy per replay) and the buffer goes back to the pool. Outputs that require grad are left as
/// they are (a clone would keep the buffer through its autograd history).
pub(super) fn compact(outputs: Vec<Tensor>) -> Result<Vec<Tensor>> {
    outputs
        .into_iter()
        .map(|t| {
            let bytes = t.numel() * t.kind().elt_size_in_bytes();
            if t.defined() && !t.requires_grad() && storage_nbytes(&t)? > bytes {
                let mut own = t.f_empty_like()?;
                own.f_copy_(&t)?;
                Ok(own)
            } else {
                Ok(t)
            }
        })
        .collect()
}

/// What [`put_to_work`] did with a new capture.
pub(super) enum Installed {
    /// The old graph's executable now runs the new capture's work.
    Updated,
    /// CUDA refused the update: the new graph, instantiated, replaces the old one.
    New(CudaGraph),
}

/// Puts a capture that kept its `cudaGraph_t` to work: updates `old`'s executable from it where
/// CUDA allows ([`CudaGraph::update_from`]), else instantiates it.
pub(super) fn put_to_work(old: Option<&mut CudaGraph>, mut graph: CudaGraph) -> Result<Installed> {
    if let Some(old) = old {
        if old.update_from(&mut graph)? {
            return Ok(Installed::Updated);
        }
    }
    graph.instantiate()?;
    Ok(Installed::New(graph))
}
