//! Key compaction of closed segments.
//!
//! Keeps the newest record of every key among the closed segments (dropping
//! a key's records entirely when its newest record is in the active
//! segment), drops tombstones older than the delete retention, and rewrites
//! each changed segment in place of the old one, keeping offsets (readers
//! handle the gaps). Segments are never merged, so the base-offset chain that
//! detects missing segments stays intact.
//!
//! # Crash safety
//!
//! 1. Every changed segment is written in full to `<base>.log.compacting`
//!    and fsynced; a crash here leaves the old segments untouched, and open
//!    deletes the leftovers.
//! 2. If records are dropped, the advanced [`Horizon`] (tombstones purged,
//!    records superseded) is persisted in the metadata file *before* any old
//!    segment is replaced: a horizon that is too high only makes a snapshot
//!    look stale or refuses a point-in-time read, while a purged tombstone
//!    under a horizon that does not cover it could let a restore resurrect a
//!    deleted key, and a dropped record a point-in-time read believes is
//!    there would give a state the log never had.
//! 3. The compacted files are renamed over the old ones in ascending offset
//!    order, with a directory fsync after each rename. A crash between two
//!    renames leaves older segments compacted and newer ones not. That state
//!    is a valid log: every record compaction dropped was superseded by a
//!    newer record of its key, which is either still in an uncompacted (old)
//!    newer segment, or is a purged tombstone — and then every older record
//!    of the key is in a segment renamed before it, so already dropped too.

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use super::codec::{self, SegmentHeader};
use super::segment::{IndexBuilder, Segment};
use super::{COMPACTING_SUFFIX, FileChangelog, io_err, lock, meta, read_shared, write_shared};
use crate::changelog::Horizon;
use crate::error::{Error, Result};

/// Options for [`FileChangelog::compact`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompactOptions {
    /// How long a tombstone is kept after it was appended (by the
    /// changelog's clock), so that a store or snapshot that is behind still
    /// sees the delete. Older tombstones are purged and the tombstone
    /// horizon advances past them. Default 24 hours (Kafka's
    /// `delete.retention.ms`).
    pub delete_retention: Duration,
}

impl Default for CompactOptions {
    fn default() -> Self {
        CompactOptions {
            delete_retention: Duration::from_secs(24 * 60 * 60),
        }
    }
}

/// What [`FileChangelog::compact`] did.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CompactionReport {
    /// Closed segments examined.
    pub segments_examined: u64,
    /// Closed segments rewritten (the others had nothing to drop).
    pub segments_rewritten: u64,
    /// Records in the closed segments before compaction.
    pub records_before: u64,
    /// Records in the closed segments after compaction.
    pub records_after: u64,
    /// Bytes of the closed segments before compaction.
    pub bytes_before: u64,
    /// Bytes of the closed segments after compaction.
    pub bytes_after: u64,
    /// Tombstones removed: purged after the retention, or superseded by a
    /// newer record of their key.
    pub tombstones_dropped: u64,
    /// The horizon after compaction.
    pub horizon: Horizon,
}

/// A compacted segment written to its temporary file.
struct Rewrite {
    old: Arc<Segment>,
    tmp: std::path::PathBuf,
    len: u64,
    index: IndexBuilder,
}

impl FileChangelog {
    /// Compacts the closed segments (never the active one): keeps the newest
    /// record of every key (none at all if the key's newest record is in the
    /// active segment), purges tombstones older than
    /// [`CompactOptions::delete_retention`] and advances
    /// [`Horizon::tombstones_before`] past the highest purged one and
    /// [`Horizon::superseded_before`] past the newest record it examined,
    /// persisting both before any segment is replaced. Offsets never change.
    ///
    /// Crash-safe: changed segments are written to `<base>.log.compacting`,
    /// fsynced, and renamed over the old ones oldest first (directory fsync
    /// after each); any crash leaves a valid log and open removes leftovers
    /// (`docs/format.md`, "Compaction and the tombstone horizon", explains
    /// why a partly renamed set is still exact).
    ///
    /// Runs on the caller's thread; appends and reads proceed concurrently
    /// (open readers keep reading the old files); one compaction runs at a
    /// time. Memory: one copy of every distinct key in the log.
    pub fn compact(&self, options: &CompactOptions) -> Result<CompactionReport> {
        self.check_writable("compact")?;
        let _one_at_a_time = lock(&self.compacting)?;
        let (closed, active, horizon) = {
            let s = read_shared(&self.shared)?;
            let n = s.segments.len();
            let active = Arc::clone(
                s.segments
                    .last()
                    .ok_or_else(|| Error::internal("changelog has no segment"))?,
            );
            (s.segments[..n - 1].to_vec(), active, s.horizon)
        };
        let mut report = CompactionReport {
            horizon,
            ..CompactionReport::default()
        };
        if closed.is_empty() {
            return Ok(report);
        }
        let retention_ms = i64::try_from(options.delete_retention.as_millis()).unwrap_or(i64::MAX);
        let cutoff = self.clock.now_ms().saturating_sub(retention_ms);

        let (newest, examined_end) = newest_offsets(&closed, &active, &mut report)?;
        let (rewrites, max_purged) = write_compacted(&closed, &newest, cutoff, &mut report)?;
        self.advance_horizon(horizon, max_purged, examined_end, &rewrites, &mut report)?;
        // Each replaced segment lives on only while readers hold it.
        drop(closed);
        self.swap_in(rewrites, &mut report)?;
        tracing::info!(
            path = %self.dir.display(),
            segments_rewritten = report.segments_rewritten,
            records_before = report.records_before,
            records_after = report.records_after,
            tombstones_dropped = report.tombstones_dropped,
            tombstones_before = report.horizon.tombstones_before,
            superseded_before = report.horizon.superseded_before,
            "compacted changelog"
        );
        Ok(report)
    }

