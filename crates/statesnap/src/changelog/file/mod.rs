//! The embedded segmented file changelog, the default [`Changelog`] backend.
//!
//! One directory per changelog holds:
//!
//! - `changelog.json` — format version, [`ChangelogId`], lineage UUID and
//!   tombstone [`Horizon`], replaced atomically (temp file, fsync, rename,
//!   fsync directory);
//! - `<base_offset:020>.log` — append-only segments of CRC32C-framed records;
//!   the last one is active, the others are closed and only ever replaced
//!   whole by [`FileChangelog::compact`];
//! - `LOCK` — held with an exclusive file lock while the log is open, so two
//!   processes (or two handles in one process) never write the same log.
//!   Readers need no lock: [`FileChangelog::open_read_only`] opens a
//!   point-in-time view of a log a writer holds, and repairs nothing.
//!
//! The byte layout is documented in `docs/format.md`, section "File
//! changelog".
//!
//! # Recovery and validation
//!
//! [`FileChangelog::open`] reads every segment header (checking the base
//! offset chain, so a missing segment is reported as a gap) and scans the
//! **last** segment completely. Only the last segment can have a torn tail:
//! a partial or checksum-failing frame with no valid frame after it is cut
//! off, logged with `tracing::warn!` and described by
//! [`FileChangelog::recovery_report`]. A bad frame that *is* followed by a
//! valid one is corruption before the tail and fails the open with a
//! [`Corrupt`](crate::ErrorKind::Corrupt) error naming the file and byte
//! position. Closed segments are validated lazily: on first read (or
//! compaction), every frame's CRC and offset order is checked and a sparse
//! index is built; a damaged closed segment fails that read with a corrupt
//! error naming the file and position. Every frame a reader returns has been
//! checked against its CRC.
//!
//! # Concurrency
//!
//! All methods take `&self`. Appends are serialized by a mutex; readers take
//! no lock while reading: [`Changelog::read_from`] captures the end offset and
//! a snapshot of the segment list (`Arc`s of open file handles), and reads
//! with positioned reads up to the length the writer has published, which
//! only ever covers complete records. A compaction that replaces segment
//! files does not disturb open readers, which keep reading the old files
//! through their handles.

mod compact;
mod format;
mod meta;
mod reader;
mod segment;

use std::fs::{self, File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::Duration;

use crate::changelog::{
    Changelog, ChangelogId, ChangelogReader, FusedReader, Horizon, Lineage, Record,
};
use crate::clock::{SharedClock, system_clock};
use crate::error::{Error, Result};

pub use compact::{CompactOptions, CompactionReport};
pub use format::{DecodedSegment, SegmentHeader, decode_segment, encode_segment};

use format::HEADER_LEN;
use segment::{IndexBuilder, Segment, SparseIndex};

/// Name of the lock file inside a changelog directory.
const LOCK_FILE: &str = "LOCK";
/// Suffix of a compacted segment written but not yet renamed into place.
const COMPACTING_SUFFIX: &str = ".compacting";

/// When appended records are fsynced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FsyncPolicy {
    /// Fsync after every append, before it returns: an acknowledged record
    /// survives a power loss.
    EveryBatch,
    /// Fsync during an append when the last fsync is at least this old (by
    /// the injected clock). There is no background thread: after the last
    /// append, records stay unsynced until the next append or
    /// [`Changelog::flush`].
    Interval(Duration),
    /// Never fsync on append; the OS writes back when it likes.
    /// [`Changelog::flush`] still fsyncs. A process crash loses nothing; a
    /// power loss may lose acknowledged records (recovery then cuts the torn
    /// tail).
    Never,
}

/// Options for [`FileChangelog::open`].
#[derive(Debug, Clone)]
pub struct FileChangelogOptions {
    /// Create the directory and an empty log if there is none. Default `true`.
    pub create_if_missing: bool,
    /// Roll to a new segment once the active one would grow past this many
    /// bytes. Default 64 MiB. A segment always takes at least one record.
    pub segment_bytes: u64,
    /// When appends are fsynced. Default [`FsyncPolicy::EveryBatch`].
    pub fsync: FsyncPolicy,
    /// Where record timestamps, the fsync interval and tombstone retention
    /// read time from. Default the system clock.
    pub clock: SharedClock,
}

impl Default for FileChangelogOptions {
    fn default() -> Self {
        FileChangelogOptions {
            create_if_missing: true,
            segment_bytes: 64 * 1024 * 1024,
            fsync: FsyncPolicy::EveryBatch,
            clock: system_clock(),
        }
    }
}

