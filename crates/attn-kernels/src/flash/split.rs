//! Split-KV execution: each job's keys cut into the plan's shards, every `(shard, job)` pair run
//! as an independent block into temporary partial results, then each output row merged from its
//! shards through their log-sum-exps ([`merge_row`]). Used only when the plan asks for more than
//! one shard; results equal the unsplit run's under the oracle rule.

use rayon::prelude::*;

use super::block::{Job, Outs, Rest, Work};
use super::plan::shard_ranges;
use crate::alloc::{self, AllocError};
use crate::merge::merge_row;

/// Runs each of `jobs` (with its output rows) as `shards` key ranges of `0..lk` into temporary
/// partials `[rows, dv]` through `block` (one block of the forward on the call's instruction
/// set), then merges them into the jobs' outputs; refuses partials too large to allocate.
pub(super) fn run_split(
    block: &(impl Fn(&Job, Outs, &mut Work) + Sync),
    jobs: Vec<(Job, Outs)>,
    shards: usize,
    lk: usize,
    dv: usize,
) -> Result<(), AllocError> {
    let rows: usize = jobs.iter().map(|(j, _)| j.rows()).sum();
    let ranges = shard_ranges(lk, shards);
    let mut po = alloc::filled("split-KV partial outputs", &[ranges.len(), rows, dv], 0.0f32)?;
    let mut pl = alloc::filled("split-KV partial log-sum-exps", &[ranges.len(), rows], f32::NEG_INFINITY)?;
    let mut pr = alloc::filled("split-KV partial log-sum-exp residues", &[ranges.len(), rows], 0.0f32)?;
    let mut rest = Rest { o: &mut po, lse: &mut pl, residue: &mut pr, w: None };
    let mut tasks = Vec::new();
    for r in &ranges {
        for (j, _) in &jobs {
            tasks.push((Job { keys: r.clone(), ..j.clone() }, rest.take(j.rows(), dv, 0)));
        }
    }
    tasks.into_par_iter().for_each_init(Work::default, |w, (job, o)| block(&job, o, w));
    let mut offsets = Vec::with_capacity(jobs.len());
    jobs.iter().fold(0, |acc, (j, _)| {
        offsets.push(acc);
        acc + j.rows()
    });
    jobs.into_par_iter().zip(offsets).for_each(|((job, o), off)| {
        for r in 0..job.rows() {
            let parts = (0..ranges.len()).map(|s| {
                let row = s * rows + off + r;
                (pl[row], pr[row], &po[row * dv..(row + 1) * dv])
            });
            (o.lse[r], o.residue[r]) = merge_row(parts, &mut o.o[r * dv..(r + 1) * dv]);
        }
    });
    Ok(())
}
