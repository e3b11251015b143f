//! Attention for Transformers on candle.

pub mod heatmap;