/// What recovery did to the last segment when the log was opened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecoveryReport {
    /// The segment whose tail was cut.
    pub segment: PathBuf,
    /// Byte position in the segment where the cut was made.
    pub file_offset: u64,
    /// Bytes removed.
    pub bytes_truncated: u64,
    /// Records (partial or checksum-failing frames) removed, counted by
    /// following their length fields.
    pub records_dropped: u64,
    /// Why the first removed frame was rejected (`truncated record`, `crc
    /// mismatch`, ...).
    pub reason: String,
    /// The offset the next append gets.
    pub next_offset: u64,
}

/// The embedded segmented file changelog. See the [module docs](self).
#[derive(Debug)]
pub struct FileChangelog {
    id: ChangelogId,
    dir: PathBuf,
    lineage: Lineage,
    segment_bytes: u64,
    fsync: FsyncPolicy,
    clock: SharedClock,
    writer: Mutex<Writer>,
    shared: RwLock<Shared>,
    /// End offset readers may read up to (exclusive). Published after the
    /// bytes are written and, per policy, fsynced.
    end: AtomicU64,
    /// One compaction at a time.
    compacting: Mutex<()>,
    /// The durable metadata as last written; held while it is rewritten.
    meta: Mutex<meta::Meta>,
    recovery: Option<RecoveryReport>,
    /// Holds the directory lock while open (`None`: opened read-only).
    _lock: Option<File>,
}

#[derive(Debug)]
struct Shared {
    /// Every segment in base-offset order; the last one is active.
    segments: Vec<Arc<Segment>>,
    horizon: Horizon,
    /// Lowest offset present, once known.
    start: Option<u64>,
    /// Bumped whenever compaction replaces segments (invalidates `start`).
    generation: u64,
}

#[derive(Debug)]
struct Writer {
    /// Write handle of the active segment.
    file: File,
    active: Arc<Segment>,
    /// Bytes written to the active segment.
    pos: u64,
    next_offset: u64,
    index: IndexBuilder,
    buf: Vec<u8>,
    last_sync_ms: i64,
    /// Whether the active segment has bytes not yet fsynced.
    dirty: bool,
    /// Bytes of the active segment known to be on disk.
    synced_pos: u64,
    /// Closed segments written under [`FsyncPolicy::Never`] and not yet fsynced.
    unsynced: Vec<(PathBuf, File)>,
    /// Whether a segment was created since the directory was last fsynced.
    dir_dirty: bool,
    /// Set when a failed write could not be undone: the log must be reopened.
    poisoned: Option<String>,
    /// Whether this session's epoch is in the metadata (done before its
    /// first record is written).
    epoch_begun: bool,
}

fn lock<T>(m: &Mutex<T>) -> Result<MutexGuard<'_, T>> {
    m.lock()
        .map_err(|_| Error::internal("changelog lock poisoned by a panic"))
}

fn read_shared(s: &RwLock<Shared>) -> Result<std::sync::RwLockReadGuard<'_, Shared>> {
    s.read()
        .map_err(|_| Error::internal("changelog lock poisoned by a panic"))
}

fn write_shared(s: &RwLock<Shared>) -> Result<std::sync::RwLockWriteGuard<'_, Shared>> {
    s.write()
        .map_err(|_| Error::internal("changelog lock poisoned by a panic"))
}

fn io_err(what: &str, path: &Path, e: std::io::Error) -> Error {
    Error::io(format!("cannot {what} path=`{}`", path.display()), e)
}

impl FileChangelog {
    /// Opens the changelog in `dir` (creating it if missing and
    /// [`FileChangelogOptions::create_if_missing`]), checks that it is the
    /// log of `id`, and recovers the tail of its last segment.
    ///
    /// Errors: [`Config`](crate::ErrorKind::Config) if `dir` holds another
    /// topic/partition or an unknown format version;
    /// [`NotFound`](crate::ErrorKind::NotFound) if missing and not to be
    /// created; [`Corrupt`](crate::ErrorKind::Corrupt) for damage that is not
    /// a torn tail (a gap in the segment chain, a bad record before the tail);
    /// [`Transient`](crate::ErrorKind::Transient) if another handle holds the
    /// directory lock.
    pub fn open(
        dir: impl AsRef<Path>,
        id: ChangelogId,
        options: FileChangelogOptions,
    ) -> Result<FileChangelog> {
        Self::open_impl(dir.as_ref().to_path_buf(), id, options, false)
    }

