//! The RocksDB store format: checkpoints of immutable SST files, uploaded
//! incrementally, restored with verification and local-file reuse.
//!
//! # Capture
//!
//! [`StoreFormat::capture`] creates a RocksDB checkpoint (memtables of both
//! column families flushed atomically, SST files hard-linked) in a staging
//! directory on the store's filesystem — by default
//! `<store path>.statesnap-staging/checkpoint-<uuid>`. The applied offset, the
//! changelog binding and RocksDB's key/byte estimates are read from the live store
//! right after the checkpoint, under the same shared borrow: every write to a
//! [`RocksStore`] takes `&mut`, so none can come between the read and the
//! checkpoint, and the offset is exactly that of the checkpoint's contents
//! (invariant 2). (Earlier versions opened the checkpoint read-only to
//! read them — 2 to 8 ms per snapshot, most of an incremental snapshot's
//! fixed cost, for the same answer.) The [`RocksCut`] owns
//! the directory and removes it when dropped, whether the snapshot succeeded
//! or not; checkpoints left by a crashed process are removed by the next
//! capture or restore.
//!
//! # Incremental write
//!
//! SST files never change once written, so a file already in the repository
//! is not uploaded again. A file *name* is not an identity, though: two stores
//! restored from one snapshot both go on to write `000042.sst`, with different
//! bytes. The format therefore keeps a cache keyed on
//! `(writer incarnation, file name, size) → blake3`, where the incarnation is
//! [`RocksStore::incarnation`] (new on every open). The cache is filled by
//! every write and seeded by every restore (the restored files are exactly the
//! manifest's bytes). Per file:
//!
//! * a mutable file (`CURRENT`, `OPTIONS-*`, `MANIFEST-*`, the WAL) or an
//!   SST of the metadata column family, of at most [`MAX_INLINE_FILE`]
//!   bytes, the smallest first while they fit in [`MAX_INLINE_TOTAL`] →
//!   carried in the manifest ([`InlineFile`](crate::repo::InlineFile)).
//!   `MANIFEST-*` and a metadata SST (the flushed applied offset) are new
//!   with every snapshot, and as blobs each cost an upload and a durable
//!   write of its own (an fsync in a local repository, a PUT in an object
//!   store) before the manifest's; inline they ride on the manifest's. The
//!   data's SSTs, even small ones, stay blobs: later snapshots reuse them by
//!   reference;
//! * SST with a cached hash that the parent manifest also names → reused
//!   without any I/O;
//! * SST with a cached hash the repository already holds (`head`) → reused;
//! * SST with the same name and size as a parent file but no cached hash (a
//!   reopened store) → hashed locally, reused if the hash matches;
//! * anything else (new SSTs, a `MANIFEST-*` or WAL grown past the limit)
//!   → uploaded, hashed while read.
//!
//! Uploads run concurrently, bounded by the repository's
//! [`TransferOptions::parallelism`](crate::repo::TransferOptions).
//!
//! # Contents: digest and counts
//!
//! RocksDB only estimates how many keys a store holds (`estimate-num-keys`
//! counts every entry in every file, so overwritten and deleted keys not yet
//! compacted away count too: 231 542 for a store of 159 602 keys), and its
//! `estimate-live-data-size` is no byte count of the keys and values either.
//! So by default ([`StoreFormat::digest_by_default`]) the write step counts
//! the checkpoint's contents exactly, on blocking threads (`util::blocking`:
//! never the processing thread, never an executor thread), concurrently
//! with the uploads. It records the pairs' logical digest
//! ([`crate::digest::LogicalDigest`], which `verify --deep` and
//! digest-checking restores compare against) and the exact key and byte
//! counts (`stats.counts_exact`). With the digest turned off
//! ([`crate::snapshot::SnapshotOptions::logical_digest`]) the manifest
//! records RocksDB's estimates, read at capture, and says they are.
//!
//! It counts in one of two ways, and the manifest's format metadata says
//! which (`digest`: `scanned` or `derived`, with `digest_keys_read`):
//!
//! * **derived** — the contents of a cut are those of the previous counted
//!   cut (the *base*) with exactly the keys written in between replaced by
//!   the last value written to each (or gone, if that was a delete). A
//!   store records every batch it applies — each key's last value — per
//!   interval between cuts (`store::written`), and keeps the base's
//!   checkpoint after its snapshot (opened read-only in the background).
//!   The digest is the base's, minus the base's pairs at those keys
//!   (batched point lookups, sorted), plus the pairs written: the cut's own
//!   checkpoint is not even opened, and nothing is scanned. Compactions (of
//!   the live store or of the checkpoint) change files, not contents, so
//!   they do not matter. What it costs: the keys and values written since
//!   the last snapshot in memory (at most 16 MiB per store,
//!   `store::written::MAX_HELD_BYTES`), and the base checkpoint's hard links
//!   on disk, which keep the files of one past version of the store alive
//!   until the next snapshot replaces it (at most one store's size;
//!   removed when the store closes, or as soon as its background open
//!   ends if that is still running). If the base cannot be read, the cut
//!   is scanned;
//! * **scanned** — every live pair read, in key ranges split at the SST
//!   files' first keys, one blocking thread each, as many as the machine
//!   has cores (at most 4), the ranges' digests summed. Used when no base
//!   applies: the first snapshot of a store opened or restored (the base
//!   lives in memory), after a bulk load (ingested files are not followed
//!   key by key), after a write that went around `apply` (RocksDB's
//!   sequence number moved without a recorded write), when more keys were
//!   written than the record holds, or when more than an eighth of the
//!   store's keys were (two lookups per key then cost more than one read in
//!   order).
//!
//! What it costs (`rocks_snapshot` bench and `statesnap bench`, 1 M keys,
//! 1 % rewritten between snapshots): see `docs/performance.md`. Before the
//! derivation every incremental snapshot was scanned: 0.372 s against
//! `BackupEngine`'s 0.011 s for the same change.
//!
//! # Space amplification
//!
//! An LSM store holds more bytes than its live data: overwritten and deleted
//! values sit in level 0 and the upper levels until compaction reaches them,
//! and a capture flushes the memtables on top. Under a write rate compaction
//! cannot keep up with (two cores, ten updates per key) a checkpoint of 110
//! MB of live data measured 415 MB. Shipping that makes every upload,
//! restore and stored byte 3.8x dearer.
//!
//! So the write step measures the cut's space amplification — the data's
//! SST bytes over those in its bottommost level (with everything still in
//! level 0: its largest files that do not overlap) and in other files whose
//! key range meets none of those, read at capture: an upper bound, since
//! those hold one version of each key and everything else may be newer
//! versions of the same keys (RocksDB's own
//! `estimate-live-data-size` was tried first: after a 1 % rewrite whose new
//! level-0 file overlaps every key range it reported 1.2 MB of live data
//! for a 115 MB store) — and when it is
//! above [`CompactionPolicy::max_space_amplification`] (default 1.3) it
//! compacts the *checkpoint* before uploading it: the checkpoint is opened
//! read-write in the background and fully compacted, which writes new files
//! into the checkpoint directory and unlinks its hard links. The live store's
//! files are never touched and the processing thread never waits (the
//! capture stays a flush and a hard-link checkpoint). Measured on the case
//! above: 415 MB became 115 MB in about 1.1 s of background work, and a
//! restore of it took 0.07 s instead of 0.13–0.4 s.
//!
//! What it costs, and the bounds on it: a compacted checkpoint's files are
//! new, so that snapshot uploads the live data in full, and the next one
//! uploads the live store's own files once more (afterwards snapshots are
//! incremental again). [`CompactionPolicy::min_interval`] (default 10 min)
//! allows one compacted snapshot per store incarnation per interval, so a
//! store snapshotted every second pays that at most once per interval;
//! [`CompactionPolicy::min_bytes`] (default 4 MiB) skips stores too small to
//! matter. Being an upper bound, the measure also counts upper-level keys
//! that are new but interleaved with the bottom's (a store growing at random
//! keys); the compaction then saves little and is bounded the same way. A
//! store growing in key order is not mistaken (its new files lie beside the
//! bottom level's; the scale bench's 4 M-key snapshot took 4.1-4.4 s with
//! the plain bottom-level measure, 1.2 s without the needless compaction),
//! and neither is one whose level-0 files are disjoint. The
//! manifest's format metadata records `space_amplification`, and
//! `compacted` (bytes before and after, seconds) when it happened.
//! [`RocksFormat::with_compaction`]`(None)` turns it off.
//!
//! # Restore
//!
//! Files are downloaded (verified: size and blake3, by the repository) into a
//! staging directory next to the target, `.<name>.statesnap-restore-<uuid>`.
//! An SST already present in the target directory with the same name, size
//! *and* blake3 (the local file is hashed) is hard-linked (or copied) instead
//! of downloaded. Only when every file is in place is the staging directory
//! renamed over the target (the old target is first renamed aside, and put
//! back if the restored store fails to open or sits at the wrong offset), and
//! the parent directory fsynced. A failed restore leaves the target as it was.
//!
//! By default ([`RestoreSync::Background`](crate::repo::RestoreSync)) the
//! files are not fsynced before that rename: the staging directory gets a
//! mark holding the kernel's boot id instead, and the opened store fsyncs
//! its files on a background thread, then removes the mark
//! ([`RocksStore::wait_durable`] waits for it). A store still marked from
//! an earlier boot is refused on open and restored again. On a local disk
//! this halves a restore: the disk's write-back of the whole store no
//! longer sits between the download and the first record.

