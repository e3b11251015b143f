//! `attn bench --backward`: one timed call is the forward (with log-sum-exp) and the backward of
//! `Σ out·grad_out` for a fixed random `grad_out`, giving `dq`, `dk` and `dv` (dropout replayed
//! from its seed). By default the kernels are called directly (`attn_kernels::attention` then
//! `attention_backward`, with the parameters of [`SdpaOptions::kernel_params`]); with
//! `--autograd` the call goes through the library and candle's autograd instead (`q`, `k`, `v` as
//! `Var`s, `loss.backward()`), which runs the same kernels but adds candle's element-wise work
//! around them (the loss, its gradient, zero-filled gradient slots and their sums): about 8 more
//! `q`-sized tensors per call, which shows on small shapes (see docs/performance-log.md,
//! "attn-cli/src/commands/bench/backward.rs: module doc").

use anyhow::Context;
use attn::random::uniform;
use attn::{sdpa_full, SdpaOptions, SdpaOutput};
use attn_kernels::{
    attention, attention_backward, AttnGrads, AttnOutput, Dims, KvView, Packed, PackedKv, Saved, View4,
};
use candle_core::{DType, Tensor, Var};
use half::{bf16, f16};

use super::inputs::Inputs;
use crate::io::{tensor_values, IoErrorKind};
use crate::measure::Held;

/// The output gradient of a case: `[B, Hq, Lq, Dv]` uniform in `[-1, 1)` from `seed` (a stream
/// of its own, apart from those of `q`, `k` and `v`).
pub fn grad_out(dims: Dims, seed: u64) -> attn::Result<Tensor> {
    uniform(&[dims.b, dims.hq, dims.lq, dims.dv], -1.0, 1.0, seed.wrapping_add(3))
}

/// Keys or values in host memory, in their storage type.
pub(super) enum HostKv {
    F32(Vec<f32>),
    F16(Vec<f16>),
    Bf16(Vec<bf16>),
}

impl HostKv {
    /// The elements of `t` (stored as `f32`, `f16` or `bf16`), copied.
    pub(super) fn of(t: &Tensor, what: &'static str) -> Result<Self, IoErrorKind> {
        Ok(match t.dtype() {
            DType::F16 => HostKv::F16(tensor_values(t, what)?),
            DType::BF16 => HostKv::Bf16(tensor_values(t, what)?),
            _ => HostKv::F32(tensor_values(t, what)?),
        })
    }

    fn view(&self, name: &'static str, dims: [usize; 4]) -> attn_kernels::Result<KvView<'_>> {
        Ok(match self {
            HostKv::F32(x) => KvView::F32(View4::contiguous(name, x, dims)?),
            HostKv::F16(x) => KvView::F16(View4::contiguous(name, x, dims)?),
            HostKv::Bf16(x) => KvView::Bf16(View4::contiguous(name, x, dims)?),
        })
    }

    /// The packed `[total, H, D]` view of `dims`.
    pub(super) fn packed(&self, name: &'static str, dims: [usize; 3]) -> attn_kernels::Result<PackedKv<'_>> {
        Ok(match self {
            HostKv::F32(x) => Packed::contiguous(name, x, dims)?.into(),
            HostKv::F16(x) => Packed::contiguous(name, x, dims)?.into(),
            HostKv::Bf16(x) => Packed::contiguous(name, x, dims)?.into(),
        })
    }
}

/// A case in host memory for the kernels: `q`, `k`, `v` (keys and values in their storage type)
/// and the output gradient, all contiguous.
pub struct HostCase {
    dims: Dims,
    q: Vec<f32>,
    k: HostKv,
    v: HostKv,
    grad_out: Vec<f32>,
}

/// What one forward-and-backward call by the kernels returns.
pub struct KernelStep {
    out: AttnOutput<f32>,
    grads: AttnGrads<f32>,
}

impl Held for KernelStep {
    fn held_bytes(&self) -> usize {
        let g = &self.grads;
        let floats = self.out.out.len() + self.out.lse.len() + g.dq.len() + g.dk.len() + g.dv.len();
        floats * std::mem::size_of::<f32>()
    }
}

impl HostCase {
    /// `data` and the output gradient `grad_out` copied to host memory.
    pub fn new(data: &Inputs, dims: Dims, grad_out: &Tensor) -> Result<Self, IoErrorKind> {
        Ok(Self {
            dims,
            q: tensor_values(&data.q, "q")?,
            k: HostKv::of(&data.k, "k")?,
            v: HostKv::of(&data.v, "v")?,
            grad_out: tensor_values(grad_out, "grad_out")?,
        })
    }

    /// One forward (with log-sum-exp) and backward under `opts` by `opts.kernel`.
    pub fn step(&self, opts: &SdpaOptions) -> anyhow::Result<KernelStep> {
        let d = self.dims;
        let host = opts.kernel_params::<f32>()?;
        let params = host.attn_params()?;
        let q = View4::contiguous("q", &self.q, [d.b, d.hq, d.lq, d.dk])?;
        let k = self.k.view("k", [d.b, d.hkv, d.lk, d.dk])?;
        let v = self.v.view("v", [d.b, d.hkv, d.lk, d.dv])?;
        let out = attention(opts.kernel, &q, &k, &v, &params, false)?;
        let dout = View4::contiguous("grad_out", &self.grad_out, [d.b, d.hq, d.lq, d.dv])?;
        let saved = Saved::of(&out, [d.b, d.hq, d.lq, d.dv], dout)?;
        let grads = attention_backward(opts.kernel, &q, &k, &v, &saved, &params, false)?;
        Ok(KernelStep { out, grads })
    }
}

/// A case as autograd variables, for `--autograd`.
pub struct Trainable {
    q: Var,
    k: Var,
    v: Var,
    grad_out: Tensor,
}

/// What one forward-and-backward call through autograd returns: the forward's results and `dq`,
/// `dk`, `dv`.
pub struct AutogradStep {
    out: SdpaOutput,
    grads: [Tensor; 3],
}

impl Held for AutogradStep {
    fn held_bytes(&self) -> usize {
        let grads: usize = self.grads.iter().map(|t| t.elem_count() * t.dtype().size_in_bytes()).sum();
        self.out.held_bytes() + grads
    }
}

impl Trainable {
    /// `data` as variables, with the output gradient `grad_out`.
    pub fn new(data: &Inputs, grad_out: Tensor) -> candle_core::Result<Self> {
        Ok(Self {
            q: Var::from_tensor(&data.q)?,
            k: Var::from_tensor(&data.k)?,
            v: Var::from_tensor(&data.v)?,
            grad_out,
        })
    }

    /// One forward and backward under `opts` through the library: `loss = Σ out·grad_out`,
    /// `loss.backward()`.
    pub fn step(&self, opts: &SdpaOptions) -> anyhow::Result<AutogradStep> {
        let out = sdpa_full(&self.q, &self.k, &self.v, opts)?;
        let grads = (&out.out * &self.grad_out)?.sum_all()?.backward()?;
        let get = |name: &str, v: &Var| grads.get(v).cloned().with_context(|| format!("no gradient reached {name}"));
        let grads = [get("q", &self.q)?, get("k", &self.k)?, get("v", &self.v)?];
        Ok(AutogradStep { out, grads })
    }
}
