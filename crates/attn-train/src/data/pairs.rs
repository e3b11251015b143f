//! A user's parallel text: one `SOURCE<TAB>TARGET` pair a line, UTF-8, `\n` or `\r\n` line ends;
//! blank lines are skipped and a leading byte-order mark is ignored. Each line is checked and a
//! refusal names the file and the 1-based line: not UTF-8, not exactly one tab, an empty side,
//! a side longer than the model's positions. The file's size is checked before it is read.

use std::collections::HashSet;
use std::path::Path;

use crate::data::error::{DataError, Side};
use crate::data::sample::{shuffle_prefix, stream};
use crate::data::vocab::SPECIALS_PER_SEQUENCE;

/// One example: `(source text, target text)`.
pub type Pair = (String, String);

/// The largest parallel-text file [`read_pairs`] reads: 256 MiB.
pub const MAX_FILE_BYTES: u64 = 256 << 20;

const SALT_SPLIT: u64 = 0x5350_4C49_5448_4F4C;

/// The pairs of the parallel-text file at `path`. Each side may take at most `max_len` positions
/// with its special token, that is `max_len - 1` characters ([`SPECIALS_PER_SEQUENCE`]).
pub fn read_pairs(path: &Path, max_len: usize) -> Result<Vec<Pair>, DataError> {
    parse_pairs(&read_pairs_file(path)?, path, max_len)
}

/// The bytes of the parallel-text file at `path`, its size checked against [`MAX_FILE_BYTES`]
/// before it is read.
pub fn read_pairs_file(path: &Path) -> Result<Vec<u8>, DataError> {
    let io = |source| DataError::Io { path: path.into(), source };
    let size = std::fs::metadata(path).map_err(io)?.len();
    if size > MAX_FILE_BYTES {
        return Err(DataError::TooLarge { path: path.into(), size, limit: MAX_FILE_BYTES });
    }
    std::fs::read(path).map_err(io)
}

/// The pairs of `bytes`, the contents of the parallel-text file `path` (named in errors), checked
/// as [`read_pairs`] does.
pub fn parse_pairs(bytes: &[u8], path: &Path, max_len: usize) -> Result<Vec<Pair>, DataError> {
    let bytes = bytes.strip_prefix("\u{feff}".as_bytes()).unwrap_or(bytes);
    let mut pairs = Vec::new();
    for (i, raw) in bytes.split(|&b| b == b'\n').enumerate() {
        let raw = raw.strip_suffix(b"\r").unwrap_or(raw);
        if raw.is_empty() {
            continue;
        }
        pairs.push(parse_line(raw, path, i + 1, max_len)?);
    }
    if pairs.is_empty() {
        return Err(DataError::Empty { path: path.into() });
    }
    Ok(pairs)
}

/// One non-blank line (its end stripped) as a pair.
fn parse_line(raw: &[u8], path: &Path, line: usize, max_len: usize) -> Result<Pair, DataError> {
    let text = std::str::from_utf8(raw).map_err(|e| DataError::InvalidUtf8 {
        path: path.into(),
        line,
        byte: e.valid_up_to() + 1,
    })?;
    let tabs = text.matches('\t').count();
    let Some((source, target)) = text.split_once('\t').filter(|_| tabs == 1) else {
        return Err(DataError::Tabs { path: path.into(), line, tabs });
    };
    for (side, s) in [(Side::Source, source), (Side::Target, target)] {
        let chars = s.chars().count();
        if chars == 0 {
            return Err(DataError::EmptySide { path: path.into(), line, side });
        }
        let positions = chars + SPECIALS_PER_SEQUENCE;
        if positions > max_len {
            return Err(DataError::TooLong { path: path.into(), line, side, chars, positions, max_len });
        }
    }
    Ok((source.to_owned(), target.to_owned()))
}

/// Splits `pairs` into `(train, held_out)`: `held_out` pairs chosen uniformly from the seed, then
/// every remaining pair whose source is also a held-out source is dropped from training, so no
/// held-out source is ever trained on. Both keep the file's order. Refused unless `held_out` is
/// below the number of pairs, or if no training pair is left.
pub fn split_held_out(pairs: Vec<Pair>, held_out: usize, seed: u64) -> Result<(Vec<Pair>, Vec<Pair>), DataError> {
    let argument = |expected: String, found: String| DataError::Argument { what: "held_out", expected, found };
    if held_out >= pairs.len() {
        return Err(argument(format!("fewer than the {} pairs", pairs.len()), held_out.to_string()));
    }
    let mut order: Vec<usize> = (0..pairs.len()).collect();
    shuffle_prefix(&mut stream(seed, SALT_SPLIT, 0), &mut order, held_out);
    let mut is_held = vec![false; pairs.len()];
    order[..held_out].iter().for_each(|&i| is_held[i] = true);
    let (held, rest): (Vec<_>, Vec<_>) = pairs.into_iter().zip(is_held).partition(|(_, h)| *h);
    let held: Vec<Pair> = held.into_iter().map(|(p, _)| p).collect();
    let sources: HashSet<&str> = held.iter().map(|(s, _)| s.as_str()).collect();
    let train: Vec<Pair> = rest.into_iter().map(|(p, _)| p).filter(|(s, _)| !sources.contains(s.as_str())).collect();
    if train.is_empty() {
        let found = format!("{held_out}, whose sources cover every other pair");
        return Err(argument("a split leaving at least one training pair".into(), found));
    }
    Ok((train, held))
}
