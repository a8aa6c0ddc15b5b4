//! Replay: bring a store (empty or behind) up to its changelog's end by
//! reading from `applied_offset + 1` in batches. The step both
//! [`LoggedStore`](crate::store::logged::LoggedStore) (catch-up, gap replay)
//! and [`crate::restore`] (the tail after a snapshot, or a full replay) use.

use std::time::{Duration, Instant};

use crate::changelog::{Changelog, ChangelogBinding, Record};
use crate::error::{Error, Result};
use crate::store::{StateStore, ensure_follows};

/// How to replay.
#[derive(Debug, Clone)]
pub struct ReplayOptions {
    /// Records read and applied per batch (default 50 000; 10 000 replayed
    /// into a `MemoryStore` 11 % slower, as it sorts and deduplicates each
    /// batch; RocksDB did not care). Each batch is one
    /// atomic `apply`, so a crash mid-replay resumes from the last batch.
    pub batch_size: usize,
}

impl Default for ReplayOptions {
    fn default() -> Self {
        ReplayOptions { batch_size: 50_000 }
    }
}

/// Progress reported after each applied batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplayProgress {
    /// Records applied so far.
    pub records: u64,
    /// Key + value bytes applied so far.
    pub bytes: u64,
    /// The store's applied offset now.
    pub applied_offset: u64,
    /// The end offset (exclusive) replay is heading for.
    pub end_offset: u64,
}

/// What a replay did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplayReport {
    /// First offset asked for (`applied_offset + 1`, or 0).
    pub from_offset: u64,
    /// End offset (exclusive) of the changelog when replay started.
    pub end_offset: u64,
    /// Records applied.
    pub records: u64,
    /// Key + value bytes applied.
    pub bytes: u64,
    /// Batches applied.
    pub batches: u64,
    /// The store's applied offset afterwards.
    pub applied_offset: Option<u64>,
    /// Wall time taken.
    pub duration: Duration,
}

impl ReplayReport {
    /// Records per second (0 for an empty replay).
    pub fn records_per_sec(&self) -> f64 {
        let s = self.duration.as_secs_f64();
        if s > 0.0 {
            self.records as f64 / s
        } else {
            0.0
        }
    }
}

/// Replays `changelog` into `store` from `store.applied_offset() + 1` up to
/// the changelog's end offset at the time of the call.
///
/// Refuses (kind `stale`) a store that follows another changelog or an
/// earlier incarnation of this one (see [`ensure_follows`]; a new store is
/// bound to this changelog), a store that is ahead of its changelog (the log was
/// recreated or truncated: the store must be rebuilt from scratch) and a store
/// whose position lies below the changelog's [`Horizon`](crate::changelog::Horizon)
/// (compaction may have purged deletes it has not seen; invariant 7). The
/// horizon is checked again once the replay has read to the end: if it moved
/// past the start meanwhile, the replay fails `stale` — the store has then
/// applied records after a tombstone that may have been purged under the
/// reader, so it must be restored again or rebuilt, not used.
pub fn replay<S, C>(
    store: &mut S,
    changelog: &C,
    options: &ReplayOptions,
    progress: &mut dyn FnMut(&ReplayProgress),
) -> Result<ReplayReport>
where
    S: StateStore + ?Sized,
    C: Changelog + ?Sized,
{
    replay_until(store, changelog, options, None, progress)
}

