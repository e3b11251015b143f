//! A paged KV cache for serving ([`PagedCache`]): fixed-size pages of keys and values shared by
//! many sequences, allocated as they grow, stored as f32, f16, bf16, int8 (q8_0) or fp8 e4m3
//! ([`KvDtype`], quantized on write), with sequences forked copy-on-write (a fork shares every
//! page of its parent; the first write to a shared page copies it), freed back to a free list,
//! and attended through the kernels' paged attention (`attn_kernels::paged`), every sequence of
//! a batch against its own length in one call.
//!
//! - `store`: one tensor's pages in one storage type.

mod store;

pub use attn_kernels::paged::PagedParams;
use attn_kernels::paged::{paged_attention, PagedKv, Q8_BLOCK};
use attn_kernels::view::View4;
use candle_core::Tensor;

use crate::convert::float_values;
use crate::error::{AttnLibError, Result};
pub use store::KvDtype;
use store::Store;

/// A paged cache's geometry and storage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheConfig {
    /// Positions per page (≥ 1).
    pub page_size: usize,
    /// Key/value heads `Hkv`.
    pub heads: usize,
    /// Key head dimension `Dk`.
    pub dk: usize,
    /// Value head dimension `Dv`.
    pub dv: usize,
    /// How keys and values are stored.
    pub dtype: KvDtype,
}

/// A sequence of a [`PagedCache`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SeqId(usize);

/// A sequence's pages, in position order, and its length.
#[derive(Debug, Clone, Default)]
struct Seq {
    pages: Vec<u32>,
    len: usize,
}

/// Pages of keys and values `[num_pages, page_size, Hkv, D]` and the sequences living in them.
#[derive(Debug, Clone)]
pub struct PagedCache {
    cfg: CacheConfig,
    k: Store,
    v: Store,
    /// Sequences holding each page (0: free).
    refs: Vec<u32>,
    free: Vec<u32>,
    seqs: Vec<Option<Seq>>,
    /// Unit fp8 scales for a cache not yet written.
    unit: Vec<f32>,
}

impl PagedCache {
    /// An empty cache; refuses a page size of 0, no heads, an empty head dimension, or int8
    /// with a head dimension that is not a multiple of 32.
    pub fn new(cfg: CacheConfig) -> Result<Self> {
        let bad = |field, reason: String| Err(AttnLibError::Value { field, reason });
        if cfg.page_size == 0 {
            return bad("page_size", "must be at least 1".into());
        }
        if cfg.heads == 0 || cfg.dk == 0 || cfg.dv == 0 {
            return bad("cache", format!("{} heads of Dk {} and Dv {}: none may be 0", cfg.heads, cfg.dk, cfg.dv));
        }
        if cfg.dtype == KvDtype::Int8 && (!cfg.dk.is_multiple_of(Q8_BLOCK) || !cfg.dv.is_multiple_of(Q8_BLOCK)) {
            return bad(
                "kv_dtype",
                format!("int8 stores blocks of {Q8_BLOCK} along D; Dk {} and Dv {} must be multiples", cfg.dk, cfg.dv),
            );
        }
        Ok(Self {
            cfg,
            k: Store::new(cfg.dtype),
            v: Store::new(cfg.dtype),
            refs: Vec::new(),
            free: Vec::new(),
            seqs: Vec::new(),
            unit: vec![1.0; cfg.heads],
        })
    }

    /// The geometry and storage.
    pub fn config(&self) -> CacheConfig {
        self.cfg
    }

    /// A new, empty sequence.
    pub fn allocate(&mut self) -> SeqId {
        let slot = self.seqs.iter().position(Option::is_none).unwrap_or(self.seqs.len());
        if slot == self.seqs.len() {
            self.seqs.push(None);
        }
        self.seqs[slot] = Some(Seq::default());
        SeqId(slot)
    }

    /// Positions cached for `seq`.
    pub fn len(&self, seq: SeqId) -> Result<usize> {
        Ok(self.seq(seq)?.len)
    }

    /// Pages allocated (held by a sequence or free).
    pub fn num_pages(&self) -> usize {
        self.refs.len()
    }

    /// Pages held by at least one sequence.
    pub fn pages_in_use(&self) -> usize {
        self.refs.len() - self.free.len()
    }

