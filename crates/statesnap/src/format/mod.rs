//! Store formats: how one store type turns a consistent cut of itself into
//! repository blobs, and back.
//!
//! [`StoreFormat`] is the extension point: the RocksDB format copies immutable
//! SST files (incrementally), the portable format writes sorted, chunked runs
//! that any iterable store can produce and any store can load, and a custom
//! store can bring its own. The catalog half ([`crate::repo`]) knows nothing
//! of what is inside the files.
//!
//! Lifecycle of one snapshot:
//!
//! 1. [`StoreFormat::capture`] on the processing thread: as cheap as the store
//!    allows (an O(1) map clone, a RocksDB checkpoint of hard links). The cut
//!    carries the applied offset *read from the cut itself* (invariant 2).
//! 2. [`StoreFormat::write`], in the background: upload what the repository
//!    lacks through a [`SnapshotWriter`], reusing the parent's blobs.
//! 3. [`crate::snapshot::commit_snapshot`] commits the manifest (invariant 3).
//!
//! Restore: [`StoreFormat::restore`] downloads and verifies every file
//! (invariant 6) into a staging directory, moves it into place and opens the
//! store; [`crate::restore::restore_store`] picks the snapshot, falls back on
//! failure and replays the changelog tail.

pub mod portable;
#[cfg(feature = "rocksdb")]
pub mod rocks;
pub(crate) mod staging;

use std::future::Future;
use std::path::Path;

use crate::changelog::ChangelogBinding;
use crate::error::Result;
use crate::repo::{
    Manifest, Repository, SnapshotId, SnapshotStats, SnapshotWriter, StoreFormatId, StoreKey,
};
use crate::store::StateStore;

/// Everything a format's `write` may use.
#[derive(Debug)]
pub struct WriteContext<'a> {
    /// The repository.
    pub repo: &'a Repository,
    /// Which store partition.
    pub store_key: &'a StoreKey,
    /// The previous snapshot of this store (same lineage, same format), whose
    /// blobs may be reused; `None` for a first snapshot.
    pub parent: Option<&'a Manifest>,
    /// Whether the snapshot records a logical digest that
    /// [`StoreFormat::cut_digest`] did not give: a format that computes it
    /// while writing (the RocksDB format scans its checkpoint in a blocking
    /// task, concurrently with the uploads) does so only when this is set,
    /// and returns it in [`FormatOutput::logical_digest`].
    pub logical_digest: bool,
}

/// What a format's `write` produced. The writer holds every file (uploaded
/// or reused); [`crate::snapshot::commit_snapshot`] commits it.
#[derive(Debug)]
pub struct FormatOutput {
    /// The files of the snapshot, uploaded or reused.
    pub writer: SnapshotWriter,
    /// Keys and logical bytes (uploaded/reused bytes are filled in by the writer).
    pub stats: SnapshotStats,
    /// Free-form format metadata recorded in the manifest.
    pub format_metadata: serde_json::Value,
    /// Snapshots this one needs to restore (a delta's base chain).
    pub depends_on: Vec<SnapshotId>,
    /// Features a reader must understand (recorded in the manifest).
    pub required_features: Vec<String>,
    /// The cut's logical digest, when the write computed it (see
    /// [`WriteContext::logical_digest`]); `None` otherwise. Its key count
    /// must equal `stats.keys` when `stats.counts_exact` is set.
    pub logical_digest: Option<crate::digest::LogicalDigest>,
}

/// Everything a format's `restore` may use.
#[derive(Debug)]
pub struct RestoreContext<'a> {
    /// The repository.
    pub repo: &'a Repository,
    /// Where the restored store lives. A format that restores files moves
    /// them here only after every one is verified; whatever was there before
    /// may be reused (local-first restore) or replaced.
    pub target: &'a Path,
}

/// What a format's `restore` did, for the restore report.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RestoreStats {
    /// Wall time until every file was in place — downloaded and verified,
    /// or reused locally — and durable (fsynced). Zero when a format does
    /// not split its time (the portable format loads while it downloads).
    pub transfer: std::time::Duration,
    /// Wall time to put the restored files in place and open the store.
    pub open: std::time::Duration,
    /// Bytes downloaded from the repository.
    pub bytes_downloaded: u64,
    /// Bytes reused from files already present locally.
    pub bytes_reused_locally: u64,
    /// Files downloaded.
    pub files_downloaded: u64,
    /// Files reused locally.
    pub files_reused_locally: u64,
}