    /// Opens the changelog in `dir` for reading only: takes no lock (a
    /// writer may hold the log open meanwhile, in this process or another),
    /// creates nothing, repairs nothing. It sees the log as it was when
    /// opened — records appended later are not visible; open again to see
    /// them — and a torn or in-progress tail is left in place and not read.
    /// For restores, plans and tools; `append` and `compact` fail (kind
    /// `config`), `flush` does nothing.
    ///
    /// Errors as [`FileChangelog::open`], and
    /// [`NotFound`](crate::ErrorKind::NotFound) if there is no log in `dir`.
    pub fn open_read_only(dir: impl AsRef<Path>, id: ChangelogId) -> Result<FileChangelog> {
        let options = FileChangelogOptions {
            create_if_missing: false,
            ..FileChangelogOptions::default()
        };
        Self::open_impl(dir.as_ref().to_path_buf(), id, options, true)
    }

    /// Whether this handle was opened with [`FileChangelog::open_read_only`].
    pub fn is_read_only(&self) -> bool {
        self._lock.is_none()
    }

    fn open_impl(
        dir: PathBuf,
        id: ChangelogId,
        options: FileChangelogOptions,
        read_only: bool,
    ) -> Result<FileChangelog> {
        if options.segment_bytes < (HEADER_LEN as u64) * 2 {
            return Err(Error::config(format!(
                "changelog segment_bytes is too small segment_bytes=`{}` min=`{}`",
                options.segment_bytes,
                HEADER_LEN * 2
            )));
        }
        if !dir.exists() {
            if read_only {
                return Err(Error::not_found(format!(
                    "changelog directory does not exist path=`{}`; nothing to read",
                    dir.display()
                )));
            }
            if !options.create_if_missing {
                return Err(Error::not_found(format!(
                    "changelog directory does not exist path=`{}`; set create_if_missing to \
                     create it",
                    dir.display()
                )));
            }
            fs::create_dir_all(&dir).map_err(|e| io_err("create changelog directory", &dir, e))?;
            if let Some(parent) = dir.parent()
                && !parent.as_os_str().is_empty()
            {
                // Durability: the new directory's entry in its parent survives a crash.
                meta::sync_dir(parent)?;
            }
        }
        let lock_file = if read_only {
            None
        } else {
            Some(Self::lock_dir(&dir)?)
        };

        let names = list_dir(&dir)?;
        if !read_only {
            remove_leftovers(&dir, &names)?;
        }
        let mut bases: Vec<u64> = names
            .iter()
            .filter_map(|n| segment::parse_segment_file_name(n))
            .collect();
        bases.sort_unstable();

        let meta = match meta::read(&dir)? {
            Some(m) => {
                let found = m.id();
                if found != id {
                    return Err(Error::config(format!(
                        "changelog directory belongs to another changelog path=`{}` \
                         expected=`{id}` found=`{found}`",
                        dir.display()
                    )));
                }
                m
            }
            None if read_only => {
                return Err(Error::not_found(format!(
                    "no changelog in directory path=`{}` (no `{}`); nothing to read",
                    dir.display(),
                    meta::META_FILE
                )));
            }
            None => {
                if !bases.is_empty() {
                    return Err(Error::corrupt(format!(
                        "changelog directory has segments but no metadata file path=`{}` \
                         missing=`{}`",
                        dir.display(),
                        meta::META_FILE
                    )));
                }
                let m = meta::Meta {
                    format_version: meta::META_VERSION,
                    topic: id.topic.clone(),
                    partition: id.partition,
                    lineage: uuid::Uuid::new_v4().to_string(),
                    horizon: Horizon::default(),
                    epochs: Vec::new(),
                };
                meta::write(&dir, &m)?;
                m
            }
        };

        let mut recovery = None;
        let mut segments: Vec<Arc<Segment>> = Vec::with_capacity(bases.len().max(1));
        let writer = match bases.split_last() {
            None if read_only => {
                return Err(Error::corrupt(format!(
                    "changelog directory has metadata but no segment path=`{}`",
                    dir.display()
                )));
            }
            None => {
                let (seg, file) = create_segment(&dir, 0, None)?;
                // Durability: the first segment's directory entry must survive.
                meta::sync_dir(&dir)?;
                let seg = Arc::new(seg);
                segments.push(Arc::clone(&seg));
                new_writer(file, seg, HEADER_LEN as u64, 0, IndexBuilder::new())
            }
            Some((&last, closed)) => {
                let mut prev: Option<u64> = None;
                for &base in closed {
                    let path = dir.join(segment::segment_file_name(base));
                    segments.push(Arc::new(open_closed_segment(&path, base, prev)?));
                    prev = Some(base);
                }
                let path = dir.join(segment::segment_file_name(last));
                let (seg, w, rep) = open_last_segment(&path, last, prev, read_only)?;
                recovery = rep;
                let seg = Arc::new(seg);
                segments.push(Arc::clone(&seg));
                w.into_writer(seg)
            }
        };
        Self::finish(
            dir, id, options, meta, segments, recovery, lock_file, writer,
        )
    }

