//! Seeded random inputs for one benchmark case as candle tensors for `attn::sdpa_full`: `f32`
//! queries, keys and values stored as `--kv-dtype` says (`f32`, `f16` or `bf16`).

use attn::random::uniform_as;
use attn_kernels::Dims;
use candle_core::{DType, Tensor};

/// The storage types `--kv-dtype` accepts.
pub const KV_DTYPES: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

/// The inputs of a case: `q: [B, Hq, Lq, Dk]`, `k: [B, Hkv, Lk, Dk]`, `v: [B, Hkv, Lk, Dv]`,
/// uniform in `[-1, 1)`.
pub struct Inputs {
    /// Queries, `f32`.
    pub q: Tensor,
    /// Keys in their storage type.
    pub k: Tensor,
    /// Values in their storage type.
    pub v: Tensor,
}

impl Inputs {
    /// Draws the tensors of `dims` from `seed`, keys and values stored as `kv_dtype`; a shape too
    /// large for memory is an error naming its size.
    pub fn random(dims: Dims, kv_dtype: DType, seed: u64) -> attn::Result<Self> {
        let d = dims;
        let draw =
            |shape: [usize; 4], stream: u64, dtype| uniform_as(&shape, -1.0, 1.0, seed.wrapping_add(stream), dtype);
        Ok(Self {
            q: draw([d.b, d.hq, d.lq, d.dk], 0, DType::F32)?,
            k: draw([d.b, d.hkv, d.lk, d.dk], 1, kv_dtype)?,
            v: draw([d.b, d.hkv, d.lk, d.dv], 2, kv_dtype)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inputs_are_seeded_in_range_and_shaped() {
        let dims = Dims { b: 2, hq: 4, hkv: 2, lq: 3, lk: 5, dk: 8, dv: 6 };
        let a = Inputs::random(dims, DType::BF16, 7).unwrap();
        assert_eq!((a.q.dims(), a.k.dims(), a.v.dims()), (&[2, 4, 3, 8][..], &[2, 2, 5, 8][..], &[2, 2, 5, 6][..]));
        assert_eq!((a.q.dtype(), a.k.dtype(), a.v.dtype()), (DType::F32, DType::BF16, DType::BF16));
        let q =
            |seed| Inputs::random(dims, DType::F32, seed).unwrap().q.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        assert!(q(7).iter().all(|x| (-1.0..1.0).contains(x)));
        assert_eq!(a.q.flatten_all().unwrap().to_vec1::<f32>().unwrap(), q(7));
        assert_ne!(q(7), q(8));
    }
}