    /// Persists the advanced horizon before any purged tombstone, or any
    /// record a point-in-time read up to its offset would need, disappears.
    /// On failure the temporary files are removed.
    fn advance_horizon(
        &self,
        horizon: Horizon,
        max_purged: Option<u64>,
        examined_end: u64,
        rewrites: &[Rewrite],
        report: &mut CompactionReport,
    ) -> Result<()> {
        let mut new = horizon;
        if let Some(m) = max_purged {
            new.tombstones_before = new.tombstones_before.max(m + 1);
        }
        if !rewrites.is_empty() {
            new.superseded_before = new.superseded_before.max(examined_end);
        }
        if new != horizon {
            if let Err(e) = self.update_meta(|m| m.horizon = new) {
                for r in rewrites {
                    let _ = fs::remove_file(&r.tmp);
                }
                return Err(e);
            }
            write_shared(&self.shared)?.horizon = new;
        }
        report.horizon = new;
        Ok(())
    }

    /// Swaps in the compacted segments, oldest first.
    fn swap_in(&self, rewrites: Vec<Rewrite>, report: &mut CompactionReport) -> Result<()> {
        let mut pending = rewrites.into_iter();
        while let Some(r) = pending.next() {
            if let Err(e) = self.swap_one(r, report) {
                for rest in pending {
                    let _ = fs::remove_file(&rest.tmp);
                }
                return Err(e);
            }
        }
        Ok(())
    }

    /// Renames one compacted segment over the old one and puts it in the
    /// segment list; the directory is synced before the next one's rename.
    fn swap_one(&self, r: Rewrite, report: &mut CompactionReport) -> Result<()> {
        let path = r.old.path.clone();
        // A read handle on the new inode, taken before the rename moves it;
        // and the old bytes keep a name for readers that hold them.
        let file = File::open(&r.tmp)
            .map_err(|e| io_err("open compacted segment", &r.tmp, e))
            .and_then(|f| r.old.retire().map(|()| f))
            // Durability: the atomic swap; the path holds the old or the new segment, never half.
            .and_then(|f| {
                fs::rename(&r.tmp, &path)
                    .map(|()| f)
                    .map_err(|e| io_err("rename compacted segment into place", &path, e))
            });
        let file = match file {
            Ok(f) => f,
            Err(e) => {
                let _ = fs::remove_file(&r.tmp);
                return Err(e);
            }
        };
        // The list follows the directory, even if syncing it fails below.
        let seg = Segment::new(
            r.old.base,
            r.old.prev_base,
            path,
            file,
            r.len,
            Some(r.index.index),
            &self.files,
        );
        {
            let mut s = write_shared(&self.shared)?;
            if let Some(i) = s.segments.iter().position(|x| Arc::ptr_eq(x, &r.old)) {
                s.segments[i] = Arc::new(seg);
            }
            s.generation += 1;
            s.start = None;
        }
        report.segments_rewritten += 1;
        // Durability: this swap is on disk before a newer segment's is (see module docs).
        meta::sync_dir(&self.dir)
    }
}

