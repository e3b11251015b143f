//! A packed test case ([`PackedCase`]): random packed inputs for given per-sequence lengths and
//! options, run through `attention_varlen` and its backward, and the oracle of both: each
//! sequence alone (sliced out of the packed buffers into a `[1, H, L, D]` tensor of its own)
//! through `reference::<f64>` and `reference::<f32>`, the results put back in the packed layout.

use std::ops::Range;

use attn_kernels::{
    attention_varlen, attention_varlen_backward, reference, reference_backward, Align, AttnGrads, AttnParams,
    CuSeqlens, Dropout, Kernel, MaskSpec, Packed, PackedKv, Precision, Real, Saved, VarlenOutput, VarlenSaved, View4,
    Window,
};
use attn_testkit::oracle::{check, GRADIENT_FACTOR, OUTPUT_FACTOR};
use half::{bf16, f16};

use crate::common::Rng;

/// How the keys and values are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvType {
    F32,
    F16,
    Bf16,
}

/// One packed call with owned inputs; fields are set directly (`PackedCase { causal: true, ..new }`).
#[derive(Debug, Clone)]
pub struct PackedCase {
    /// `(Lq_s, Lk_s)` per sequence.
    pub lens: Vec<(usize, usize)>,
    pub hq: usize,
    pub hkv: usize,
    pub dk: usize,
    pub dv: usize,
    /// `[total_q, Hq, Dk]`.
    pub q: Vec<f32>,
    /// `[total_k, Hkv, Dk]`, exactly representable in `kv`.
    pub k: Vec<f32>,
    /// `[total_k, Hkv, Dv]`, exactly representable in `kv`.
    pub v: Vec<f32>,
    pub kv: KvType,
    pub causal: bool,
    pub align: Align,
    pub window: Option<Window>,
    pub scale: Option<f64>,
    pub softcap: Option<f64>,
    pub dropout: Option<Dropout>,
    /// The products' precision.
    pub compute: Precision,
    /// Sink logits `[Hq]`.
    pub sinks: Option<Vec<f32>>,
}

/// `[0, l_0, l_0 + l_1, …]`.
pub fn offsets(lens: impl Iterator<Item = usize>) -> Vec<usize> {
    std::iter::once(0).chain(lens.scan(0, |acc, l| Some(*acc + l).inspect(|&x| *acc = x))).collect()
}

impl PackedCase {
    /// Random inputs (q, k uniform in `[-1.5, 1.5)`, v in `[-1, 1)`) for sequences of `lens`.
    pub fn new(lens: &[(usize, usize)], heads: (usize, usize), dims: (usize, usize), seed: u64) -> Self {
        let mut rng = Rng::new(seed);
        let (tq, tk) = (lens.iter().map(|l| l.0).sum::<usize>(), lens.iter().map(|l| l.1).sum::<usize>());
        let ((hq, hkv), (dk, dv)) = (heads, dims);
        Self {
            lens: lens.to_vec(),
            hq,
            hkv,
            dk,
            dv,
            q: rng.values(tq * hq * dk, 1.5),
            k: rng.values(tk * hkv * dk, 1.5),
            v: rng.values(tk * hkv * dv, 1.0),
            kv: KvType::F32,
            causal: false,
            align: Align::TopLeft,
            window: None,
            scale: None,
            softcap: None,
            dropout: None,
            compute: Precision::F32,
            sinks: None,
        }
    }

    /// The same case with keys and values stored as `kv` (their values rounded to it).
    pub fn stored_as(mut self, kv: KvType) -> Self {
        let round = |x: &mut f32| match kv {
            KvType::F32 => {}
            KvType::F16 => *x = f16::from_f32(*x).to_f32(),
            KvType::Bf16 => *x = bf16::from_f32(*x).to_f32(),
        };
        self.k.iter_mut().chain(self.v.iter_mut()).for_each(round);
        Self { kv, ..self }
    }

    pub fn cu_q(&self) -> Vec<usize> {
        offsets(self.lens.iter().map(|l| l.0))
    }

    pub fn cu_k(&self) -> Vec<usize> {
        offsets(self.lens.iter().map(|l| l.1))
    }

    pub fn totals(&self) -> (usize, usize) {
        (*self.cu_q().last().unwrap(), *self.cu_k().last().unwrap())
    }

    /// A one-line description for failure messages.
    pub fn describe(&self) -> String {
        format!(
            "lens={:?} Hq={} Hkv={} Dk={} Dv={} kv={:?} causal={} {:?} window={:?} scale={:?} softcap={:?} dropout={:?} sinks={:?}",
            self.lens,
            self.hq,
            self.hkv,
            self.dk,
            self.dv,
            self.kv,
            self.causal,
            self.align,
            self.window.map(|w| (w.left, w.right)),
            self.scale,
            self.softcap,
            self.dropout,
            self.sinks
        )
    }

