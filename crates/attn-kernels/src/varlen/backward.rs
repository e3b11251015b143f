//! The backward of packed sequences: each sequence (a rayon task, as in the forward) through the
//! dense backward on its queries and output gradient gathered head-major (read tile after tile),
//! its keys, values and output read in place (once per key block into the kernel's packed blocks,
//! once per row for `Δ`), its log-sum-exp rows gathered from the head-major `[Hq, total_q]`, and
//! its gradients copied into the packed layout; with sinks, the sequences' `dsinks` summed.

use rayon::prelude::*;

use super::packed::{scatter_rows, CuSeqlens, Packed, PackedKv};
use super::pool::{Held, Pool};
use super::{split_rows, Call, VarlenOutput};
use crate::alloc;
use crate::dispatch::{attention_backward, Kernel};
use crate::error::{AttnError, Result};
use crate::grad::{AttnGrads, Saved, SideGrads};
use crate::lines::Lines;
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
    /// The gradient of the log-sum-exp `[Hq, total_q]`, when one arrives (see [`SideGrads`]).
    pub dlse: Option<&'a [f32]>,
}

impl<'a> VarlenSaved<'a> {
    /// What the backward needs from `fwd` and the output's gradient `dout: [total_q, Hq, Dv]`.
    pub fn of(fwd: &'a VarlenOutput, dout: Packed<'a, f32>) -> Result<Self> {
        Ok(Self {
            out: Packed::contiguous("out", &fwd.out, dout.dims())?,
            lse: &fwd.lse,
            lse_residue: Some(&fwd.lse_residue),
            dout,
            dlse: None,
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
        let lens = [("lse", Some(self.lse.len())), ("lse_residue", self.lse_residue.map(<[f32]>::len))];
        for (tensor, len) in lens.into_iter().chain([("grad_lse", self.dlse.map(<[f32]>::len))]) {
            if let Some(len) = len.filter(|&n| n != c.hq * c.total_q) {
                let reason = format!("{len} elements, expected [Hq, total_q] = {}", c.hq * c.total_q);
                return Err(AttnError::Layout { tensor, reason });
            }
        }
        Ok(())
    }
}

/// One sequence's buffers: its log-sum-exp rows, residues and gradients, and its gathered
/// queries and output gradients.
#[derive(Default)]
struct Bufs {
    lse: Vec<f32>,
    residue: Vec<f32>,
    dlse: Vec<f32>,
    q: Lines<f32>,
    dout: Lines<f32>,
}

impl Held for Bufs {
    fn held(&self) -> usize {
        [&self.lse, &self.residue, &self.dlse].iter().map(|v| v.held()).sum::<usize>()
            + self.q.held()
            + self.dout.held()
    }
}

/// The backward's buffers, kept for the next sequence and call.
static BUFS: Pool<Bufs> = Pool::new();

/// Gradients of [`attention_varlen`](super::attention_varlen): `q`, `k`, `v`, `cu` and `params` as
/// given to the forward, `saved` its results and the output's gradient; returns
/// `dq: [total_q, Hq, Dk]`, `dk: [total_k, Hkv, Dk]` and `dv: [total_k, Hkv, Dv]` (in the inputs'
/// packed shapes), with sinks `dsinks: [Hq]` summed over the sequences in their order (`dbias` and
/// `dtable` are `None`). Dropout replays the forward's decisions from its seed.
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
        dq: alloc::zeroed("gradient dq", &[tq, c.hq, c.dk])?,
        dk: alloc::zeroed("gradient dk", &[c.total_k, c.hkv, c.dk])?,
        dv: alloc::zeroed("gradient dv", &[c.total_k, c.hkv, c.dv])?,
        dbias: None,
        dtable: None,
        dsinks: None,
    };
    let (hq, hkv, dk, dv) = (c.hq, c.hkv, c.dk, c.dv);
    let gq = split_rows(&mut g.dq, &c.seqs, |(qr, _)| qr.len() * hq * dk);
    let gk = split_rows(&mut g.dk, &c.seqs, |(_, kr)| kr.len() * hkv * dk);
    let gv = split_rows(&mut g.dv, &c.seqs, |(_, kr)| kr.len() * hkv * dv);
    let parts: Vec<_> = gq.into_iter().zip(gk).zip(gv).collect();
    let dsinks = c.seqs.par_iter().zip(parts).enumerate().map(|(s, ((qr, kr), ((gq, gk), gv)))| {
        if c.idle(s, params) {
            return Ok(None);
        }
        let b = &mut BUFS.take();
        let gather = |from: &[f32], to: &mut Vec<f32>| {
            to.clear();
            to.extend((0..hq).flat_map(|h| &from[h * tq + qr.start..h * tq + qr.end]));
        };
        gather(saved.lse, &mut b.lse);
        if let Some(r) = saved.lse_residue {
            gather(r, &mut b.residue);
        }
        if let Some(r) = saved.dlse {
            gather(r, &mut b.dlse);
        }
        let seq_saved = Saved {
            // Read once per row, for `Δ = dO·O`: no gather.
            out: saved.out.view("out", qr.clone())?,
            lse: &b.lse,
            lse_residue: saved.lse_residue.map(|_| &b.residue[..]),
            // The path the forward chose for these sizes: it ran untuned.
            forward_path: None,
            dout: saved.dout.gather("grad_out", qr.clone(), &mut b.dout)?,
            side: SideGrads { dlse: saved.dlse.map(|_| &b.dlse[..]), dweights: None },
        };
        let qv = q.gather("q", qr.clone(), &mut b.q)?;
        // Read once per key block, into the kernel's packed blocks: no gather.
        let (kv, vv) = (k.view("k", kr.clone())?, v.view("v", kr.clone())?);
        let sg = attention_backward(kernel, &qv, &kv, &vv, &seq_saved, &c.params(params, s), false)?;
        BUFS.give(std::mem::take(b));
        scatter_rows(&sg.dq, gq, hq, dk);
        scatter_rows(&sg.dk, gk, hkv, dk);
        scatter_rows(&sg.dv, gv, hkv, dv);
        Ok::<_, AttnError>(sg.dsinks)
    });
    let dsinks: Vec<Option<Vec<f32>>> = dsinks.collect::<Result<_>>()?;
    if params.sinks.is_some() {
        let mut sum = vec![0.0f64; hq];
        for ds in dsinks.iter().flatten() {
            sum.iter_mut().zip(ds).for_each(|(a, &x)| *a += x as f64);
        }
        g.dsinks = Some(sum.into_iter().map(|x| x as f32).collect());
    }
    Ok(g)
}
