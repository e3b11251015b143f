//! Characters as tokens. Ids `0..4` are the special tokens [`PAD`], [`BOS`], [`EOS`], [`UNK`];
//! the characters follow in ascending order from id 4, so a vocabulary built from the same texts
//! is the same on every run. Saved as JSON:
//!
//! ```json
//! {"format": "attn-char-vocab", "version": 1, "specials": ["<pad>", "<bos>", "<eos>", "<unk>"],
//!  "chars": [" ", ",", "-", "0", "1"]}
//! ```

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::data::error::DataError;

/// The padding id.
pub const PAD: u32 = 0;
/// The begin-of-sequence id: the decoder's first input.
pub const BOS: u32 = 1;
/// The end-of-sequence id: ends a source and the decoder's output.
pub const EOS: u32 = 2;
/// The id of a character outside the vocabulary.
pub const UNK: u32 = 3;
/// How many special ids precede the characters.
pub const NUM_SPECIALS: u32 = 4;
/// Positions a text takes beyond its characters: one special token (`eos` after a source, `bos`
/// before a decoder input, `eos` after a decoder output).
pub const SPECIALS_PER_SEQUENCE: usize = 1;

const FORMAT: &str = "attn-char-vocab";
const VERSION: u32 = 1;
const SPECIAL_NAMES: [&str; 4] = ["<pad>", "<bos>", "<eos>", "<unk>"];

/// A character vocabulary: special ids `0..4`, then characters in ascending order.
///
/// ```
/// use attn_train::data::{vocab, Vocab};
/// let v = Vocab::from_texts(["ab", "ba c"]);
/// assert_eq!(v.len(), 4 + 4); // specials, then ' ', 'a', 'b', 'c'
/// let ids = v.encode("cab", true, true);
/// assert_eq!(ids, [vocab::BOS, 7, 5, 6, vocab::EOS]);
/// assert_eq!(v.decode(&ids), "cab");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Vocab {
    /// Distinct characters, ascending; `chars[i]` has id `i + 4`.
    chars: Vec<char>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct VocabFile {
    format: String,
    version: u32,
    specials: Vec<String>,
    chars: Vec<String>,
}

impl Vocab {
    /// The vocabulary of every character in `texts`.
    pub fn from_texts<I, S>(texts: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let mut chars: Vec<char> = texts.into_iter().flat_map(|t| t.as_ref().chars().collect::<Vec<_>>()).collect();
        chars.sort_unstable();
        chars.dedup();
        Self { chars }
    }

    /// The number of ids, specials included: the model's vocabulary size.
    pub fn len(&self) -> usize {
        self.chars.len() + NUM_SPECIALS as usize
    }

    /// Whether the vocabulary has no characters (only the specials).
    pub fn is_empty(&self) -> bool {
        self.chars.is_empty()
    }

    /// The characters, ascending (ids 4, 5, …).
    pub fn chars(&self) -> &[char] {
        &self.chars
    }

    /// The id of `c`, or [`UNK`] if it is not in the vocabulary.
    pub fn id(&self, c: char) -> u32 {
        self.chars.binary_search(&c).map_or(UNK, |i| i as u32 + NUM_SPECIALS)
    }

    /// The character of `id`, or `None` for a special or out-of-range id.
    pub fn char(&self, id: u32) -> Option<char> {
        id.checked_sub(NUM_SPECIALS).and_then(|i| self.chars.get(i as usize)).copied()
    }

    /// The ids of `text`'s characters (unknown ones as [`UNK`]), after [`BOS`] if `bos` and
    /// followed by [`EOS`] if `eos`: `[chars + bos + eos]`.
    pub fn encode(&self, text: &str, bos: bool, eos: bool) -> Vec<u32> {
        let body = text.chars().map(|c| self.id(c));
        bos.then_some(BOS).into_iter().chain(body).chain(eos.then_some(EOS)).collect()
    }

    /// The text of `ids` up to the first [`EOS`]; the other specials and out-of-range ids are
    /// skipped.
    pub fn decode(&self, ids: &[u32]) -> String {
        ids.iter().take_while(|&&id| id != EOS).filter_map(|&id| self.char(id)).collect()
    }

    /// The vocabulary as its JSON text.
    pub fn to_json(&self) -> String {
        let file = VocabFile {
            format: FORMAT.into(),
            version: VERSION,
            specials: SPECIAL_NAMES.map(String::from).to_vec(),
            chars: self.chars.iter().map(char::to_string).collect(),
        };
        serde_json::to_string_pretty(&file).expect("a vocabulary serialises")
    }

    /// The vocabulary of a JSON text; `path` names its file in errors.
    pub fn from_json(text: &str, path: &Path) -> Result<Self, DataError> {
        let file: VocabFile =
            serde_json::from_str(text).map_err(|source| DataError::VocabJson { path: path.into(), source })?;
        let invalid = |field, expected: String, found: String| DataError::VocabInvalid {
            path: path.into(),
            field,
            expected,
            found,
        };
        if file.format != FORMAT {
            return Err(invalid("format", format!("{FORMAT:?}"), format!("{:?}", file.format)));
        }
        if file.version != VERSION {
            return Err(invalid("version", VERSION.to_string(), file.version.to_string()));
        }
        if file.specials != SPECIAL_NAMES {
            return Err(invalid("specials", format!("{SPECIAL_NAMES:?}"), format!("{:?}", file.specials)));
        }
        let mut chars = Vec::with_capacity(file.chars.len());
        for (i, entry) in file.chars.iter().enumerate() {
            let mut it = entry.chars();
            let c = match (it.next(), it.next()) {
                (Some(c), None) => c,
                _ => return Err(invalid("chars", "one character per entry".into(), format!("{entry:?} at index {i}"))),
            };
            if let Some(&prev) = chars.last() {
                if prev >= c {
                    let found = format!("{prev:?} then {c:?} at index {i}");
                    return Err(invalid("chars", "distinct characters in ascending order".into(), found));
                }
            }
            chars.push(c);
        }
        Ok(Self { chars })
    }

    /// Writes the vocabulary to `path` as JSON.
    pub fn save(&self, path: &Path) -> Result<(), DataError> {
        std::fs::write(path, self.to_json()).map_err(|source| DataError::Io { path: path.into(), source })
    }

    /// Reads a vocabulary saved by [`Vocab::save`].
    pub fn load(path: &Path) -> Result<Self, DataError> {
        let text = std::fs::read_to_string(path).map_err(|source| DataError::Io { path: path.into(), source })?;
        Self::from_json(&text, path)
    }
}
