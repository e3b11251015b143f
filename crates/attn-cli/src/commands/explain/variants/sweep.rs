//! The time and memory sweep of `attn explain variants`: each variant's causal self-attention on
//! seeded `[1, H, L, D]` inputs, forward and forward + backward (the backward of `Σ out`), timed by
//! [`measure`] (memory: the most a call holds beyond its output). A block-sparse pattern's mask is
//! built before timing. The report prints the points, draws three log-log plots with each series'
//! fitted slope, and writes `variants.md`: the points and the seed table's complexity column with
//! the measured slopes beside it.

use std::fmt::Write as _;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use attn::alloc::human_bytes;
use attn::chart::{draw_lines, log_log_slope, LineChart, Series};
use attn::delta::{DeltaOptions, DeltaParams};
use attn::linear::FeatureMap;
use attn::sparse::Pattern;
use attn::{Kernel, LinearOptions, SdpaOptions};
use candle_core::{Tensor, Var};
use indicatif::ProgressBar;

use super::Args;
use crate::measure::{measure, Budget, Measurement};

/// The variants, in the plots' order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Variant {
    Dense,
    Flash,
    Window,
    Strided,
    LinearElu,
    Favor(usize),
    GatedDelta,
}

const VARIANTS: [Variant; 8] = [
    Variant::Dense,
    Variant::Flash,
    Variant::Window,
    Variant::Strided,
    Variant::LinearElu,
    Variant::Favor(64),
    Variant::Favor(256),
    Variant::GatedDelta,
];

/// Keys before the diagonal of the sliding window.
const WINDOW: usize = 256;

impl Variant {
    fn name(self) -> String {
        match self {
            Variant::Dense => "exact reference".into(),
            Variant::Flash => "flash".into(),
            Variant::Window => format!("sliding window {WINDOW}"),
            Variant::Strided => "strided sparse, stride ≈ √L".into(),
            Variant::LinearElu => "linear elu+1".into(),
            Variant::Favor(m) => format!("linear FAVOR+ {m}"),
            Variant::GatedDelta => "gated delta rule".into(),
        }
    }

    /// The seed table's complexity: (time, memory beyond the inputs and output).
    fn theory(self) -> (&'static str, &'static str) {
        match self {
            Variant::Dense => ("O(L²·D), one thread", "O(L): one row of scores at a time"),
            Variant::Flash => ("O(L²·D)", "O(L)"),
            Variant::Window => ("O(L·w·D)", "O(L)"),
            Variant::Strided => ("O(L·√L·D)", "O(L) + mask"),
            Variant::LinearElu => ("O(L·D²)", "O(L·D)"),
            Variant::Favor(_) => ("O(L·m·D)", "O(L·m)"),
            Variant::GatedDelta => ("O(L·D²) (+ O(L·C·D) in chunks of C = 64)", "O(L·D)"),
        }
    }

    /// Time grows with `L²`.
    fn quadratic(self) -> bool {
        matches!(self, Variant::Dense | Variant::Flash)
    }
}

/// One case to measure.
#[derive(Debug, Clone, Copy)]
pub(super) struct Case {
    variant: Variant,
    l: usize,
    backward: bool,
}

/// The cases of the sweep over `lengths`: the reference up to `--dense-max`, the quadratic series'
/// backward up to `--quadratic-backward-max`.
pub(super) fn plan(args: &Args, lengths: &[usize]) -> Vec<Case> {
    let mut cases = Vec::new();
    for &l in lengths {
        for variant in VARIANTS {
            for backward in [false, true] {
                let skip = (variant == Variant::Dense && l > args.dense_max)
                    || (backward && variant.quadratic() && l > args.quadratic_backward_max);
                if !skip {
                    cases.push(Case { variant, l, backward });
                }
            }
        }
    }
    cases
}

/// One measured case.
pub(super) struct Point {
    case: Case,
    m: Measurement,
}

impl Point {
    fn ms(&self) -> f64 {
        self.m.median() * 1e3
    }
    fn mib(&self) -> f64 {
        self.m.extra_bytes as f64 / (1u64 << 20) as f64
    }
}

/// The attention of `variant` on `q`, `k`, `v` (`[1, H, L, D]`), causal.
type Call = Box<dyn Fn(&Tensor, &Tensor, &Tensor) -> anyhow::Result<Tensor> + Send + Sync>;

