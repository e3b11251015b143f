//! A named [`Pattern`] from parameters given one by one, as a command line's flags give them:
//! [`PatternParts`] holds each parameter given or not, and [`PatternParts::pattern`] makes the
//! pattern a name asks for, refusing a parameter the pattern needs and lacks, or one it does not
//! take, by a typed error naming the parameter.
//!
//! Two parameters may also serve beside a pattern: a `window` given to a pattern without a window
//! of its own (strided, fixed, document, prefix-lm) is no part of it (the caller applies it as the
//! call's own sliding window, which composes with the pattern by AND), and a `seed` given to a
//! pattern without random blocks is left to the caller (a dropout seed, say).

use super::Pattern;
use crate::error::{AttnError, Result};
use crate::mask::Window;

/// Every pattern's name, as [`Pattern::name`] gives it, in the order of [`Pattern`]'s variants.
pub const PATTERN_NAMES: [&str; 7] = ["strided", "fixed", "longformer", "bigbird", "document", "prefix-lm", "sinks"];

/// A pattern's parameters, each given or not (the fields of the variants of [`Pattern`], under
/// the names a command line gives them).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PatternParts {
    /// Keys before and after the diagonal: longformer's and bigbird's window; for sinks the
    /// recent keys as `LEFT,0` (`LEFT + 1` keys, the query's own included).
    pub window: Option<Window>,
    /// Global tokens (longformer, bigbird).
    pub global: Option<usize>,
    /// Random key blocks per query block (bigbird).
    pub random: Option<usize>,
    /// Seed of the random blocks (bigbird; 0 when not given).
    pub seed: Option<u64>,
    /// Stride, or chunk length (strided, fixed).
    pub stride: Option<usize>,
    /// Summary positions per chunk (fixed).
    pub summary: Option<usize>,
    /// Document lengths (document).
    pub doc_lengths: Option<Vec<usize>>,
    /// Prefix length (prefix-lm).
    pub prefix: Option<usize>,
    /// Sink tokens (sinks).
    pub sink_tokens: Option<usize>,
}

/// The parameter names of [`PatternParts`] that only some patterns take, and whether each is
/// given in `p`.
fn exclusive(p: &PatternParts) -> [(&'static str, bool); 7] {
    [
        ("global", p.global.is_some()),
        ("random", p.random.is_some()),
        ("stride", p.stride.is_some()),
        ("summary", p.summary.is_some()),
        ("doc_lengths", p.doc_lengths.is_some()),
        ("prefix", p.prefix.is_some()),
        ("sink_tokens", p.sink_tokens.is_some()),
    ]
}

impl PatternParts {
    /// The pattern called `name` (one of [`PATTERN_NAMES`]) made of these parts. Refuses, naming
    /// the parameter ([`AttnError::Param`]): an unknown name (`pattern`), a parameter the pattern
    /// needs and was not given, one of `global`, `random`, `stride`, `summary`, `doc_lengths`,
    /// `prefix`, `sink_tokens` that it does not take, an empty `doc_lengths`, and for sinks a
    /// window that is not `LEFT,0`. The sizes themselves are checked against the sequence by
    /// [`Pattern::check`] when the pattern is built.
    pub fn pattern(&self, name: &str) -> Result<Pattern> {
        let takes: &[&str] = match name {
            "strided" => &["stride"],
            "fixed" => &["stride", "summary"],
            "longformer" => &["global"],
            "bigbird" => &["global", "random"],
            "document" => &["doc_lengths"],
            "prefix-lm" => &["prefix"],
            "sinks" => &["sink_tokens"],
            _ => {
                let reason = format!("'{name}' is not a pattern, expected one of {}", PATTERN_NAMES.join(", "));
                return Err(AttnError::Param { field: "pattern", reason });
            }
        };
        if let Some((field, _)) = exclusive(self).into_iter().find(|&(f, given)| given && !takes.contains(&f)) {
            return Err(AttnError::Param { field, reason: format!("the {name} pattern does not take it") });
        }
        let need = |field: &'static str, value: Option<usize>| {
            value.ok_or_else(|| AttnError::Param { field, reason: format!("the {name} pattern needs it") })
        };
        let window = || {
            self.window
                .ok_or_else(|| AttnError::Param { field: "window", reason: format!("the {name} pattern needs it") })
        };
        Ok(match name {
            "strided" => Pattern::Strided { stride: need("stride", self.stride)? },
            "fixed" => Pattern::Fixed { stride: need("stride", self.stride)?, summary: need("summary", self.summary)? },
            "longformer" => Pattern::Longformer { window: window()?, global: need("global", self.global)? },
            "bigbird" => Pattern::BigBird {
                window: window()?,
                global: need("global", self.global)?,
                random: need("random", self.random)?,
                seed: self.seed.unwrap_or(0),
            },
            "document" => {
                let Some(lengths) = self.doc_lengths.clone() else {
                    return Err(AttnError::Param {
                        field: "doc_lengths",
                        reason: format!("the {name} pattern needs it"),
                    });
                };
                if lengths.is_empty() {
                    let reason = "the document pattern needs at least one document length".to_string();
                    return Err(AttnError::Param { field: "doc_lengths", reason });
                }
                Pattern::Document { lengths }
            }
            "prefix-lm" => Pattern::PrefixLm { prefix: need("prefix", self.prefix)? },
            _ => {
                let sinks = need("sink_tokens", self.sink_tokens)?;
                match window()? {
                    Window { left: Some(left), right: Some(0) } => Pattern::Sinks { sinks, window: left + 1 },
                    _ => {
                        let reason = "the sinks pattern is causal: expected LEFT,0 with LEFT >= 0 (LEFT + 1 recent \
                                      keys, the query's own included)"
                            .to_string();
                        return Err(AttnError::Param { field: "window", reason });
                    }
                }
            }
        })
    }
}

