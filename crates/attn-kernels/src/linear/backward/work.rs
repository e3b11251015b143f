//! A backward job's scratch ([`Work`]): one chunk's features, gradients and masked products,
//! the running key and query states, and causal, the key states kept before each chunk; the
//! state updates and the query side's gradient steps on them; and where a chunk reads its key
//! states from ([`KeyState`]).

use super::{Acc, Head};
use crate::linear::gemm::{gemm, Lhs};
use crate::linear::rows::{add_rows, axpy};
use crate::linear::LinearDims;
use crate::lines::Lines;
use crate::reference::Real;

/// One job's scratch: a chunk's features, gradients, masked products and row statistics, and
/// the states.
pub(super) struct Work<T> {
    /// `[C, F]` each.
    pub(super) fq: Lines<T>,
    pub(super) fk: Lines<T>,
    pub(super) dfq: Lines<T>,
    pub(super) dfk: Lines<T>,
    /// `dN_c: [C, Dv]`, `r_c: [C]`.
    pub(super) dn: Lines<T>,
    pub(super) r: Lines<T>,
    /// `P`, `M`: `[C, C]`, and the transposed operand `tril_products` makes.
    pub(super) pm: Lines<T>,
    pub(super) mm: Lines<T>,
    pub(super) bt: Lines<T>,
    /// The states `Sᵀ: [Dv, F]`, `z: [F]`, `U: [F, Dv]` (and `Uᵀ`), `w: [F]`.
    pub(super) st: Lines<T>,
    pub(super) z: Lines<T>,
    pub(super) u: Lines<T>,
    pub(super) ut: Lines<T>,
    pub(super) wsum: Lines<T>,
    /// A chunk's row statistics `[C, 2]`: each row's denominator `den_i` and `r_i`.
    pub(super) stats: Lines<T>,
    /// Causal, the key states before each chunk `[⌈L/C⌉, Dv·F + F]` (`causal::key_states`): `Sᵀ`,
    /// then `z`.
    pub(super) states: Lines<T>,
    /// A chunk's key gradient before it is added, `[C, D]`.
    pub(super) dx: Lines<T>,
}

impl<T: Real> Work<T> {
    pub(super) fn new(d: &LinearDims, c: usize) -> Self {
        let c = c.min(d.lq.max(d.lk));
        let zeros = |n| Lines::filled(n, T::zero());
        let (f, w) = (d.f, d.dv);
        Work {
            fq: zeros(c * f),
            fk: zeros(c * f),
            dfq: zeros(c * f),
            dfk: zeros(c * f),
            dn: zeros(c * w),
            r: zeros(c),
            pm: zeros(c * c),
            mm: zeros(c * c),
            bt: Lines::default(),
            st: zeros(w * f),
            z: zeros(f),
            u: zeros(f * w),
            ut: zeros(w * f),
            wsum: zeros(f),
            stats: zeros(2 * c),
            states: Lines::default(),
            dx: zeros(c * d.d),
        }
    }

    /// The chunk length.
    pub(super) fn chunk(&self) -> usize {
        self.r.len()
    }
}

impl<T: Real> Work<T> {
    /// The states `Sᵀ`, `z`, `U`, `w` cleared for a new head.
    pub(super) fn clear_states(&mut self) {
        let states = self.st.iter_mut().chain(self.z.iter_mut()).chain(self.u.iter_mut());
        states.chain(self.wsum.iter_mut()).for_each(|x| *x = T::zero());
    }

    /// `Sᵀ += V_cᵀ·φ(K_c)`, `z += Σ φ(K_c)` for the `nk` keys from `t0` (their features in `fk`).
    #[inline(always)]
    pub(super) fn add_keys(&mut self, hd: &Head<T>, t0: usize, nk: usize) {
        let (f, wd, keys) = (hd.d.f, hd.d.dv, &hd.keys);
        let fk = &self.fk[..nk * f];
        gemm(hd.isa, wd, f, nk, Lhs::transposed(keys.values(t0), keys.ldv), fk, f, &mut self.st, f);
        add_rows(&mut self.z, fk, nk);
    }

    /// `dφ(Q_c) = dN_c·Sᵀ + r·zᵀ` into `dfq` for the chunk's `n` rows (`dN_c`, `r_c` in `dn`, `r`),
    /// with the key states `at` names.
    #[inline(always)]
    pub(super) fn query_grads(&mut self, hd: &Head<T>, n: usize, at: KeyState) {
        let (f, wd) = (hd.d.f, hd.d.dv);
        let (st, z) = at.of(hd.d, &self.st, &self.z, &self.states);
        let dfq = &mut self.dfq[..n * f];
        gemm(hd.isa, n, f, wd, Lhs::rows(&self.dn[..n * wd], wd).write(true), st, f, dfq, f);
        dfq.chunks_exact_mut(f).zip(&self.r[..n]).for_each(|(row, &ri)| axpy(row, ri, z));
    }

    /// `U += φ(Q_c)ᵀ·dN_c`, `w += Σ_i r_i φ(q_i)` for the chunk's `n` rows.
    #[inline(always)]
    pub(super) fn add_queries(&mut self, hd: &Head<T>, n: usize) {
        let (f, wd) = (hd.d.f, hd.d.dv);
        let fq = &self.fq[..n * f];
        gemm(hd.isa, f, wd, n, Lhs::transposed(fq, f), &self.dn[..n * wd], wd, &mut self.u, wd);
        fq.chunks_exact(f).zip(&self.r[..n]).for_each(|(x, &ri)| axpy(&mut self.wsum, ri, x));
    }

    /// `dq` of the chunk's `n` rows from `t0` through `φ`'s Jacobian, from `dφ(Q_c)` in `dfq`.
    #[inline(always)]
    pub(super) fn query_vjp(&mut self, hd: &Head<T>, t0: usize, n: usize, acc: &mut Acc<T>) {
        let (f, dq) = (hd.d.f, &mut acc.dq[(t0 - acc.base) * hd.d.d..]);
        hd.rows.vjp(hd.isa, hd.p.map, t0, n, &self.fq[..n * f], &mut self.dfq[..n * f], dq);
    }
}

/// Where a chunk's key states `Sᵀ`, `z` are read: the running ones (`Work::st`, `Work::z`), or
/// those `causal::key_states` kept before chunk `c` (`Work::states`).
#[derive(Debug, Clone, Copy)]
pub(super) enum KeyState {
    Running,
    Kept(usize),
}

impl KeyState {
    /// `(Sᵀ: [Dv, F], z: [F])`, from the running `st`, `z` or the kept `states`.
    #[inline(always)]
    pub(super) fn of<'a, T>(self, d: &LinearDims, st: &'a [T], z: &'a [T], states: &'a [T]) -> (&'a [T], &'a [T]) {
        let fdv = d.f * d.dv;
        match self {
            KeyState::Running => (st, z),
            KeyState::Kept(c) => states[c * (fdv + d.f)..][..fdv + d.f].split_at(fdv),
        }
    }
}
