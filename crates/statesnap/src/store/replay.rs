//! Replay: bring a store (empty or behind) up to its changelog's end by
//! reading from `applied_offset + 1` in batches. The step both
//! [`LoggedStore`](crate::store::logged::LoggedStore) (catch-up, gap replay)
//! and [`crate::restore`] (the tail after a snapshot, or a full replay) use.

use std::time::{Duration, Instant};

use crate::changelog::{Changelog, ChangelogBinding, ChangelogId, ChangelogReader, Record};
use crate::error::{Error, Result};
use crate::store::{StateStore, ensure_follows};

/// How to replay.
#[derive(Debug, Clone)]
pub struct ReplayOptions {
    /// Records read and applied per batch (default 50 000; 10 000 replayed
    /// into a `MemoryStore` 11 % slower; RocksDB did not care). A batch of
    /// 256 records or more is put in key order with only the last record
    /// of each key, by the reading thread, before the store applies it.
    /// Each batch is one atomic `apply`, so a crash mid-replay resumes
    /// from the last batch.
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
    /// Records read from the log and applied so far (within a batch, the
    /// store receives only the last record of each key).
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
    /// Records read from the log and applied (within a batch, the store
    /// receives only the last record of each key).
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
/// for a store already past `until`: a store cannot go back; and (kind
/// `stale`) when compaction may have removed a record in the range that a
/// write after `until` replaced, before or while it runs
/// ([`crate::changelog::Horizon::exact_as_of`]).
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
    let (from, end, stop) = replay_range(changelog, applied, until, log_end)?;
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
        )).with_reason(crate::Reason::BelowHorizon));
    }
    // A replay that stops before the log's end needs the records compaction
    // drops in favour of later writes (a point in time).
    let point_in_time = until.filter(|&u| u.saturating_add(1) < log_end);
    if let Some(u) = point_in_time {
        check_exact_as_of(changelog, &horizon, applied, u)?;
    }
    let batch_size = options.batch_size.max(1);
    let reader = changelog.read_from(from)?;
    // Reading, checking and ordering a batch run on a thread of their own
    // (`feed`), one batch ahead of the store's `apply` here: a replay into
    // a `MemoryStore` spends about a quarter of its time reading and
    // sorting, which then overlaps the tree updates instead of adding to
    // them. One batch waits in the channel, one is being prepared.
    let reader = apply_batches(
        store,
        reader,
        changelog.id(),
        (batch_size, from, stop, end),
        &mut report,
        progress,
    )?;
    check_horizon_after(changelog, applied, from, point_in_time)?;
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

/// What a replay reads, `[from, end)`, and where it stops (`until + 1`).
/// Refuses a store already past `until` (`config`: a store cannot go back)
/// and one ahead of the log (`stale`).
fn replay_range<C: Changelog + ?Sized>(
    changelog: &C,
    applied: Option<u64>,
    until: Option<u64>,
    log_end: u64,
) -> Result<(u64, u64, Option<u64>)> {
    if let (Some(u), Some(a)) = (until, applied)
        && a > u
    {
        return Err(Error::config(format!(
            "store is past the requested offset changelog=`{}` applied_offset={a} until={u}; \
             a store cannot go back: restore into another directory",
            changelog.id()
        ))
        .with_reason(crate::Reason::PastPoint));
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
        )).with_reason(crate::Reason::AheadOfLog));
    }
    Ok((from, end, stop))
}

