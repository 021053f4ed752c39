//! The benchmark models, built identically in `torch_reference.py`.

use tch::{nn, nn::Module, Device, Kind, Tensor};

/// Which model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModelKind {
    /// width 256, 3 layers, batch 32
    SmallMlp,
    /// width 1024, 8 layers, batch 256
    MediumMlp,
    /// embedding, self-attention, MLP, layer norm; seq 128, width 256, batch 16
    Transformer,
}

impl ModelKind {
    pub const ALL: [ModelKind; 3] = [ModelKind::SmallMlp, ModelKind::MediumMlp, ModelKind::Transformer];
    pub fn name(self) -> &'static str {
        match self {
            ModelKind::SmallMlp => "mlp_small",
            ModelKind::MediumMlp => "mlp_medium",
            ModelKind::Transformer => "transformer",
        }
    }
}

pub const VOCAB: i64 = 1000;
const HEADS: i64 = 4;

/// A model: forward + loss on (x, y).
pub enum Model {
    Mlp(nn::Sequential),
    Block(Box<Block>),
}

pub struct Block {
    emb: nn::Embedding,
    ln1: nn::LayerNorm,
    qkv: nn::Linear,
    proj: nn::Linear,
    ln2: nn::LayerNorm,
    fc1: nn::Linear,
    fc2: nn::Linear,
    ln_f: nn::LayerNorm,
    head: nn::Linear,
    width: i64,
}

impl Block {
    fn new(p: nn::Path, width: i64) -> Self {
        let ln = |name: &str| nn::layer_norm(&p / name, vec![width], Default::default());
        Block {
            emb: nn::embedding(&p / "emb", VOCAB, width, Default::default()),
            ln1: ln("ln1"),
            qkv: nn::linear(&p / "qkv", width, 3 * width, Default::default()),
            proj: nn::linear(&p / "proj", width, width, Default::default()),
            ln2: ln("ln2"),
            fc1: nn::linear(&p / "fc1", width, 4 * width, Default::default()),
            fc2: nn::linear(&p / "fc2", 4 * width, width, Default::default()),
            ln_f: ln("ln_f"),
            head: nn::linear(&p / "head", width, VOCAB, Default::default()),
            width,
        }
    }

    fn forward(&self, tokens: &Tensor) -> Tensor {
        let (b, t) = tokens.size2().expect("tokens are [batch, seq]");
        let (w, hd) = (self.width, self.width / HEADS);
        let x = self.emb.forward(tokens);
        let qkv = self.qkv.forward(&self.ln1.forward(&x)).view([b, t, 3, HEADS, hd]).permute([2, 0, 3, 1, 4]);
        let (q, k, v) = (qkv.get(0), qkv.get(1), qkv.get(2));
        let att = (q.matmul(&k.transpose(-2, -1)) * (1.0 / (hd as f64).sqrt())).softmax(-1, Kind::Float);
        let y = att.matmul(&v).transpose(1, 2).reshape([b, t, w]);
        let x = x + self.proj.forward(&y);
        let h = self.fc2.forward(&self.fc1.forward(&self.ln2.forward(&x)).gelu("none"));
        let x = x + h;
        self.head.forward(&self.ln_f.forward(&x))
    }
}

impl Model {
    pub fn new(kind: ModelKind, vs: &nn::VarStore) -> Self {
        let p = vs.root();
        match kind {
            ModelKind::SmallMlp => Model::Mlp(mlp(p, 256, 3)),
            ModelKind::MediumMlp => Model::Mlp(mlp(p, 1024, 8)),
            ModelKind::Transformer => Model::Block(Box::new(Block::new(p, 256))),
        }
    }

    pub fn loss(&self, x: &Tensor, y: &Tensor) -> Tensor {
        match self {
            Model::Mlp(m) => m.forward(x).mse_loss(y, tch::Reduction::Mean),
            Model::Block(b) => b.forward(x).view([-1, VOCAB]).cross_entropy_for_logits(&y.view([-1])),
        }
    }
}

fn mlp(p: nn::Path, width: i64, layers: usize) -> nn::Sequential {
    let mut s = nn::seq();
    for i in 0..layers {
        s = s.add(nn::linear(&p / format!("l{i}"), width, width, Default::default()));
        if i + 1 < layers {
            s = s.add_fn(|x| x.relu());
        }
    }
    s
}

/// A batch for `kind` on `device`.
pub fn batch(kind: ModelKind, device: Device) -> (Tensor, Tensor) {
    match kind {
        ModelKind::SmallMlp => {
            (Tensor::randn([32, 256], (Kind::Float, device)), Tensor::randn([32, 256], (Kind::Float, device)))
        }
        ModelKind::MediumMlp => {
            (Tensor::randn([256, 1024], (Kind::Float, device)), Tensor::randn([256, 1024], (Kind::Float, device)))
        }
        ModelKind::Transformer => (
            Tensor::randint(VOCAB, [16, 128], (Kind::Int64, device)),
            Tensor::randint(VOCAB, [16, 128], (Kind::Int64, device)),
        ),
    }
}