mod cut;
mod digest;
mod restore;
mod write;

use cut::*;
pub use cut::{CompactionPolicy, RocksCut};
use digest::*;
use write::*;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rocksdb::{ColumnFamilyDescriptor, DB};

use super::staging::{
    Hold, blocking_held, check_replaceable, clean_restore_leftovers, hold, io_err,
    new_restore_staging, normalize_target, register_live, remove_leftovers, remove_path,
    split_target, swap_into_place, sync_dir, sync_tree, unregister_live,
};
use super::{
    FormatOutput, LocalStoreInfo, RestoreContext, RestoreStats, StoreFormat, WriteContext,
};
use crate::changelog::ChangelogBinding;
use crate::error::{Error, Result};
use crate::repo::{
    BlobHash, BlobRef, FileEntry, MAX_INLINE_FILE, MAX_INLINE_TOTAL, Manifest, PutOutcome,
    SnapshotStats, SnapshotWriter, StoreFormatId,
};
use crate::store::rocks::{
    META_CF, RocksOptions, RocksStore, read_applied_offset, read_binding, rocks_error,
};
use crate::store::unsynced;
use crate::store::written::{Base, Derivation, Follow, Sealed};
use crate::util::{blocking, drain_bounded};

/// Name of this format in manifests.
pub const FORMAT_NAME: &str = "rocksdb";
/// Version of this format.
pub const FORMAT_VERSION: u32 = 1;