    /// A new sequence equal to `seq`, sharing its pages until either writes to one.
    pub fn fork(&mut self, seq: SeqId) -> Result<SeqId> {
        let copy = self.seq(seq)?.clone();
        for &p in &copy.pages {
            self.refs[p as usize] += 1;
        }
        let id = self.allocate();
        self.seqs[id.0] = Some(copy);
        Ok(id)
    }

    /// Ends `seq`: the pages no other sequence holds go back to the free list.
    pub fn free(&mut self, seq: SeqId) -> Result<()> {
        let s = self.seq(seq)?.clone();
        for &p in &s.pages {
            self.refs[p as usize] -= 1;
            if self.refs[p as usize] == 0 {
                self.free.push(p);
            }
        }
        self.seqs[seq.0] = None;
        Ok(())
    }

    /// Writes `k: [n, Hkv, Dk]` and `v: [n, Hkv, Dv]` (any float dtype, quantized as the cache
    /// stores) after `seq`'s positions, taking pages from the free list or growing the cache;
    /// a shared last page is copied first. Nothing is written when an argument is refused.
    pub fn append(&mut self, seq: SeqId, k: &Tensor, v: &Tensor) -> Result<()> {
        let c = self.cfg;
        let n = k.dims().first().copied().unwrap_or(0);
        for (name, t, d) in [("k", k, c.dk), ("v", v, c.dv)] {
            if t.dims() != [n, c.heads, d] {
                return Err(AttnLibError::Shape {
                    tensor: name,
                    found: t.dims().to_vec(),
                    expected: format!("[n, Hkv {}, D {d}] with the same n as k", c.heads),
                });
            }
        }
        let (kx, vx) = (float_values::<f32>("k", k)?, float_values::<f32>("v", v)?);
        if let Some(name) = [("k", &kx), ("v", &vx)].iter().find(|(_, x)| x.iter().any(|a| !a.is_finite())).map(|p| p.0)
        {
            return Err(AttnLibError::Value { field: name, reason: "holds a NaN or infinite value".into() });
        }
        let mut s = self.seq(seq)?.clone();
        let (ps, row_k, row_v) = (c.page_size, c.heads * c.dk, c.heads * c.dv);
        let shared_last = s.len % ps != 0 && self.refs[*s.pages.last().expect("a partial page") as usize] > 1;
        self.reserve((s.len + n).div_ceil(ps) - s.pages.len() + usize::from(shared_last && n > 0))?;
        let mut done = 0;
        while done < n {
            let slot = s.len % ps;
            if slot == 0 {
                s.pages.push(self.take_page());
            } else {
                let last = s.pages.len() - 1;
                let p = s.pages[last] as usize;
                if self.refs[p] > 1 {
                    let fresh = self.take_page();
                    self.k.copy(p * ps * row_k, fresh as usize * ps * row_k, ps * row_k);
                    self.v.copy(p * ps * row_v, fresh as usize * ps * row_v, ps * row_v);
                    self.refs[p] -= 1;
                    s.pages[last] = fresh;
                }
            }
            let page = *s.pages.last().expect("a page was just ensured") as usize;
            let m = (ps - slot).min(n - done);
            let r0 = (page * ps + slot) * c.heads;
            self.k.write(r0, &kx[done * row_k..(done + m) * row_k], c.heads, c.dk);
            self.v.write(r0, &vx[done * row_v..(done + m) * row_v], c.heads, c.dv);
            s.len += m;
            done += m;
        }
        self.seqs[seq.0] = Some(s);
        Ok(())
    }