/// What a local store directory holds, read without changing it (see
/// [`StoreFormat::inspect_local`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalStoreInfo {
    /// The last changelog offset the local store applied.
    pub applied_offset: Option<u64>,
    /// The changelog incarnation the store follows.
    pub binding: Option<ChangelogBinding>,
}

/// A way to snapshot and restore one store type. Implemented by the RocksDB
/// and portable formats, and by custom stores.
pub trait StoreFormat: Send + Sync {
    /// The store this format snapshots and restores.
    type Store: StateStore;
    /// A consistent cut, sent to the background writer.
    type Cut: Send + 'static;

    /// Name and version recorded in manifests; restore refuses other names
    /// and newer versions.
    fn id(&self) -> StoreFormatId;

    /// Takes a consistent cut of `store` on the caller's thread.
    fn capture(&self, store: &Self::Store) -> Result<Self::Cut>;

    /// The changelog offset the cut reflects (`None`: the store had applied
    /// nothing, so there is nothing worth snapshotting).
    fn cut_offset(&self, cut: &Self::Cut) -> Option<u64>;

    /// The changelog incarnation the cut's offset belongs to, read from the
    /// cut itself like the offset (`None`: the store records none, and
    /// [`crate::snapshot::commit_snapshot`] refuses to tag it).
    fn cut_binding(&self, cut: &Self::Cut) -> Option<ChangelogBinding>;

    /// Turns the cut into blobs in the repository.
    fn write(
        &self,
        cut: Self::Cut,
        ctx: WriteContext<'_>,
    ) -> impl Future<Output = Result<FormatOutput>> + Send;

    /// Rebuilds a store from the snapshot `manifest` into `ctx.target`,
    /// verifying every byte before use. On error the target must be left as
    /// it was (or empty), never half-restored.
    fn restore(
        &self,
        manifest: &Manifest,
        ctx: RestoreContext<'_>,
    ) -> impl Future<Output = Result<(Self::Store, RestoreStats)>> + Send;

    /// An empty store at `target` (removing anything there), for a full
    /// replay when no snapshot can be used.
    fn create_empty(&self, target: &Path) -> Result<Self::Store>;

    /// What the store at `dir` holds, read without changing anything
    /// (`Ok(None)`: no store of this format is there). Local-first restore
    /// keeps such a store when it follows the same changelog and is at or
    /// past the newest usable snapshot, so only the tail is replayed. The
    /// default says there is never one (a store that lives only in memory).
    fn inspect_local(&self, dir: &Path) -> Result<Option<LocalStoreInfo>> {
        let _ = dir;
        Ok(None)
    }

    /// The logical digest of the cut's contents
    /// ([`crate::digest::LogicalDigest`]), for the manifest, computed
    /// before `write`, for cuts whose digest is cheap (the portable format
    /// follows a memory cut's changes). A scan belongs on a blocking thread
    /// (`tokio::task::spawn_blocking`), never on the polling one: the task
    /// that runs the snapshot shares its executor with other stores'
    /// uploads. `Ok(None)`: none here — the format computes it in `write`
    /// instead ([`WriteContext::logical_digest`]; the RocksDB format), or
    /// cannot compute one.
    fn cut_digest(
        &self,
        cut: &Self::Cut,
    ) -> impl Future<Output = Result<Option<crate::digest::LogicalDigest>>> + Send {
        let _ = cut;
        std::future::ready(Ok(None))
    }

    /// Whether snapshots record a logical digest unless told otherwise
    /// (the portable and RocksDB formats: yes).
    fn digest_by_default(&self) -> bool {
        false
    }

    /// Whether a restore reuses a local file at the snapshot file's `path`
    /// (same size, hash checked) instead of downloading it. Plans count
    /// such files as local bytes. Default: never.
    fn reuses_local_file(&self, path: &str) -> bool {
        let _ = path;
        false
    }

    /// Opens the store at `dir` that [`StoreFormat::inspect_local`] found,
    /// for writing. Called only after `inspect_local` returned `Some`.
    fn open_local(&self, dir: &Path) -> Result<Self::Store> {
        Err(crate::error::Error::config(format!(
            "this store format keeps no local store format=`{}` path=`{}`",
            self.id().name,
            dir.display()
        )))
    }
}