/// [`replay`], stopping after offset `until` when it is given (a
/// point-in-time restore: the store ends at the changelog's state at that
/// offset, or at the log's end if that comes first). Fails (kind `config`)
/// for a store already past `until`: a store cannot go back.
pub fn replay_until<S, C>(
    store: &mut S,
    changelog: &C,
    options: &ReplayOptions,
    until: Option<u64>,
    progress: &mut dyn FnMut(&ReplayProgress),
) -> Result<ReplayReport>
where
    S: StateStore + ?Sized,
    C: Changelog + ?Sized,
{
    let started = Instant::now();
    // Invariant 10: an offset means something only in its own incarnation.
    ensure_follows(store, &ChangelogBinding::of(changelog)?)?;
    let applied = store.applied_offset()?;
    let log_end = changelog.end_offset()?;
    if let (Some(u), Some(a)) = (until, applied)
        && a > u
    {
        return Err(Error::config(format!(
            "store is past the requested offset changelog=`{}` applied_offset={a} until={u}; \
             a store cannot go back: restore into another directory",
            changelog.id()
        )));
    }
    // Replay reads [from, end): `until` is the last offset to apply.
    let stop = until.map(|u| u.saturating_add(1));
    let end = stop.map_or(log_end, |s| log_end.min(s));
    let from = applied.map_or(0, |o| o.saturating_add(1));
    if from > log_end {
        return Err(Error::stale(format!(
            "store is ahead of its changelog changelog=`{}` applied_offset={} end_offset={log_end}; \
             the changelog was recreated or truncated — delete the store and replay from scratch",
            changelog.id(),
            applied.unwrap_or(0),
        )));
    }
    let mut report = ReplayReport {
        from_offset: from,
        end_offset: end,
        records: 0,
        bytes: 0,
        batches: 0,
        applied_offset: applied,
        duration: Duration::ZERO,
    };
    if from == end {
        report.duration = started.elapsed();
        return Ok(report);
    }
    // Only a tail to read needs the horizon (for Kafka it costs a topic
    // config lookup, an offset-by-time lookup and a one-record read).
    let horizon = changelog.horizon()?;
    if !horizon.can_resume_after(applied) {
        return Err(Error::stale(format!(
            "changelog no longer holds everything needed to resume changelog=`{}` from_offset={from} \
             tombstones_before={} deleted_before={}; rebuild the store from a newer snapshot or from scratch",
            changelog.id(),
            horizon.tombstones_before,
            horizon.deleted_before,
        )));
    }
    let batch_size = options.batch_size.max(1);
    let mut reader = changelog.read_from(from)?;
    let mut records: Vec<Record> = Vec::with_capacity(batch_size);
    let mut expect_min = from;
    let mut done = false;
    while !done && let Some(batch) = reader.next_batch(batch_size)? {
        records.clear();
        let mut last = expect_min;
        for r in batch {
            if stop.is_some_and(|s| r.offset >= s) {
                // Past the point-in-time bound: stop here.
                done = true;
                break;
            }
            if r.offset < expect_min {
                return Err(Error::corrupt(format!(
                    "changelog returned offsets out of order changelog=`{}` offset={} expected_at_least={expect_min}",
                    changelog.id(),
                    r.offset
                )));
            }
            report.bytes += (r.key.len() + r.value.as_ref().map_or(0, |v| v.len())) as u64;
            last = r.offset;
            expect_min = r.offset + 1;
            records.push(r.into_record());
        }
        if records.is_empty() {
            continue;
        }
        store.apply(&records, last)?;
        report.records += records.len() as u64;
        report.batches += 1;
        report.applied_offset = Some(last);
        progress(&ReplayProgress {
            records: report.records,
            bytes: report.bytes,
            applied_offset: last,
            end_offset: end,
        });
    }
    // Compaction runs while we read: a tombstone that was young enough when
    // the replay started may have been purged before the reader reached it.
    // The horizon only moves forward, so if it still allows resuming from
    // `from` now, nothing after `from` could have been purged meanwhile.
    let after = changelog.horizon()?;
    if !after.can_resume_after(applied) {
        return Err(Error::stale(format!(
            "the changelog's horizon passed the replay's start while it ran changelog=`{}` \
             from_offset={from} tombstones_before={} deleted_before={}; a deleted key may have come \
             back: do not use this store — restore again (restore_store replaces it) or rebuild it",
            changelog.id(),
            after.tombstones_before,
            after.deleted_before,
        )));
    }
    // The reader read everything below its end. The last offsets may hold
    // nothing it hands out (lineage markers, records compaction removed);
    // the store reflects them all the same. Recording that keeps the next
    // replay, and a snapshot's offset, at the end: a store left two offsets
    // behind on an idle topic would later look below the tombstone horizon.
    if let Some(tail) = reader
        .end_offset()
        .min(stop.unwrap_or(u64::MAX))
        .checked_sub(1)
        && report.applied_offset.is_none_or(|a| a < tail)
    {
        store.apply(&[], tail)?;
        report.applied_offset = Some(tail);
    }
    report.duration = started.elapsed();
    Ok(report)
}
