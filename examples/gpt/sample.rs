//! Text sampled from the model by a decode step of static shapes: a context of `block` tokens
//! on the device and a device-side position, so every step has the same shapes and, on a GPU,
//! runs as one replay of a captured graph (no host sync until the text is read). The logits at
//! the position depend only on the tokens up to it (causal attention), so what lies after it
//! does not matter; once the context is full it shifts left by one token per step. Tokens are
//! drawn at a temperature by the Gumbel-max trick (the argmax of the logits plus Gumbel noise),
//! which samples the softmax's distribution with device ops only.
#![allow(dead_code)]

use crate::lm::LanguageModel;
use tch::{Device, Kind, Tensor};
use tch_cuda_graphs::{capture_with_warmup, CaptureOptions, Result};

/// The decoder's state, all on the model's device.
pub struct Decoder {
    /// `[1, block]` tokens; the valid ones end at `pos`.
    ctx: Tensor,
    /// 0-d: the position of the last token.
    pos: Tensor,
    /// `[n]`: the tokens drawn so far, and 0-d: how many.
    out: Tensor,
    count: Tensor,
    temperature: f64,
}

impl Decoder {
    /// A decoder for `n` tokens after the token `first`.
    pub fn new(model: &dyn LanguageModel, device: Device, first: i64, n: i64, temperature: f64) -> Result<Decoder> {
        let block = model.block();
        let ctx = Tensor::f_zeros([1, block], (Kind::Int64, device))?.f_fill_(first)?;
        let zero = || Tensor::f_zeros([], (Kind::Int64, device));
        let out = Tensor::f_zeros([n.max(1)], (Kind::Int64, device))?;
        Ok(Decoder { ctx, pos: zero()?, out, count: zero()?, temperature })
    }

    /// One token: drawn from the logits at `pos`, written after it (the context shifted left
    /// when full), `pos` moved on, the token appended to the output. Device ops only.
    pub fn step(&mut self, model: &dyn LanguageModel) -> Result<()> {
        let _no_grad = tch::no_grad_guard();
        let block = model.block();
        let logits = model.logits(&self.ctx)?; // [1, block, vocab]
        let at = logits.f_index_select(1, &self.pos.f_view([1])?)?.f_view([-1])?.f_to_kind(Kind::Float)?;
        let u = at.f_rand_like()?.f_clamp_min(1e-20)?;
        let gumbel = u.f_log()?.f_neg()?.f_log()?.f_neg()?;
        let next = at.f_div_scalar(self.temperature)?.f_add(&gumbel)?.f_argmax(0, true)?; // [1]
                                                                                          // full: everything moves one place left and the new token goes last
        let full = self.pos.f_eq(block - 1)?;
        let shifted = self.ctx.f_roll([-1], [1])?;
        let ctx = shifted.f_where_self(&full, &self.ctx)?;
        self.ctx.f_copy_(&ctx)?;
        let at = self.pos.f_add_scalar(1)?.f_clamp_max(block - 1)?;
        let _ = self.ctx.f_index_copy_(1, &at.f_view([1])?, &next.f_view([1, 1])?)?;
        self.pos.f_copy_(&at)?;
        let _ = self.out.f_index_copy_(0, &self.count.f_view([1])?, &next)?;
        let _ = self.count.f_add_scalar_(1)?;
        Ok(())
    }

    /// The tokens drawn so far (one host read).
    pub fn tokens(&self) -> Result<Vec<i64>> {
        let n = i64::try_from(&self.count)?;
        Ok(Vec::<i64>::try_from(&self.out.f_narrow(0, 0, n.min(self.out.size()[0]))?.f_to_device(Device::Cpu)?)?)
    }
}

/// `n` tokens after `first`, with the decode step run eagerly, or (`captured`, on a GPU) once
/// eagerly, captured, and replayed for the rest.
pub fn sample(model: &dyn LanguageModel, device: Device, first: i64, n: i64, captured: bool) -> Result<Vec<i64>> {
    model.set_train(false);
    let mut dec = Decoder::new(model, device, first, n, 0.8)?;
    let result = if captured && n > 1 {
        let options = CaptureOptions::default().device(device);
        // the warmup run is a real step (the first token); the captured one runs at each replay
        let (mut graph, ()) = capture_with_warmup(1, options, || dec.step(model))?;
        (1..n).try_for_each(|_| graph.replay())
    } else {
        (0..n).try_for_each(|_| dec.step(model))
    };
    model.set_train(true);
    result?;
    dec.tokens()
}
