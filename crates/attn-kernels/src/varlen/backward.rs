//! The backward of packed sequences: each sequence through the dense backward on its inputs,
//! output and output gradient gathered head-major (and its log-sum-exp rows from the head-major
//! `[Hq, total_q]`), its gradients copied into the packed layout.

use super::packed::{scatter_rows, CuSeqlens, KvBuf, Packed, PackedKv};
use super::{Call, VarlenOutput};
use crate::alloc;
use crate::dispatch::{attention_backward, Kernel};
use crate::error::{AttnError, Result};
use crate::grad::{AttnGrads, Saved};
use crate::problem::AttnParams;

/// What the packed backward needs from its forward, and the gradient arriving at the output.
#[derive(Debug, Clone, Copy)]
pub struct VarlenSaved<'a> {
    /// The forward's output `[total_q, Hq, Dv]`.
    pub out: Packed<'a, f32>,
    /// The forward's log-sum-exp `[Hq, total_q]`.
    pub lse: &'a [f32],
    /// Its rounding residue `[Hq, total_q]`, when at hand (see [`Saved::lse_residue`]).
    pub lse_residue: Option<&'a [f32]>,
    /// The gradient of the output, `dO: [total_q, Hq, Dv]`.
    pub dout: Packed<'a, f32>,
}

impl<'a> VarlenSaved<'a> {
    /// What the backward needs from `fwd` and the output's gradient `dout: [total_q, Hq, Dv]`.
    pub fn of(fwd: &'a VarlenOutput, dout: Packed<'a, f32>) -> Result<Self> {
        Ok(Self {
            out: Packed::contiguous("out", &fwd.out, dout.dims())?,
            lse: &fwd.lse,
            lse_residue: Some(&fwd.lse_residue),
            dout,
        })
    }

    /// Checks every part against the call's sizes.
    fn check(&self, c: &Call) -> Result<()> {
        let want = [c.total_q, c.hq, c.dv];
        for (tensor, p) in [("grad_out", &self.dout), ("out", &self.out)] {
            if p.dims() != want {
                let reason = format!("shape {:?}, expected [total_q, Hq, Dv] = {want:?}", p.dims());
                return Err(AttnError::Layout { tensor, reason });
            }
        }
        for (tensor, len) in [("lse", Some(self.lse.len())), ("lse_residue", self.lse_residue.map(<[f32]>::len))] {
            if let Some(len) = len.filter(|&n| n != c.hq * c.total_q) {
                let reason = format!("{len} elements, expected [Hq, total_q] = {}", c.hq * c.total_q);
                return Err(AttnError::Layout { tensor, reason });
            }
        }
        Ok(())
    }
}

/// Gradients of [`attention_varlen`](super::attention_varlen): `q`, `k`, `v`, `cu` and `params` as
/// given to the forward, `saved` its results and the output's gradient; returns
/// `dq: [total_q, Hq, Dk]`, `dk: [total_k, Hkv, Dk]` and `dv: [total_k, Hkv, Dv]` (in the inputs'
/// packed shapes; `dbias` is `None`). Dropout replays the forward's decisions from its seed.
pub fn attention_varlen_backward(
    kernel: Kernel,
    q: &Packed<f32>,
    k: &PackedKv,
    v: &PackedKv,
    cu: &CuSeqlens,
    saved: &VarlenSaved,
    params: &AttnParams<f32>,
) -> Result<AttnGrads<f32>> {
    let c = Call::new(q.dims(), k.dims(), v.dims(), cu, params)?;
    saved.check(&c)?;
    let tq = c.total_q;
    let mut g = AttnGrads {
        dq: alloc::filled("gradient dq", &[tq, c.hq, c.dk], 0.0f32)?,
        dk: alloc::filled("gradient dk", &[c.total_k, c.hkv, c.dk], 0.0f32)?,
        dv: alloc::filled("gradient dv", &[c.total_k, c.hkv, c.dv], 0.0f32)?,
        dbias: None,
    };
    let (mut lse, mut residue) = (Vec::new(), Vec::new());
    let (mut qbuf, mut dobuf) = (Vec::new(), Vec::new());
    let (mut kbuf, mut vbuf) = (KvBuf::default(), KvBuf::default());
    for (s, (qr, kr)) in c.seqs.iter().enumerate() {
        if qr.is_empty() || kr.is_empty() {
            // No query sees a key: every gradient of the sequence is 0, as allocated.
            continue;
        }
        let gather = |from: &[f32], to: &mut Vec<f32>| {
            to.clear();
            to.extend((0..c.hq).flat_map(|h| &from[h * tq + qr.start..h * tq + qr.end]));
        };
        gather(saved.lse, &mut lse);
        if let Some(r) = saved.lse_residue {
            gather(r, &mut residue);
        }
        let seq_saved = Saved {
            // Read once per row, for `Δ = dO·O`: no gather.
            out: saved.out.view("out", qr.clone())?,
            lse: &lse,
            lse_residue: saved.lse_residue.map(|_| &residue[..]),
            // The path the forward chose for these sizes: it ran untuned.
            forward_path: None,
            dout: saved.dout.gather("grad_out", qr.clone(), &mut dobuf)?,
        };
        let qv = q.gather("q", qr.clone(), &mut qbuf)?;
        let (kv, vv) = (k.gather("k", kr.clone(), &mut kbuf)?, v.gather("v", kr.clone(), &mut vbuf)?);
        let sg = attention_backward(kernel, &qv, &kv, &vv, &seq_saved, &c.params(params, s), false)?;
        scatter_rows(&sg.dq, &mut g.dq, qr, c.hq, c.dk);
        scatter_rows(&sg.dk, &mut g.dk, kr, c.hkv, c.dk);
        scatter_rows(&sg.dv, &mut g.dv, kr, c.hkv, c.dv);
    }
    Ok(g)
}
