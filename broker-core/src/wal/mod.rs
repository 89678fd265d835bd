//! Segmented write-ahead log (in progress).