/// The gated delta rule as Qwen3-Next calls it (L2-normalised `q` and `k`, a scalar decay per
/// head and token), `q, k, v: [1, H, L, D]` read as `[1, L, H, D]`, with a fixed mild decay
/// `g = −0.05` and step size `β = 0.5` (their values do not change the work).
fn gated_delta(q: &Tensor, k: &Tensor, v: &Tensor) -> anyhow::Result<Tensor> {
    let (b, h, l, _) = q.dims4()?;
    let g = Tensor::full(-0.05f32, (b, l, h), q.device())?;
    let beta = Tensor::full(0.5f32, (b, l, h), q.device())?;
    let [q, k, v] = [q, k, v].map(|x| x.transpose(1, 2));
    let opts = DeltaOptions { params: DeltaParams { l2norm_qk: true, ..DeltaParams::default() }, cu_seqlens: None };
    Ok(attn::delta_rule(&q?, &k?, &v?, &g, &beta, None, &opts)?.out)
}

/// The call of `variant` at length `l` (a pattern's mask built here, untimed).
fn call(variant: Variant, l: usize, d: usize, pool: &rayon::ThreadPool) -> anyhow::Result<Call> {
    let sdpa = |opts: SdpaOptions| -> Call { Box::new(move |q, k, v| Ok(attn::sdpa(q, k, v, &opts)?)) };
    let linear = |opts: LinearOptions| -> Call {
        let opts = opts.causal(true);
        Box::new(move |q, k, v| Ok(attn::linear_attention(q, k, v, &opts)?))
    };
    let causal = SdpaOptions::default().causal(true);
    Ok(match variant {
        Variant::Dense => sdpa(causal.kernel(Kernel::Reference)),
        Variant::Flash => sdpa(causal),
        Variant::Window => sdpa(causal.window(Some(WINDOW), Some(0))),
        Variant::Strided => {
            let stride = ((l as f64).sqrt() / 64.0).round().max(1.0) as usize * 64;
            let mask = pool.install(|| Pattern::Strided { stride }.block_mask(l, l))?;
            sdpa(SdpaOptions::default().block_mask(Arc::new(mask)))
        }
        Variant::LinearElu => linear(LinearOptions::new(FeatureMap::Elu)),
        Variant::Favor(m) => linear(LinearOptions::favor(d, m, 0)?),
        Variant::GatedDelta => Box::new(gated_delta),
    })
}

/// Measures every case of `plan` until done or `stop` is raised.
pub(super) fn run(
    args: &Args,
    plan: &[Case],
    pool: &rayon::ThreadPool,
    bar: &ProgressBar,
    stop: &AtomicBool,
) -> anyhow::Result<Vec<Point>> {
    let (h, d) = (args.heads, args.dim);
    println!(
        "causal self-attention on [1, {h}, L, {d}], {} thread(s): median of up to {} calls; memory: the most a call \
         holds beyond its output",
        pool.current_num_threads(),
        args.iters
    );
    println!("{:>6} {:<28} {:<18} {:>12} {:>12}", "L", "variant", "pass", "ms", "memory");
    let mut points = Vec::new();
    let mut inputs: Option<(usize, [Var; 3])> = None;
    for &case in plan {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let Case { variant, l, backward } = case;
        let pass = if backward { "forward + backward" } else { "forward" };
        bar.set_message(format!("L {l}, {}, {pass}", variant.name()));
        if inputs.as_ref().is_none_or(|(at, _)| *at != l) {
            let x = |seed| -> anyhow::Result<Var> {
                Ok(Var::from_tensor(&attn::random::uniform(&[1, h, l, d], -1.0, 1.0, seed)?)?)
            };
            inputs = Some((l, [x(1)?, x(2)?, x(3)?]));
        }
        let [q, k, v] = &inputs.as_ref().expect("set above").1;
        let f = call(variant, l, d, pool)?;
        let budget = Budget { warmup: usize::from(l < 8192), iters: args.iters, seconds: 2.0 };
        let m = measure(budget, || {
            pool.install(|| {
                let out = f(q.as_tensor(), k.as_tensor(), v.as_tensor())?;
                if backward {
                    out.sum_all()?.backward()?;
                }
                Ok(out)
            })
        })?;
        let p = Point { case, m };
        crate::commands::say(
            bar,
            format!(
                "{l:>6} {:<28} {pass:<18} {:>12.3} {:>12}",
                variant.name(),
                p.ms(),
                human_bytes(p.m.extra_bytes as f64, true)
            ),
        );
        points.push(p);
        bar.inc(1);
    }
    Ok(points)
}