    /// Takes the directory lock of a writer.
    fn lock_dir(dir: &Path) -> Result<File> {
        let lock_path = dir.join(LOCK_FILE);
        let lock_file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&lock_path)
            .map_err(|e| io_err("open changelog lock file", &lock_path, e))?;
        match lock_file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                // Transient, not config: the usual holder is the previous
                // owner of a partition still closing during a handoff.
                let holder = std::fs::read_to_string(&lock_path).unwrap_or_default();
                let holder: String = holder.trim().chars().take(200).collect();
                return Err(Error::transient(format!(
                    "changelog directory is locked by another writer path=`{}` holder=`{}`; one \
                     writer per changelog: close that handle (or wait for its process to exit) \
                     and retry, or open this one with FileChangelog::open_read_only to read",
                    dir.display(),
                    holder.escape_debug()
                )));
            }
            Err(std::fs::TryLockError::Error(e)) => {
                return Err(io_err("lock changelog directory", &lock_path, e));
            }
        }
        // Who holds it, for the error a second writer gets (advisory only:
        // the lock, not this text, is what excludes).
        let me = format!("pid={}\n", std::process::id());
        if let Err(e) = lock_file
            .set_len(0)
            .and_then(|()| segment::write_all_at(&lock_file, me.as_bytes(), 0))
        {
            tracing::debug!(path = %lock_path.display(), error = %e, "cannot record the lock holder");
        }
        Ok(lock_file)
    }

    #[allow(clippy::too_many_arguments)]
    fn finish(
        dir: PathBuf,
        id: ChangelogId,
        options: FileChangelogOptions,
        meta: meta::Meta,
        segments: Vec<Arc<Segment>>,
        recovery: Option<RecoveryReport>,
        lock_file: Option<File>,
        mut writer: Writer,
    ) -> Result<FileChangelog> {
        writer.last_sync_ms = options.clock.now_ms();
        if lock_file.is_some() {
            // Durability: what recovery kept of the active segment (maybe
            // only in the page cache after a process crash) is on disk
            // before new records follow it.
            writer
                .file
                .sync_data()
                .map_err(|e| io_err("fsync changelog segment", &writer.active.path, e))?;
            writer.synced_pos = writer.pos;
        }
        let end = writer.next_offset;
        Ok(FileChangelog {
            id,
            dir,
            lineage: Lineage(meta.lineage.clone()),
            segment_bytes: options.segment_bytes,
            fsync: options.fsync,
            clock: options.clock,
            writer: Mutex::new(writer),
            shared: RwLock::new(Shared {
                segments,
                horizon: meta.horizon,
                start: None,
                generation: 0,
            }),
            end: AtomicU64::new(end),
            compacting: Mutex::new(()),
            meta: Mutex::new(meta),
            recovery,
            _lock: lock_file,
        })
    }

    pub(crate) fn check_writable(&self, what: &str) -> Result<()> {
        if self.is_read_only() {
            return Err(Error::config(format!(
                "cannot {what} a changelog opened read-only path=`{}`; open it with \
                 FileChangelog::open (one writer at a time)",
                self.dir.display()
            )));
        }
        Ok(())
    }

    /// The active segment and how many of its bytes are known to be on disk
    /// (fsynced). Under [`FsyncPolicy::EveryBatch`] that is every
    /// acknowledged record; under the other policies it lags until the next
    /// sync or [`Changelog::flush`]. For crash tests and tooling.
    pub fn durable_tail(&self) -> Result<(PathBuf, u64)> {
        let w = lock(&self.writer)?;
        Ok((w.active.path.clone(), w.synced_pos))
    }

    /// What recovery cut off the last segment's tail when the log was
    /// opened, or `None` if the log was clean.
    pub fn recovery_report(&self) -> Option<&RecoveryReport> {
        self.recovery.as_ref()
    }

    /// The directory holding the log.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Paths of the segment files, in offset order (the last is active).
    pub fn segment_paths(&self) -> Result<Vec<PathBuf>> {
        Ok(read_shared(&self.shared)?
            .segments
            .iter()
            .map(|s| s.path.clone())
            .collect())
    }

    /// Applies `change` to the metadata and replaces the file atomically;
    /// the in-memory copy changes only once the new file is durable.
    pub(crate) fn update_meta(&self, change: impl FnOnce(&mut meta::Meta)) -> Result<()> {
        let mut current = lock(&self.meta)?;
        let mut next = current.clone();
        next.format_version = meta::META_VERSION;
        change(&mut next);
        if next != *current {
            meta::write(&self.dir, &next)?;
            *current = next;
        }
        Ok(())
    }

    /// Appends `batch` under the writer lock.
    fn append_locked(&self, w: &mut Writer, batch: &[Record]) -> Result<Vec<u64>> {
        if let Some(why) = &w.poisoned {
            return Err(Error::io(
                format!(
                    "changelog writer is unusable after an earlier failure path=`{}`; reopen \
                     the changelog",
                    self.dir.display()
                ),
                std::io::Error::other(why.clone()),
            ));
        }
        for r in batch {
            format::check_record_size(r.key.len(), r.value.as_ref().map_or(0, |v| v.len()))?;
        }
        if !w.epoch_begun {
            // Durability: the new epoch is on disk before any record of it.
            self.update_meta(|m| m.begin_epoch(w.next_offset))?;
            w.epoch_begun = true;
        }
        let now = self.clock.now_ms();
        let mut offsets = Vec::with_capacity(batch.len());
        let mut buf = std::mem::take(&mut w.buf);
        buf.clear();
        let mut new_entries: Vec<(u64, u64)> = Vec::new();
        let mut next = w.next_offset;
        let result = (|| -> Result<()> {
            for r in batch {
                let flen =
                    format::frame_len(r.key.len(), r.value.as_ref().map_or(0, |v| v.len())) as u64;
                let written = w.pos + buf.len() as u64;
                if written + flen > self.segment_bytes && written > HEADER_LEN as u64 {
                    self.write_out(w, &mut buf, &mut new_entries, next)?;
                    self.roll(w)?;
                }
                let pos = w.pos + buf.len() as u64;
                let before = w.index.index.entries.len();
                w.index.add(next, pos);
                if w.index.index.entries.len() > before {
                    new_entries.push((next, pos));
                }
                format::encode_record(&mut buf, next, now, &r.key, r.value.as_deref());
                offsets.push(next);
                next += 1;
            }
            self.write_out(w, &mut buf, &mut new_entries, next)
        })();
        let mut sync_failed = false;
        let result = result.and_then(|()| {
            self.sync_per_policy(w, now)
                .inspect_err(|_| sync_failed = true)
        });
        w.buf = buf;
        if w.buf.capacity() > 16 * 1024 * 1024 {
            w.buf = Vec::new();
        }
        // Publish what is written (and synced per policy) even if a later
        // write failed: those records are in the log and replay will see
        // them. Not after a failed fsync: the kernel may have dropped those
        // pages, so the records may not survive; no reader (and so no store
        // or snapshot) may see them (invariant 11). The writer is poisoned;
        // a reopen re-validates what the file really holds.
        if !sync_failed {
            self.end.store(w.next_offset, Ordering::Release);
        }
        result.map(|()| offsets)
    }

    /// Writes the buffered frames to the active segment and makes them
    /// visible to readers' length checks (not yet to `end`).
    fn write_out(
        &self,
        w: &mut Writer,
        buf: &mut Vec<u8>,
        entries: &mut Vec<(u64, u64)>,
        next: u64,
    ) -> Result<()> {
        if buf.is_empty() {
            return Ok(());
        }
        if let Err(e) = segment::write_all_at(&w.file, buf, w.pos) {
            // Undo the partial write so the next append does not land after garbage.
            if let Err(e2) = w.file.set_len(w.pos) {
                w.poisoned = Some(format!("write failed: {e}; truncating back failed: {e2}"));
            }
            w.index = IndexBuilder::resume(SparseIndex {
                entries: w
                    .active
                    .index()
                    .map(|i| i.entries.clone())
                    .unwrap_or_default(),
            });
            buf.clear();
            entries.clear();
            return Err(io_err("write changelog segment", &w.active.path, e));
        }
        w.pos += buf.len() as u64;
        w.dirty = true;
        w.next_offset = next;
        w.active.extend_index(entries);
        w.active.set_len(w.pos);
        buf.clear();
        entries.clear();
        Ok(())
    }

    fn sync_per_policy(&self, w: &mut Writer, now: i64) -> Result<()> {
        let due = match self.fsync {
            FsyncPolicy::EveryBatch => true,
            FsyncPolicy::Interval(d) => {
                let ms = i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
                now.saturating_sub(w.last_sync_ms) >= ms
            }
            FsyncPolicy::Never => false,
        };
        if due {
            self.sync_all_locked(w, now)
        } else {
            Ok(())
        }
    }

    fn sync_all_locked(&self, w: &mut Writer, now: i64) -> Result<()> {
        let r = self.sync_all_inner(w, now);
        if let Err(e) = &r {
            // After a failed fsync the kernel may have dropped the dirty pages:
            // the file no longer says what we wrote. Only a reopen (which
            // re-validates the tail) may continue.
            w.poisoned = Some(format!("fsync failed: {e}"));
        }
        r
    }

    fn sync_all_inner(&self, w: &mut Writer, now: i64) -> Result<()> {
        while let Some((path, f)) = w.unsynced.pop() {
            // Durability: closed segments written under `Never` reach disk on flush.
            f.sync_data()
                .map_err(|e| io_err("fsync changelog segment", &path, e))?;
        }
        if w.dirty {
            // Durability: the acknowledged records of the active segment reach disk.
            w.file
                .sync_data()
                .map_err(|e| io_err("fsync changelog segment", &w.active.path, e))?;
            w.dirty = false;
        }
        w.synced_pos = w.pos;
        if w.dir_dirty {
            // Durability: segments created under `Never` get their directory entries on disk.
            meta::sync_dir(&self.dir)?;
            w.dir_dirty = false;
        }
        w.last_sync_ms = now;
        Ok(())
    }

    /// Closes the active segment and starts a new one at `w.next_offset`.
    fn roll(&self, w: &mut Writer) -> Result<()> {
        if self.fsync == FsyncPolicy::Never {
            let f = w
                .file
                .try_clone()
                .map_err(|e| io_err("clone handle", &w.active.path, e))?;
            w.unsynced.push((w.active.path.clone(), f));
        } else if w.dirty {
            // Durability: a closed segment is complete on disk before later records are acked.
            w.file
                .sync_data()
                .map_err(|e| io_err("fsync changelog segment", &w.active.path, e))?;
        }
        w.dirty = false;
        // Everything in the closed segment is now readable.
        self.end.store(w.next_offset, Ordering::Release);
        let base = w.next_offset;
        let (seg, file) = match create_segment(&self.dir, base, Some(w.active.base)) {
            Ok(x) => x,
            Err(e) => {
                w.poisoned = Some(format!("segment roll failed: {e}"));
                return Err(e);
            }
        };
        if self.fsync == FsyncPolicy::Never {
            w.dir_dirty = true;
        } else {
            // Durability: the new segment's directory entry exists before records in it are acked.
            meta::sync_dir(&self.dir)?;
        }
        let seg = Arc::new(seg);
        write_shared(&self.shared)?.segments.push(Arc::clone(&seg));
        w.file = file;
        w.active = seg;
        w.pos = HEADER_LEN as u64;
        // Not even the new header is known to be on disk yet.
        w.synced_pos = 0;
        w.index = IndexBuilder::new();
        Ok(())
    }

    fn compute_start(&self) -> Result<u64> {
        let (segments, generation) = {
            let s = read_shared(&self.shared)?;
            if let Some(start) = s.start {
                return Ok(start);
            }
            (s.segments.clone(), s.generation)
        };
        let end = self.end.load(Ordering::Acquire);
        for seg in &segments {
            if let Some(first) = seg.first_offset()? {
                if first >= end {
                    // Written but not yet published: nothing readable yet.
                    return Ok(end);
                }
                let mut s = write_shared(&self.shared)?;
                if s.generation == generation {
                    s.start = Some(first);
                }
                return Ok(first);
            }
        }
        Ok(end)
    }
}

