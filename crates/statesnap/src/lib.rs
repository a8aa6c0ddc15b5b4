//! statesnap: durable key-value state for stream processors that recovers fast.
//!
//! A state store ([`store::memory::MemoryStore`], `store::rocks::RocksStore`,
//! or your own [`store::StateStore`]) is a local cache of its changelog
//! ([`changelog::Changelog`]: the embedded [`changelog::file::FileChangelog`],
//! or Kafka with feature `kafka`). [`store::logged::LoggedStore`] appends
//! every committed batch to the changelog first and then applies it to the
//! store, tagged with its offset. A snapshot copies a consistent cut of the
//! store to a [`repo::Repository`] (local directory, S3, GCS, Azure, memory)
//! tagged with that offset; restore loads the newest usable snapshot and
//! replays the changelog after it. The invariants are in
//! `docs/architecture.md`, the on-disk formats in `docs/format.md`.
//!
//! # Quick start
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> statesnap::Result<()> {
//! use statesnap::{
//!     ChangelogId, FileChangelog, FileChangelogOptions, LoggedStore, MemoryStore, PortableFormat,
//!     Repository, RestoreOptions, StateStore, StateStoreExt, StoreFormat, StoreKey,
//!     commit_snapshot, restore_store,
//! };
//!
//! let dir = tempfile::tempdir().expect("tempdir");
//! let id = ChangelogId::for_store("shop", "carts", 0)?; // topic shop-carts-changelog
//! let log = FileChangelog::open(dir.path().join("log"), id, FileChangelogOptions::default())?;
//!
//! // Write through the logged store: read-your-writes, then commit.
//! let mut carts = LoggedStore::new(MemoryStore::new(), log)?;
//! carts.put("cart-1", "apples");
//! carts.put("cart-2", "pears");
//! assert_eq!(carts.get(b"cart-1")?.as_deref(), Some(&b"apples"[..]));
//! carts.commit()?;
//!
//! // Snapshot: an O(1) cut on this thread, written and committed async.
//! let url = format!("file://{}", dir.path().join("repo").display());
//! let repo = Repository::init(&url, Default::default()).await?;
//! let format = PortableFormat::memory();
//! let store_key = StoreKey::new("shop", "carts", 0)?;
//! let cut = format.capture(carts.store())?;
//! let manifest = commit_snapshot(&format, cut, &repo, &store_key, carts.changelog(), None).await?;
//!
//! // More writes after the snapshot land only in the changelog tail.
//! carts.delete("cart-2");
//! carts.commit()?;
//! let (_, log) = carts.into_parts();
//!
//! // Restore = newest usable snapshot + replay of the tail.
//! let (store, report) = restore_store(
//!     &format, &repo, &store_key, &log, &dir.path().join("restored"), &RestoreOptions::default(),
//! ).await?;
//! assert_eq!(report.snapshot, Some(manifest.snapshot_id));
//! assert_eq!(report.replay.records, 1);
//! let keys: Vec<_> = store.iter()?.map(|kv| kv.map(|(k, _)| k)).collect::<Result<_, _>>()?;
//! assert_eq!(keys, vec![bytes::Bytes::from("cart-1")]);
//! # Ok(()) }
//! ```
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

// What a user touches, reachable from the crate root. The modules stay
// public for everything else (options structs, reports, traits' helpers).
pub use changelog::file::{FileChangelog, FileChangelogOptions, FsyncPolicy};
#[cfg(feature = "kafka")]
pub use changelog::kafka::{KafkaChangelog, KafkaOptions};
pub use changelog::{Changelog, ChangelogId, Record};
pub use format::StoreFormat;
pub use format::portable::PortableFormat;
#[cfg(feature = "rocksdb")]
pub use format::rocks::RocksFormat;
pub use repo::{Manifest, Repository, RepositoryOptions, SnapshotId, StoreKey};
pub use restore::{ReplayOptions, RestoreOptions, RestoreReport, replay, restore_store};
pub use snapshot::commit_snapshot;
pub use store::logged::LoggedStore;
pub use store::memory::MemoryStore;
#[cfg(feature = "rocksdb")]
pub use store::rocks::{RocksOptions, RocksStore};
pub use store::{StateStore, StateStoreExt};
