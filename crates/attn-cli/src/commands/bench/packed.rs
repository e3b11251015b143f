//! `attn bench --seq-lens L1,...,LB`: the `B` sequences of `--shape B,H,Lq,D` have these lengths
//! (each at most `Lq`, keys as long as queries). Timed is attention over them packed
//! (`[Σ L, H, D]` cut by `cu_seqlens`: `attn::sdpa_varlen_full`; with `--backward` the packed
//! kernels directly, with `--autograd` through candle's autograd), or with `--padded` the padded
//! batch `[B, H, Lq, D]` with the lengths as key lengths (the dense paths, unchanged). The FLOPs of
//! both are those of each sequence's own `(query, key)` pairs, so their GFLOP/s compare the useful
//! work done per second.

use anyhow::{bail, Context};
use attn::{cu_seqlens, sdpa_varlen_full, SdpaOptions, SdpaVarlenOutput};
use attn_kernels::{
    attention_varlen, attention_varlen_backward, AttnGrads, CuSeqlens, Dims, Packed, VarlenOutput, VarlenSaved,
};
use candle_core::{DType, Tensor, Var};

use super::backward::HostKv;
use super::spec;
use crate::io::tensor_values;
use crate::measure::Held;

/// Checks `lens` against the padded sizes `d`: one length per batch entry, each at most `Lq`, and
/// keys as long as queries.
pub fn check(d: &Dims, lens: &[usize]) -> anyhow::Result<()> {
    if lens.len() != d.b {
        bail!("--seq-lens gives {} lengths, expected B = {} (one per sequence of --shape)", lens.len(), d.b);
    }
    if let Some(l) = lens.iter().find(|&&l| l > d.lq) {
        bail!("--seq-lens: length {l} exceeds the padded length Lq = {}", d.lq);
    }
    if d.lk != d.lq {
        bail!(
            "--seq-lens: --kv-len {} differs from Lq = {}; packed sequences' keys are as long as their queries",
            d.lk,
            d.lq
        );
    }
    Ok(())
}

/// The calls the packed sequences of lengths `lens` run as, one each: `B = 1`, `Lq = Lk = L`, the
/// other sizes those of `d`.
pub fn calls(d: &Dims, lens: &[usize]) -> Vec<Dims> {
    lens.iter().map(|&l| Dims { b: 1, lq: l, lk: l, ..*d }).collect()
}

/// FLOPs of the sequences' own pairs by the FLOP rule: the sum over their [`calls`].
pub fn flops(d: &Dims, lens: &[usize], opts: &SdpaOptions) -> u64 {
    calls(d, lens).iter().map(|c| spec::flops(c, opts)).sum()
}

/// The packed inputs `q: [T, H, D]` (f32), `k: [T, Hkv, D]`, `v: [T, Hkv, Dv]` (in the key/value
/// dtype), `T = Σ L`, uniform in `[-1, 1)`, the offsets, and the output gradient `[T, H, Dv]`.
pub struct PackedInputs {
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cu: Vec<usize>,
    grad_out: Tensor,
}

/// What one packed call by the kernels returns.
pub struct PackedStep {
    out: VarlenOutput,
    grads: AttnGrads<f32>,
}

impl Held for PackedStep {
    fn held_bytes(&self) -> usize {
        let g = &self.grads;
        let floats = self.out.out.len() + self.out.lse.len() + g.dq.len() + g.dk.len() + g.dv.len();
        floats * std::mem::size_of::<f32>()
    }
}

impl Held for SdpaVarlenOutput {
    fn held_bytes(&self) -> usize {
        [&self.out, &self.lse].iter().map(|t| t.elem_count() * t.dtype().size_in_bytes()).sum()
    }
}