/// A writer for the last segment, before its `Arc` exists.
struct LastSegment {
    file: File,
    pos: u64,
    next_offset: u64,
    index: SparseIndex,
}

impl LastSegment {
    fn into_writer(self, seg: Arc<Segment>) -> Writer {
        new_writer(
            self.file,
            seg,
            self.pos,
            self.next_offset,
            IndexBuilder::resume(self.index),
        )
    }
}

fn new_writer(
    file: File,
    active: Arc<Segment>,
    pos: u64,
    next_offset: u64,
    index: IndexBuilder,
) -> Writer {
    Writer {
        file,
        active,
        pos,
        next_offset,
        index,
        buf: Vec::new(),
        last_sync_ms: 0,
        dirty: false,
        synced_pos: 0,
        unsynced: Vec::new(),
        dir_dirty: false,
        poisoned: None,
        epoch_begun: false,
    }
}

fn list_dir(dir: &Path) -> Result<Vec<String>> {
    let mut names = Vec::new();
    let rd = fs::read_dir(dir).map_err(|e| io_err("list changelog directory", dir, e))?;
    for entry in rd {
        let entry = entry.map_err(|e| io_err("list changelog directory", dir, e))?;
        if let Some(n) = entry.file_name().to_str() {
            names.push(n.to_string());
        }
    }
    names.sort();
    Ok(names)
}

