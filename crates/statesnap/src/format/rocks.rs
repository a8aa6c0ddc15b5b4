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
//! So by default ([`StoreFormat::digest_by_default`]) the write step opens
//! the checkpoint read-only and reads every live pair — in key ranges split
//! at its SST files' first keys, one blocking thread each, as many as the
//! machine has cores (at most 4), the ranges' digests summed — with
//! `spawn_blocking` (never the processing thread, never an executor
//! thread), concurrently with the uploads. It records the pairs' logical
//! digest ([`crate::digest::LogicalDigest`], which `verify --deep` and
//! digest-checking restores compare against) and the exact key and byte
//! counts (`stats.counts_exact`). With the digest turned off
//! ([`crate::snapshot::SnapshotOptions::logical_digest`]) the manifest
//! records RocksDB's estimates, read at capture, and says they are.
//!
//! What it costs: the scan reads every pair, so it grows with the store,
//! not with what changed, and it sets the pace of an incremental snapshot.
//! The `rocks_snapshot` bench, 1 M keys, on two cores kept busy by other
//! builds (load average 8–10), before → after: full snapshot 0.19–0.26 s →
//! 0.97–1.07 s, incremental (1 % of the keys rewritten) 0.044–0.048 s →
//! 0.86–0.99 s. (Following the changes instead — the previous checkpoint's
//! digest adjusted by the keys its successor's new files hold — would make
//! it proportional to the change; not done yet.)
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

/// What a checkpoint's metadata says.
struct CheckpointInfo {
    offset: Option<u64>,
    binding: Option<ChangelogBinding>,
    keys: u64,
    bytes: u64,
}
use crate::util::drain_bounded;

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

/// A consistent cut of a [`RocksStore`]: a checkpoint directory this value
/// owns (removed on drop, once the scan that counts its contents let go of
/// it too), with the offset and statistics read from it.
#[derive(Debug)]
pub struct RocksCut {
    dir: Arc<CheckpointDir>,
    files: Vec<(String, u64)>,
    offset: Option<u64>,
    binding: Option<ChangelogBinding>,
    keys: u64,
    logical_bytes: u64,
    incarnation: uuid::Uuid,
    /// SST bytes of the data column family, and of those the bytes certain
    /// to hold one version of each key (read at capture; see
    /// [`RocksCut::space_amplification`]).
    data_bytes: u64,
    bottom_bytes: u64,
    /// SST files of the metadata column family (the applied offset and the
    /// binding): a new one with every snapshot, a few KiB each.
    meta_files: std::collections::HashSet<String>,
    /// Set once the write step compacted the checkpoint: its files are no
    /// longer the live store's.
    compacted: Option<Compacted>,
}

/// What compacting a checkpoint did.
#[derive(Debug, Clone, Copy)]
struct Compacted {
    sst_bytes_before: u64,
    secs: f64,
}

impl RocksCut {
    /// The checkpoint directory.
    pub fn dir(&self) -> &Path {
        &self.dir.0
    }

    /// Files of the checkpoint: name and size, sorted by name.
    pub fn files(&self) -> &[(String, u64)] {
        &self.files
    }

    /// The incarnation of the store it was taken from.
    pub fn incarnation(&self) -> uuid::Uuid {
        self.incarnation
    }

    /// Bytes of its SST and blob files.
    pub fn sst_bytes(&self) -> u64 {
        self.files
            .iter()
            .filter(|(n, _)| is_immutable(n))
            .map(|(_, s)| s)
            .sum()
    }

    /// Its space amplification, bounded from above: the data's SST bytes
    /// over those certain to hold one version of each key — the bottommost
    /// level (with everything still in level 0: its largest files that do
    /// not overlap), and other files whose key range meets none of those
    /// (everything else may be newer versions of the same keys). 1.0 for a
    /// store without data.
    pub fn space_amplification(&self) -> f64 {
        if self.bottom_bytes == 0 {
            return 1.0;
        }
        self.data_bytes as f64 / self.bottom_bytes as f64
    }
}

/// When the write step compacts a checkpoint before uploading it (see the
/// module docs, "Space amplification").
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CompactionPolicy {
    /// Compact a checkpoint whose SST bytes exceed this multiple of the
    /// store's live data (default 1.3).
    pub max_space_amplification: f64,
    /// Never compact a checkpoint of fewer SST bytes (default 4 MiB: below
    /// that a restore is mostly fixed costs, and the bytes saved do not pay
    /// for the rewrite).
    pub min_bytes: u64,
    /// At most one compacted snapshot per store incarnation in this interval
    /// (default 10 minutes). Each one rewrites and uploads the live data
    /// once, and the next snapshot uploads the live store's own files once
    /// more; the interval bounds that cost for frequent snapshots.
    pub min_interval: std::time::Duration,
}

impl Default for CompactionPolicy {
    fn default() -> Self {
        CompactionPolicy {
            max_space_amplification: 1.3,
            min_bytes: 4 << 20,
            min_interval: std::time::Duration::from_secs(600),
        }
    }
}

/// A checkpoint directory, removed when its last owner lets go: the cut,
/// and the blocking scan that counts its contents (which finishes on its
/// own thread if the write is cancelled under it).
#[derive(Debug)]
struct CheckpointDir(PathBuf, ParentOnDrop);