    /// Attention of `q: [B, Hq, Lq, Dk]` (the last `Lq` positions of each sequence, already
    /// appended) against the sequences `seqs` (`B` of them) → `(out: [B, Hq, Lq, Dv], lse: [B,
    /// Hq, Lq])`, f32, with the kernels' paged semantics (causal and windows bottom-right).
    pub fn attend(&self, q: &Tensor, seqs: &[SeqId], p: &PagedParams) -> Result<(Tensor, Tensor)> {
        let dims: [usize; 4] = q.dims().try_into().map_err(|_| AttnLibError::Shape {
            tensor: "q",
            found: q.dims().to_vec(),
            expected: "rank 4 [B, Hq, Lq, Dk]".into(),
        })?;
        let [b, hq, lq, _] = dims;
        if b != seqs.len() {
            return Err(AttnLibError::Shape {
                tensor: "q",
                found: q.dims().to_vec(),
                expected: format!("B = {} (one row per sequence)", seqs.len()),
            });
        }
        let lists: Vec<&Seq> = seqs.iter().map(|&s| self.seq(s)).collect::<Result<_>>()?;
        let max_pages = lists.iter().map(|s| s.pages.len()).max().unwrap_or(0).max(1);
        let mut table = vec![0i32; b * max_pages];
        for (row, s) in table.chunks_mut(max_pages).zip(&lists) {
            row.iter_mut().zip(&s.pages).for_each(|(t, &p)| *t = p as i32);
        }
        let seqlens: Vec<i32> = lists.iter().map(|s| s.len as i32).collect();
        let cache = self.kernel_view(&table, &seqlens);
        let qd = float_values::<f32>("q", q)?;
        let mut out = vec![0.0f32; b * hq * lq * self.cfg.dv];
        let mut lse = vec![0.0f32; b * hq * lq];
        paged_attention(&View4::contiguous("q", &qd, dims)?, &cache, p, &mut out, &mut lse)?;
        Ok((
            Tensor::from_vec(out, (b, hq, lq, self.cfg.dv), q.device())?,
            Tensor::from_vec(lse, (b, hq, lq), q.device())?,
        ))
    }

    /// `seq`'s keys `[Hkv, len, Dk]` and values `[Hkv, len, Dv]` as the kernel reads them
    /// (dequantized), dense: for checks and for callers that need a copy.
    pub fn gather(&self, seq: SeqId) -> Result<(Tensor, Tensor)> {
        let s = self.seq(seq)?;
        let table: Vec<i32> = if s.pages.is_empty() { vec![0] } else { s.pages.iter().map(|&p| p as i32).collect() };
        let lens = [s.len as i32];
        let cache = self.kernel_view(&table, &lens);
        let (k, v) = cache.gather(0);
        let dev = &candle_core::Device::Cpu;
        Ok((
            Tensor::from_vec(k, (self.cfg.heads, s.len, self.cfg.dk), dev)?,
            Tensor::from_vec(v, (self.cfg.heads, s.len, self.cfg.dv), dev)?,
        ))
    }

    /// The kernels' view of the pages with a block table and lengths.
    fn kernel_view<'a>(&'a self, block_table: &'a [i32], seqlens: &'a [i32]) -> PagedKv<'a> {
        let c = self.cfg;
        PagedKv {
            k: self.k.pages(&self.unit),
            v: self.v.pages(&self.unit),
            page_size: c.page_size,
            heads: c.heads,
            dk: c.dk,
            dv: c.dv,
            block_table,
            seqlens,
        }
    }

    fn seq(&self, seq: SeqId) -> Result<&Seq> {
        self.seqs.get(seq.0).and_then(Option::as_ref).ok_or_else(|| AttnLibError::Value {
            field: "seq",
            reason: format!("sequence {} is not in this cache (freed or never allocated)", seq.0),
        })
    }

    /// Makes sure `n` pages are free, growing the storage by half (at least 16 pages, at least
    /// what is missing).
    fn reserve(&mut self, n: usize) -> Result<()> {
        if self.free.len() >= n {
            return Ok(());
        }
        let old = self.refs.len();
        let new = (old + old / 2).max(old + 16).max(old + n - self.free.len());
        if new > i32::MAX as usize {
            return Err(AttnLibError::Value {
                field: "paged cache",
                reason: format!("{new} pages: more than a block table (i32) can name"),
            });
        }
        let c = self.cfg;
        self.k.resize(new * c.page_size * c.heads * c.dk)?;
        self.v.resize(new * c.page_size * c.heads * c.dv)?;
        self.refs.resize(new, 0);
        self.free.extend((old as u32..new as u32).rev());
        Ok(())
    }

    /// A free page ([`reserve`](Self::reserve) made sure there is one), now held once.
    fn take_page(&mut self) -> u32 {
        let p = self.free.pop().expect("pages reserved before the write");
        self.refs[p as usize] = 1;
        p
    }
}