/// Removes what a crash may leave behind: compacted segments never renamed
/// into place (the old segment they were to replace is still there and
/// valid) and a metadata temp file never renamed.
fn remove_leftovers(dir: &Path, names: &[String]) -> Result<()> {
    let mut removed = false;
    for n in names {
        if n.ends_with(COMPACTING_SUFFIX) || n == meta::META_TMP {
            let p = dir.join(n);
            tracing::warn!(path = %p.display(), "removing leftover of an interrupted changelog write");
            fs::remove_file(&p).map_err(|e| io_err("remove leftover file", &p, e))?;
            removed = true;
        }
    }
    if removed {
        // Durability: the removal of the leftovers is persisted before new ones may be made.
        meta::sync_dir(dir)?;
    }
    Ok(())
}

/// Creates a segment file holding just its header.
fn create_segment(dir: &Path, base: u64, prev: Option<u64>) -> Result<(Segment, File)> {
    let path = dir.join(segment::segment_file_name(base));
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .map_err(|e| io_err("create changelog segment", &path, e))?;
    let header = SegmentHeader {
        base_offset: base,
        prev_base_offset: prev,
    }
    .encode();
    segment::write_all_at(&file, &header, 0)
        .map_err(|e| io_err("write changelog segment header", &path, e))?;
    let read = File::open(&path).map_err(|e| io_err("open changelog segment", &path, e))?;
    let seg = Segment::new(
        base,
        prev,
        path,
        read,
        HEADER_LEN as u64,
        Some(SparseIndex::default()),
    );
    Ok((seg, file))
}

