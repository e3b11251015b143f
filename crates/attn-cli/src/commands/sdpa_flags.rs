//! The attention flags `attn run` and `attn bench` share (causal, align, window, scale, softcap,
//! dropout, seed, kernel, and the block-sparse pattern's, see [`super::pattern_flags`]), flattened
//! into both commands' arguments, and their one conversion into [`attn::SdpaOptions`] and into the
//! words `run` and `bench` report them in; also the parsers of
//! flags naming one of a fixed set of values (`--align`, `--compute`, `bench --kv-dtype`) and of numbers with a
//! range, which take negative numbers so that they can say the range instead of clap's
//! "unexpected argument".

use std::fmt::Display;
use std::str::FromStr;

use attn::sparse::Pattern;
use attn::{Align, AttnError, Dropout, Kernel, Precision, SdpaOptions, Window};
use attn_kernels::Dims;
use clap::builder::{PossibleValuesParser, TypedValueParser};
use clap::ArgGroup;

use super::flag_of;
use super::pattern_flags::PatternFlags;

/// How one attention call is computed, as given on the command line.
#[derive(clap::Args, Debug, Clone)]
#[command(group(ArgGroup::new("seeded").args(["dropout", "random"]).multiple(true)))]
pub struct SdpaFlags {
    /// Causal masking: query i sees keys j <= i (top-left) or j <= i + Lk - Lq (bottom-right).
    #[arg(long)]
    pub causal: bool,
    /// Where the causal diagonal and window centre sit when `Lq != Lk`.
    #[arg(long, default_value = "top-left", value_parser = named_values(&ALIGNS, align_name))]
    pub align: Align,
    /// Sliding window `LEFT,RIGHT` around the aligned diagonal; -1 means unbounded (with --pattern
    /// longformer, bigbird or sinks: the pattern's own window).
    #[arg(long, value_parser = parse_window, allow_hyphen_values = true)]
    pub window: Option<Window>,
    /// Score multiplier (default `1/sqrt(D)`).
    #[arg(long, allow_hyphen_values = true)]
    pub scale: Option<f64>,
    /// Logit soft-capping C > 0: scores become C·tanh(s/C) (Gemma 2 uses 50).
    #[arg(long, value_name = "C", allow_negative_numbers = true, value_parser = parse_softcap)]
    pub softcap: Option<f64>,
    /// Dropout probability on the attention weights, in `[0, 1)`; without --seed the seed is 0.
    #[arg(long, value_name = "P", allow_negative_numbers = true, value_parser = parse_dropout)]
    pub dropout: Option<f32>,
    /// Seed of the dropout generator and of bigbird's random blocks (default 0).
    #[arg(long, requires = "seeded", allow_negative_numbers = true)]
    pub seed: Option<u64>,
    /// Kernel: reference, auto, flash-avx512, flash-avx2 or flash-portable.
    #[arg(long, default_value = "auto")]
    pub kernel: Kernel,
    /// Products of the flash kernel: f32, or bf16 (bfloat16 products with f32 accumulation:
    /// q, k, v and the probabilities rounded to bf16; native on AVX512-BF16, emulated elsewhere;
    /// a decode-shaped call, H/Hkv · Lq ≤ 16, computes in f32 either way).
    #[arg(long, default_value = "f32", value_parser = named_values(&PRECISIONS, precision_name))]
    pub compute: Precision,
    #[command(flatten)]
    pub pattern: PatternFlags,
}

impl SdpaFlags {
    /// The library options these flags ask for (without masks, biases, key lengths or weights,
    /// which come from files and other flags, nor the pattern's block mask, which needs the
    /// sequence lengths: see [`SdpaFlags::pattern`]).
    pub fn options(&self) -> SdpaOptions {
        // Both sides spelled out, so that a new flag or a new library option fails to compile
        // here until it is wired or named as coming from elsewhere (`run::options_spelled`).
        let SdpaFlags { causal, align, window: _, scale, softcap, dropout, seed, kernel, compute, pattern: _ } = *self;
        SdpaOptions {
            scale,
            causal,
            align,
            window: self.own_window(),
            mask: None,
            bias: None,
            key_lengths: None,
            block_mask: None,
            softcap,
            dropout: dropout.map(|p| Dropout { p, seed: seed.unwrap_or(DEFAULT_SEED) }),
            sinks: None,
            score_mod: None,
            kernel,
            compute,
            return_weights: false,
        }
    }