/// `name key=value ...` in the parameter names of [`PatternParts`], e.g. `longformer
/// window=128,128 global=16`; an unbounded side of a window is `-1`, and more than 8 document
/// lengths are cut short with their count.
impl std::fmt::Display for Pattern {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let side = |s: Option<usize>| s.map_or("-1".to_string(), |n| n.to_string());
        let window = |w: &Window| format!("window={},{}", side(w.left), side(w.right));
        let params = match self {
            Pattern::Strided { stride } => format!("stride={stride}"),
            Pattern::Fixed { stride, summary } => format!("stride={stride} summary={summary}"),
            Pattern::Longformer { window: w, global } => format!("{} global={global}", window(w)),
            Pattern::BigBird { window: w, global, random, seed } => {
                format!("{} global={global} random={random} seed={seed}", window(w))
            }
            Pattern::Document { lengths } => {
                let shown: Vec<String> = lengths.iter().take(8).map(|n| n.to_string()).collect();
                let more =
                    if lengths.len() > 8 { format!(",... ({} documents)", lengths.len()) } else { String::new() };
                format!("doc_lengths={}{more}", shown.join(","))
            }
            Pattern::PrefixLm { prefix } => format!("prefix={prefix}"),
            Pattern::Sinks { sinks, window: w } => match w.checked_sub(1) {
                Some(left) => format!("sink_tokens={sinks} window={left},0"),
                None => format!("sink_tokens={sinks} window=none"),
            },
        };
        write!(f, "{} {params}", self.name())
    }
}