fn check_header(path: &Path, h: &SegmentHeader, base: u64, prev: Option<u64>) -> Result<()> {
    if h.base_offset != base {
        return Err(Error::corrupt(format!(
            "changelog segment header does not match its file name path=`{}` \
             header_base_offset=`{}`",
            path.display(),
            h.base_offset
        )));
    }
    if h.prev_base_offset != prev {
        let expected = match h.prev_base_offset {
            Some(p) => segment::segment_file_name(p),
            None => "none (this should be the first segment)".to_string(),
        };
        return Err(Error::corrupt(format!(
            "changelog has a gap: a segment is missing before path=`{}` expected_previous=`{}` \
             found_previous=`{}`",
            path.display(),
            expected,
            prev.map_or_else(|| "none".to_string(), segment::segment_file_name)
        )));
    }
    Ok(())
}

fn open_closed_segment(path: &Path, base: u64, prev: Option<u64>) -> Result<Segment> {
    let file = File::open(path).map_err(|e| io_err("open changelog segment", path, e))?;
    let len = file
        .metadata()
        .map_err(|e| io_err("stat changelog segment", path, e))?
        .len();
    let mut hb = vec![0u8; HEADER_LEN.min(usize::try_from(len).unwrap_or(HEADER_LEN))];
    segment::read_exact_at(&file, &mut hb, 0)
        .map_err(|e| io_err("read changelog segment header", path, e))?;
    let h = SegmentHeader::decode(&hb, path)?;
    check_header(path, &h, base, prev)?;
    Ok(Segment::new(
        base,
        prev,
        path.to_path_buf(),
        file,
        len,
        None,
    ))
}

