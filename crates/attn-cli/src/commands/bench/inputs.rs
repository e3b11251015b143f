//! Seeded random inputs for one benchmark case: `f32` queries and keys/values stored as `f32`,
//! `f16` or `bf16`, with views ready for `attn_kernels::attention`.

use attn_kernels::rng::SplitMix64;
use attn_kernels::{Dims, KvView, View4};
use half::{bf16, f16};

/// Storage type of the keys and values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum KvDtype {
    /// Single precision.
    F32,
    /// IEEE half precision.
    F16,
    /// bfloat16.
    Bf16,
}

impl KvDtype {
    /// The name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            KvDtype::F32 => "f32",
            KvDtype::F16 => "f16",
            KvDtype::Bf16 => "bf16",
        }
    }
}

/// A key or value tensor `[B, Hkv, Lk, D]` in its storage type.
enum KvData {
    F32(Vec<f32>),
    F16(Vec<f16>),
    Bf16(Vec<bf16>),
}

impl KvData {
    fn new(values: Vec<f32>, dtype: KvDtype) -> Self {
        match dtype {
            KvDtype::F32 => KvData::F32(values),
            KvDtype::F16 => KvData::F16(values.into_iter().map(f16::from_f32).collect()),
            KvDtype::Bf16 => KvData::Bf16(values.into_iter().map(bf16::from_f32).collect()),
        }
    }

    fn view(&self, name: &'static str, dims: [usize; 4]) -> anyhow::Result<KvView<'_>> {
        Ok(match self {
            KvData::F32(d) => KvView::F32(View4::contiguous(name, d, dims)?),
            KvData::F16(d) => KvView::F16(View4::contiguous(name, d, dims)?),
            KvData::Bf16(d) => KvView::Bf16(View4::contiguous(name, d, dims)?),
        })
    }
}

/// The owned inputs of a case: `q: [B, Hq, Lq, Dk]`, `k: [B, Hkv, Lk, Dk]`, `v: [B, Hkv, Lk, Dv]`,
/// uniform in `[-1, 1)`.
pub struct Inputs {
    dims: Dims,
    q: Vec<f32>,
    k: KvData,
    v: KvData,
}

impl Inputs {
    /// Draws the tensors of `dims` from `seed`, keys and values stored as `kv_dtype`.
    pub fn random(dims: Dims, kv_dtype: KvDtype, seed: u64) -> Self {
        let mut rng = SplitMix64::new(seed);
        let q = rng.uniform(dims.b * dims.hq * dims.lq * dims.dk, -1.0, 1.0);
        let k = KvData::new(rng.uniform(dims.b * dims.hkv * dims.lk * dims.dk, -1.0, 1.0), kv_dtype);
        let v = KvData::new(rng.uniform(dims.b * dims.hkv * dims.lk * dims.dv, -1.0, 1.0), kv_dtype);
        Self { dims, q, k, v }
    }

    /// Views `(q, k, v)` over the tensors.
    pub fn views(&self) -> anyhow::Result<(View4<'_, f32>, KvView<'_>, KvView<'_>)> {
        let d = self.dims;
        Ok((
            View4::contiguous("q", &self.q, [d.b, d.hq, d.lq, d.dk])?,
            self.k.view("k", [d.b, d.hkv, d.lk, d.dk])?,
            self.v.view("v", [d.b, d.hkv, d.lk, d.dv])?,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inputs_are_seeded_in_range_and_shaped() {
        let dims = Dims { b: 2, hq: 4, hkv: 2, lq: 3, lk: 5, dk: 8, dv: 6 };
        let a = Inputs::random(dims, KvDtype::Bf16, 7);
        let (q, k, v) = a.views().unwrap();
        assert_eq!(q.dims(), [2, 4, 3, 8]);
        assert_eq!(k.dims(), [2, 2, 5, 8]);
        assert_eq!(v.dims(), [2, 2, 5, 6]);
        assert!(matches!(k, KvView::Bf16(_)));
        assert!(a.q.iter().all(|x| (-1.0..1.0).contains(x)));
        assert_eq!(a.q, Inputs::random(dims, KvDtype::F32, 7).q);
        assert_ne!(a.q, Inputs::random(dims, KvDtype::F32, 8).q);
    }
}
