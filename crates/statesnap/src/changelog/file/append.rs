//! The write path of a [`FileChangelog`]: appending, fsync per policy,
//! rolling to a new segment, and metadata updates.

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::codec::{self, HEADER_LEN, SegmentHeader};
use super::files::OpenFiles;
use super::segment::{self, IndexBuilder, Segment, SparseIndex};
use super::{FileChangelog, FsyncPolicy, MAX_UNSYNCED_SEGMENTS, io_err, lock, meta, write_shared};
use crate::changelog::Record;
use crate::error::{Error, Result};

#[derive(Debug)]
pub(super) struct Writer {
    /// Write handle of the active segment.
    pub(super) file: File,
    pub(super) active: Arc<Segment>,
    /// Bytes written to the active segment.
    pub(super) pos: u64,
    pub(super) next_offset: u64,
    index: IndexBuilder,
    buf: Vec<u8>,
    pub(super) last_sync_ms: i64,
    /// Whether the active segment has bytes not yet fsynced.
    dirty: bool,
    /// Bytes of the active segment known to be on disk.
    pub(super) synced_pos: u64,
    /// Closed segments written under [`FsyncPolicy::Never`] and not yet fsynced.
    unsynced: Vec<(PathBuf, File)>,
    /// Whether a segment was created since the directory was last fsynced.
    dir_dirty: bool,
    /// Segments created under [`FsyncPolicy::Never`] so far (a flush that
    /// synced the directory clears `dir_dirty` only if none came since).
    dir_gen: u64,
    /// Set when a failed write could not be undone: the log must be reopened.
    poisoned: Option<String>,
    /// Set when an fsync during a roll failed: what this writer wrote may
    /// not survive, and is never published to readers.
    fsync_failed: bool,
    /// Whether this session's epoch is in the metadata (done before its
    /// first record is written).
    epoch_begun: bool,
}

pub(super) fn new_writer(
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
        fsync_failed: false,
        dir_dirty: false,
        dir_gen: 0,
        poisoned: None,
        epoch_begun: false,
    }
}