/// Opens the last segment, validates it completely and cuts a torn tail.
fn open_last_segment(
    path: &Path,
    base: u64,
    prev: Option<u64>,
    read_only: bool,
) -> Result<(Segment, LastSegment, Option<RecoveryReport>)> {
    let file = OpenOptions::new()
        .read(true)
        .write(!read_only)
        .open(path)
        .map_err(|e| io_err("open changelog segment", path, e))?;
    let bytes = fs::read(path).map_err(|e| io_err("read changelog segment", path, e))?;
    let mut report = None;
    let (valid_len, next_offset, index) = if bytes.len() < HEADER_LEN && read_only {
        // A segment being created (or torn): nothing in it to read.
        (HEADER_LEN as u64, base, SparseIndex::default())
    } else if bytes.len() < HEADER_LEN {
        // A crash while a new segment was being created: rewrite its header.
        let header = SegmentHeader {
            base_offset: base,
            prev_base_offset: prev,
        }
        .encode();
        segment::write_all_at(&file, &header, 0)
            .map_err(|e| io_err("write changelog segment header", path, e))?;
        report = Some(RecoveryReport {
            segment: path.to_path_buf(),
            file_offset: 0,
            bytes_truncated: bytes.len() as u64,
            records_dropped: 0,
            reason: "truncated segment header".to_string(),
            next_offset: base,
        });
        (HEADER_LEN as u64, base, SparseIndex::default())
    } else {
        let h = SegmentHeader::decode(&bytes, path)?;
        check_header(path, &h, base, prev)?;
        let mut b = IndexBuilder::new();
        let end = format::scan_records(&bytes, base, path, |r| {
            b.add(r.offset, (r.key.start - format::FRAME_HEADER_LEN) as u64);
        })?;
        let next = end.last_offset.map_or(base, |l| l + 1);
        if let Some(t) = end.torn.filter(|_| !read_only) {
            file.set_len(t.position as u64)
                .map_err(|e| io_err("truncate torn changelog tail", path, e))?;
            report = Some(RecoveryReport {
                segment: path.to_path_buf(),
                file_offset: t.position as u64,
                bytes_truncated: t.bytes as u64,
                records_dropped: t.records,
                reason: t.reason.to_string(),
                next_offset: next,
            });
        }
        (end.valid_len as u64, next, b.index)
    };
    if let Some(r) = &report {
        // Durability: the repaired tail is on disk before new records are appended after it.
        file.sync_all()
            .map_err(|e| io_err("fsync changelog segment", path, e))?;
        tracing::warn!(
            path = %r.segment.display(),
            file_offset = r.file_offset,
            bytes_truncated = r.bytes_truncated,
            records_dropped = r.records_dropped,
            reason = %r.reason,
            "changelog recovery cut a torn tail off the last segment"
        );
    }
    let read = File::open(path).map_err(|e| io_err("open changelog segment", path, e))?;
    let seg = Segment::new(
        base,
        prev,
        path.to_path_buf(),
        read,
        valid_len,
        Some(SparseIndex {
            entries: index.entries.clone(),
        }),
    );
    Ok((
        seg,
        LastSegment {
            file,
            pos: valid_len,
            next_offset,
            index,
        },
        report,
    ))
}

impl Changelog for FileChangelog {
    fn id(&self) -> &ChangelogId {
        &self.id
    }

    fn append(&self, batch: &[Record]) -> Result<Vec<u64>> {
        self.check_writable("append to")?;
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        let mut w = lock(&self.writer)?;
        self.append_locked(&mut w, batch)
    }

    fn read_from(&self, from: u64) -> Result<Box<dyn ChangelogReader + '_>> {
        // Load `end` before the segment list: every record below it is in a
        // segment already in the list (segments are added before records).
        let end = self.end.load(Ordering::Acquire);
        let segments = read_shared(&self.shared)?.segments.clone();
        Ok(Box::new(FusedReader::new(reader::FileReader::new(
            segments, from, end,
        )?)))
    }

    fn start_offset(&self) -> Result<u64> {
        self.compute_start()
    }

    fn end_offset(&self) -> Result<u64> {
        Ok(self.end.load(Ordering::Acquire))
    }

    fn lineage(&self) -> Result<Lineage> {
        Ok(self.lineage.clone())
    }

    fn horizon(&self) -> Result<Horizon> {
        Ok(read_shared(&self.shared)?.horizon)
    }

    fn epoch_at(&self, offset: u64) -> Result<Option<u64>> {
        if offset >= self.end.load(Ordering::Acquire) {
            return Ok(None);
        }
        Ok(meta::Meta::epoch_at(&lock(&self.meta)?.epochs, offset))
    }

    fn flush(&self) -> Result<()> {
        if self.is_read_only() {
            return Ok(()); // nothing was written through this handle
        }
        let mut w = lock(&self.writer)?;
        let now = self.clock.now_ms();
        self.sync_all_locked(&mut w, now)
    }
}
