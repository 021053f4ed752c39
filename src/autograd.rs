//! Gradients of outputs with respect to inputs without touching `.grad`: [`grad`], libtorch's
//! `torch::autograd::grad` (PyTorch's `torch.autograd.grad`), with what tch's
//! `Tensor::run_backward` lacks: explicit output gradients and unused inputs.

use crate::error::Result;
use crate::sys::autograd as sys;
use tch::Tensor;

/// The gradients of `outputs` with respect to `inputs` (`torch.autograd.grad(outputs, inputs,
/// grad_outputs, retain_graph, allow_unused=allow_unused)`), one per input. The `.grad` fields
/// are not touched. `grad_outputs`: one gradient per output, like each output; `None` means
/// ones, which libtorch allows for scalar outputs only. With `allow_unused`, an input the
/// outputs do not depend on gets `None`; without it that is an error. No double backward
/// (`create_graph` is false). Works on the CPU and on CUDA, and inside a capture.
///
/// ```
/// # fn main() -> tch_cuda_graphs::Result<()> {
/// use tch::{Kind, Tensor};
/// let x = Tensor::from_slice(&[1.0f32, 2.0, 3.0]).set_requires_grad(true);
/// let y = (&x * &x).sum(Kind::Float);
/// let g = tch_cuda_graphs::autograd::grad(&[y], &[x.shallow_clone()], None, false, false)?;
/// let g = g[0].as_ref().expect("x was used");
/// assert_eq!(Vec::<f32>::try_from(g).unwrap(), vec![2.0, 4.0, 6.0]); // d(x·x)/dx = 2x
/// assert!(x.grad().defined() == false); // .grad untouched
/// # Ok(()) }
/// ```
pub fn grad(
    outputs: &[Tensor],
    inputs: &[Tensor],
    grad_outputs: Option<&[Tensor]>,
    retain_graph: bool,
    allow_unused: bool,
) -> Result<Vec<Option<Tensor>>> {
    let (outputs, inputs): (Vec<&Tensor>, Vec<&Tensor>) = (outputs.iter().collect(), inputs.iter().collect());
    sys::grad(&outputs, &inputs, grad_outputs, retain_graph, allow_unused)
}
