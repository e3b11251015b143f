//! Training data for a character-level sequence-to-sequence model.
//!
//! - [`dates`]: the built-in task, a date between 1950-01-01 and 2049-12-31 written in one of
//!   fourteen forms → `YYYY-MM-DD`, generated from a seed, with held-out dates never trained on;
//! - [`calendar`]: the proleptic Gregorian dates and weekdays behind it;
//! - [`vocab`]: characters as tokens, with `pad = 0`, `bos = 1`, `eos = 2`, `unk = 3`, saved as JSON;
//! - [`pairs`]: a user's parallel text, one `SOURCE<TAB>TARGET` a line, checked line by line;
//! - [`batch`]: padded `[B, L]` (or packed) token tensors and the seeded batch order.
//!
//! One vocabulary serves both sides. Sequences as the model sees them: the source is its
//! characters then `eos`; the decoder input is `bos` then the target's characters, and the decoder
//! output `eos` follows them; so a text of `n` characters takes `n + 1` positions
//! ([`vocab::SPECIALS_PER_SEQUENCE`]).
//!
//! Every random choice is a pure function of the seed and an index (never of earlier draws), so a
//! run resumed at step `k` sees the same data as one that never stopped.

pub mod batch;
pub mod calendar;
pub mod dates;
pub mod error;
pub mod pairs;
pub(crate) mod sample;
pub mod vocab;

pub use batch::{Batch, BatchOrder, PackedBatch};
pub use calendar::Date;
pub use dates::{DateFormat, DatesTask};
pub use error::{DataError, Side};
pub use pairs::{parse_pairs, read_pairs, read_pairs_file, split_held_out, Pair};
pub use vocab::Vocab;
