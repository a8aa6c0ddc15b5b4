//! statesnap: durable key-value state for stream processors that recovers fast.
//!
//! A state store ([`store::MemoryStore`], `store::RocksStore`,
//! or your own [`store::StateStore`]) is a local cache of its changelog
//! ([`changelog::Changelog`]: the embedded [`changelog::file::FileChangelog`],
//! or Kafka with feature `kafka`). [`store::LoggedStore`] appends
//! every committed batch to the changelog first and then applies it to the
//! store, tagged with its offset. A snapshot copies a consistent cut of the
//! store to a [`repo::Repository`] (local directory, S3, GCS, Azure, memory)
//! tagged with that offset; restore loads the newest usable snapshot and
//! replays the changelog after it. The invariants are in
//! `docs/architecture.md`, the on-disk formats in `docs/format.md`.
//!
//! # Quick start
//!
//! The runtime ([`runtime`]) is the one way in: one [`StateManager`] per
//! process, one [`StateHandle`] per store partition, opened restored and
//! ready, snapshotted in the background, handed off on close.
//!
//! ```
//! # #[tokio::main(flavor = "multi_thread", worker_threads = 2)]
//! # async fn main() -> statesnap::Result<()> {
//! use statesnap::{FileChangelog, Repository, SnapshotPolicy, StateManager, StoreKey, StoreSpec};
//! # let dir = tempfile::tempdir().expect("tempdir");
//! # let url = format!("file://{}", dir.path().join("repo").display());
//! let carts_0 = StoreKey::new("shop", "carts", 0)?; // application, store, partition
//! # let id = carts_0.changelog_id();
//! # let log = || FileChangelog::open(dir.path().join("log"), id.clone(), Default::default());
//!
//! let state = StateManager::builder(Repository::init(&url, Default::default()).await?)
//!     .policy(SnapshotPolicy::default().every_records(100_000))
//!     .build()?;
//! let mut carts = state.open(StoreSpec::memory(carts_0.clone(), log()?, dir.path().join("carts"))).await?;
//! carts.put("cart-1", "apples");
//! carts.commit()?;                      // changelog first, then the store
//! assert_eq!(carts.get(b"cart-1")?.as_deref(), Some(&b"apples"[..]));
//! carts.close().await?;                 // handoff snapshot
//!
//! // The next owner: the snapshot, nothing to replay.
//! let carts = state.open(StoreSpec::memory(carts_0, log()?, dir.path().join("carts"))).await?;
//! assert_eq!(carts.report().replay.records, 0);
//! # Ok(()) }
//! ```
//!
//! # The lower layer
//!
//! The runtime is made of calls you can also make yourself: a
//! [`LoggedStore`] (changelog first, then the store), a format's `capture`
//! and [`commit_snapshot`], and [`restore_store`] (or [`restore::plan_restore`]
//! for the decision alone).
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> statesnap::Result<()> {
//! use statesnap::{
//!     FileChangelog, FileChangelogOptions, LoggedStore, MemoryStore, PortableFormat,
//!     Repository, RestoreOptions, StateStore, StateStoreExt, StoreFormat, StoreKey,
//!     commit_snapshot, restore_store,
//! };
//!
//! let dir = tempfile::tempdir().expect("tempdir");
//! let store_key = StoreKey::new("shop", "carts", 0)?;
//! let id = store_key.changelog_id(); // topic shop-carts-changelog, partition 0
//! let log = FileChangelog::open(dir.path().join("log"), id, FileChangelogOptions::default())?;
//!
//! // Write through the logged store: read-your-writes, then commit.
//! let mut carts = LoggedStore::new(MemoryStore::new(), log)?;
//! carts.put("cart-1", "apples");
//! carts.put("cart-2", "pears");
//! carts.commit()?;
//!
//! // Snapshot: an O(1) cut on this thread, written and committed async.
//! let url = format!("file://{}", dir.path().join("repo").display());
//! let repo = Repository::init(&url, Default::default()).await?;
//! let format = PortableFormat::memory();
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
//! Either way the runtime takes it as it takes the built-in ones
//! (`StoreSpec::new(store_key, changelog, format, dir)`), and underneath
//! [`commit_snapshot`] commits its snapshots and
//! [`restore::restore_store`] restores them and replays the changelog tail.
//! `examples/custom_store.rs` runs a store on one append-only file through
//! the runtime. A format that keeps a local store implements
//! [`format::StoreFormat::inspect_local`] and `open_local` so a reopen keeps
//! it instead of restoring.

#![deny(rustdoc::broken_intra_doc_links)]
#![warn(unnameable_types)]

#[cfg(feature = "bench")]
pub mod bench;
pub mod changelog;
pub mod clock;
pub mod commit;
#[cfg(feature = "conformance")]
pub mod conformance;
pub(crate) mod digest;
pub(crate) mod error;
pub mod format;
#[cfg(feature = "kafka")]
pub mod group;
pub mod repo;
pub mod reshard;
pub mod restore;
pub mod runtime;
pub(crate) mod snapshot;
pub mod store;
mod util;

pub use digest::LogicalDigest;
pub use error::{Error, ErrorKind, Reason, Result};

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
pub use runtime::{SnapshotPolicy, StandbyHandle, StateHandle, StateManager, StoreSpec};
pub use snapshot::{SnapshotOptions, commit_snapshot, commit_snapshot_with};
pub use store::logged::LoggedStore;
pub use store::memory::MemoryStore;
#[cfg(feature = "rocksdb")]
pub use store::rocks::{RocksOptions, RocksStore};
pub use store::{StateStore, StateStoreExt};

/// The README's code blocks, compiled as doctests: its library example
/// must keep building.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
struct ReadmeDoctests;
