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
//! a snapshot of the segment list, and reads with positioned reads up to the
//! length the writer has published, which only ever covers complete
//! records. A compaction that replaces segment files does not disturb open
//! readers: they keep reading the old files.
//!
//! # Open files
//!
//! A log holds at most [`FileChangelogOptions::max_open_segments`] segment
//! read handles open; the others are opened again when read. Besides them:
//! the active segment's write handle, the lock file, under
//! [`FsyncPolicy::Never`] the write handles of at most eight closed
//! segments awaiting their fsync, and briefly, while a flush syncs, copies
//! of those. A read in flight keeps the handle it started with until it
//! returns. A segment replaced by a compaction while readers still hold it
//! keeps its old bytes under a second name,
//! `<base_offset:020>.log.retired.<n>`, removed when the last reader lets it
//! go (readers let go of each segment as they move past it) and by the next
//! open after a crash. On a filesystem without hard links it keeps its old
//! handle open instead, outside the budget, for as long as a reader holds
//! it.

mod append;
mod codec;
mod compact;
mod files;
mod meta;
mod open;
mod reader;
mod segment;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::Duration;

use crate::changelog::{
    Changelog, ChangelogId, ChangelogReader, FusedReader, Horizon, Lineage, Record,
};
use crate::clock::{SharedClock, system_clock};
use crate::error::{Error, Result};

pub use codec::{DecodedSegment, SegmentHeader, decode_segment, encode_segment};
pub use compact::{CompactOptions, CompactionReport};

use append::Writer;
use segment::Segment;

/// Suffix of a compacted segment written but not yet renamed into place.
const COMPACTING_SUFFIX: &str = ".compacting";

/// Under [`FsyncPolicy::Never`], closed segments not yet fsynced are synced
/// (and their write handles closed) once this many wait, so that a log that
/// rolls many segments between flushes holds a bounded number of files.
const MAX_UNSYNCED_SEGMENTS: usize = 8;

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
    /// [`Changelog::flush`] still fsyncs, and so does a roll that would
    /// leave more than eight closed segments unsynced (each holds a file
    /// open until it is synced). A process crash loses nothing; a
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
    /// Segment read handles held open at most; the least recently opened
    /// is closed when another must open, and opened again when read. Reading
    /// a closed segment costs one `open` call. Default 64; at least 1.
    pub max_open_segments: usize,
}

impl Default for FileChangelogOptions {
    fn default() -> Self {
        FileChangelogOptions {
            create_if_missing: true,
            segment_bytes: 64 * 1024 * 1024,
            fsync: FsyncPolicy::EveryBatch,
            clock: system_clock(),
            max_open_segments: 64,
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
    /// The open-file budget every segment of this log shares.
    files: Arc<files::OpenFiles>,
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
    /// Writer claims on this handle ([`Changelog::begin_writer`]).
    claims: crate::changelog::WriterClaims,
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
    /// Whether this handle was opened with [`FileChangelog::open_read_only`].
    pub fn is_read_only(&self) -> bool {
        self._lock.is_none()
    }

    pub(crate) fn check_writable(&self, what: &str) -> Result<()> {
        if self.is_read_only() {
            return Err(Error::config(format!(
                "cannot {what} a changelog opened read-only path=`{}`; open it with \
                 FileChangelog::open (one writer at a time)",
                self.dir.display()
            ))
            .with_reason(crate::Reason::ReadOnly));
        }
        Ok(())
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

    fn begin_writer(&self) -> Result<Option<crate::changelog::WriterClaim>> {
        self.check_writable("claim")?;
        // Under the writer lock: an append of an older claim either
        // finished before this claim or sees it and is refused.
        let _w = lock(&self.writer)?;
        Ok(Some(self.claims.begin()))
    }

    fn append_as(
        &self,
        claim: crate::changelog::WriterClaim,
        batch: &[Record],
    ) -> Result<Vec<u64>> {
        self.check_writable("append to")?;
        let mut w = lock(&self.writer)?;
        self.claims.check(claim, &self.id)?;
        if batch.is_empty() {
            return Ok(Vec::new());
        }
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
        self.sync_all_concurrently()
    }

    fn flush_async(&self) -> futures::future::BoxFuture<'_, Result<()>> {
        Box::pin(async move {
            if self.is_read_only() {
                return Ok(());
            }
            self.sync_all_off_thread().await
        })
    }
}
