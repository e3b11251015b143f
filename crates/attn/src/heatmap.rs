//! Attention heatmaps.