impl FileChangelog {
    /// The active segment and how many of its bytes are known to be on disk
    /// (fsynced). Under [`FsyncPolicy::EveryBatch`] that is every
    /// acknowledged record; under the other policies it lags until the next
    /// sync or [`Changelog::flush`](crate::changelog::Changelog::flush). For
    /// crash tests and tooling.
    pub fn durable_tail(&self) -> Result<(PathBuf, u64)> {
        let w = lock(&self.writer)?;
        Ok((w.active.path.clone(), w.synced_pos))
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
    pub(super) fn append_locked(&self, w: &mut Writer, batch: &[Record]) -> Result<Vec<u64>> {
        if let Some(why) = &w.poisoned {
            return Err(Error::io(
                format!(
                    "changelog writer is unusable after an earlier failure path=`{}`; reopen \
                     the changelog",
                    self.dir.display()
                ),
                std::io::Error::other(why.clone()),
            )
            .with_reason(crate::Reason::FailedEarlier));
        }
        for r in batch {
            codec::check_record_size(r.key.len(), r.value.as_ref().map_or(0, |v| v.len()))?;
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
                    codec::frame_len(r.key.len(), r.value.as_ref().map_or(0, |v| v.len())) as u64;
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
                codec::encode_record(&mut buf, next, now, &r.key, r.value.as_deref());
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
        if !sync_failed && !w.fsync_failed {
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

    pub(super) fn sync_all_locked(&self, w: &mut Writer, now: i64) -> Result<()> {
        let r = self.sync_all_inner(w, now);
        if let Err(e) = &r {
            // After a failed fsync the kernel may have dropped the dirty pages:
            // the file no longer says what we wrote. Only a reopen (which
            // re-validates the tail) may continue.
            w.poisoned = Some(format!("fsync failed: {e}"));
        }
        r
    }

    /// What [`Changelog::flush`](crate::changelog::Changelog::flush) does:
    /// everything appended before the call reaches disk. The fsyncs run
    /// *outside* the writer lock, so appends (commits) go on meanwhile
    /// instead of waiting for the disk: the handles and positions to sync
    /// are taken under the lock ([`Self::begin_sync`]), synced without it
    /// ([`PendingSync::run`]), and recorded under it again
    /// ([`Self::end_sync`]; a segment rolled meanwhile is left to a later
    /// sync).
    pub(super) fn sync_all_concurrently(&self) -> Result<()> {
        let pending = self.begin_sync()?;
        let (pending, synced) = pending.run();
        self.end_sync(pending, synced)
    }

    /// [`Self::sync_all_concurrently`] with the fsyncs on a blocking thread.
    pub(super) async fn sync_all_off_thread(&self) -> Result<()> {
        let pending = self.begin_sync()?;
        let (pending, synced) = crate::util::blocking(move || Ok(pending.run())).await?;
        self.end_sync(pending, synced)
    }

    /// Takes what a flush must sync, under the writer lock.
    fn begin_sync(&self) -> Result<PendingSync> {
        let mut w = lock(&self.writer)?;
        if let Some(why) = &w.poisoned {
            return Err(Error::io(
                format!(
                    "changelog writer is unusable after an earlier failure path=`{}`: {why}; \
                     reopen the changelog",
                    self.dir.display()
                ),
                std::io::Error::other("poisoned"),
            )
            .with_reason(crate::Reason::FailedEarlier));
        }
        let active = if w.dirty {
            let f = w
                .file
                .try_clone()
                .map_err(|e| io_err("clone handle", &w.active.path, e))?;
            Some((Arc::clone(&w.active), f, w.pos))
        } else {
            None
        };
        Ok(PendingSync {
            dir: self.dir.clone(),
            closed: std::mem::take(&mut w.unsynced),
            active,
            dir_gen: w.dir_dirty.then_some(w.dir_gen),
        })
    }

    /// Records a flush's outcome under the writer lock: a failed fsync
    /// poisons the writer, a successful one moves the synced position.
    fn end_sync(&self, pending: PendingSync, synced: Result<()>) -> Result<()> {
        let mut w = lock(&self.writer)?;
        if let Err(e) = &synced {
            // After a failed fsync the kernel may have dropped the dirty pages.
            w.poisoned = Some(format!("fsync failed: {e}"));
            return synced;
        }
        if let Some((seg, _, pos)) = pending.active
            && Arc::ptr_eq(&seg, &w.active)
        {
            w.synced_pos = w.synced_pos.max(pos);
            if w.pos == pos {
                w.dirty = false;
            }
        }
        if pending.dir_gen.is_some_and(|g| g == w.dir_gen) {
            w.dir_dirty = false;
        }
        w.last_sync_ms = self.clock.now_ms();
        Ok(())
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
            if w.unsynced.len() > MAX_UNSYNCED_SEGMENTS {
                for (path, f) in std::mem::take(&mut w.unsynced) {
                    // Durability (and bounded open files): closed segments waiting for a flush reach disk now.
                    if let Err(e) = f.sync_data() {
                        return Err(fsync_failed(w, &path, e));
                    }
                }
            }
        } else if w.dirty {
            // Durability: a closed segment is complete on disk before later records are acked.
            if let Err(e) = w.file.sync_data() {
                let path = w.active.path.clone();
                return Err(fsync_failed(w, &path, e));
            }
        }
        w.dirty = false;
        // Everything in the closed segment is now readable.
        self.end.store(w.next_offset, Ordering::Release);
        let base = w.next_offset;
        let (seg, file) = match create_segment(&self.dir, base, Some(w.active.base), &self.files) {
            Ok(x) => x,
            Err(e) => {
                w.poisoned = Some(format!("segment roll failed: {e}"));
                return Err(e);
            }
        };
        if self.fsync == FsyncPolicy::Never {
            w.dir_dirty = true;
            w.dir_gen += 1;
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
}

/// Records an fsync failure during a roll: the kernel may have dropped the
/// pages, so the writer is poisoned and publishes nothing more.
fn fsync_failed(w: &mut Writer, path: &Path, e: std::io::Error) -> Error {
    let e = io_err("fsync changelog segment", path, e);
    w.poisoned = Some(format!("fsync failed: {e}"));
    w.fsync_failed = true;
    e
}

/// Creates a segment file holding just its header.
pub(super) fn create_segment(
    dir: &Path,
    base: u64,
    prev: Option<u64>,
    files: &Arc<OpenFiles>,
) -> Result<(Segment, File)> {
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
        files,
    );
    Ok((seg, file))
}

/// What one flush syncs, taken under the writer lock and synced without it.
pub(super) struct PendingSync {
    dir: PathBuf,
    closed: Vec<(PathBuf, File)>,
    active: Option<(Arc<Segment>, File, u64)>,
    dir_gen: Option<u64>,
}

impl PendingSync {
    /// The fsyncs (blocking). Returns itself for [`FileChangelog::end_sync`].
    fn run(self) -> (Self, Result<()>) {
        let synced = (|| {
            for (path, f) in &self.closed {
                // Durability: closed segments written under `Never` reach disk on flush.
                f.sync_data()
                    .map_err(|e| io_err("fsync changelog segment", path, e))?;
            }
            if let Some((seg, f, _)) = &self.active {
                // Durability: the records appended before the flush reach disk.
                f.sync_data()
                    .map_err(|e| io_err("fsync changelog segment", &seg.path, e))?;
            }
            if self.dir_gen.is_some() {
                // Durability: segments created under `Never` get their directory entries on disk.
                meta::sync_dir(&self.dir)?;
            }
            Ok(())
        })();
        (self, synced)
    }
}