    /// The block-sparse pattern asked for, its parameters checked; `None` without `--pattern`.
    pub fn pattern(&self) -> anyhow::Result<Option<Pattern>> {
        self.pattern.pattern(self.window, self.seed).map_err(pattern_error)
    }

    /// `--window` unless it is a part of the pattern (which then must not apply it again).
    fn own_window(&self) -> Option<Window> {
        match self.pattern() {
            Ok(Some(p)) if p.has_window() => None,
            _ => self.window,
        }
    }

    /// The kernel as reported: its name, and for `auto` the kernel it resolves to on this CPU,
    /// such as `auto (flash-avx512)`, then the products as [`Products::text`] words them for
    /// calls of sizes `calls` (see [`SdpaFlags::products`]).
    pub fn kernel_text(&self, calls: &[Dims]) -> String {
        let kernel = match (self.kernel, self.kernel.resolve()) {
            (Kernel::Auto, Ok(resolved)) => format!("auto ({})", resolved.name()),
            (kernel, _) => kernel.name().to_string(),
        };
        format!("{kernel}{}", self.products(calls).text())
    }

    /// The products of calls of sizes `calls` — a dense call's sizes, or each packed sequence's
    /// as the call of its own that it runs as; none when the sizes are not known: `--compute`,
    /// except on the decode path, which computes in f32.
    pub fn products(&self, calls: &[Dims]) -> Products {
        let decoding = calls.iter().filter(|d| attn_kernels::flash::decodes(d)).count();
        let on_amx = match self.kernel.flash_isa() {
            Ok(Some(isa)) => calls.iter().filter(|d| attn_kernels::flash::runs_on_amx(isa, self.compute, d)).count(),
            _ => 0,
        };
        Products { asked: self.compute, calls: calls.len(), decoding, on_amx }
    }

    /// Dropout as reported, `dropout 0.1, seed 7`, with `(default)` after a seed not given;
    /// `None` without dropout.
    pub fn dropout_text(&self) -> Option<String> {
        let seed = self.seed.map_or(format!("{DEFAULT_SEED} (default)"), |s| s.to_string());
        self.dropout.map(|p| format!("dropout {p}, seed {seed}"))
    }

    /// The causal/window band as a short text: `full`, or those of `causal`, `window L,R`
    /// (`-1` = unbounded) and `bottom-right` that are set.
    pub fn band_text(&self) -> String {
        let mut parts = Vec::new();
        if self.causal {
            parts.push("causal".to_string());
        }
        if let Some(w) = self.own_window() {
            let side = |s: Option<usize>| s.map_or("-1".to_string(), |n| n.to_string());
            parts.push(format!("window {},{}", side(w.left), side(w.right)));
        }
        if parts.is_empty() {
            return "full".into();
        }
        if self.align == Align::BottomRight {
            parts.push(align_name(self.align).into());
        }
        parts.join(" ")
    }
}

/// The dropout seed without `--seed`.
const DEFAULT_SEED: u64 = 0;

/// `Ok` when `ok`, else the message that `value` is outside `range` (in interval notation).
pub(super) fn in_range(value: impl Display, ok: bool, range: &str) -> Result<(), String> {
    if ok {
        Ok(())
    } else {
        Err(format!("{value} is outside {range}"))
    }
}

/// Parses a number of type `T` for which `ok` holds, else says it is outside `range`.
pub(super) fn number_in<T: FromStr + Copy + Display>(
    s: &str,
    ok: impl Fn(T) -> bool,
    range: &str,
) -> Result<T, String> {
    let x: T = s.trim().parse().map_err(|_| format!("'{s}' is not a number"))?;
    in_range(x, ok(x), range)?;
    Ok(x)
}

fn parse_softcap(s: &str) -> Result<f64, String> {
    number_in(s, |c: f64| c.is_finite() && c > 0.0, "(0, inf)")
}

fn parse_dropout(s: &str) -> Result<f32, String> {
    number_in(s, |p: f32| Dropout { p, seed: DEFAULT_SEED }.validate().is_ok(), "[0, 1)")
}

/// Every alignment, in `--align`'s order.
const ALIGNS: [Align; 2] = [Align::TopLeft, Align::BottomRight];

/// The values of `--compute`.
const PRECISIONS: [Precision; 2] = [Precision::F32, Precision::Bf16];