    /// The options, no element masks.
    pub fn params<T: Default>(&self) -> AttnParams<'static, T> {
        AttnParams {
            scale: self.scale,
            mask: MaskSpec { causal: self.causal, window: self.window, align: self.align, ..Default::default() },
            softcap: self.softcap,
            dropout: self.dropout,
            compute: self.compute,
            ..Default::default()
        }
    }

    /// The options with the sinks, for the packed calls.
    fn params32(&self) -> AttnParams<'_, f32> {
        AttnParams { sinks: self.sinks.as_deref(), ..self.params() }
    }

    /// Calls `f` with the packed views of the inputs (keys and values in their storage type).
    fn with_views<R>(&self, f: impl FnOnce(&Packed<f32>, &PackedKv, &PackedKv) -> R) -> R {
        let (tq, tk) = self.totals();
        let q = Packed::contiguous("q", &self.q, [tq, self.hq, self.dk]).unwrap();
        let (kd, vd) = ([tk, self.hkv, self.dk], [tk, self.hkv, self.dv]);
        match self.kv {
            KvType::F32 => {
                let (k, v) =
                    (Packed::contiguous("k", &self.k, kd).unwrap(), Packed::contiguous("v", &self.v, vd).unwrap());
                f(&q, &k.into(), &v.into())
            }
            KvType::F16 => {
                let conv = |x: &[f32]| x.iter().map(|&x| f16::from_f32(x)).collect::<Vec<_>>();
                let (k, v) = (conv(&self.k), conv(&self.v));
                let (k, v) = (Packed::contiguous("k", &k, kd).unwrap(), Packed::contiguous("v", &v, vd).unwrap());
                f(&q, &k.into(), &v.into())
            }
            KvType::Bf16 => {
                let conv = |x: &[f32]| x.iter().map(|&x| bf16::from_f32(x)).collect::<Vec<_>>();
                let (k, v) = (conv(&self.k), conv(&self.v));
                let (k, v) = (Packed::contiguous("k", &k, kd).unwrap(), Packed::contiguous("v", &v, vd).unwrap());
                f(&q, &k.into(), &v.into())
            }
        }
    }

    /// `kernel`'s packed forward.
    pub fn run(&self, kernel: Kernel) -> attn_kernels::Result<VarlenOutput> {
        let (cq, ck) = (self.cu_q(), self.cu_k());
        self.with_views(|q, k, v| attention_varlen(kernel, q, k, v, &CuSeqlens { q: &cq, k: &ck }, &self.params32()))
    }

    /// `kernel`'s packed forward then backward for the output gradient `dout: [total_q, Hq, Dv]`.
    pub fn grads(&self, kernel: Kernel, dout: &[f32]) -> attn_kernels::Result<AttnGrads<f32>> {
        let (cq, ck) = (self.cu_q(), self.cu_k());
        let cu = CuSeqlens { q: &cq, k: &ck };
        let fwd = self.run(kernel)?;
        let dout = Packed::contiguous("grad_out", dout, [self.totals().0, self.hq, self.dv])?;
        let saved = VarlenSaved::of(&fwd, dout)?;
        self.with_views(|q, k, v| attention_varlen_backward(kernel, q, k, v, &cu, &saved, &self.params32()))
    }

    /// A random output gradient `[total_q, Hq, Dv]`.
    pub fn random_dout(&self, seed: u64) -> Vec<f32> {
        Rng::new(seed ^ 0xD0).values(self.totals().0 * self.hq * self.dv, 1.0)
    }

    /// Each sequence alone through `reference::<T>` (dropout keyed for its index), forward and,
    /// with `dout`, backward; results `(out, lse, grads)` in the packed layouts.
    pub fn alone<T: Real>(&self, dout: Option<&[f32]>) -> (Vec<T>, Vec<T>, Option<AttnGrads<T>>) {
        let (tq, tk) = self.totals();
        let (hq, hkv, dk, dv) = (self.hq, self.hkv, self.dk, self.dv);
        let mut out = vec![T::zero(); tq * hq * dv];
        let mut lse = vec![T::neg_infinity(); hq * tq];
        let zeros = |n| vec![T::zero(); n];
        let mut g = AttnGrads {
            dq: zeros(tq * hq * dk),
            dk: zeros(tk * hkv * dk),
            dv: zeros(tk * hkv * dv),
            dbias: None,
            dtable: None,
            dsinks: self.sinks.as_ref().map(|_| zeros(hq)),
        };
        let sinks: Option<Vec<T>> = self.sinks.as_ref().map(|s| s.iter().map(|&x| T::from_f32(x).unwrap()).collect());
        let (cq, ck) = (self.cu_q(), self.cu_k());
        for s in 0..self.lens.len() {
            let (qr, kr) = (cq[s]..cq[s + 1], ck[s]..ck[s + 1]);
            let (lq, lk) = (qr.len(), kr.len());
            let q = head_major::<T>(&self.q, &qr, hq, dk);
            let k = head_major::<T>(&self.k, &kr, hkv, dk);
            let v = head_major::<T>(&self.v, &kr, hkv, dv);
            let q = View4::contiguous("q", &q, [1, hq, lq, dk]).unwrap();
            let k = View4::contiguous("k", &k, [1, hkv, lk, dk]).unwrap();
            let v = View4::contiguous("v", &v, [1, hkv, lk, dv]).unwrap();
            let params = AttnParams {
                dropout: self.dropout.map(|d| d.for_sequence(s)),
                sinks: sinks.as_deref(),
                ..self.params()
            };
            let r = reference(&q, &k, &v, &params, false).unwrap();
            packed_rows(&r.out, &mut out, &qr, hq, dv);
            for h in 0..hq {
                lse[h * tq + qr.start..h * tq + qr.end].copy_from_slice(&r.lse[h * lq..(h + 1) * lq]);
            }
            if let Some(dout) = dout {
                let d = head_major::<T>(dout, &qr, hq, dv);
                let d = View4::contiguous("grad_out", &d, [1, hq, lq, dv]).unwrap();
                let saved = Saved::of(&r, [1, hq, lq, dv], d).unwrap();
                let sg = reference_backward(&q, &k, &v, &saved, &params, false).unwrap();
                packed_rows(&sg.dq, &mut g.dq, &qr, hq, dk);
                packed_rows(&sg.dk, &mut g.dk, &kr, hkv, dk);
                packed_rows(&sg.dv, &mut g.dv, &kr, hkv, dv);
                if let (Some(total), Some(ds)) = (g.dsinks.as_mut(), sg.dsinks) {
                    total.iter_mut().zip(ds).for_each(|(a, x)| *a = *a + x);
                }
            }
        }
        (out, lse, dout.map(|_| g))
    }

    /// Checks `kernel`'s forward and backward against each sequence alone under the oracle rule;
    /// panics naming `what` and the case otherwise.
    pub fn check(&self, kernel: Kernel, what: &str) {
        let label = format!("{} {what} [{}]", kernel.name(), self.describe());
        let dout = self.random_dout(7);
        let (o64, l64, g64) = self.alone::<f64>(Some(&dout));
        let (o32, l32, g32) = self.alone::<f32>(Some(&dout));
        let (g64, g32) = (g64.unwrap(), g32.unwrap());
        let fast = self.run(kernel).unwrap_or_else(|e| panic!("{label}: {e}"));
        let grads = self.grads(kernel, &dout).unwrap_or_else(|e| panic!("{label}: {e}"));
        let verdict = check("out", &fast.out, &o64, &o32, OUTPUT_FACTOR)
            .and_then(|_| check("lse", &fast.lse, &l64, &l32, OUTPUT_FACTOR))
            .and_then(|_| check("dq", &grads.dq, &g64.dq, &g32.dq, GRADIENT_FACTOR))
            .and_then(|_| check("dk", &grads.dk, &g64.dk, &g32.dk, GRADIENT_FACTOR))
            .and_then(|_| check("dv", &grads.dv, &g64.dv, &g32.dv, GRADIENT_FACTOR))
            .and_then(|_| match (&grads.dsinks, &g64.dsinks, &g32.dsinks) {
                (Some(fast), Some(d64), Some(d32)) => check("dsinks", fast, d64, d32, GRADIENT_FACTOR),
                (None, None, None) => Ok(()),
                _ => Err(format!("dsinks given by some and not others: {:?}", grads.dsinks)),
            });
        if let Err(e) = verdict {
            panic!("{label}: {e}");
        }
    }
}

/// Rows `rows` of the packed `[total, H, D]` as a head-major `[H, len, D]` in `T`.
pub fn head_major<T: Real>(packed: &[f32], rows: &Range<usize>, h: usize, d: usize) -> Vec<T> {
    (0..h)
        .flat_map(|hi| rows.clone().flat_map(move |t| &packed[(t * h + hi) * d..(t * h + hi + 1) * d]))
        .map(|&x| T::from_f32(x).unwrap())
        .collect()
}

/// Puts a head-major `[H, len, D]` into rows `rows` of the packed `[total, H, D]`.
pub fn packed_rows<T: Copy>(seq: &[T], packed: &mut [T], rows: &Range<usize>, h: usize, d: usize) {
    for (i, t) in rows.clone().enumerate() {
        for hi in 0..h {
            let from = (hi * rows.len() + i) * d;
            packed[(t * h + hi) * d..(t * h + hi + 1) * d].copy_from_slice(&seq[from..from + d]);
        }
    }
}