const CHECKPOINT_PREFIX: &str = "checkpoint-";
const STAGING_SUFFIX: &str = ".statesnap-staging";

/// Store incarnations whose file hashes the cache keeps; the least recently
/// used one is forgotten beyond this (its next snapshot hashes its files
/// again — slower, never wrong). One per store a process snapshots or
/// restores is what matters; every restore makes a new incarnation.
pub const HASH_CACHE_INCARNATIONS: usize = 64;

/// File hashes per store incarnation: `(name, size) -> blake3`, bounded to
/// [`HASH_CACHE_INCARNATIONS`] incarnations, least recently used evicted.
/// Within one incarnation it holds only the files of its last snapshot or
/// restore, so it never grows with history.
#[derive(Debug, Default)]
struct HashCache {
    by_incarnation: HashMap<uuid::Uuid, HashMap<(String, u64), BlobHash>>,
    /// When each incarnation last had a checkpoint compacted.
    compacted_at: HashMap<uuid::Uuid, std::time::Instant>,
    /// Least recently used first.
    order: std::collections::VecDeque<uuid::Uuid>,
}

impl HashCache {
    fn touch(&mut self, inc: uuid::Uuid) {
        if let Some(i) = self.order.iter().position(|x| *x == inc) {
            self.order.remove(i);
        }
        self.order.push_back(inc);
    }

    fn get(&mut self, inc: uuid::Uuid, name: &str, size: u64) -> Option<BlobHash> {
        let h = self
            .by_incarnation
            .get(&inc)?
            .get(&(name.to_owned(), size))
            .copied();
        self.touch(inc);
        h
    }

    /// Forgets the least recently used incarnations beyond the bound.
    fn evict(&mut self) {
        while self.order.len() > HASH_CACHE_INCARNATIONS {
            if let Some(old) = self.order.pop_front() {
                self.by_incarnation.remove(&old);
                self.compacted_at.remove(&old);
            }
        }
    }

