//! Tensor file readers and writers.
