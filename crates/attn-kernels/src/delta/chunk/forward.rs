//! The chunked forward: per head, each chunk's outputs `O = diag(Γ)·Q·S₀ + P·U` (the channel
//! gate's `Q⁺·S₀ + P·U`) and the state carried to the next chunk (the module header's algebra).

use rayon::prelude::*;

use super::{Chunk, Head};
use crate::alloc;
use crate::delta::reference::At;
use crate::delta::{check, DeltaDims, DeltaInputs, DeltaOutput, DeltaParams, Gate};
use crate::disjoint::Disjoint;
use crate::error::Result;
use crate::linear::gemm::{gemm, Lhs, Part};
use crate::simd::Isa;

/// The gated delta rule's outputs `o: [B, T, Hv, Dv]` and final states `[N, Hv, Dk, Dv]` in `f32`
/// (the `delta` module's header); refuses inputs that do not match `d` and `p`, naming the
/// argument.
pub fn delta_rule(d: &DeltaDims, x: &DeltaInputs<f32>, p: &DeltaParams) -> Result<DeltaOutput<f32>> {
    let scale = check(d, x, p)? as f32;
    let mut out = alloc::zeroed("delta rule output", &[d.v_len()])?;
    let mut final_state = alloc::zeroed("delta rule final state", &[d.state_len(x.sequences(d))])?;
    let (dk, dv, hv) = (d.dk, d.dv, d.hv);
    let isa = Isa::best();
    let at = At::new(d, x, p.gate);
    // Each (n, h) owns its state and its output rows (`Dv` apart from those of the token's other
    // heads), which it writes a chunk at a time.
    let rows = Disjoint::new(&mut out);
    final_state.par_chunks_mut(dk * dv).enumerate().for_each(|(bh, s)| {
        let (n, h) = (bh / hv, bh % hv);
        let head = Head { d, x, p, scale, n, h };
        head.forward(isa, x.initial_state.map(|i| &i[bh * dk * dv..][..dk * dv]), s, &mut |t0, o: &[f32]| {
            for (t, row) in (t0..).zip(o.chunks_exact(dv)) {
                // SAFETY: token `t`'s row of head `(n, h)` is written by this head alone.
                unsafe { rows.part(at.v(n, t, h), dv) }.copy_from_slice(row);
            }
        });
    });
    Ok(DeltaOutput { out, final_state })
}

/// Sequences shorter than this run token by token (decoding: one token against a cached state),
/// where a chunk's products and inverse would cost more than the two passes over the state.
const SHORT: usize = 4;

impl Head<'_> {
    /// The head in chunks from the initial state `init` (zeros when `None`): `s` (`[Dk, Dv]`,
    /// zeros on entry) is left holding the final state; each chunk's outputs (`[n, Dv]`) go to
    /// `emit` with the chunk's first token.
    fn forward(&self, isa: Isa, init: Option<&[f32]>, s: &mut [f32], emit: &mut impl FnMut(usize, &[f32])) {
        let (dk, dv) = (self.d.dk, self.d.dv);
        let t = self.tokens();
        let mut o = vec![0.0f32; super::CHUNK.min(t) * dv];
        if t < SHORT {
            self.tokens_one_by_one(0, t, init, s, &mut o);
            return emit(0, &o);
        }
        if let Some(init) = init {
            s.copy_from_slice(init);
        }
        let mut c = Chunk::new(dk, dv);
        for t0 in (0..t).step_by(super::CHUNK) {
            let n = super::CHUNK.min(t - t0);
            let r = self.rows(t0, n);
            let out = &mut o[..n * dv];
            if self.p.gate == Gate::Channel {
                if !c.fill_channel(isa, &r, s, (dk, dv), true) {
                    out.fill(0.0);
                    self.tokens_one_by_one(t0, n, None, s, out);
                    emit(t0, out);
                    continue;
                }
                gemm(isa, n, dv, dk, Lhs::rows(&c.qplus, dk).write(true), s, dv, out, dv);
            } else {
                c.fill(isa, &r, s, (dk, dv), true);
                gemm(isa, n, dv, dk, Lhs::rows(&r.q, dk).write(true), s, dv, out, dv);
                for (row, g) in out.chunks_exact_mut(dv).zip(&c.gamma) {
                    let decay = g.exp() as f32;
                    row.iter_mut().for_each(|x| *x *= decay);
                }
            }
            gemm(isa, n, dv, n, Lhs::rows(&c.p, n).part(Part::LowerA), &c.u, dv, out, dv);
            emit(t0, out);
            if self.p.gate == Gate::Channel {
                c.advance_channel(isa, &r, s, (dk, dv));
            } else {
                c.advance(isa, &r, s, (dk, dv));
            }
        }
    }

    /// Tokens `t0..t0 + n` of the head one by one, each token two passes over the state (the
    /// prediction `S'ᵀk` read, then every row decayed, corrected and read into the output); the
    /// first token reads `init` when given (so a decode step reads the cached state straight into
    /// the new one, with no copy first), every other `s`; `s` as in [`Head::forward`], `o`
    /// (`[n, Dv]`, zeros on entry) receives the span's outputs.
    pub(super) fn tokens_one_by_one(
        &self,
        t0: usize,
        n: usize,
        mut init: Option<&[f32]>,
        s: &mut [f32],
        o: &mut [f32],
    ) {
        let (dk, dv) = (self.d.dk, self.d.dv);
        let mut u = vec![0.0f32; dv];
        let mut old = vec![0.0f32; dv];
        let mut decays = vec![0.0f32; dk];
        for t in t0..t0 + n {
            let r = self.rows(t, 1);
            match self.p.gate {
                Gate::Scalar => decays.fill(r.g[0].exp()),
                Gate::Channel => decays.iter_mut().zip(&r.g).for_each(|(a, g)| *a = g.exp()),
            }
            u.fill(0.0);
            let src = init.unwrap_or(s);
            for ((row, &ki), &a) in src.chunks_exact(dv).zip(&r.k).zip(&decays) {
                let c = ki * a;
                u.iter_mut().zip(row).for_each(|(u, &x)| *u += c * x);
            }
            u.iter_mut().zip(&r.v).for_each(|(u, &v)| *u = r.beta[0] * (v - *u));
            let out = &mut o[(t - t0) * dv..][..dv];
            for (i, ((&ki, &qi), &a)) in r.k.iter().zip(&r.q).zip(&decays).enumerate() {
                old.copy_from_slice(&init.unwrap_or(s)[i * dv..][..dv]);
                let row = &mut s[i * dv..][..dv];
                for (((x, &prev), &uj), o) in row.iter_mut().zip(&old).zip(&u).zip(out.iter_mut()) {
                    *x = a * prev + ki * uj;
                    *o += qi * *x;
                }
            }
            init = None;
        }
        // No token (an empty sequence): the final state is the initial one.
        if let Some(init) = init {
            s.copy_from_slice(init);
        }
    }
}