    /// Replaces everything known about `inc` by `files`.
    fn replace(&mut self, inc: uuid::Uuid, files: impl Iterator<Item = (String, u64, BlobHash)>) {
        let map = files.map(|(n, s, h)| ((n, s), h)).collect();
        self.by_incarnation.insert(inc, map);
        self.touch(inc);
        self.evict();
    }

    /// Whether `inc` may have a checkpoint compacted now (none in the last
    /// `interval`); if so, records that it does.
    fn claim_compaction(&mut self, inc: uuid::Uuid, interval: std::time::Duration) -> bool {
        let now = std::time::Instant::now();
        if self
            .compacted_at
            .get(&inc)
            .is_some_and(|t| now.duration_since(*t) < interval)
        {
            return false;
        }
        self.compacted_at.insert(inc, now);
        self.touch(inc);
        self.evict();
        true
    }

    fn incarnations(&self) -> usize {
        self.by_incarnation.len()
    }
}

/// The RocksDB [`StoreFormat`]. Cheap to clone; clones share the file-hash
/// cache, so use one format (or its clones) for restores and snapshots of a
/// store to get the most reuse.
#[derive(Debug, Clone)]
pub struct RocksFormat {
    options: RocksOptions,
    staging_root: Option<PathBuf>,
    cache: Arc<Mutex<HashCache>>,
    compaction: Option<CompactionPolicy>,
}

impl Default for RocksFormat {
    fn default() -> Self {
        RocksFormat::new(RocksOptions::default())
    }
}

impl RocksFormat {
    /// A format opening stores with `options`, staging checkpoints next to
    /// each store (`<store path>.statesnap-staging`).
    pub fn new(options: RocksOptions) -> Self {
        RocksFormat {
            options,
            staging_root: None,
            cache: Arc::new(Mutex::new(HashCache::default())),
            compaction: Some(CompactionPolicy::default()),
        }
    }

    /// When snapshots are compacted before upload; `None` never compacts
    /// (snapshots then carry the store's space amplification as it is).
    pub fn with_compaction(mut self, policy: Option<CompactionPolicy>) -> Self {
        self.compaction = policy;
        self
    }

    /// The compaction policy.
    pub fn compaction(&self) -> Option<&CompactionPolicy> {
        self.compaction.as_ref()
    }
    /// Stages checkpoints under `root` instead. It must be on the store's
    /// filesystem for checkpoints to be hard links rather than copies.
    pub fn with_staging_root(mut self, root: impl Into<PathBuf>) -> Self {
        self.staging_root = Some(root.into());
        self
    }

    /// The store options.
    pub fn options(&self) -> &RocksOptions {
        &self.options
    }

    /// Where checkpoints of the store at `store_path` are staged.
    pub fn staging_root_for(&self, store_path: &Path) -> PathBuf {
        match &self.staging_root {
            Some(r) => r.clone(),
            None => {
                let mut s = store_path.as_os_str().to_owned();
                s.push(STAGING_SUFFIX);
                PathBuf::from(s)
            }
        }
    }

    /// The blake3 this format knows for file `name` of `size` bytes written
    /// by store incarnation `incarnation`, if any.
    pub fn known_hash(&self, incarnation: uuid::Uuid, name: &str, size: u64) -> Option<BlobHash> {
        self.lock_cache().get(incarnation, name, size)
    }

    /// How many store incarnations the file-hash cache holds (at most
    /// [`HASH_CACHE_INCARNATIONS`]).
    pub fn cached_incarnations(&self) -> usize {
        self.lock_cache().incarnations()
    }

    fn lock_cache(&self) -> std::sync::MutexGuard<'_, HashCache> {
        match self.cache.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }

    /// Removes checkpoints and restore staging left by crashed runs for the
    /// store at `store_path`. Returns how many entries were removed.
    pub fn clean_leftovers(&self, store_path: &Path) -> Result<usize> {
        let mut n = remove_leftovers(&self.staging_root_for(store_path), |name| {
            name.starts_with(CHECKPOINT_PREFIX)
        })?;
        n += clean_restore_leftovers(store_path)?;
        Ok(n)
    }

    fn cf_descriptors(&self) -> (rocksdb::Options, Vec<ColumnFamilyDescriptor>) {
        let opts = self.options.db_options();
        let cfs = vec![
            ColumnFamilyDescriptor::new(rocksdb::DEFAULT_COLUMN_FAMILY_NAME, opts.clone()),
            ColumnFamilyDescriptor::new(META_CF, opts.clone()),
        ];
        (opts, cfs)
    }
}