/// What happens to a checkpoint's staging directory when the checkpoint
/// goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ParentOnDrop {
    /// The default `<store>.statesnap-staging`, ours: removed once empty,
    /// so no empty directory outlives the snapshots beside the store.
    RemoveIfEmpty,
    /// A root the caller chose ([`RocksFormat::with_staging_root`]): kept.
    Keep,
}

impl Drop for CheckpointDir {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.0)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(path = %self.0.display(), error = %e, "cannot remove checkpoint; the next capture will");
        }
        unregister_live(&self.0);
        if self.1 == ParentOnDrop::RemoveIfEmpty
            && let Some(parent) = self.0.parent()
        {
            // Fails (and is meant to) while another checkpoint is in it; a
            // capture that finds it gone makes it again.
            let _ = std::fs::remove_dir(parent);
        }
    }
}

/// What a scan of a checkpoint's data counted: its logical digest (with
/// the exact key count) and its logical bytes.
#[derive(Debug, Clone, Copy)]
struct Counted {
    digest: crate::digest::LogicalDigest,
    logical_bytes: u64,
}

/// Sets its flag when dropped: stops a scan whose write was cancelled or
/// failed.
struct StopOnDrop(Arc<std::sync::atomic::AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// How many parts a checkpoint's scan is split into, each read on a
/// blocking thread of its own: the machine's cores, at most 4.
fn scan_parts() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get().min(4))
}

/// Keys splitting a checkpoint's data into at most `parts` ranges of about
/// equal SST bytes: the first keys of its files (sorted), where the bytes
/// before them cross a quantile. Sorted and distinct. Any keys would be
/// correct — the ranges between them partition the key space — these only
/// balance the work.
fn split_keys(live: &[rocksdb::LiveFile], parts: usize) -> Vec<Vec<u8>> {
    let mut files: Vec<(&[u8], u64)> = live
        .iter()
        .filter(|f| f.column_family_name == rocksdb::DEFAULT_COLUMN_FAMILY_NAME)
        .filter_map(|f| Some((f.start_key.as_deref()?, f.size as u64)))
        .collect();
    files.sort();
    let total: u64 = files.iter().map(|f| f.1).sum();
    let parts = parts.max(1) as u64;
    let mut keys: Vec<Vec<u8>> = Vec::new();
    let (mut before, mut next) = (0u64, 1u64);
    for (start, size) in files {
        if next < parts && before > 0 && before >= total / parts * next {
            if keys.last().is_none_or(|k| k.as_slice() < start) {
                keys.push(start.to_vec());
            }
            next += 1;
        }
        before += size;
    }
    keys
}

/// Reads every live pair of the data column family of `db` (a checkpoint
/// at `dir`, opened read-only) in `[lower, upper)` into a logical digest
/// and a byte count. Blocking. `Ok(None)` when `stop` was set before it
/// finished.
fn scan_range(
    db: &DB,
    dir: &Path,
    lower: Option<&[u8]>,
    upper: Option<Vec<u8>>,
    stop: &std::sync::atomic::AtomicBool,
) -> Result<Option<Counted>> {
    let cf = db
        .cf_handle(rocksdb::DEFAULT_COLUMN_FAMILY_NAME)
        .ok_or_else(|| {
            Error::corrupt(format!(
                "checkpoint has no default column family path=`{}`",
                dir.display()
            ))
        })?;
    let mut read = rocksdb::ReadOptions::default();
    // One pass over everything: nothing worth keeping in the block cache.
    read.fill_cache(false);
    read.set_readahead_size(2 << 20);
    if let Some(u) = upper {
        read.set_iterate_upper_bound(u);
    }
    let mut it = db.raw_iterator_cf_opt(cf, read);
    match lower {
        Some(l) => it.seek(l),
        None => it.seek_to_first(),
    }
    let mut digest = crate::digest::LogicalDigest::new();
    let mut logical_bytes = 0u64;
    while let (Some(k), Some(v)) = (it.key(), it.value()) {
        digest.add(k, v);
        logical_bytes += (k.len() + v.len()) as u64;
        if digest.keys().is_multiple_of(4096) && stop.load(std::sync::atomic::Ordering::Relaxed) {
            return Ok(None);
        }
        it.next();
    }
    it.status()
        .map_err(|e| rocks_error("read checkpoint", dir, e))?;
    Ok(Some(Counted {
        digest,
        logical_bytes,
    }))
}

/// Whether RocksDB never rewrites a file of this name once written.
fn is_immutable(name: &str) -> bool {
    name.ends_with(".sst") || name.ends_with(".blob")
}

/// File names of the metadata column family's SSTs among `live`.
fn meta_names(live: &[rocksdb::LiveFile]) -> impl Iterator<Item = String> + '_ {
    live.iter()
        .filter(|f| f.column_family_name == META_CF)
        .filter_map(|f| Path::new(&f.name).file_name())
        .map(|n| n.to_string_lossy().into_owned())
}

/// The live SST files of `store` now.
fn live_files(store: &RocksStore) -> Result<Vec<rocksdb::LiveFile>> {
    store
        .db()
        .live_files()
        .map_err(|e| rocks_error("list live files", store.path(), e))
}