/// The precision a run's products are computed in: `--compute` for the calls on the prefill path,
/// f32 for those on the decode path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Products {
    /// `--compute`.
    pub asked: Precision,
    /// Calls (a dense call, or packed sequences); 0 when their sizes are not known.
    pub calls: usize,
    /// Of those, the calls on the decode path.
    pub decoding: usize,
    /// Of those, the calls whose forward products run on AMX tiles.
    pub on_amx: usize,
}

impl Products {
    /// The precision of the products: `--compute`, or f32 when every call decodes.
    pub fn precision(&self) -> Precision {
        if self.calls > 0 && self.decoding == self.calls {
            Precision::F32
        } else {
            self.asked
        }
    }

    /// What follows the kernel's name: nothing for f32 products, else `+bf16`, `+amx` after it when
    /// the forward's products run on AMX tiles (`+amx 3 of 16` when only some calls do), and when
    /// some of several calls decode in f32, how many: `+bf16 (f32: 3 of 16 decode-length sequences)`.
    pub fn text(&self) -> String {
        let amx = match self.on_amx {
            0 => String::new(),
            n if n == self.calls => "+amx".to_string(),
            n => format!("+amx {n} of {}", self.calls),
        };
        match self.precision() {
            Precision::F32 => String::new(),
            p if self.decoding == 0 => format!("+{}{amx}", precision_name(p)),
            p => {
                let (name, d, n) = (precision_name(p), self.decoding, self.calls);
                format!("+{name}{amx} (f32: {d} of {n} decode-length sequences)")
            }
        }
    }
}

/// The command-line name of a precision.
pub fn precision_name(p: Precision) -> &'static str {
    match p {
        Precision::F32 => "f32",
        Precision::Bf16 => "bf16",
    }
}

/// The name of an alignment on the command line.
pub fn align_name(align: Align) -> &'static str {
    match align {
        Align::TopLeft => "top-left",
        Align::BottomRight => "bottom-right",
    }
}

/// A parser accepting exactly the names of `all` (listed in `--help`) and giving the value named.
pub(super) fn named_values<T: Copy + Send + Sync + 'static>(
    all: &'static [T],
    name: fn(T) -> &'static str,
) -> impl TypedValueParser<Value = T> {
    PossibleValuesParser::new(all.iter().map(|&v| name(v)))
        .try_map(move |s| all.iter().copied().find(|&v| name(v) == s).ok_or_else(|| format!("unknown value '{s}'")))
}

fn parse_window(s: &str) -> Result<Window, String> {
    let side = |x: &str| -> Result<Option<usize>, String> {
        match x.trim().parse::<i64>() {
            Ok(-1) => Ok(None),
            Ok(n) if n >= 0 => usize::try_from(n).map(Some).map_err(|e| e.to_string()),
            _ => Err(format!("'{x}' is not a window size, expected an integer >= -1")),
        }
    };
    let (left, right) = s.split_once(',').ok_or_else(|| format!("'{s}', expected LEFT,RIGHT"))?;
    Ok(Window { left: side(left)?, right: side(right)? })
}