/// Applies the batches `reader` hands out to `store`, up to `stop`:
/// reading, checking and ordering a batch run on a thread of their own
/// (`feed`), one batch ahead of the store's `apply` here. Returns the
/// reader, to see where it ended.
fn apply_batches<'r, S: StateStore + ?Sized>(
    store: &mut S,
    reader: Box<dyn ChangelogReader + 'r>,
    id: &ChangelogId,
    (batch_size, from, stop, end): (usize, u64, Option<u64>, u64),
    report: &mut ReplayReport,
    progress: &mut dyn FnMut(&ReplayProgress),
) -> Result<Box<dyn ChangelogReader + 'r>> {
    std::thread::scope(|scope| -> Result<Box<dyn ChangelogReader + '_>> {
        let (tx, rx) = std::sync::mpsc::sync_channel::<Result<Prepared>>(1);
        let feeder = std::thread::Builder::new()
            .name("statesnap-replay-read".into())
            .spawn_scoped(scope, move || feed(reader, id, batch_size, from, stop, &tx))
            .map_err(|e| Error::io("cannot start the replay's reading thread", e))?;
        // Stops at the first error either side: dropping `rx` ends the
        // feeder's next send, an error from the feeder ends the loop.
        let applied: Result<()> = (|| {
            for prepared in &rx {
                let p = prepared?;
                store.apply(&p.records, p.last)?;
                report.records += p.read;
                report.bytes += p.bytes;
                report.batches += 1;
                report.applied_offset = Some(p.last);
                progress(&ReplayProgress {
                    records: report.records,
                    bytes: report.bytes,
                    applied_offset: p.last,
                    end_offset: end,
                });
            }
            Ok(())
        })();
        drop(rx);
        let joined = feeder.join();
        // The store's own error first: it says what to do about the store.
        applied?;
        joined.map_err(|panic| {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            Error::internal(format!(
                "the replay's reading thread panicked changelog=`{id}` panic=`{}`",
                what.escape_debug()
            ))
        })
    })
}

/// Compaction runs while a replay reads: a tombstone that was young enough
/// when the replay started may have been purged before the reader reached
/// it. The horizon only moves forward, so if it still allows resuming from
/// `from` now, nothing after `from` could have been purged meanwhile.
fn check_horizon_after<C: Changelog + ?Sized>(
    changelog: &C,
    applied: Option<u64>,
    from: u64,
    point_in_time: Option<u64>,
) -> Result<()> {
    let after = changelog.horizon()?;
    if let Some(u) = point_in_time {
        check_exact_as_of(changelog, &after, applied, u)?;
    }
    if !after.can_resume_after(applied) {
        return Err(Error::stale(format!(
            "the changelog's horizon passed the replay's start while it ran changelog=`{}` \
             from_offset={from} tombstones_before={} deleted_before={}; a deleted key may have come \
             back: do not use this store — restore again (restore_store replaces it) or rebuild it",
            changelog.id(),
            after.tombstones_before,
            after.deleted_before,
        )).with_reason(crate::Reason::BelowHorizon));
    }
    Ok(())
}

/// Refuses (`stale`) a replay from after `applied` up to `until` that may
/// miss records compaction dropped ([`crate::changelog::Horizon::exact_as_of`]).
fn check_exact_as_of<C: Changelog + ?Sized>(
    changelog: &C,
    horizon: &crate::changelog::Horizon,
    applied: Option<u64>,
    until: u64,
) -> Result<()> {
    if horizon.exact_as_of(applied, until) {
        return Ok(());
    }
    Err(Error::stale(format!(
        "replaying up to the point in time may miss records compaction removed changelog=`{}` \
         applied_offset={applied:?} until={until} superseded_before={}; the state at that offset \
         cannot be rebuilt exactly from here: use a snapshot at exactly that offset, or an \
         offset at or after {}",
        changelog.id(),
        horizon.superseded_before,
        horizon.superseded_before.saturating_sub(1),
    ))
    .with_reason(crate::Reason::BelowHorizon))
}

/// A batch [`feed`] read, ready to apply.
struct Prepared {
    /// In key order, the last record of each key, when the batch is large
    /// enough to gain from it ([`last_write_per_key`]); as read otherwise.
    records: Vec<Record>,
    /// Records read (before the ordering dropped overwritten ones).
    read: u64,
    /// Key + value bytes read.
    bytes: u64,
    /// The batch's last offset.
    last: u64,
}

