//! `captured.rs` on the crate's layers: its norms and linear layers swapped by their imports,
//! each block's residual adds carried by a `ResidualStream` into the next norm's kernel, the
//! fused cross-entropy, bf16 autocast and weight shadows of the optimizer's parameters
//! (`docs/adopting.md` shows the diff).
//!
//!     cargo run --release --example from_tch_fused -- [TEXT_FILE] [ITERATIONS]
use std::time::Instant;
use tch::nn;
use tch::{Device, Kind, Tensor};
use tch_cuda_graphs::linear::{self, linear, Linear};
use tch_cuda_graphs::norm::{layer_norm, LayerNorm};
use tch_cuda_graphs::optim::{Adam, AdamConfig, Optimizer};
use tch_cuda_graphs::{loss::cross_entropy, transformer::ResidualStream, StepOptions, TrainStep};

const VOCAB: i64 = 96; // newline and printable ASCII
const BLOCK: i64 = 256;
const BATCH: i64 = 64;
const EMBD: i64 = 384;
const HEADS: i64 = 6;
const LAYERS: i64 = 6;
const DROPOUT: f64 = 0.2;

struct Block {
    ln_1: LayerNorm,
    c_attn: Linear,
    attn_proj: Linear,
    ln_2: LayerNorm,
    c_fc: Linear,
    mlp_proj: Linear,
}

impl Block {
    fn new(p: nn::Path) -> Block {
        Block {
            ln_1: layer_norm(&p / "ln_1", vec![EMBD], Default::default()),
            c_attn: linear(&p / "c_attn", EMBD, 3 * EMBD, Default::default()),
            attn_proj: linear(&p / "attn_proj", EMBD, EMBD, Default::default()),
            ln_2: layer_norm(&p / "ln_2", vec![EMBD], Default::default()),
            c_fc: linear(&p / "c_fc", EMBD, 4 * EMBD, Default::default()),
            mlp_proj: linear(&p / "mlp_proj", 4 * EMBD, EMBD, Default::default()),
        }
    }

    fn attention(&self, h: &Tensor, train: bool) -> Tensor {
        let (b, t, _) = h.size3().unwrap();
        let qkv = h.apply(&self.c_attn).split(EMBD, 2);
        let heads = |x: &Tensor| x.view([b, t, HEADS, EMBD / HEADS]).transpose(1, 2);
        let p = if train { DROPOUT } else { 0.0 };
        let (q, k, v) = (heads(&qkv[0]), heads(&qkv[1]), heads(&qkv[2]));
        let y = Tensor::scaled_dot_product_attention::<Tensor>(&q, &k, &v, None, p, true, None, false);
        y.transpose(1, 2).contiguous().view([b, t, EMBD]).apply(&self.attn_proj)
    }

    fn mlp(&self, h: &Tensor) -> Tensor {
        h.apply(&self.c_fc).gelu("none").apply(&self.mlp_proj)
    }

    fn forward_t(&self, x: &mut ResidualStream, train: bool) {
        x.residual(&self.ln_1, DROPOUT, train, |h| self.attention(h, train));
        x.residual(&self.ln_2, DROPOUT, train, |h| self.mlp(h));
    }
}

struct Gpt {
    wte: nn::Embedding,
    wpe: nn::Embedding,
    blocks: Vec<Block>,
    ln_f: LayerNorm,
}

impl Gpt {
    fn new(p: &nn::Path) -> Gpt {
        Gpt {
            wte: nn::embedding(p / "wte", VOCAB, EMBD, Default::default()),
            wpe: nn::embedding(p / "wpe", BLOCK, EMBD, Default::default()),
            blocks: (0..LAYERS).map(|i| Block::new(p / "h" / i)).collect(),
            ln_f: layer_norm(p / "ln_f", vec![EMBD], Default::default()),
        }
    }

    /// The mean cross-entropy of the next characters; dropout when `train`.
    fn loss(&self, idx: &Tensor, targets: &Tensor, train: bool) -> Tensor {
        let pos = Tensor::arange(BLOCK, (Kind::Int64, idx.device()));
        let mut x = ResidualStream::with_positions(idx.apply(&self.wte), pos.apply(&self.wpe), DROPOUT, train);
        for block in &self.blocks {
            block.forward_t(&mut x, train);
        }
        let logits = linear::apply(&x.norm(&self.ln_f), &self.wte.ws, None, &Default::default()); // tied to the embedding
        cross_entropy(&logits.view([-1, VOCAB]), &targets.view([-1]), &Default::default())
    }
}

/// BATCH random windows of the text and the characters that follow them.
fn batch(data: &Tensor) -> (Tensor, Tensor) {
    let start = Tensor::randint(data.size()[0] - BLOCK - 1, [BATCH, 1], (Kind::Int64, data.device()));
    let at = (start + Tensor::arange(BLOCK, (Kind::Int64, data.device()))).view([-1]);
    let x = data.index_select(0, &at).view([BATCH, BLOCK]);
    (x, data.index_select(0, &(at + 1)).view([BATCH, BLOCK]))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let text = std::fs::read(args.get(1).map_or("README.md", String::as_str))?;
    let iters: usize = args.get(2).map_or(Ok(300), |n| n.parse())?;
    let token = |c: &u8| match *c {
        b'\n' => Some(0),
        32..=126 => Some(*c as i64 - 31),
        _ => None,
    };
    let chars: Vec<i64> = text.iter().filter_map(token).collect();
    let device = Device::cuda_if_available();
    let data = Tensor::from_slice(&chars).to_device(device);
    let vs = nn::VarStore::new(device);
    let model = Gpt::new(&vs.root());
    let opt = Adam::new(&vs, AdamConfig::from(nn::AdamW::default()).lr(1e-3))?;
    let (x, y) = batch(&data);
    let options = StepOptions::default().autocast(Kind::BFloat16).weight_shadows(true);
    let mut step = TrainStep::with_optimizer(opt, &[("x", &x), ("y", &y)], options, |opt, inp| {
        let loss = model.loss(&inp[0], &inp[1], true);
        opt.backward_step(&loss)?; // tch's backward_step, capturable
        Ok(vec![loss.detach()])
    })?;
    let mut start = Instant::now();
    for i in 0..iters {
        let (x, y) = batch(&data);
        let loss = &step.run(&[&x, &y])?[0];
        if i == 10 || i % 100 == 0 || i == iters - 1 {
            println!("iteration {i}: loss {:.4}", loss.double_value(&[])); // waits for the GPU
        }
        if i == 10 {
            start = Instant::now();
        }
    }
    let per_iter = start.elapsed().as_secs_f64() / (iters - 11) as f64;
    let (x, y) = batch(&data);
    let eval = tch::no_grad(|| model.loss(&x, &y, false));
    println!("{:.2} ms/iter after the first 10; evaluation loss {:.4}", per_iter * 1e3, eval.double_value(&[]));
    Ok(())
}
