//! A batch against the step's static inputs: checked (count, dtype, rank, device) and copied in,
//! from the GPU or from the CPU (pinned buffers and the copy stream).

use crate::error::{Error, Result};
use crate::feed::{copy_non_blocking, is_pinned, Stager};
use tch::{Device, Tensor};

use super::TrainStep;

impl<S> TrainStep<'_, S> {
    /// Validates a batch without copying it.
    pub fn check_batch(&self, batch: &[&Tensor]) -> Result<()> {
        self.batch_shape(batch).map(drop)
    }

    pub(super) fn batch_shape(&self, batch: &[&Tensor]) -> Result<Vec<Vec<i64>>> {
        if batch.len() != self.names.len() {
            return Err(Error::Misuse(format!(
                "the step has {} static inputs ({}), got {} tensors",
                self.names.len(),
                self.names.join(", "),
                batch.len()
            )));
        }
        let mut shape = Vec::with_capacity(batch.len());
        for (index, b) in batch.iter().enumerate() {
            let device_ok = b.device() == self.device || (self.device != Device::Cpu && b.device() == Device::Cpu);
            let size = b.size();
            if b.kind() != self.kinds[index] || !device_ok || size.len() != self.ranks[index] {
                return Err(Error::InputMismatch {
                    name: self.names[index].clone(),
                    index,
                    expected: format!(
                        "rank {} {:?} on {:?}{}",
                        self.ranks[index],
                        self.kinds[index],
                        self.device,
                        if self.device == Device::Cpu { "" } else { " or the CPU" }
                    ),
                    got: describe(b),
                });
            }
            shape.push(size);
        }
        Ok(shape)
    }

    /// Copies `batch` into entry `i`'s static inputs.
    pub(super) fn fill(&mut self, i: usize, batch: &[&Tensor]) -> Result<()> {
        let entry = &mut self.shapes[i];
        let from_cpu = self.device != Device::Cpu && batch.iter().all(|b| b.device() == Device::Cpu);
        if self.graphed && from_cpu && self.options.copy_stream {
            let stager = match &mut entry.stager {
                Some(s) => s,
                none => none.insert(Stager::new(self.device, &entry.inputs)?),
            };
            return stager.feed(&mut entry.inputs, batch);
        }
        for (dst, src) in entry.inputs.iter_mut().zip(batch) {
            if src.device() != Device::Cpu || is_pinned(src) {
                copy_non_blocking(dst, src)?; // queued on the current stream
            } else {
                dst.f_copy_(src)?; // pageable memory: CUDA copies synchronously
            }
        }
        Ok(())
    }
}

fn describe(t: &Tensor) -> String {
    format!("shape {:?} {:?} on {:?}", t.size(), t.kind(), t.device())
}
