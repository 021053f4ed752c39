//! Rotary position embeddings (RoPE) on the crate's kernel: [`Rotary`] rotates q and k in one
//! launch forward and one backward.
//!
//! Written as PyTorch models write it, rotary embeddings are slices, casts to float32, four
//! multiplies, two adds and a stack per tensor, each its own kernel, forward and backward. The
//! crate's kernel reads q and k once (any strides with a contiguous last dimension, e.g. the
//! views of a fused projection), rotates each pair in fp32 and writes both in their dtype; the
//! backward is the same kernel with the rotation transposed. In float32 it equals the
//! element-wise composition on the same tables bit for bit (each product and sum rounded once,
//! no fused multiply-add); in bf16 it rounds once where the composition in bf16 rounds at each
//! step. ATen's composition (float32 math) runs where the kernel does not apply: on a CPU, a
//! head dimension that is not a multiple of 8, or under [`Kernels::PyTorch`].
//!
//! Both layouts: [`RotaryLayout::Interleaved`] pairs (2i, 2i+1), as Meta's Llama;
//! [`RotaryLayout::HalfSplit`] pairs (i, i + D/2), as GPT-NeoX and Hugging Face's Llama. The
//! tables are PyTorch's: `inv_freq = 1 / base^(arange(0, D, 2) / D)`, `cos`, `sin` of
//! `outer(arange(positions), inv_freq)`, float32, computed on the device.
//!
//! ```
//! # fn main() -> tch_cuda_graphs::Result<()> {
//! use tch::{Device, Kind, Tensor};
//! use tch_cuda_graphs::rotary::{Rotary, RotaryConfig};
//! let rope = Rotary::f_new(64, 1024, Device::Cpu, RotaryConfig::default())?;
//! let q = Tensor::randn([2, 16, 8, 64], (Kind::Float, Device::Cpu)); // [batch, seq, heads, dim]
//! let k = Tensor::randn([2, 16, 2, 64], (Kind::Float, Device::Cpu)); // fewer KV heads
//! let (q, k) = rope.f_forward(&q, &k, 0)?;
//! assert_eq!(q.size(), [2, 16, 8, 64]);
//! // decoding: one token at position 16
//! let (q1, _) = rope.f_forward(&q.narrow(1, 0, 1), &k.narrow(1, 0, 1), 16)?;
//! # let _ = q1;
//! # Ok(()) }
//! ```

use crate::error::{Error, Result};
use crate::kernels::{KernelPath, Kernels};
use crate::linear::Linear;
use crate::sys::rotary::{self as raw, RawRotaryLayout};
use std::cell::Cell;
use tch::{Device, Kind, Tensor};

/// Which elements of a head form the pairs that rotate together.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum RotaryLayout {
    /// (2i, 2i+1): Meta's Llama (`view_as_complex` of the last dimension in pairs).
    #[default]
    Interleaved,
    /// (i, i + D/2): GPT-NeoX and Hugging Face's Llama (`rotate_half`).
    HalfSplit,
}

/// How [`Rotary`] is made and runs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RotaryConfig {
    /// The frequencies' base θ (default 10,000; Llama 3 uses 500,000).
    pub base: f64,
    /// Which elements pair up (default [`RotaryLayout::Interleaved`]).
    pub layout: RotaryLayout,
    /// The crate's kernel where it applies ([`Kernels::Auto`], the default), ATen's composition
    /// ([`Kernels::PyTorch`]), or the kernel only ([`Kernels::Own`]).
    pub kernels: Kernels,
}

impl Default for RotaryConfig {
    fn default() -> Self {
        RotaryConfig { base: 10_000.0, layout: RotaryLayout::default(), kernels: Kernels::Auto }
    }
}

/// Rotary embeddings for heads of one dimension, up to a number of positions: the cos and sin
/// tables, and the rotation of q and k.
#[derive(Debug)]
pub struct Rotary {
    cos: Tensor,
    sin: Tensor,
    /// The tables with each row's angles in the order the projection's GEMM holds the pairs
    /// ([`f_project_qkv`](Self::f_project_qkv)); on a CUDA device, for a head dimension that is a
    /// multiple of 8.
    gemm_tables: Option<(Tensor, Tensor)>,
    config: RotaryConfig,
    last: Cell<Option<KernelPath>>,
}

impl Rotary {
    /// The tables for heads of `head_dim` (even) and positions `0..max_positions`, on `device`.
    /// [`Error::Misuse`] for an odd head dimension or no positions.
    pub fn f_new(head_dim: i64, max_positions: i64, device: Device, config: RotaryConfig) -> Result<Self> {
        if head_dim <= 0 || head_dim % 2 != 0 {
            return Err(Error::Misuse(format!("rotary: an odd head dimension ({head_dim}) has no pairs to rotate")));
        }
        if max_positions <= 0 {
            return Err(Error::Misuse(format!("rotary: {max_positions} positions")));
        }
        let exponent = Tensor::f_arange_start_step(0, head_dim, 2, (Kind::Int64, device))?
            .f_to_kind(Kind::Float)?
            .f_div_scalar(head_dim as f64)?;
        let inv_freq = Tensor::f_pow_scalar(config.base, &exponent)?.f_reciprocal()?;
        let t = Tensor::f_arange(max_positions, (Kind::Int64, device))?.f_to_kind(Kind::Float)?;
        let freqs = t.f_outer(&inv_freq)?;
        let (cos, sin) = (freqs.f_cos()?, freqs.f_sin()?);
        let gemm_tables = if device.is_cuda() && head_dim % 8 == 0 {
            Some((raw::permuted_table(&cos)?, raw::permuted_table(&sin)?))
        } else {
            None
        };
        Ok(Rotary { cos, sin, gemm_tables, config, last: Cell::new(None) })
    }

