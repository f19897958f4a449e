//! Indexes.