/// A refusal of the pattern library as the user of the flags sees it: a parameter is named by
/// its flag (`doc_lengths` → `--doc-lengths`).
pub fn pattern_error(e: AttnError) -> anyhow::Error {
    if let AttnError::Param { field, reason } = &e {
        if let Some(long) = flag_of::<SdpaFlags>(field) {
            return anyhow::anyhow!("--{long}: {reason}");
        }
    }
    e.into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        flags: SdpaFlags,
    }

    fn flags(args: &[&str]) -> SdpaFlags {
        Cli::try_parse_from([&["attn"], args].concat()).unwrap().flags
    }

    fn options(args: &[&str]) -> SdpaOptions {
        flags(args).options()
    }

    #[test]
    fn every_flag_reaches_the_options() {
        let o = options(&[
            "--causal",
            "--align",
            "bottom-right",
            "--window",
            "2,-1",
            "--scale",
            "-0.5",
            "--softcap",
            "30",
            "--dropout",
            "0.25",
            "--seed",
            "7",
            "--kernel",
            "reference",
        ]);
        assert!(o.causal);
        assert_eq!(o.align, Align::BottomRight);
        assert_eq!(o.window, Some(Window { left: Some(2), right: None }));
        assert_eq!((o.scale, o.softcap), (Some(-0.5), Some(30.0)));
        assert_eq!(o.dropout, Some(Dropout { p: 0.25, seed: 7 }));
        assert_eq!(o.kernel, Kernel::Reference);
    }

    #[test]
    fn defaults_are_the_library_defaults() {
        let o = options(&[]);
        let d = SdpaOptions::default();
        assert_eq!((o.causal, o.align, o.window, o.scale), (d.causal, d.align, d.window, d.scale));
        assert_eq!((o.softcap, o.dropout, o.kernel), (d.softcap, d.dropout, d.kernel));
        assert_eq!(options(&["--dropout", "0.1"]).dropout, Some(Dropout { p: 0.1, seed: 0 }));
    }

    #[test]
    fn band_text_names_what_is_set() {
        assert_eq!(flags(&[]).band_text(), "full");
        assert_eq!(flags(&["--align", "bottom-right"]).band_text(), "full");
        assert_eq!(flags(&["--causal"]).band_text(), "causal");
        let both = flags(&["--causal", "--window", "4,-1", "--align", "bottom-right"]);
        assert_eq!(both.band_text(), "causal window 4,-1 bottom-right");
    }

    #[test]
    fn bad_values_are_refused() {
        let bad_values: [&[&str]; 8] = [
            &["--window", "3"],
            &["--window", "-2,0"],
            &["--align", "middle"],
            &["--seed", "1"],
            &["--softcap", "0"],
            &["--softcap", "inf"],
            &["--dropout", "1"],
            &["--dropout", "NaN"],
        ];
        for bad in bad_values {
            assert!(Cli::try_parse_from([&["attn"], bad].concat()).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn one_seed_serves_dropout_and_random_blocks() {
        let f = flags(&[
            "--pattern",
            "bigbird",
            "--window",
            "4,4",
            "--global",
            "1",
            "--random",
            "2",
            "--seed",
            "5",
            "--dropout",
            "0.1",
        ]);
        let window = Window { left: Some(4), right: Some(4) };
        assert_eq!(f.pattern().unwrap(), Some(Pattern::BigBird { window, global: 1, random: 2, seed: 5 }));
        assert_eq!(f.options().dropout, Some(Dropout { p: 0.1, seed: 5 }));
        assert!(Cli::try_parse_from(["attn", "--pattern", "bigbird", "--random", "2", "--seed", "5"]).is_ok());
        assert!(Cli::try_parse_from(["attn", "--pattern", "strided", "--stride", "2", "--seed", "5"]).is_err());
    }

    #[test]
    fn a_window_is_the_calls_own_only_when_the_pattern_has_none() {
        let lf = flags(&["--pattern", "longformer", "--window", "4,4", "--global", "1", "--causal"]);
        assert_eq!((lf.options().window, lf.band_text().as_str()), (None, "causal"));
        let strided = flags(&["--pattern", "strided", "--stride", "3", "--window", "4,0"]);
        assert_eq!(strided.options().window, Some(Window { left: Some(4), right: Some(0) }));
        assert_eq!(strided.band_text(), "window 4,0");
        assert_eq!(flags(&[]).pattern().unwrap(), None);
    }

    #[test]
    fn pattern_refusals_name_the_flag() {
        let e = flags(&["--pattern", "document"]).pattern().unwrap_err().to_string();
        assert_eq!(e, "--doc-lengths: the document pattern needs it");
        let e = flags(&["--pattern", "prefix-lm", "--prefix", "3", "--sink-tokens", "2"]).pattern().unwrap_err();
        assert_eq!(e.to_string(), "--sink-tokens: the prefix-lm pattern does not take it");
        let unnamed = attn::AttnError::Param { field: "block_mask", reason: "too many keys".into() };
        assert_eq!(pattern_error(unnamed).to_string(), "block_mask: too many keys");
    }

    #[test]
    fn products_name_the_amx_tiles_and_the_calls_decoding_in_f32() {
        let p = |calls, decoding, on_amx| Products { asked: Precision::Bf16, calls, decoding, on_amx }.text();
        assert_eq!(p(1, 0, 0), "+bf16");
        assert_eq!(p(1, 0, 1), "+bf16+amx");
        assert_eq!(p(3, 0, 2), "+bf16+amx 2 of 3");
        assert_eq!(p(3, 1, 2), "+bf16+amx 2 of 3 (f32: 1 of 3 decode-length sequences)");
        assert_eq!(p(2, 2, 0), "");
        assert_eq!(Products { asked: Precision::F32, calls: 1, decoding: 0, on_amx: 0 }.text(), "");
    }
}