    /// [`f_new`](Self::f_new), panicking on an error (as tch's constructors do).
    pub fn new(head_dim: i64, max_positions: i64, device: Device, config: RotaryConfig) -> Self {
        Self::f_new(head_dim, max_positions, device, config).unwrap_or_else(|e| panic!("{e}"))
    }

    /// q [batch, seq, heads, head_dim] and k [batch, seq, kv_heads, head_dim] rotated at
    /// positions `offset..offset + seq`: new contiguous tensors of their shapes and dtype,
    /// differentiable in q and k. [`Error::Misuse`] for positions past the table, other shapes,
    /// dtypes or devices.
    pub fn f_forward(&self, q: &Tensor, k: &Tensor, offset: i64) -> Result<(Tensor, Tensor)> {
        self.run(q, k, offset, None)
    }

    /// [`f_forward`](Self::f_forward), panicking on an error.
    pub fn forward(&self, q: &Tensor, k: &Tensor, offset: i64) -> (Tensor, Tensor) {
        self.f_forward(q, k, offset).unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`f_forward`](Self::f_forward) at positions `offset..offset + seq`, `offset` a 0-d int64
    /// tensor on q's device read when the kernel runs: a captured decoding step moves on as the
    /// tensor does. Positions past the table give NaN (no host check is possible).
    pub fn f_forward_at(&self, q: &Tensor, k: &Tensor, offset: &Tensor) -> Result<(Tensor, Tensor)> {
        self.run(q, k, 0, Some(offset))
    }

    /// q and k rotated and v, from a fused projection's output `qkv` [batch, seq, heads +
    /// 2 kv_heads, head_dim] (q | k | v along the head dimension) at positions
    /// `offset..offset + seq`, differentiable in `qkv`. On the crate's kernel one launch makes
    /// the three (v copied) and the backward writes `qkv`'s gradient in one launch, where
    /// splitting `qkv` first would have autograd concatenate dq, dk and dv; ATen's composition
    /// returns v as a view of `qkv`. [`Error::Misuse`] as [`f_forward`](Self::f_forward), and for
    /// a head count that does not add up.
    ///
    /// ```
    /// use tch::{Device, Kind, Tensor};
    /// use tch_cuda_graphs::rotary::{Rotary, RotaryConfig};
    /// let rope = Rotary::new(64, 256, Device::Cpu, RotaryConfig::default());
    /// let qkv = Tensor::randn([2, 16, 12 + 2 * 4, 64], (Kind::Float, Device::Cpu)); // 12 heads, 4 KV
    /// let (q, k, v) = rope.f_forward_qkv(&qkv, 12, 4, 0)?;
    /// assert_eq!((q.size()[2], k.size()[2], v.size()[2]), (12, 4, 4));
    /// # Ok::<(), tch_cuda_graphs::Error>(())
    /// ```
    pub fn f_forward_qkv(
        &self,
        qkv: &Tensor,
        heads: i64,
        kv_heads: i64,
        offset: i64,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        let tables = (&self.cos, &self.sin);
        let (q, k, v, own) = raw::apply_qkv(
            qkv,
            (heads, kv_heads),
            tables,
            (offset, None),
            self.raw_layout(),
            self.config.kernels.raw(),
        )?;
        self.last.set(Some(KernelPath::of_one(own)));
        Ok((q, k, v))
    }