/// Reads batches from `reader` starting at `from`, checks their offsets,
/// stops before `stop`, and sends each, ordered, to `tx`; returns the
/// reader (its end offset is read afterwards). Ends at the log's end, on
/// the first error (sent), or when the receiver is gone.
fn feed<'a>(
    mut reader: Box<dyn ChangelogReader + 'a>,
    id: &ChangelogId,
    batch_size: usize,
    from: u64,
    stop: Option<u64>,
    tx: &std::sync::mpsc::SyncSender<Result<Prepared>>,
) -> Box<dyn ChangelogReader + 'a> {
    let mut expect_min = from;
    loop {
        let batch = match reader.next_batch(batch_size) {
            Ok(Some(b)) => b,
            Ok(None) => return reader,
            Err(e) => {
                let _ = tx.send(Err(e));
                return reader;
            }
        };
        let mut records = Vec::with_capacity(batch.len());
        let (mut bytes, mut last, mut done) = (0u64, expect_min, false);
        for r in batch {
            if stop.is_some_and(|s| r.offset >= s) {
                // Past the point-in-time bound: stop here.
                done = true;
                break;
            }
            if r.offset < expect_min {
                let _ = tx.send(Err(Error::corrupt(format!(
                    "changelog returned offsets out of order changelog=`{id}` offset={} \
                     expected_at_least={expect_min}",
                    r.offset
                ))));
                return reader;
            }
            bytes += (r.key.len() + r.value.as_ref().map_or(0, |v| v.len())) as u64;
            last = r.offset;
            expect_min = r.offset + 1;
            records.push(r.into_record());
        }
        if !records.is_empty() {
            let read = records.len() as u64;
            if records.len() >= ORDER_BATCHES_OF {
                last_write_per_key(&mut records);
            }
            let prepared = Prepared {
                records,
                read,
                bytes,
                last,
            };
            if tx.send(Ok(prepared)).is_err() {
                return reader;
            }
        }
        if done {
            return reader;
        }
    }
}

/// Batches of at least this many records are handed to the store in key
/// order, one record per key.
pub(crate) const ORDER_BATCHES_OF: usize = 256;

