//! Training support for the `attn` translator. So far the data layer, [`data`]: the built-in
//! dates-to-ISO task, the character vocabulary, a user's tab-separated parallel text, and padded
//! batches in a seeded order that a resumed run can continue exactly.

pub mod data;
