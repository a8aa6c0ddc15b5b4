//! Shared conformance suites (feature `conformance`).

pub mod repo {}