    /// q, k and v from the fused projection `wqkv` (its weight [(heads + 2 kv_heads) ·
    /// head_dim, in]) of `x` [batch, seq, in], q and k rotated at positions `offset..offset +
    /// seq`: what `wqkv.f_forward(x)` viewed as [batch, seq, heads + 2 kv_heads, head_dim] and
    /// then [`f_forward_qkv`](Self::f_forward_qkv) give, the same values, differentiable in `x`
    /// and `wqkv`'s parameters.
    ///
    /// On the crate's path (the linear layer's and the kernel's: a CUDA step in bf16 or f16, the
    /// head dimension a multiple of 8, neither config [`Kernels::PyTorch`]) one autograd node
    /// does both: the GEMM writes the projection and the kernel rotates q and k in place in it
    /// (with bf16, interleaved pairs, heads of 64 and no bias on an sm_90 GPU, the GEMM's
    /// epilogue rotates them: no pass of its own reads the projection), so q, k and v are views
    /// of the projection (strided along the heads, as
    /// `scaled_dot_product_attention` takes them) and no copy of v or second tensor of q and k
    /// is made; its backward packs the three gradients into the projection's in one launch and
    /// runs `wqkv`'s GEMMs on it, its weight gradient as `wqkv`'s config says. Elsewhere it is
    /// those two calls. [`Error::Misuse`] as [`f_forward_qkv`](Self::f_forward_qkv), and for a
    /// weight whose rows are not heads + 2 kv_heads heads; [`Error::Unsupported`] where either
    /// config asks for [`Kernels::Own`] and the path does not apply. The views are made inside
    /// an autograd function: copy one before changing it in place.
    ///
    /// ```
    /// # fn main() -> tch_cuda_graphs::Result<()> {
    /// use tch::{nn, Device, Kind, Tensor};
    /// use tch_cuda_graphs::linear::{linear, LinearConfig};
    /// use tch_cuda_graphs::rotary::{Rotary, RotaryConfig};
    /// let vs = nn::VarStore::new(Device::Cpu);
    /// let wqkv = linear(vs.root() / "wqkv", 256, (8 + 2 * 2) * 32, LinearConfig { bias: false, ..Default::default() });
    /// let rope = Rotary::f_new(32, 128, Device::Cpu, RotaryConfig::default())?;
    /// let x = Tensor::randn([2, 16, 256], (Kind::Float, Device::Cpu));
    /// let (q, k, v) = rope.f_project_qkv(&wqkv, &x, 8, 2, 0)?; // 8 heads, 2 KV heads of 32
    /// assert_eq!((q.size(), k.size(), v.size()), (vec![2, 16, 8, 32], vec![2, 16, 2, 32], vec![2, 16, 2, 32]));
    /// # Ok(()) }
    /// ```
    pub fn f_project_qkv(
        &self,
        wqkv: &Linear,
        x: &Tensor,
        heads: i64,
        kv_heads: i64,
        offset: i64,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        let linear = wqkv.config();
        let kernels = match (self.config.kernels, linear.kernels) {
            (Kernels::PyTorch, _) | (_, Kernels::PyTorch) => None,
            (Kernels::Own, _) | (_, Kernels::Own) => Some(Kernels::Own),
            _ => Some(Kernels::Auto),
        };
        if let Some(kernels) = kernels {
            let tables = (&self.cos, &self.sin);
            let gemm_tables = self.gemm_tables.as_ref().map(|(c, s)| (c, s));
            let modes = (linear.weight_grad.raw(), kernels.raw());
            let heads_kv = (heads, kv_heads);
            let layout = self.raw_layout();
            let bias = wqkv.bs.as_ref();
            if let Some(qkv) =
                raw::project_qkv(x, &wqkv.ws, bias, heads_kv, tables, gemm_tables, offset, layout, modes)?
            {
                self.last.set(Some(KernelPath::Own));
                return Ok(qkv);
            }
        }
        let size = x.size();
        let (batch, seq) = match size.as_slice() {
            [b, t, _] => (*b, *t),
            _ => return Err(Error::Misuse(format!("rotary projection: x must be [batch, seq, in], not {size:?}"))),
        };
        let qkv = wqkv.f_forward(x)?.f_view([batch, seq, heads + 2 * kv_heads, -1])?;
        self.f_forward_qkv(&qkv, heads, kv_heads, offset)
    }

    /// [`f_project_qkv`](Self::f_project_qkv), panicking on an error.
    pub fn project_qkv(
        &self,
        wqkv: &Linear,
        x: &Tensor,
        heads: i64,
        kv_heads: i64,
        offset: i64,
    ) -> (Tensor, Tensor, Tensor) {
        self.f_project_qkv(wqkv, x, heads, kv_heads, offset).unwrap_or_else(|e| panic!("{e}"))
    }

    fn raw_layout(&self) -> RawRotaryLayout {
        match self.config.layout {
            RotaryLayout::Interleaved => RawRotaryLayout::TCG_ROTARY_INTERLEAVED,
            RotaryLayout::HalfSplit => RawRotaryLayout::TCG_ROTARY_HALF_SPLIT,
        }
    }

    fn run(&self, q: &Tensor, k: &Tensor, offset: i64, offset_dev: Option<&Tensor>) -> Result<(Tensor, Tensor)> {
        let tables = (&self.cos, &self.sin);
        let (q, k, own) = raw::apply(q, k, tables, offset, offset_dev, self.raw_layout(), self.config.kernels.raw())?;
        self.last.set(Some(KernelPath::of_one(own)));
        Ok((q, k))
    }

    /// The cos and sin tables, [max_positions, head_dim / 2] float32.
    pub fn tables(&self) -> (&Tensor, &Tensor) {
        (&self.cos, &self.sin)
    }

    /// The configuration it was made with.
    pub fn config(&self) -> RotaryConfig {
        self.config
    }

    /// Which kernels the last forward ran: [`KernelPath::Own`] for the crate's kernel,
    /// [`KernelPath::PyTorch`] for ATen's composition (None before the first).
    pub fn last_path(&self) -> Option<KernelPath> {
        self.last.get()
    }
}