/// Which of a checkpoint's files (name and size) its manifest carries
/// inline: the mutable ones and the metadata column family's SSTs (`meta`;
/// the data's SSTs stay blobs, which later snapshots reuse by reference),
/// the smallest first, each at most [`MAX_INLINE_FILE`], while they fit in
/// [`MAX_INLINE_TOTAL`].
fn inline_choice(files: &[(String, u64)], meta: &std::collections::HashSet<String>) -> Vec<bool> {
    let mut by_size: Vec<usize> = (0..files.len())
        .filter(|&i| {
            let (name, size) = &files[i];
            (!is_immutable(name) || meta.contains(name)) && *size <= MAX_INLINE_FILE
        })
        .collect();
    by_size.sort_by_key(|&i| files[i].1);
    let mut chosen = vec![false; files.len()];
    let mut room = MAX_INLINE_TOTAL;
    for i in by_size {
        let Some(left) = room.checked_sub(files[i].1) else {
            break;
        };
        room = left;
        chosen[i] = true;
    }
    chosen
}

/// Files of a checkpoint that belong in a snapshot (not the info log or lock).
fn snapshot_file(name: &str) -> bool {
    !(name == "LOCK" || name.starts_with("LOG"))
}

fn hash_file(path: &Path) -> Result<BlobHash> {
    let f = std::fs::File::open(path).map_err(|e| io_err("open file to hash", path, e))?;
    let mut h = blake3::Hasher::new();
    h.update_reader(std::io::BufReader::with_capacity(1 << 20, f))
        .map_err(|e| io_err("read file to hash", path, e))?;
    Ok(BlobHash::from(h.finalize()))
}

async fn hash_file_async(path: PathBuf) -> Result<BlobHash> {
    tokio::task::spawn_blocking(move || hash_file(&path))
        .await
        .map_err(|e| Error::internal("file hashing task failed").with_source(e))?
}

/// One checkpoint file's part of a snapshot: reuse the parent's blob, or
/// one the repository already holds, or upload the file.
async fn write_step(
    repo: crate::repo::Repository,
    sk: crate::repo::StoreKey,
    local: PathBuf,
    name: String,
    size: u64,
    plan: Plan,
) -> Result<(String, Done)> {
    // A parent's blob is reused only if it is still there: gc may have
    // swept it since (a retried snapshot re-uploads it from the checkpoint
    // instead of failing its commit again).
    let stored = |hash: BlobHash| {
        let (repo, sk) = (&repo, &sk);
        async move {
            Ok::<_, Error>(
                repo.blobs()
                    .head_blob(sk, &hash)
                    .await?
                    .is_some_and(|i| i.size == size),
            )
        }
    };
    let done = match plan {
        Plan::Inline => {
            let path = local.clone();
            let bytes =
                blocking(move || std::fs::read(&path).map_err(|e| io_err("read file", &path, e)))
                    .await?;
            // Chosen for its listed size; a file that changed since (not
            // one of ours) goes as a blob instead of overrunning the room.
            if bytes.len() as u64 == size {
                Done::Inline(bytes)
            } else {
                Done::Stored(repo.blobs().put_blob_file(&sk, &local).await?)
            }
        }
        Plan::Reuse(e) if stored(e.blake3).await? => Done::Reused(e),
        Plan::Known(hash) if stored(hash).await? => Done::Stored(PutOutcome {
            blob: BlobRef { hash, size },
            uploaded: false,
        }),
        Plan::CompareLocal(p)
            if hash_file_async(local.clone()).await? == p.blake3 && stored(p.blake3).await? =>
        {
            Done::Reused(FileEntry {
                path: name.clone(),
                size,
                blake3: p.blake3,
            })
        }
        // An SST is never written again once RocksDB finished it: a local
        // repository may link it (`TransferOptions::link_immutable_files`).
        _ if is_immutable(&name) => {
            Done::Stored(repo.blobs().put_immutable_file(&sk, &local).await?)
        }
        _ => Done::Stored(repo.blobs().put_blob_file(&sk, &local).await?),
    };
    Ok((name, done))
}

/// What one file's write step produced.
enum Done {
    /// Named by the parent manifest: reuse its entry.
    Reused(FileEntry),
    /// Stored (uploaded, or found already present).
    Stored(PutOutcome),
    /// Read, to be carried in the manifest.
    Inline(Vec<u8>),
}

enum Plan {
    /// Cached hash named by the parent.
    Reuse(FileEntry),
    /// Cached hash, not in the parent: the repository may still hold it.
    Known(BlobHash),
    /// Same name and size as this parent file, hash unknown: hash locally.
    CompareLocal(FileEntry),
    /// Upload (hashing while streaming).
    Upload,
    /// Carry in the manifest (small files; module docs, "Incremental write").
    Inline,
}