impl StoreFormat for RocksFormat {
    type Store = RocksStore;
    type Cut = RocksCut;

    fn id(&self) -> StoreFormatId {
        StoreFormatId {
            name: FORMAT_NAME.to_owned(),
            version: FORMAT_VERSION,
        }
    }
    fn capture(&self, store: &RocksStore) -> Result<RocksCut> {
        self.checkpoint(store)
    }

    fn cut_offset(&self, cut: &RocksCut) -> Option<u64> {
        cut.offset
    }

    fn cut_binding(&self, cut: &RocksCut) -> Option<ChangelogBinding> {
        cut.binding.clone()
    }

    /// Yes: the write scans the checkpoint in a blocking task,
    /// concurrently with the uploads, for the digest and the exact counts
    /// (module docs, "Contents: digest and counts").
    fn digest_by_default(&self) -> bool {
        true
    }
    async fn write(&self, cut: RocksCut, ctx: WriteContext<'_>) -> Result<FormatOutput> {
        self.write_cut(cut, ctx).await
    }

    async fn restore(
        &self,
        manifest: &Manifest,
        ctx: RestoreContext<'_>,
    ) -> Result<(RocksStore, RestoreStats)> {
        self.restore_snapshot(manifest, ctx).await
    }

    fn inspect_local(&self, dir: &Path) -> Result<Option<LocalStoreInfo>> {
        // A store directory the runtime may adopt: marked as a store and
        // holding a RocksDB database. Anything else is not a local store.
        let marked = std::fs::symlink_metadata(dir.join(crate::store::STORE_MARKER))
            .is_ok_and(|m| m.is_file());
        if !marked || !dir.join("CURRENT").is_file() {
            return Ok(None);
        }
        // Restored on an earlier boot and never confirmed on disk: refused
        // (with why) rather than read.
        unsynced::check(dir)?;
        let info = self.read_checkpoint(dir)?;
        Ok(Some(LocalStoreInfo {
            applied_offset: info.offset,
            binding: info.binding,
        }))
    }

    fn reuses_local_file(&self, path: &str) -> bool {
        is_immutable(path)
    }

    fn open_local(&self, dir: &Path) -> Result<RocksStore> {
        check_replaceable(dir)?;
        // A crashed capture or restore may have left staging behind.
        self.clean_leftovers(dir)?;
        RocksStore::open(dir, &self.options)
    }

    fn create_empty(&self, target: &Path) -> Result<RocksStore> {
        check_replaceable(target)?;
        self.clean_leftovers(target)?;
        remove_path(target).map_err(|e| io_err("remove existing store", target, e))?;
        let store = RocksStore::open(target, &self.options)?;
        if let Ok((parent, _)) = split_target(target) {
            sync_dir(&parent)?;
        }
        Ok(store)
    }
}
#[cfg(test)]
mod tests {
    use super::*;

    /// Defect 9: the cache grew with every restore of a long-running
    /// process (each restore is a new incarnation).
    #[test]
    fn hash_cache_is_bounded_and_evicts_the_least_recently_used() {
        let mut c = HashCache::default();
        let h = BlobHash::from(blake3::hash(b"x"));
        let first = uuid::Uuid::new_v4();
        c.replace(first, std::iter::once(("1.sst".to_string(), 1, h)));
        let mut last = first;
        for i in 0..(HASH_CACHE_INCARNATIONS * 3) {
            let inc = uuid::Uuid::new_v4();
            c.replace(inc, std::iter::once((format!("{i}.sst"), 1, h)));
            // Keep `first` in use: it must survive the churn.
            assert_eq!(c.get(first, "1.sst", 1), Some(h));
            last = inc;
        }
        assert_eq!(c.incarnations(), HASH_CACHE_INCARNATIONS);
        assert_eq!(c.order.len(), HASH_CACHE_INCARNATIONS);
        assert!(
            c.get(last, &format!("{}.sst", HASH_CACHE_INCARNATIONS * 3 - 1), 1)
                .is_some()
        );
        // Replacing an incarnation forgets its files that are gone.
        c.replace(first, std::iter::once(("2.sst".to_string(), 1, h)));
        assert_eq!(c.get(first, "1.sst", 1), None);
        assert_eq!(c.get(first, "2.sst", 1), Some(h));
    }
}
