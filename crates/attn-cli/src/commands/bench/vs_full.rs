//! `attn bench --pattern P --vs-full`: whether the work follows the blocks (issue 18: a pattern
//! computing a fraction `f` of the blocks should take at most `1.25·f` of the full time). Each of
//! `--rounds` rounds times the call without the block mask (the full call, under the same other
//! flags) and with it, one after the other in this process on the same inputs, the order
//! alternating from round to round so that drifting load hits both alike; forward, or forward +
//! backward by the kernels with `--backward`. Reported: `f`, the blocks the pattern computes over
//! those the full call computes ([`spec::blocks`]); each side's median over the rounds of its
//! per-round median; the time ratio pattern/full as the median of the rounds' own ratios; and
//! that ratio over `f`. The mask is built once before timing, its building not counted.

use attn::{sdpa_full, SdpaOptions};
use attn_kernels::Dims;
use serde_json::json;

use super::backward::{grad_out, HostCase};
use super::inputs::Inputs;
use super::sparse::Sparse;
use super::{spec, Args};
use crate::measure::{self, Budget, Measurement};

/// One shape's comparison.
pub struct VsFull {
    /// Blocks computed with the pattern over those of the full call.
    pub f: f64,
    /// Per-round median seconds of the full call, in round order.
    pub full: Vec<f64>,
    /// Per-round median seconds of the pattern's call, in round order.
    pub pattern: Vec<f64>,
}

fn median(xs: impl IntoIterator<Item = f64>) -> f64 {
    Measurement { times: xs.into_iter().collect(), extra_bytes: 0 }.median()
}

impl VsFull {
    /// Times `dims` under `opts` (the pattern's mask in `opts.block_mask`) against the same call
    /// without the mask, `rounds` rounds of `budget` calls each, in `pool`.
    pub fn measure(
        args: &Args,
        pool: &rayon::ThreadPool,
        opts: &SdpaOptions,
        dims: Dims,
        budget: Budget,
        rounds: usize,
    ) -> anyhow::Result<Self> {
        let full_opts = SdpaOptions { block_mask: None, ..opts.clone() };
        let f = spec::blocks(&dims, opts).computed / spec::blocks(&dims, &full_opts).computed.max(f64::MIN_POSITIVE);
        let data = Inputs::random(dims, args.kv_dtype, args.data_seed)?;
        let host =
            if args.backward { Some(HostCase::new(&data, dims, &grad_out(dims, args.data_seed)?)?) } else { None };
        let time = |o: &SdpaOptions| -> anyhow::Result<f64> {
            let m = match &host {
                Some(h) => measure::measure(budget, || pool.install(|| h.step(o))),
                None => measure::measure(budget, || Ok(pool.install(|| sdpa_full(&data.q, &data.k, &data.v, o))?)),
            };
            Ok(m?.median())
        };
        let (mut full, mut pattern) = (Vec::with_capacity(rounds), Vec::with_capacity(rounds));
        for r in 0..rounds {
            if r % 2 == 0 {
                full.push(time(&full_opts)?);
                pattern.push(time(opts)?);
            } else {
                pattern.push(time(opts)?);
                full.push(time(&full_opts)?);
            }
        }
        Ok(Self { f, full, pattern })
    }

    /// The time ratio pattern/full: the median of the rounds' own ratios.
    pub fn ratio(&self) -> f64 {
        median(self.pattern.iter().zip(&self.full).map(|(p, f)| p / f))
    }

    /// The table's header.
    pub fn header() -> String {
        format!(
            "{:<16} {:>3} {:<9} {:>7} {:>11} {:>11} {:>7} {:>7} {:>6}  pattern",
            "shape B,H,Lq,D", "thr", "pass", "f", "full ms", "pattern ms", "ratio", "ratio/f", "rounds"
        )
    }

    /// One table row for `dims` and `sparse`.
    pub fn table_row(&self, args: &Args, threads: usize, dims: &Dims, sparse: &Sparse) -> String {
        format!(
            "{:<16} {:>3} {:<9} {:>7.4} {:>11.3} {:>11.3} {:>7.4} {:>7.3} {:>6}  {}",
            spec::shape_text(dims),
            threads,
            pass(args),
            self.f,
            median(self.full.iter().copied()) * 1e3,
            median(self.pattern.iter().copied()) * 1e3,
            self.ratio(),
            self.ratio() / self.f,
            self.full.len(),
            sparse.pattern
        )
    }

    /// One JSON object for `dims` and `sparse`.
    pub fn json_row(&self, args: &Args, threads: usize, dims: &Dims, sparse: &Sparse) -> serde_json::Value {
        json!({
            "shape": spec::shape_text(dims),
            "threads": threads,
            "backward": args.backward,
            "causal": args.sdpa.causal,
            "kernel": args.sdpa.kernel.name(),
            "pattern": sparse.pattern.to_string(),
            "f": self.f,
            "full_round_s": self.full,
            "pattern_round_s": self.pattern,
            "ratio": self.ratio(),
            "ratio_over_f": self.ratio() / self.f,
            "mask_build_s": sparse.build.median(),
        })
    }
}

fn pass(args: &Args) -> &'static str {
    if args.backward {
        "fwd+bwd"
    } else {
        "forward"
    }
}
