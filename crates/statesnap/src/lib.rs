//! statesnap: durable key-value state for stream processors that recovers fast.
//!
//! (The manual is written as the crate grows; see README.md.)

#![deny(rustdoc::broken_intra_doc_links)]

pub mod changelog;
pub mod clock;
#[cfg(feature = "conformance")]
pub mod conformance;
pub mod error;
pub mod format;
pub mod repo;
pub mod restore;
pub mod snapshot;
pub mod store;
mod util;

pub use error::{Error, ErrorKind, Result};