/// Pass 1: the newest offset of every key, closed segments then the
/// active one (up to what is written now; later appends only supersede
/// more). Also returns one past the newest offset pass 1 sees: every record
/// compaction drops as superseded is replaced by a record below it.
fn newest_offsets(
    closed: &[Arc<Segment>],
    active: &Segment,
    report: &mut CompactionReport,
) -> Result<(HashMap<Bytes, u64>, u64)> {
    let mut newest: HashMap<Bytes, u64> = HashMap::new();
    // One past the newest offset pass 1 sees: every record compaction
    // drops as superseded is replaced by a record below it.
    let mut examined_end = 0u64;
    let mut note = |buf: &[u8], r: &codec::RawRecord| {
        examined_end = examined_end.max(r.offset + 1);
        let key = &buf[r.key.clone()];
        match newest.get_mut(key) {
            Some(o) => *o = r.offset,
            None => {
                newest.insert(Bytes::copy_from_slice(key), r.offset);
            }
        }
    };
    for (i, seg) in closed.iter().enumerate() {
        let next_base = closed.get(i + 1).map_or(active.base, |s| s.base);
        let buf = seg.read_all()?;
        let mut beyond = None;
        let end = codec::scan_records(&buf, seg.base, &seg.path, |r| {
            if r.offset >= next_base {
                beyond.get_or_insert(r.offset);
            }
            note(&buf, r);
        })?;
        if let Some(o) = beyond {
            return Err(seg.beyond_next_base(o, Some(next_base)));
        }
        if let Some(t) = end.torn {
            return Err(seg.corrupt_at(t.position as u64, t.reason));
        }
        report.segments_examined += 1;
        report.records_before += end.records;
        report.bytes_before += buf.len() as u64;
    }
    let abuf = active.read_all()?;
    codec::scan_records(&abuf, active.base, &active.path, |r| note(&abuf, r))?;
    drop(abuf);
    Ok((newest, examined_end))
}

/// Pass 2: write the compacted segments to temporary files. Returns them
/// with the highest purged newest tombstone; on failure the temporary files
/// written so far are removed.
fn write_compacted(
    closed: &[Arc<Segment>],
    newest: &HashMap<Bytes, u64>,
    cutoff: i64,
    report: &mut CompactionReport,
) -> Result<(Vec<Rewrite>, Option<u64>)> {
    let mut rewrites = Vec::new();
    let mut max_purged: Option<u64> = None;
    let result = (|| -> Result<()> {
        for seg in closed {
            if let Some(r) = compact_segment(seg, newest, cutoff, report, &mut max_purged)? {
                rewrites.push(r);
            }
        }
        Ok(())
    })();
    if let Err(e) = result {
        for r in &rewrites {
            let _ = fs::remove_file(&r.tmp);
        }
        return Err(e);
    }
    Ok((rewrites, max_purged))
}

/// One closed segment of pass 2: keeps each key's newest record unless it
/// is an expired tombstone, and writes the result to `<base>.log.compacting`
/// if anything was dropped (`None` when the segment stays as it is).
fn compact_segment(
    seg: &Arc<Segment>,
    newest: &HashMap<Bytes, u64>,
    cutoff: i64,
    report: &mut CompactionReport,
    max_purged: &mut Option<u64>,
) -> Result<Option<Rewrite>> {
    let buf = seg.read_all()?;
    let header = SegmentHeader {
        base_offset: seg.base,
        prev_base_offset: seg.prev_base,
    };
    let mut out = header.encode().to_vec();
    let mut index = IndexBuilder::new();
    let (mut total, mut kept) = (0u64, 0u64);
    codec::scan_records(&buf, seg.base, &seg.path, |r| {
        total += 1;
        let is_newest = newest.get(&buf[r.key.clone()]) == Some(&r.offset);
        let tombstone = r.value.is_none();
        let expired = tombstone && r.timestamp_ms < cutoff;
        if is_newest && !expired {
            let start = r.key.start - codec::FRAME_HEADER_LEN;
            index.add(r.offset, out.len() as u64);
            out.extend_from_slice(&buf[start..r.next]);
            kept += 1;
        } else if tombstone {
            report.tombstones_dropped += 1;
            if is_newest {
                // A purged newest tombstone: replay from below it would miss the delete.
                *max_purged = Some(max_purged.map_or(r.offset, |m| m.max(r.offset)));
            }
        }
    })?;
    report.records_after += kept;
    report.bytes_after += out.len() as u64;
    if kept == total {
        return Ok(None);
    }
    let mut tmp = seg.path.clone().into_os_string();
    tmp.push(COMPACTING_SUFFIX);
    let tmp = std::path::PathBuf::from(tmp);
    let mut f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(&tmp)
        .map_err(|e| io_err("create compacted segment", &tmp, e))?;
    f.write_all(&out)
        .map_err(|e| io_err("write compacted segment", &tmp, e))?;
    // Durability: the compacted segment is complete on disk before it replaces the old.
    f.sync_all()
        .map_err(|e| io_err("fsync compacted segment", &tmp, e))?;
    drop(f);
    Ok(Some(Rewrite {
        old: Arc::clone(seg),
        tmp,
        len: out.len() as u64,
        index,
    }))
}