impl Pattern {
    /// Whether a window is one of the pattern's parts (longformer, bigbird, sinks), so that it
    /// must not also be applied as the call's own sliding window.
    pub fn has_window(&self) -> bool {
        matches!(self, Pattern::Longformer { .. } | Pattern::BigBird { .. } | Pattern::Sinks { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(r: Result<Pattern>) -> &'static str {
        match r {
            Err(AttnError::Param { field, .. }) => field,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn each_name_makes_its_pattern() {
        let w = Window { left: Some(3), right: Some(2) };
        let d = PatternParts::default;
        let cases = [
            ("strided", PatternParts { stride: Some(4), ..d() }, Pattern::Strided { stride: 4 }),
            (
                "fixed",
                PatternParts { stride: Some(8), summary: Some(2), ..d() },
                Pattern::Fixed { stride: 8, summary: 2 },
            ),
            (
                "longformer",
                PatternParts { window: Some(w), global: Some(1), ..d() },
                Pattern::Longformer { window: w, global: 1 },
            ),
            (
                "bigbird",
                PatternParts { window: Some(w), global: Some(1), random: Some(2), seed: Some(9), ..d() },
                Pattern::BigBird { window: w, global: 1, random: 2, seed: 9 },
            ),
            (
                "document",
                PatternParts { doc_lengths: Some(vec![3, 5]), ..d() },
                Pattern::Document { lengths: vec![3, 5] },
            ),
            ("prefix-lm", PatternParts { prefix: Some(6), ..d() }, Pattern::PrefixLm { prefix: 6 }),
            (
                "sinks",
                PatternParts { sink_tokens: Some(4), window: Some(Window { left: Some(7), right: Some(0) }), ..d() },
                Pattern::Sinks { sinks: 4, window: 8 },
            ),
        ];
        let names: Vec<&str> = cases.iter().map(|c| c.0).collect();
        assert_eq!(names, PATTERN_NAMES);
        for (name, parts, want) in cases {
            let got = parts.pattern(name).unwrap();
            assert_eq!((got.name(), &got), (name, &want));
        }
    }

    #[test]
    fn display_names_the_parts_as_given() {
        let w = Window { left: Some(128), right: None };
        let bb = Pattern::BigBird { window: w, global: 16, random: 3, seed: 0 };
        assert_eq!(bb.to_string(), "bigbird window=128,-1 global=16 random=3 seed=0");
        assert_eq!(Pattern::Sinks { sinks: 4, window: 8 }.to_string(), "sinks sink_tokens=4 window=7,0");
        let docs = Pattern::Document { lengths: (1..=10).collect() };
        assert_eq!(docs.to_string(), "document doc_lengths=1,2,3,4,5,6,7,8,... (10 documents)");
    }

    #[test]
    fn bigbird_seed_defaults_to_zero_and_other_patterns_leave_window_and_seed_alone() {
        let w = Window { left: Some(1), right: Some(1) };
        let p = PatternParts { window: Some(w), global: Some(0), random: Some(1), ..Default::default() };
        assert_eq!(p.pattern("bigbird").unwrap(), Pattern::BigBird { window: w, global: 0, random: 1, seed: 0 });
        let p = PatternParts { window: Some(w), seed: Some(3), stride: Some(2), ..Default::default() };
        let strided = p.pattern("strided").unwrap();
        assert_eq!(strided, Pattern::Strided { stride: 2 });
        assert!(!strided.has_window() && p.pattern("bigbird").is_err());
    }

    #[test]
    fn missing_foreign_and_bad_parts_are_refused_by_name() {
        let none = PatternParts::default();
        assert_eq!(field(none.pattern("diagonal")), "pattern");
        for (name, missing) in [
            ("strided", "stride"),
            ("fixed", "stride"),
            ("longformer", "window"),
            ("bigbird", "window"),
            ("document", "doc_lengths"),
            ("prefix-lm", "prefix"),
            ("sinks", "sink_tokens"),
        ] {
            assert_eq!(field(none.pattern(name)), missing, "{name}");
        }
        let w = Some(Window { left: Some(2), right: Some(2) });
        assert_eq!(field(PatternParts { stride: Some(4), ..Default::default() }.pattern("fixed")), "summary");
        assert_eq!(field(PatternParts { window: w, ..Default::default() }.pattern("longformer")), "global");
        let lf = PatternParts { window: w, global: Some(1), ..Default::default() };
        assert_eq!(field(lf.pattern("bigbird")), "random");
        assert_eq!(field(PatternParts { stride: Some(3), ..lf.clone() }.pattern("longformer")), "stride");
        assert_eq!(field(lf.pattern("strided")), "global");
        assert_eq!(
            field(PatternParts { doc_lengths: Some(vec![]), ..Default::default() }.pattern("document")),
            "doc_lengths"
        );
        for right in [Some(1), None] {
            let sinks = PatternParts {
                sink_tokens: Some(2),
                window: Some(Window { left: Some(3), right }),
                ..Default::default()
            };
            assert_eq!(field(sinks.pattern("sinks")), "window");
        }
        let unbounded = Window { left: None, right: Some(0) };
        let sinks = PatternParts { sink_tokens: Some(2), window: Some(unbounded), ..Default::default() };
        assert_eq!(field(sinks.pattern("sinks")), "window");
    }
}
