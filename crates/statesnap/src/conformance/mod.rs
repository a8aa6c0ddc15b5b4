//! Shared conformance suites for the public traits (feature `conformance`).
//!
//! Every implementation of a trait runs the same suite, so that backends
//! cannot drift apart in behaviour: ours from `tests/`, yours from your own
//! tests. The checks panic (like `assert!`) with a message saying what broke.

pub mod changelog;
pub mod format;
pub mod repo;
pub mod store;