impl Plan {
    /// Order in which the write starts the steps: slowest kind first.
    fn rank(&self) -> u8 {
        match self {
            Plan::Upload | Plan::CompareLocal(_) => 0,
            Plan::Known(_) | Plan::Reuse(_) => 1,
            Plan::Inline => 2,
        }
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

    /// Compacts the cut's checkpoint in place if the policy asks for it.
    /// The checkpoint is this cut's own directory of hard links: compacting
    /// it writes new files there and unlinks its links, and the live
    /// store's files are never touched.
    async fn compact_if_amplified(&self, cut: &mut RocksCut) -> Result<()> {
        let Some(policy) = self.compaction else {
            return Ok(());
        };
        let before = cut.sst_bytes();
        if before < policy.min_bytes || cut.space_amplification() <= policy.max_space_amplification
        {
            return Ok(());
        }
        if !self
            .lock_cache()
            .claim_compaction(cut.incarnation, policy.min_interval)
        {
            return Ok(());
        }
        let started = std::time::Instant::now();
        let (opts, cfs) = self.cf_descriptors();
        let dir = cut.dir().to_path_buf();
        let expected = cut.offset;
        let files = blocking(move || {
            let db = DB::open_cf_descriptors(&opts, &dir, cfs)
                .map_err(|e| rocks_error("open checkpoint to compact", &dir, e))?;
            for name in [rocksdb::DEFAULT_COLUMN_FAMILY_NAME, META_CF] {
                let cf = db.cf_handle(name).ok_or_else(|| {
                    Error::corrupt(format!(
                        "checkpoint has no column family `{name}` path=`{}`",
                        dir.display()
                    ))
                })?;
                db.compact_range_cf(cf, None::<&[u8]>, None::<&[u8]>);
            }
            // Same contents, same offset: anything else is a bug here.
            let offset = read_applied_offset(&db, &dir)?;
            if offset != expected {
                return Err(Error::internal(format!(
                    "compacting a checkpoint changed its offset path=`{}` before={expected:?} \
                     after={offset:?}",
                    dir.display()
                )));
            }
            drop(db);
            list_checkpoint(&dir)
        })
        .await?;
        cut.files = files;
        let secs = started.elapsed().as_secs_f64();
        tracing::info!(
            path = %cut.dir().display(),
            sst_bytes_before = before,
            sst_bytes_after = cut.sst_bytes(),
            secs,
            "compacted a space-amplified checkpoint before upload"
        );
        cut.compacted = Some(Compacted {
            sst_bytes_before: before,
            secs,
        });
        Ok(())
    }

    /// Counts the checkpoint `dir`'s contents: opens it read-only and reads
    /// its data in [`scan_parts`] key ranges, each on a blocking thread
    /// (`spawn_blocking`: never the processing thread, never an executor
    /// thread), their digests and byte counts summed. Each range task holds
    /// the directory until it ends. `Ok(None)` when `stop` was set first.
    async fn count_checkpoint(
        &self,
        dir: Arc<CheckpointDir>,
        stop: Arc<std::sync::atomic::AtomicBool>,
    ) -> Result<Option<Counted>> {
        let (opts, cfs) = self.cf_descriptors();
        let d = Arc::clone(&dir);
        let (db, splits) = blocking(move || {
            let db = DB::open_cf_descriptors_read_only(&opts, &d.0, cfs, false)
                .map_err(|e| rocks_error("open checkpoint read-only", &d.0, e))?;
            let live = db
                .live_files()
                .map_err(|e| rocks_error("list checkpoint files", &d.0, e))?;
            let splits = split_keys(&live, scan_parts());
            Ok((Arc::new(db), splits))
        })
        .await?;
        let mut bounds: Vec<Option<Vec<u8>>> = vec![None];
        bounds.extend(splits.into_iter().map(Some));
        let n = bounds.len();
        // The last range takes `db` itself: only the tasks hold it, so it
        // is closed on a blocking thread.
        let mut db = Some(db);
        let mut tasks = Vec::with_capacity(n);
        for i in 0..n {
            let lower = bounds[i].clone();
            let upper = bounds.get(i + 1).cloned().flatten();
            let db = if i + 1 == n {
                db.take()
            } else {
                db.as_ref().map(Arc::clone)
            };
            let (dir, stop) = (Arc::clone(&dir), Arc::clone(&stop));
            tasks.push(tokio::task::spawn_blocking(move || {
                let r = match &db {
                    Some(db) => scan_range(db, &dir.0, lower.as_deref(), upper, &stop),
                    None => Ok(None),
                };
                // The database before its directory.
                drop(db);
                drop(dir);
                r
            }));
        }
        let mut total = Counted {
            digest: crate::digest::LogicalDigest::new(),
            logical_bytes: 0,
        };
        let (mut stopped, mut failed) = (false, None);
        // Every task is awaited, also after a failure (which stops the
        // others), so none holds the directory when this returns.
        for task in tasks {
            let part = task
                .await
                .map_err(|e| Error::internal("checkpoint scan task failed").with_source(e))
                .and_then(|r| r);
            match part {
                Ok(Some(c)) => {
                    total.digest.merge(&c.digest);
                    total.logical_bytes += c.logical_bytes;
                }
                Ok(None) => stopped = true,
                Err(e) => {
                    stop.store(true, std::sync::atomic::Ordering::Relaxed);
                    failed.get_or_insert(e);
                }
            }
        }
        match failed {
            Some(e) => Err(e),
            None => Ok((!stopped).then_some(total)),
        }
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

    /// Reads offset, binding and statistics from a store directory, opened
    /// read-only.
    fn read_checkpoint(&self, dir: &Path) -> Result<CheckpointInfo> {
        let (opts, cfs) = self.cf_descriptors();
        let db = DB::open_cf_descriptors_read_only(&opts, dir, cfs, false)
            .map_err(|e| rocks_error("open checkpoint read-only", dir, e))?;
        read_info(&db, dir)
    }

    fn seed_cache(&self, incarnation: uuid::Uuid, files: &[FileEntry]) {
        self.lock_cache().replace(
            incarnation,
            files
                .iter()
                .filter(|f| is_immutable(&f.path))
                .map(|f| (f.path.clone(), f.size, f.blake3)),
        );
    }

    /// Moves `staging` over `target`, opens the store and checks its offset;
    /// on failure puts the old target back.
    fn install(&self, staging: &Path, target: &Path, manifest: &Manifest) -> Result<RocksStore> {
        swap_into_place(staging, target, |target| {
            use crate::store::StateStore;
            let mut store = RocksStore::open(target, &self.options)?;
            // A checkpoint of a bound store carries its binding; one taken
            // before bindings existed is bound here, from the manifest.
            crate::store::bind_restored(&mut store, &manifest.changelog.binding())?;
            let applied = store.applied_offset()?;
            if applied != Some(manifest.changelog.offset) {
                return Err(Error::corrupt(format!(
                    "restored store does not sit at its snapshot's offset snapshot=`{}` \
                     snapshot_offset={} applied_offset={applied:?} path=`{}`",
                    manifest.snapshot_id,
                    manifest.changelog.offset,
                    target.display()
                )));
            }
            Ok(store)
        })
    }
}

/// The files of a checkpoint that belong in a snapshot: name and size,
/// sorted by name.
fn list_checkpoint(dir: &Path) -> Result<Vec<(String, u64)>> {
    let mut files = Vec::new();
    let rd = std::fs::read_dir(dir).map_err(|e| io_err("list checkpoint", dir, e))?;
    for entry in rd {
        let entry = entry.map_err(|e| io_err("list checkpoint", dir, e))?;
        let meta = entry
            .metadata()
            .map_err(|e| io_err("stat checkpoint file", &entry.path(), e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if meta.is_file() && snapshot_file(&name) {
            files.push((name, meta.len()));
        }
    }
    files.sort();
    Ok(files)
}

/// SST bytes of the data column family, and of those the bytes that hold
/// at most one version of each key: a reference set of files whose key
/// ranges do not overlap — the bottommost non-empty level, or with
/// everything still in level 0 the largest files taken greedily while they
/// overlap none already taken — plus every other file whose key range meets
/// none of the reference's (its keys cannot be newer versions of the
/// reference's: a store growing in key order).
fn level_bytes(files: &[rocksdb::LiveFile]) -> (u64, u64) {
    let mut data: Vec<&rocksdb::LiveFile> = files
        .iter()
        .filter(|f| f.column_family_name == rocksdb::DEFAULT_COLUMN_FAMILY_NAME)
        .collect();
    let total = data.iter().map(|f| f.size as u64).sum();
    fn range(f: &rocksdb::LiveFile) -> Option<(&[u8], &[u8])> {
        Some((f.start_key.as_deref()?, f.end_key.as_deref()?))
    }
    // Sorted by first key and non-overlapping: a key range meets one of
    // them iff it meets the last one starting at or before its end.
    let meets = |ranges: &[(&[u8], &[u8])], f: &rocksdb::LiveFile| -> bool {
        let Some((start, end)) = range(f) else {
            return true;
        };
        let i = ranges.partition_point(|(s, _)| *s <= end);
        i > 0 && ranges[i - 1].1 >= start
    };
    let bottom = data.iter().map(|f| f.level).max().unwrap_or(0);
    let mut reference: Vec<(&[u8], &[u8])> = Vec::new();
    let mut single = 0u64;
    if bottom > 0 {
        for f in data.iter().filter(|f| f.level == bottom) {
            single += f.size as u64;
            reference.extend(range(f));
        }
        reference.sort();
    } else {
        data.sort_by_key(|f| std::cmp::Reverse(f.size));
        for f in &data {
            if let Some(r) = range(f)
                && !meets(&reference, f)
            {
                single += f.size as u64;
                let at = reference.partition_point(|x| *x < r);
                reference.insert(at, r);
            }
        }
        return (total, single);
    }
    single += data
        .iter()
        .filter(|f| f.level != bottom && !meets(&reference, f))
        .map(|f| f.size as u64)
        .sum::<u64>();
    (total, single)
}

/// Offset, binding and statistics of an open database.
fn read_info(db: &DB, dir: &Path) -> Result<CheckpointInfo> {
    let offset = read_applied_offset(db, dir)?;
    let binding = read_binding(db, dir)?;
    let cf = db
        .cf_handle(rocksdb::DEFAULT_COLUMN_FAMILY_NAME)
        .ok_or_else(|| {
            Error::corrupt(format!(
                "store has no default column family path=`{}`",
                dir.display()
            ))
        })?;
    let prop = |name: &str| -> Result<u64> {
        Ok(db
            .property_int_value_cf(cf, name)
            .map_err(|e| rocks_error("property", dir, e))?
            .unwrap_or(0))
    };
    let keys = prop("rocksdb.estimate-num-keys")?;
    let bytes = prop("rocksdb.estimate-live-data-size")?;
    Ok(CheckpointInfo {
        offset,
        binding,
        keys,
        bytes,
    })
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Error::internal("blocking task failed").with_source(e))?
}

/// Hard-links (or copies) `local` to `dest` if its bytes hash to `f.blake3`
/// (`held`: the staging directory `dest` is in, kept while the step runs).
async fn reuse_local(
    (f, local, dest): (FileEntry, PathBuf, PathBuf),
    held: Hold,
) -> Result<(FileEntry, PathBuf, bool)> {
    let expected = f.blake3;
    let d = dest.clone();
    let ok = blocking_held(held, move || {
        if hash_file(&local)? != expected {
            return Ok(false);
        }
        if let Some(p) = d.parent() {
            std::fs::create_dir_all(p).map_err(|e| io_err("create directory", p, e))?;
        }
        if std::fs::hard_link(&local, &d).is_err() {
            std::fs::copy(&local, &d).map_err(|e| io_err("copy local file", &local, e))?;
        }
        Ok(true)
    })
    .await?;
    Ok((f, dest, ok))
}

/// Writes a manifest's inline files (checked against their hashes) under
/// `dir`, fsyncing each if `sync`.
fn write_inline(files: &[crate::repo::InlineFile], dir: &Path, sync: bool) -> Result<()> {
    for f in files {
        let bytes = f.bytes()?;
        let dest = Manifest::file_path_within(dir, &f.path)?;
        if let Some(p) = dest.parent() {
            std::fs::create_dir_all(p).map_err(|e| io_err("create directory", p, e))?;
        }
        let mut file = std::fs::File::create(&dest).map_err(|e| io_err("create file", &dest, e))?;
        std::io::Write::write_all(&mut file, &bytes).map_err(|e| io_err("write file", &dest, e))?;
        if sync {
            file.sync_all()
                .map_err(|e| io_err("fsync file", &dest, e))?;
        }
    }
    Ok(())
}

/// Downloads one verified file, naming it in any error.
async fn download_one(
    repo: &crate::repo::Repository,
    sk: &crate::repo::StoreKey,
    id: crate::repo::SnapshotId,
    f: FileEntry,
    dest: PathBuf,
    sync: bool,
) -> Result<()> {
    repo.blobs()
        .get_blob_to_file_with(sk, &BlobRef::from(&f), &dest, sync)
        .await
        .map_err(|e| {
            Error::new(
                e.kind(),
                format!(
                    "cannot restore snapshot file file=`{}` snapshot=`{id}`: {}",
                    f.path,
                    e.message()
                ),
            )
            .with_source(e)
        })
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
        let root = self.staging_root_for(store.path());
        std::fs::create_dir_all(&root).map_err(|e| io_err("create staging directory", &root, e))?;
        remove_leftovers(&root, |n| n.starts_with(CHECKPOINT_PREFIX))?;
        let dir = root.join(format!(
            "{CHECKPOINT_PREFIX}{}",
            uuid::Uuid::new_v4().simple()
        ));
        register_live(&dir);
        // From here on the cut owns `dir`: dropping it (also on error) removes it.
        let mut cut = RocksCut {
            dir: Arc::new(CheckpointDir(
                dir,
                if self.staging_root.is_some() {
                    ParentOnDrop::Keep
                } else {
                    ParentOnDrop::RemoveIfEmpty
                },
            )),
            files: Vec::new(),
            offset: None,
            binding: None,
            keys: 0,
            logical_bytes: 0,
            incarnation: store.incarnation(),
            data_bytes: 0,
            bottom_bytes: 0,
            meta_files: std::collections::HashSet::new(),
            compacted: None,
        };
        // The metadata column family's files, listed before the checkpoint
        // and after it: its flush can start a compaction that removes the
        // older ones from the live store while the checkpoint still holds
        // them, and the newest appears only after. (Which files these are
        // only decides what travels inline.)
        let mut meta_files: std::collections::HashSet<String> =
            meta_names(&live_files(store)?).collect();
        let cp = rocksdb::checkpoint::Checkpoint::new(store.db())
            .map_err(|e| rocks_error("checkpoint", store.path(), e))?;
        // log_size_for_flush = 0: flush memtables (atomically, both column
        // families) so the checkpoint is complete even with the WAL off.
        let mut made = cp.create_checkpoint_with_log_size(cut.dir(), 0);
        if made.is_err() && !root.is_dir() {
            // The previous cut removed the (then empty) staging directory
            // between our creating it and the checkpoint: make it again.
            std::fs::create_dir_all(&root)
                .map_err(|e| io_err("create staging directory", &root, e))?;
            made = cp.create_checkpoint_with_log_size(cut.dir(), 0);
        }
        made.map_err(|e| rocks_error("checkpoint", cut.dir(), e))?;
        // Read under the same borrow as the checkpoint: writes need `&mut`,
        // so the checkpoint holds exactly what these describe (module docs).
        // After it, so the statistics count the memtables it flushed.
        let info = read_info(store.db(), store.path())?;
        let live = live_files(store)?;
        (cut.data_bytes, cut.bottom_bytes) = level_bytes(&live);
        meta_files.extend(meta_names(&live));
        cut.meta_files = meta_files;
        cut.files = list_checkpoint(cut.dir())?;
        cut.offset = info.offset;
        cut.binding = info.binding;
        cut.keys = info.keys;
        cut.logical_bytes = info.bytes;
        Ok(cut)
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

    async fn write(&self, mut cut: RocksCut, ctx: WriteContext<'_>) -> Result<FormatOutput> {
        let amplification = cut.space_amplification();
        self.compact_if_amplified(&mut cut).await?;
        // The contents' digest and exact counts: a scan of the checkpoint
        // (after any compaction: same contents, and it needs the directory
        // to itself), on a blocking thread while the files upload. It holds
        // the directory until it ends, and stops early when this write
        // fails or is dropped.
        let stop = StopOnDrop(Arc::new(std::sync::atomic::AtomicBool::new(false)));
        let scanned = async {
            if ctx.logical_digest {
                self.count_checkpoint(Arc::clone(&cut.dir), Arc::clone(&stop.0))
                    .await
            } else {
                Ok(None)
            }
        };
        let repo = ctx.repo;
        let sk = ctx.store_key;
        let mut parent_by_hash: HashMap<BlobHash, &FileEntry> = HashMap::new();
        let mut parent_by_name: HashMap<&str, &FileEntry> = HashMap::new();
        for f in ctx.parent.map(|p| p.files.as_slice()).unwrap_or_default() {
            parent_by_hash.insert(f.blake3, f);
            parent_by_name.insert(f.path.as_str(), f);
        }
        let inline = inline_choice(&cut.files, &cut.meta_files);
        let mut plans: Vec<(String, u64, Plan)> = {
            let mut cache = self.lock_cache();
            cut.files
                .iter()
                .enumerate()
                .map(|(i, (name, size))| {
                    // A compacted checkpoint's files are new: their names may
                    // repeat the live store's with other bytes.
                    let plan = if inline[i] {
                        Plan::Inline
                    } else if !is_immutable(name) || cut.compacted.is_some() {
                        Plan::Upload
                    } else if let Some(h) = cache.get(cut.incarnation, name, *size) {
                        match parent_by_hash.get(&h) {
                            Some(p) if p.size == *size => Plan::Reuse(FileEntry {
                                path: name.clone(),
                                size: *size,
                                blake3: h,
                            }),
                            _ => Plan::Known(h),
                        }
                    } else if let Some(p) = parent_by_name
                        .get(name.as_str())
                        .filter(|p| p.size == *size)
                    {
                        Plan::CompareLocal((*p).clone())
                    } else {
                        Plan::Upload
                    };
                    (name.clone(), *size, plan)
                })
                .collect()
        };
        // The slowest steps first, so none waits for a slot behind a queue
        // of quick ones: uploads and local hashes, largest first, then the
        // `head`s of reused blobs, then the inline reads. (In name order,
        // an incremental snapshot's new SST came last, behind twenty
        // others: 1 M keys, 1 % rewritten, its upload started some 6 ms
        // into the write.)
        plans.sort_by_key(|(_, size, plan)| (plan.rank(), std::cmp::Reverse(*size)));
        let dir = cut.dir().to_path_buf();
        // Each file's steps run as a task of their own, so they go on while
        // this task waits (the changelog's flush blocks the thread polling
        // it, and with every step polled here each read, hash and put
        // waited for it), and large files hash on both cores. A full
        // snapshot of 1 M keys: 0.45-0.65 s before, 0.32-0.38 s after.
        let step = |(name, size, plan): (String, u64, Plan)| {
            // Aborted if this write is dropped (a cancelled snapshot).
            let task = tokio_util::task::AbortOnDropHandle::new(tokio::spawn(write_step(
                repo.clone(),
                sk.clone(),
                dir.join(&name),
                name,
                size,
                plan,
            )));
            async move {
                task.await
                    .map_err(|e| Error::internal("snapshot file task failed").with_source(e))?
            }
        };
        let uploads = async {
            let r = drain_bounded(plans, repo.transfer().parallelism.max(1), step).await;
            if r.is_err() {
                stop.0.store(true, std::sync::atomic::Ordering::Relaxed);
            }
            r
        };
        // Both run to their end (a failed upload stops the scan), so the
        // checkpoint is gone once this write returns.
        let (results, counted) = futures::join!(uploads, scanned);
        let mut results: Vec<(String, Done)> = results?;
        let counted = counted?;
        if ctx.logical_digest && counted.is_none() {
            return Err(Error::internal(
                "the checkpoint scan stopped before the write ended",
            ));
        }
        results.sort_by(|a, b| a.0.cmp(&b.0));
        let mut writer = SnapshotWriter::new(repo, sk.clone());
        let mut hashes = Vec::with_capacity(results.len());
        let mut sst_files = 0u64;
        for (name, done) in results {
            if is_immutable(&name) {
                sst_files += 1;
            }
            let entry = match done {
                Done::Reused(e) => {
                    writer.reuse(e.clone())?;
                    e
                }
                Done::Stored(out) => writer.add_uploaded(&name, out)?,
                Done::Inline(bytes) => {
                    writer.put_inline(&name, &bytes).await?;
                    continue;
                }
            };
            hashes.push(entry);
        }
        if cut.compacted.is_none() {
            // Remember this incarnation's hashes for the next snapshot; forget
            // its files that are gone (compacted away). A compacted
            // checkpoint's files are not the live store's: what the cache
            // knows of those stays.
            self.lock_cache().replace(
                cut.incarnation,
                hashes
                    .iter()
                    .filter(|e| is_immutable(&e.path))
                    .map(|e| (e.path.clone(), e.size, e.blake3)),
            );
        }
        // Counted when scanned; else RocksDB's estimates, read at capture
        // (`estimate-num-keys` counts overwritten and deleted entries not
        // yet compacted away).
        let stats = match counted {
            Some(c) => SnapshotStats {
                keys: c.digest.keys(),
                logical_bytes: c.logical_bytes,
                counts_exact: true,
                ..SnapshotStats::default()
            },
            None => SnapshotStats {
                keys: cut.keys,
                logical_bytes: cut.logical_bytes,
                ..SnapshotStats::default()
            },
        };
        let mut format_metadata = serde_json::json!({
            "writer_incarnation": cut.incarnation.hyphenated().to_string(),
            "sst_files": sst_files,
            "space_amplification": round3(amplification),
        });
        if let Some(c) = cut.compacted {
            format_metadata["compacted"] = serde_json::json!({
                "sst_bytes_before": c.sst_bytes_before,
                "sst_bytes_after": cut.sst_bytes(),
                "secs": round3(c.secs),
            });
        }
        drop(cut);
        Ok(FormatOutput {
            writer,
            stats,
            format_metadata,
            depends_on: Vec::new(),
            required_features: Vec::new(),
            logical_digest: counted.map(|c| c.digest),
        })
    }

    async fn restore(
        &self,
        manifest: &Manifest,
        ctx: RestoreContext<'_>,
    ) -> Result<(RocksStore, RestoreStats)> {
        if manifest.store_format.name != FORMAT_NAME
            || manifest.store_format.version > FORMAT_VERSION
        {
            return Err(Error::config(format!(
                "snapshot was not written by this rocksdb format snapshot=`{}` format=`{}` version={}",
                manifest.snapshot_id, manifest.store_format.name, manifest.store_format.version
            )));
        }
        let repo = ctx.repo;
        let sk = &manifest.store_key;
        let target = normalize_target(ctx.target)?;
        check_replaceable(&target)?;
        self.clean_leftovers(&target)?;
        let (staging, guard) = new_restore_staging(&target)?;
        std::fs::create_dir(&staging)
            .map_err(|e| io_err("create staging directory", &staging, e))?;

        let started = std::time::Instant::now();
        let mut stats = RestoreStats::default();
        // Background: the files are fsynced after the store is published,
        // which a mark with this boot's id makes safe (`store::unsynced`).
        let boot = match repo.transfer().restore_sync {
            crate::repo::RestoreSync::Background => unsynced::boot_id(),
            crate::repo::RestoreSync::Immediate => None,
        };
        // Files reused from a store that is itself still marked may not be
        // on disk yet: an immediate restore must sync them too.
        let reused_unsynced = boot.is_none() && unsynced::is_marked(&target)?;
        let mut downloads: Vec<(FileEntry, PathBuf)> = Vec::new();
        let mut candidates: Vec<(FileEntry, PathBuf, PathBuf)> = Vec::new();
        for f in &manifest.files {
            let dest = Manifest::file_path_within(&staging, &f.path)?;
            let local = Manifest::file_path_within(&target, &f.path)?;
            // `symlink_metadata`: a symlink in the old store is never followed
            // (its target could be anything, anywhere) nor carried over.
            let same_size = is_immutable(&f.path)
                && std::fs::symlink_metadata(&local)
                    .is_ok_and(|m| m.is_file() && m.len() == f.size);
            if same_size {
                candidates.push((f.clone(), local, dest));
            } else {
                downloads.push((f.clone(), dest));
            }
        }
        let parallelism = repo.transfer().parallelism.max(1);
        // Local-first: a local file is reused only if its bytes hash to the
        // manifest's blake3, never on name and size alone.
        // Errors drain the transfers still running before the guard removes
        // `staging`, so none of them re-creates it (see `drain_bounded`).
        let checked: Vec<(FileEntry, PathBuf, bool)> =
            drain_bounded(candidates, parallelism, |c| {
                reuse_local(c, hold(&[&staging]))
            })
            .await?;
        for (f, dest, ok) in checked {
            if ok {
                stats.files_reused_locally += 1;
                stats.bytes_reused_locally += f.size;
            } else {
                downloads.push((f, dest));
            }
        }
        for (f, _) in &downloads {
            stats.files_downloaded += 1;
            stats.bytes_downloaded += f.size;
        }
        let id = manifest.snapshot_id;
        let sync_each = boot.is_none();
        drain_bounded(downloads, parallelism, |(f, dest)| {
            download_one(repo, sk, id, f, dest, sync_each)
        })
        .await?;
        if !manifest.inline_files.is_empty() {
            let (inline, s) = (manifest.inline_files.clone(), staging.clone());
            blocking_held(hold(&[&staging]), move || {
                write_inline(&inline, &s, sync_each)
            })
            .await?;
        }
        crate::store::mark_store_dir(&staging)?;
        if let Some(boot) = boot {
            unsynced::mark(&staging, boot)?;
        } else if reused_unsynced {
            let s = staging.clone();
            blocking_held(hold(&[&staging]), move || sync_tree(&s)).await?;
        }
        // Immediate: every file was fsynced by its download. Background:
        // the mark. Either way the directory's entries must be durable
        // before the rename publishes it.
        sync_dir(&staging)?;
        stats.transfer = started.elapsed();

        let started = std::time::Instant::now();
        let this = self.clone();
        let manifest_c = manifest.clone();
        let staging_c = staging.clone();
        let target_c = target.clone();
        // Held: if this restore is cancelled meanwhile, the install still
        // finishes, and the staging paths (this one and, when `target` is
        // itself one, the outer one) are removed only after it.
        let held = hold(&[&staging, &target]);
        let store = blocking_held(held, move || {
            this.install(&staging_c, &target_c, &manifest_c)
        })
        .await?;
        // `staging` was renamed to `target`: nothing left to remove.
        guard.disarm();
        drop(guard);
        self.seed_cache(store.incarnation(), &manifest.files);
        stats.open = started.elapsed();
        Ok((store, stats))
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
