//! The data layer's error type: every refusal names the file and, for a parallel-text file, the
//! 1-based line, and says what was expected versus found. Bad input is an error, never a panic.

use std::path::PathBuf;

use thiserror::Error;

/// Which side of a `SOURCE<TAB>TARGET` line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The text before the tab.
    Source,
    /// The text after the tab.
    Target,
}

impl std::fmt::Display for Side {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Side::Source => "source",
            Side::Target => "target",
        })
    }
}

/// Why data could not be read, built or saved.
#[derive(Debug, Error)]
pub enum DataError {
    /// The file could not be opened, read or written.
    #[error("{}: {source}", .path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The operating system's reason.
        source: std::io::Error,
    },
    /// The file is larger than the reader accepts.
    #[error("{}: the file is {size} bytes, larger than the {limit}-byte limit for parallel text", .path.display())]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// Its size in bytes.
        size: u64,
        /// The largest accepted size in bytes.
        limit: u64,
    },
    /// The file holds no pairs (it is empty, or only blank lines).
    #[error("{}: no SOURCE<TAB>TARGET pairs: the file is empty or holds only blank lines", .path.display())]
    Empty {
        /// The file.
        path: PathBuf,
    },
    /// A line is not valid UTF-8.
    #[error("{}: line {line}: not valid UTF-8 (at byte {byte} of the line)", .path.display())]
    InvalidUtf8 {
        /// The file.
        path: PathBuf,
        /// The 1-based line number.
        line: usize,
        /// The 1-based byte position in the line where decoding failed.
        byte: usize,
    },
    /// A line does not hold exactly one tab.
    #[error("{}: line {line}: expected SOURCE<TAB>TARGET (exactly one tab), found {tabs} tabs", .path.display())]
    Tabs {
        /// The file.
        path: PathBuf,
        /// The 1-based line number.
        line: usize,
        /// How many tabs the line holds.
        tabs: usize,
    },
    /// One side of a line is empty.
    #[error("{}: line {line}: the {side} is empty (expected text on both sides of the tab)", .path.display())]
    EmptySide {
        /// The file.
        path: PathBuf,
        /// The 1-based line number.
        line: usize,
        /// The empty side.
        side: Side,
    },
    /// One side of a line needs more positions than the model has.
    #[error(
        "{}: line {line}: the {side} is {chars} characters, {positions} positions with bos/eos, \
         more than the model's {max_len}",
        .path.display()
    )]
    TooLong {
        /// The file.
        path: PathBuf,
        /// The 1-based line number.
        line: usize,
        /// The side that is too long.
        side: Side,
        /// Its length in characters.
        chars: usize,
        /// The positions it takes with its special token.
        positions: usize,
        /// The most positions a sequence may take.
        max_len: usize,
    },
    /// A vocabulary file is not the JSON of a vocabulary.
    #[error("{}: not a vocabulary file: {source}", .path.display())]
    VocabJson {
        /// The file.
        path: PathBuf,
        /// The JSON parser's reason, with line and column.
        source: serde_json::Error,
    },
    /// A vocabulary file parses but its content is not a usable vocabulary.
    #[error("{}: vocabulary: {field}: expected {expected}, found {found}", .path.display())]
    VocabInvalid {
        /// The file.
        path: PathBuf,
        /// The offending field.
        field: &'static str,
        /// What was expected, in words.
        expected: String,
        /// What the file holds.
        found: String,
    },
    /// An argument is outside what the function accepts.
    #[error("{what}: expected {expected}, found {found}")]
    Argument {
        /// The function and argument.
        what: &'static str,
        /// What was expected, in words.
        expected: String,
        /// The value given.
        found: String,
    },
    /// The data of a run changed since it started.
    #[error("{data} changed since the run started (its contents were {then}, now {now}): its pairs are not the run's")]
    Changed {
        /// The pairs file, or the task.
        data: String,
        /// The fingerprint recorded when the run started.
        then: String,
        /// The fingerprint now.
        now: String,
    },
    /// Building a tensor failed.
    #[error("candle: {0}")]
    Candle(#[from] candle_core::Error),
}
