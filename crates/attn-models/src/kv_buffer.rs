//! The decoders' KV cache for inference: keys and values written in place into buffers that
//! grow by doubling, so a decode step copies only its own token's keys (attn-nn's `KvCache`
//! concatenates, copying the whole cache every step: fine for training-sized sequences, most of a
//! step's time at thousands of cached tokens). The attention reads the filled part as a strided
//! view. In-place writes carry no gradient: this cache is for generation only.

use candle_core::Tensor;

use crate::error::Result;

/// Cached keys `[B, Hkv, L, Dk]` and values `[B, Hkv, L, Dv]` of one layer, in buffers of
/// capacity `≥ L` along the positions.
#[derive(Debug, Default)]
pub struct KvBuffer {
    buffers: Option<(Tensor, Tensor)>,
    len: usize,
}

impl Clone for KvBuffer {
    /// A deep copy: two caches never share a buffer (an append to one would write the other's).
    fn clone(&self) -> Self {
        let copy = |t: &Tensor| t.copy().expect("copying a CPU tensor");
        Self { buffers: self.buffers.as_ref().map(|(k, v)| (copy(k), copy(v))), len: self.len }
    }
}

impl KvBuffer {
    /// How many positions are cached.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Appends `k: [B, Hkv, n, Dk]`, `v: [B, Hkv, n, Dv]` after the cached positions and returns
    /// views of all of them, `[B, Hkv, len + n, D]`.
    pub fn append(&mut self, k: &Tensor, v: &Tensor) -> Result<(Tensor, Tensor)> {
        let n = k.dim(2)?;
        let needed = self.len + n;
        let capacity = self.buffers.as_ref().map_or(0, |(bk, _)| bk.dim(2).unwrap_or(0));
        if needed > capacity {
            let grown = needed.max(2 * capacity).max(64);
            let widen = |t: &Tensor, old: Option<&Tensor>| -> Result<Tensor> {
                let (b, h, _, d) = t.dims4()?;
                let buf = Tensor::zeros((b, h, grown, d), t.dtype(), t.device())?;
                if let Some(old) = old {
                    buf.slice_set(&old.narrow(2, 0, self.len)?.contiguous()?, 2, 0)?;
                }
                Ok(buf)
            };
            let old = self.buffers.take();
            let bk = widen(k, old.as_ref().map(|(bk, _)| bk))?;
            let bv = widen(v, old.as_ref().map(|(_, bv)| bv))?;
            self.buffers = Some((bk, bv));
        }
        let (bk, bv) = self.buffers.as_ref().expect("allocated above");
        bk.slice_set(&k.contiguous()?, 2, self.len)?;
        bv.slice_set(&v.contiguous()?, 2, self.len)?;
        self.len = needed;
        Ok((bk.narrow(2, 0, needed)?, bv.narrow(2, 0, needed)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn appends_equal_concatenation_across_growth_and_clones_stay_apart() {
        let t = |n: usize, seed: u64| attn::random::uniform(&[1, 2, n, 3], -1.0, 1.0, seed).unwrap();
        let mut cache = KvBuffer::default();
        let mut all: Vec<Tensor> = Vec::new();
        for (step, n) in [5, 1, 70, 1, 1, 200].into_iter().enumerate() {
            let k = t(n, step as u64);
            let (ck, cv) = cache.append(&k, &(&k * 2.0).unwrap()).unwrap();
            all.push(k);
            let want = Tensor::cat(&all, 2).unwrap();
            assert_eq!(ck.dims(), want.dims());
            let diff = (ck - &want).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
            let vdiff =
                (cv - (want * 2.0).unwrap()).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
            assert_eq!((diff, vdiff), (0.0, 0.0), "step {step}");
        }
        let mut copy = cache.clone();
        let before = cache.append(&t(1, 9), &t(1, 9)).unwrap().0;
        copy.append(&t(1, 10), &t(1, 10)).unwrap();
        let after = cache.buffers.as_ref().unwrap().0.narrow(2, 0, cache.len()).unwrap();
        let diff = (before - after).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
        assert_eq!(diff, 0.0, "an append to a clone wrote into the original");
        assert_eq!(cache.len(), 5 + 1 + 70 + 1 + 1 + 200 + 1);
    }
}
