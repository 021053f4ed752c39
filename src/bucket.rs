//! [`Buckets`]: pad variable-length batches to the next of a few lengths, so a step that sees
//! sequences of any length captures only a few graphs (one per bucket).

use crate::error::{Error, Result};
use crate::scalar::{cpu_f64, cpu_i64};
use tch::{Kind, Tensor};

/// A few padded lengths, ascending. [`pad`](Buckets::pad) pads a batch along one dimension to
/// the smallest bucket that holds it and gives the mask of the real positions.
///
/// ```
/// use tch::{Device, Kind, Tensor};
/// use tch_cuda_graphs::Buckets;
/// let buckets = Buckets::new([32, 64, 128])?;
/// let tokens = Tensor::ones([4, 50], (Kind::Int64, Device::Cpu)); // batch 4, length 50
/// let p = buckets.pad(&tokens, 1, 0.0, None)?;
/// assert_eq!(p.tensor.size(), [4, 64]);
/// assert_eq!(p.mask.size(), [4, 64]);
/// assert_eq!(p.len, 50);
/// # Ok::<(), tch_cuda_graphs::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Buckets {
    lengths: Vec<i64>,
}

/// A batch padded to a bucket.
#[derive(Debug)]
pub struct Padded {
    /// The batch, padded along the chosen dimension to the bucket length.
    pub tensor: Tensor,
    /// Bool mask of shape `tensor.size()[..=dim]`: true at real positions, false at padding.
    pub mask: Tensor,
    /// The length before padding.
    pub len: i64,
    /// The bucket length.
    pub bucket: i64,
}

impl Buckets {
    /// Buckets of these lengths (positive; sorted and deduplicated here).
    pub fn new(lengths: impl IntoIterator<Item = i64>) -> Result<Self> {
        let mut lengths: Vec<i64> = lengths.into_iter().collect();
        lengths.sort_unstable();
        lengths.dedup();
        if lengths.is_empty() || lengths[0] <= 0 {
            return Err(Error::Misuse(format!("buckets must be positive lengths, got {lengths:?}")));
        }
        Ok(Buckets { lengths })
    }

    /// The bucket lengths, ascending.
    pub fn lengths(&self) -> &[i64] {
        &self.lengths
    }

    /// The smallest bucket of at least `len`; [`Error::Misuse`] when `len` is longer than all.
    pub fn bucket_for(&self, len: i64) -> Result<i64> {
        self.lengths.iter().copied().find(|&b| b >= len).ok_or_else(|| {
            Error::Misuse(format!(
                "length {len} is longer than the largest bucket {}",
                self.lengths[self.lengths.len() - 1]
            ))
        })
    }

    /// Pads `t` along `dim` with `value` to its bucket. `lengths` (one per row of dimension 0,
    /// int64) marks rows that are shorter than `t` itself; without it every row is `t`'s length.
    pub fn pad(&self, t: &Tensor, dim: i64, value: f64, lengths: Option<&Tensor>) -> Result<Padded> {
        let size = t.size();
        let rank = size.len() as i64;
        if dim < 1 || dim >= rank {
            return Err(Error::Misuse(format!("pad: dim {dim} must be a non-batch dimension of a rank-{rank} tensor")));
        }
        let len = size[dim as usize];
        let bucket = self.bucket_for(len)?;
        // constant_pad_nd takes (left, right) pairs from the last dimension backwards
        let mut pads = vec![0i64; 2 * (rank - dim) as usize];
        let last = pads.len() - 1;
        pads[last] = bucket - len;
        let tensor = t.f_constant_pad_nd(&pads)?; // pads with zeros
        if value != 0.0 && bucket > len {
            let mut tail = tensor.f_narrow(dim, len, bucket - len)?; // a view into `tensor`
            let _ = tail.f_fill_tensor_(&cpu_f64(value)?)?;
        }
        let positions = Tensor::f_arange(bucket, (Kind::Int64, t.device()))?;
        let row_len = match lengths {
            Some(l) => l.f_to_kind(Kind::Int64)?.f_to_device(t.device())?,
            None => Tensor::f_empty([size[0]], (Kind::Int64, t.device()))?.f_fill_tensor_(&cpu_i64(len)?)?,
        };
        // mask[b, p] = p < len[b], then broadcast over the dimensions between 0 and dim
        let mut mask = positions.f_unsqueeze(0)?.f_lt_tensor(&row_len.f_unsqueeze(1)?)?;
        for _ in 1..dim {
            mask = mask.f_unsqueeze(1)?;
        }
        let mut shape = size[..=dim as usize].to_vec();
        shape[dim as usize] = bucket;
        let mask = mask.f_expand(&shape, false)?.f_contiguous()?;
        Ok(Padded { tensor, mask, len, bucket })
    }
}
