//! The weight shadows a step holds, keeps fresh (what is stale, before each run and at the end of
//! its body) and reads
//! ([`super::StepOptions::weight_shadows`]).

use crate::error::{Error, Result};
use crate::optim::Optimizer;
use crate::shadow::WeightShadows;
use tch::Kind;

use super::TrainStep;

impl<'a, O: Optimizer + 'a> TrainStep<'a, O> {
    /// Gives every float32 CUDA parameter of the step's optimizer (its state) a shadow in the
    /// autocast dtype, held by the step and kept fresh (written by the crate's Adam as it updates,
    /// copied where something else changed a parameter): the one call that
    /// [`crate::StepOptions::weight_shadows`] needs. Returns how many parameters got one. Call it before
    /// the first run (a graph captured without the refresh would not read them). After the first
    /// run (an eager warmup) the step keeps only the shadows its layers asked for
    /// ([`crate::StepOptions::weight_shadows`]).
    ///
    /// # Errors
    /// [`Error::Misuse`] without `weight_shadows(true)` and an autocast dtype, after the first
    /// run, or when called twice.
    pub fn shadow_parameters(&mut self) -> Result<usize> {
        let dtype = self.shadow_dtype()?;
        let shadows = WeightShadows::new(self.state.params(), dtype)?;
        self.set_weight_shadows(shadows)
    }
}

impl<S> TrainStep<'_, S> {
    /// Gives the step a set of weight shadows to keep fresh and read
    /// ([`crate::StepOptions::weight_shadows`]); how many parameters it shadows. The step owns it from
    /// now on. [`shadow_parameters`](TrainStep::shadow_parameters) makes the set of a step's
    /// optimizer; this takes any set (a step with no optimizer in its state, or a subset).
    ///
    /// # Errors
    /// [`Error::Misuse`] without `weight_shadows(true)` and an autocast dtype, for a set of
    /// another dtype than autocast's, after the first run (a graph captured without the refresh
    /// would not read them), or when the step holds a set already.
    pub fn set_weight_shadows(&mut self, shadows: WeightShadows) -> Result<usize> {
        let dtype = self.shadow_dtype()?;
        if shadows.dtype() != dtype {
            return Err(Error::Misuse(format!(
                "weight shadows of {:?} for a step under {dtype:?} autocast: make them in the autocast dtype",
                shadows.dtype()
            )));
        }
        if self.runs > 0 || self.shadows.is_some() {
            return Err(Error::Misuse("weight shadows: give a step its set once, before the first run".into()));
        }
        let made = shadows.len();
        self.shadows = Some(shadows);
        Ok(made)
    }

    /// The weight shadows the step holds, if any.
    pub fn weight_shadows(&self) -> Option<&WeightShadows> {
        self.shadows.as_ref()
    }

    /// The autocast dtype, which shadows must have; an error without shadows asked for.
    pub(super) fn shadow_dtype(&self) -> Result<Kind> {
        match (self.options.shadows, self.options.autocast) {
            (true, Some(dtype)) => Ok(dtype),
            _ => Err(Error::Misuse("weight shadows need StepOptions::weight_shadows(true) and autocast".into())),
        }
    }
}
