//! statesnap: durable key-value state for stream processors that recovers fast.
//!
//! (The manual is written as the crate grows; see README.md.)
//!
//! # Plugging in a custom store
//!
//! A store implements [`store::StateStore`] (`get`, ordered `range`,
//! `apply(batch, applied_offset)` atomic with the offset, `applied_offset`,
//! `approximate_size`). To snapshot it, pick one of:
//!
//! * **The portable format, for free**: implement
//!   [`format::portable::PortableSource`] — one line with
//!   [`format::portable::PortableCut::materialize`] — and use
//!   [`format::portable::PortableFormat::new`] with a constructor for an
//!   empty store. Its snapshots are sorted, content-defined chunks that
//!   restore into *any* store type (a RocksDB snapshot restores into a
//!   `MemoryStore` and back).
//! * **Your own format**: implement [`format::StoreFormat`] (`capture` a
//!   consistent cut on the caller's thread, `write` it through a
//!   [`repo::SnapshotWriter`], `restore` from verified blobs,
//!   `create_empty`), when the store's files can be copied more cheaply
//!   than iterated.
//!
//! Either way [`snapshot::commit_snapshot`] commits the snapshot and
//! [`restore::restore_store`] restores it and replays the changelog tail.
//! `examples/custom_store.rs` does both for a store on one append-only file.

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
