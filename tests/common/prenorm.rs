//! The graphed-callables model: `blocks` pre-LayerNorm MLP blocks (LayerNorm, Linear w→4w,
//! GELU, Linear 4w→w, residual) and a Linear head w→w, trained with an MSE loss. Shared by the
//! tests and `benches/graphed.rs`; `benches/torch_graphed.py` builds the same in PyTorch.
#![allow(dead_code)]

use tch::{nn, nn::Module, Tensor};

/// One pre-LayerNorm MLP block: `x + fc2(gelu(fc1(ln(x))))`.
#[derive(Debug)]
pub struct PreLnBlock {
    ln: nn::LayerNorm,
    fc1: nn::Linear,
    fc2: nn::Linear,
}

impl PreLnBlock {
    pub fn new(p: nn::Path, width: i64) -> Self {
        PreLnBlock {
            ln: nn::layer_norm(&p / "ln", vec![width], Default::default()),
            fc1: nn::linear(&p / "fc1", width, 4 * width, Default::default()),
            fc2: nn::linear(&p / "fc2", 4 * width, width, Default::default()),
        }
    }

    /// Its parameters (LayerNorm weight and bias, then each Linear's weight and bias).
    pub fn params(&self) -> Vec<Tensor> {
        let mut ps = Vec::new();
        ps.extend(self.ln.ws.iter().chain(self.ln.bs.iter()).map(Tensor::shallow_clone));
        for l in [&self.fc1, &self.fc2] {
            ps.push(l.ws.shallow_clone());
            ps.extend(l.bs.iter().map(Tensor::shallow_clone));
        }
        ps
    }
}

impl Module for PreLnBlock {
    fn forward(&self, x: &Tensor) -> Tensor {
        x + self.fc2.forward(&self.fc1.forward(&self.ln.forward(x)).gelu("none"))
    }
}

/// The blocks and the head.
#[derive(Debug)]
pub struct PreLnModel {
    pub blocks: Vec<PreLnBlock>,
    pub head: nn::Linear,
}

impl PreLnModel {
    pub fn new(vs: &nn::VarStore, width: i64, blocks: usize) -> Self {
        let root = vs.root();
        PreLnModel {
            blocks: (0..blocks).map(|k| PreLnBlock::new(&root / format!("block{k}"), width)).collect(),
            head: nn::linear(&root / "head", width, width, Default::default()),
        }
    }
}