/// Reorders `records` by key (byte order) and keeps only the last record
/// of each key. Applied as one atomic batch, the result is the same: of a
/// key's records only the last decides its value, and records of
/// different keys commute. Stores gain from it: a tree's consecutive
/// updates walk mostly the same path, and overwritten values are never
/// written.
pub(crate) fn last_write_per_key<R: std::borrow::Borrow<Record>>(records: &mut Vec<R>) {
    // Stable: each key's records keep their order.
    records.sort_by(|a, b| super::slot::cmp_bytes(&a.borrow().key, &b.borrow().key));
    records.dedup_by(|later, earlier| {
        let same = later.borrow().key == earlier.borrow().key;
        if same {
            // `dedup_by` keeps the first of a run: keep the last.
            std::mem::swap(later, earlier);
        }
        same
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::changelog::file::{FileChangelog, FileChangelogOptions};
    use crate::changelog::{Horizon, Lineage, LoggedRecord};
    use crate::error::ErrorKind;
    use crate::store::memory::MemoryStore;
    use crate::store::{KvIter, SizeEstimate};
    use bytes::Bytes;
    use std::collections::BTreeMap;
    use std::ops::Bound;

    type Model = BTreeMap<Bytes, Bytes>;

    /// A log of `n` records over 40 keys: many writes per key, deletes
    /// among them, values of changing length.
    fn log_with(dir: &std::path::Path, n: usize, seed: u64) -> (FileChangelog, Vec<Record>) {
        let id = ChangelogId::new("replay-test", 0).unwrap();
        let log = FileChangelog::open(dir, id, FileChangelogOptions::default()).unwrap();
        let mut state = seed;
        let records: Vec<Record> = (0..n)
            .map(|_| {
                let x = crate::util::splitmix64(&mut state);
                let key = Bytes::from(format!("k{:02}", x % 40));
                if x.is_multiple_of(6) {
                    Record::delete(key)
                } else {
                    Record::put(key, vec![b'a' + (x % 26) as u8; (x % 19) as usize])
                }
            })
            .collect();
        for chunk in records.chunks(333) {
            log.append(chunk).unwrap();
        }
        (log, records)
    }

    fn model_of(records: &[Record]) -> Model {
        let mut m = Model::new();
        for r in records {
            match &r.value {
                Some(v) => m.insert(r.key.clone(), v.clone()),
                None => m.remove(&r.key),
            };
        }
        m
    }

    fn contents(s: &MemoryStore) -> Model {
        s.range(Bound::Unbounded, Bound::Unbounded)
            .unwrap()
            .map(|kv| kv.unwrap())
            .collect()
    }

    /// Whatever the batch size (below, at and above the size from which
    /// batches are reordered) and wherever `until` cuts a batch, replay
    /// ends where applying every record in order ends, and counts every
    /// record read, the ones the reordering dropped included.
    #[test]
    fn replay_equals_applying_every_record_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let (log, records) = log_with(dir.path(), 3_000, 11);
        let bytes_of = |rs: &[Record]| -> u64 {
            rs.iter()
                .map(|r| (r.key.len() + r.value.as_ref().map_or(0, |v| v.len())) as u64)
                .sum()
        };
        for batch_size in [1, 7, 255, 256, 300, 1_000, 50_000] {
            let opts = ReplayOptions { batch_size };
            let mut whole = MemoryStore::new();
            let r = replay(&mut whole, &log, &opts, &mut |_| {}).unwrap();
            assert_eq!(contents(&whole), model_of(&records), "batch {batch_size}");
            assert_eq!(r.records, 3_000, "batch {batch_size}");
            assert_eq!(r.bytes, bytes_of(&records), "batch {batch_size}");
            assert_eq!(r.applied_offset, Some(2_999));
            assert_eq!(r.batches, 3_000u64.div_ceil(batch_size as u64));

            // In two steps, the first ending inside a batch.
            let mut split = MemoryStore::new();
            let mut seen = Vec::new();
            let first = replay_until(&mut split, &log, &opts, Some(1_234), &mut |p| {
                seen.push(p.records)
            })
            .unwrap();
            assert_eq!(first.applied_offset, Some(1_234));
            assert_eq!(first.records, 1_235);
            assert_eq!(seen.last(), Some(&1_235), "progress counts records read");
            assert_eq!(contents(&split), model_of(&records[..1_235]));
            let rest = replay(&mut split, &log, &opts, &mut |_| {}).unwrap();
            assert_eq!(rest.records, 3_000 - 1_235);
            assert_eq!(contents(&split), model_of(&records));
        }
    }

    #[test]
    fn ordering_keeps_the_last_record_of_each_key_in_key_order() {
        let mut rs = vec![
            Record::put("b", "1"),
            Record::put("a", "1"),
            Record::delete("b"),
            Record::put("c", "1"),
            Record::put("a", "2"),
            Record::put("b", "3"),
        ];
        last_write_per_key(&mut rs);
        assert_eq!(
            rs,
            vec![
                Record::put("a", "2"),
                Record::put("b", "3"),
                Record::put("c", "1")
            ]
        );
    }

    /// A `MemoryStore` whose `apply` fails from its `fail_at`-th call on.
    struct Failing {
        inner: MemoryStore,
        calls: usize,
        fail_at: usize,
    }

    impl StateStore for Failing {
        fn get(&self, key: &[u8]) -> Result<Option<Bytes>> {
            self.inner.get(key)
        }
        fn range<'a>(&'a self, start: Bound<&[u8]>, end: Bound<&[u8]>) -> Result<KvIter<'a>> {
            self.inner.range(start, end)
        }
        fn apply(&mut self, batch: &[Record], applied_offset: u64) -> Result<()> {
            self.calls += 1;
            if self.calls >= self.fail_at {
                return Err(Error::new(ErrorKind::Io, "disk full"));
            }
            self.inner.apply(batch, applied_offset)
        }
        fn applied_offset(&self) -> Result<Option<u64>> {
            self.inner.applied_offset()
        }
        fn approximate_size(&self) -> Result<SizeEstimate> {
            self.inner.approximate_size()
        }
        fn binding(&self) -> Result<Option<ChangelogBinding>> {
            self.inner.binding()
        }
        fn bind(&mut self, binding: &ChangelogBinding) -> Result<()> {
            self.inner.bind(binding)
        }
    }

    /// A store that fails stops the replay (the reading thread too: the
    /// test would hang otherwise) with its error, at the last batch it
    /// applied; a later replay resumes from there.
    #[test]
    fn a_failing_apply_stops_the_replay_at_the_last_good_batch() {
        let dir = tempfile::tempdir().unwrap();
        let (log, records) = log_with(dir.path(), 3_000, 12);
        let opts = ReplayOptions { batch_size: 400 };
        let mut store = Failing {
            inner: MemoryStore::new(),
            calls: 0,
            fail_at: 3,
        };
        let err = replay(&mut store, &log, &opts, &mut |_| {}).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Io);
        assert_eq!(store.inner.applied_offset().unwrap(), Some(799));
        assert_eq!(contents(&store.inner), model_of(&records[..800]));
        let mut inner = store.inner;
        replay(&mut inner, &log, &opts, &mut |_| {}).unwrap();
        assert_eq!(contents(&inner), model_of(&records));
    }

    /// What a [`Troubled`] reader does after its good batches.
    #[derive(Clone, Copy, Debug)]
    enum Trouble {
        Error,
        Disorder,
        Panic,
    }

    /// A changelog over a file log whose readers hand out `batches` good
    /// batches, then get into `trouble`.
    struct Troubled {
        log: FileChangelog,
        batches: usize,
        trouble: Trouble,
    }

    struct TroubledReader<'a> {
        inner: Box<dyn ChangelogReader + 'a>,
        left: usize,
        trouble: Trouble,
    }

    impl ChangelogReader for TroubledReader<'_> {
        fn next_batch(&mut self, max: usize) -> Result<Option<Vec<LoggedRecord>>> {
            if self.left > 0 {
                self.left -= 1;
                return self.inner.next_batch(max);
            }
            match self.trouble {
                Trouble::Error => Err(Error::new(ErrorKind::Transient, "broker gone")),
                Trouble::Disorder => {
                    let mut b = self.inner.next_batch(max)?.unwrap_or_default();
                    b.reverse();
                    Ok(Some(b))
                }
                Trouble::Panic => panic!("a reader's bug"),
            }
        }
        fn end_offset(&self) -> u64 {
            self.inner.end_offset()
        }
    }

    impl Changelog for Troubled {
        fn id(&self) -> &ChangelogId {
            self.log.id()
        }
        fn append(&self, batch: &[Record]) -> Result<Vec<u64>> {
            self.log.append(batch)
        }
        fn read_from(&self, from: u64) -> Result<Box<dyn ChangelogReader + '_>> {
            Ok(Box::new(TroubledReader {
                inner: self.log.read_from(from)?,
                left: self.batches,
                trouble: self.trouble,
            }))
        }
        fn start_offset(&self) -> Result<u64> {
            self.log.start_offset()
        }
        fn end_offset(&self) -> Result<u64> {
            self.log.end_offset()
        }
        fn lineage(&self) -> Result<Lineage> {
            self.log.lineage()
        }
        fn horizon(&self) -> Result<Horizon> {
            self.log.horizon()
        }
        fn flush(&self) -> Result<()> {
            self.log.flush()
        }
    }

    /// A reader's error, records out of order, and a reader that panics
    /// end the replay with an error of their kind (never as if the log had
    /// ended); the batches before them are applied.
    #[test]
    fn reader_trouble_ends_the_replay_after_the_good_batches() {
        for trouble in [Trouble::Error, Trouble::Disorder, Trouble::Panic] {
            let dir = tempfile::tempdir().unwrap();
            let (log, records) = log_with(dir.path(), 3_000, 13);
            let log = Troubled {
                log,
                batches: 2,
                trouble,
            };
            let mut store = MemoryStore::new();
            let opts = ReplayOptions { batch_size: 500 };
            let err = replay(&mut store, &log, &opts, &mut |_| {}).unwrap_err();
            let want = match trouble {
                Trouble::Error => ErrorKind::Transient,
                Trouble::Disorder => ErrorKind::Corrupt,
                Trouble::Panic => ErrorKind::Internal,
            };
            assert_eq!(err.kind(), want, "{err}");
            assert_eq!(store.applied_offset().unwrap(), Some(999));
            assert_eq!(contents(&store), model_of(&records[..1_000]));
        }
    }
}