/// Each variant's `(L, value)` points of the pass chosen, named with their fitted slope.
fn series(points: &[Point], backward: bool, value: fn(&Point) -> f64) -> Vec<(Variant, Option<f64>, Series)> {
    VARIANTS
        .iter()
        .map(|&variant| {
            let pts: Vec<(f64, f64)> = points
                .iter()
                .filter(|p| p.case.variant == variant && p.case.backward == backward)
                .map(|p| (p.case.l as f64, value(p)))
                .collect();
            let slope = log_log_slope(&pts);
            let shown = slope.map_or("-".to_string(), |k| format!("{k:.2}"));
            (variant, slope, Series { name: format!("{} (slope {shown})", variant.name()), points: pts })
        })
        .collect()
}

/// Prints the slopes and draws `variants-forward.png`, `variants-forward-backward.png` and
/// `variants-memory.png`; returns the paths written and the Markdown of the complexity table and
/// the points.
pub(super) fn report(args: &Args, points: &[Point], dir: &Path) -> anyhow::Result<(Vec<String>, String)> {
    let (h, d) = (args.heads, args.dim);
    let forward = series(points, false, Point::ms);
    let both = series(points, true, Point::ms);
    let memory = series(points, false, Point::mib);
    let mut written = Vec::new();
    for (file, title, y, s) in [
        ("variants-forward.png", format!("causal forward, [1, {h}, L, {d}]"), "milliseconds", &forward),
        (
            "variants-forward-backward.png",
            format!("causal forward + backward, [1, {h}, L, {d}]"),
            "milliseconds",
            &both,
        ),
        ("variants-memory.png", "forward: memory beyond the output".to_string(), "MiB", &memory),
    ] {
        let chart = LineChart {
            title,
            x_label: "length L".into(),
            y_label: y.into(),
            log_x: true,
            log_y: true,
            series: s.iter().map(|(_, _, s)| s.clone()).filter(|s| !s.points.is_empty()).collect(),
        };
        let path = dir.join(file);
        draw_lines(&path, &chart)?;
        written.push(path.display().to_string());
    }
    let slope = |s: &[(Variant, Option<f64>, Series)], i: usize| s[i].1.map_or("-".to_string(), |k| format!("{k:.2}"));
    let mut md = format!(
        "Causal self-attention on `[1, {h}, L, {d}]`, {} timed call(s) at most per case.\n\n\
         ## Complexity: the seed table's column and the fitted log-log slopes\n\n\
         | variant | time | memory | slope, forward time | slope, forward + backward time | slope, forward memory |\n\
         |---|---|---|---|---|---|\n",
        args.iters
    );
    for (i, variant) in VARIANTS.iter().enumerate() {
        let (time, mem) = variant.theory();
        let row = [slope(&forward, i), slope(&both, i), slope(&memory, i)];
        writeln!(md, "| {} | {time} | {mem} | {} | {} | {} |", variant.name(), row[0], row[1], row[2])?;
    }
    md.push_str("\n## Points\n\n| L | variant | pass | ms | memory |\n|---|---|---|---|---|\n");
    for p in points {
        let pass = if p.case.backward { "forward + backward" } else { "forward" };
        let mem = human_bytes(p.m.extra_bytes as f64, true);
        writeln!(md, "| {} | {} | {pass} | {:.3} | {mem} |", p.case.l, p.case.variant.name(), p.ms())?;
    }
    println!("fitted slopes of log time over log L, forward: {}", names(&forward));
    println!("fitted slopes of log time over log L, forward + backward: {}", names(&both));
    println!("fitted slopes of log memory over log L, forward: {}", names(&memory));
    Ok((written, md))
}

/// The series' names (with their slopes), comma-separated.
fn names(series: &[(Variant, Option<f64>, Series)]) -> String {
    series.iter().map(|(_, _, s)| s.name.as_str()).collect::<Vec<_>>().join(", ")
}