impl PackedInputs {
    /// Draws the inputs of sequences `lens` with the head counts and dimensions of `d` from `seed`.
    pub fn random(d: &Dims, lens: &[usize], kv_dtype: DType, seed: u64) -> attn::Result<Self> {
        let cu = cu_seqlens(lens);
        let t = cu[lens.len()];
        let draw = |shape: [usize; 3], stream: u64, dtype| {
            attn::random::uniform_as(&shape, -1.0, 1.0, seed.wrapping_add(stream), dtype)
        };
        Ok(Self {
            q: draw([t, d.hq, d.dk], 0, DType::F32)?,
            k: draw([t, d.hkv, d.dk], 1, kv_dtype)?,
            v: draw([t, d.hkv, d.dv], 2, kv_dtype)?,
            grad_out: draw([t, d.hq, d.dv], 3, DType::F32)?,
            cu,
        })
    }

    /// The forward through the library.
    pub fn forward(&self, opts: &SdpaOptions) -> attn::Result<SdpaVarlenOutput> {
        sdpa_varlen_full(&self.q, &self.k, &self.v, &self.cu, &self.cu, opts)
    }

    /// One forward and backward through the library and candle's autograd (`q`, `k`, `v` as
    /// `Var`s, `loss = Σ out·grad_out`).
    pub fn autograd_step(&self, opts: &SdpaOptions) -> anyhow::Result<Grads> {
        let [q, k, v] = [&self.q, &self.k, &self.v].map(Var::from_tensor);
        let (q, k, v) = (q?, k?, v?);
        let out = sdpa_varlen_full(&q, &k, &v, &self.cu, &self.cu, opts)?;
        let grads = (&out.out * &self.grad_out)?.sum_all()?.backward()?;
        let get = |name: &str, v: &Var| grads.get(v).cloned().with_context(|| format!("no gradient reached {name}"));
        Ok(Grads([get("q", &q)?, get("k", &k)?, get("v", &v)?]))
    }
}

/// The gradients of `q`, `k` and `v` through autograd.
pub struct Grads([Tensor; 3]);

impl Held for Grads {
    fn held_bytes(&self) -> usize {
        self.0.iter().map(|t| t.elem_count() * t.dtype().size_in_bytes()).sum()
    }
}

/// The packed inputs copied to host memory once, for the kernels.
pub struct HostPacked {
    dims: [[usize; 3]; 4],
    q: Vec<f32>,
    k: HostKv,
    v: HostKv,
    grad_out: Vec<f32>,
    cu: Vec<usize>,
}

impl HostPacked {
    /// `data` in host memory.
    pub fn new(data: &PackedInputs) -> anyhow::Result<Self> {
        let dims3 = |t: &Tensor| -> anyhow::Result<[usize; 3]> { Ok(t.dims3().map(|(a, b, c)| [a, b, c])?) };
        Ok(Self {
            dims: [dims3(&data.q)?, dims3(&data.k)?, dims3(&data.v)?, dims3(&data.grad_out)?],
            q: tensor_values(&data.q, "q")?,
            k: HostKv::of(&data.k, "k")?,
            v: HostKv::of(&data.v, "v")?,
            grad_out: tensor_values(&data.grad_out, "grad_out")?,
            cu: data.cu.clone(),
        })
    }

    /// One forward (with log-sum-exp) and backward by the packed kernels under `opts`.
    pub fn step(&self, opts: &SdpaOptions) -> anyhow::Result<PackedStep> {
        let host = opts.kernel_params::<f32>()?;
        let params = host.attn_params()?;
        let [qd, kd, vd, gd] = self.dims;
        let q = Packed::contiguous("q", &self.q, qd)?;
        let (k, v) = (self.k.packed("k", kd)?, self.v.packed("v", vd)?);
        let cu = CuSeqlens { q: &self.cu, k: &self.cu };
        let out = attention_varlen(opts.kernel, &q, &k, &v, &cu, &params)?;
        let saved = VarlenSaved::of(&out, Packed::contiguous("grad_out", &self.grad_out, gd)?)?;
        let grads = attention_varlen_backward(opts.kernel, &q, &k, &v, &cu, &saved, &params)?;
        Ok(PackedStep { out, grads })
    }
}
