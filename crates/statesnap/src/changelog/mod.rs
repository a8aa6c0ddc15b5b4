//! The changelog: the offset-addressed, compacted log of every write that a
//! state store caches (invariant 1: the changelog is the source of
//! truth).
//!
//! [`Changelog`] is the small trait a backend implements; the embedded
//! default is [`FileChangelog`](crate::changelog::file::FileChangelog).
//! Offsets start at 0 and grow by one per record. `end_offset` is the offset
//! the *next* appended record will get (Kafka's high watermark), so a log
//! holding records `0..=9` has `end_offset() == 10`.

pub mod file;
mod url;
pub use url::ChangelogUrl;
#[cfg(feature = "kafka")]
pub mod kafka;

use bytes::Bytes;
use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use std::fmt;

use crate::error::{Error, Result};

/// One write: a key and its new value, or a tombstone (`value == None`).
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Record {
    /// The key.
    pub key: Bytes,
    /// The new value, or `None` for a delete.
    pub value: Option<Bytes>,
}

impl Record {
    /// A put.
    pub fn put(key: impl Into<Bytes>, value: impl Into<Bytes>) -> Self {
        Record {
            key: key.into(),
            value: Some(value.into()),
        }
    }
    /// A delete (tombstone).
    pub fn delete(key: impl Into<Bytes>) -> Self {
        Record {
            key: key.into(),
            value: None,
        }
    }
    /// Whether this record is a tombstone.
    pub fn is_tombstone(&self) -> bool {
        self.value.is_none()
    }
}

impl fmt::Debug for Record {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Record")
            .field("key", &crate::util::DebugBytes(&self.key))
            .field("value", &self.value.as_deref().map(crate::util::DebugBytes))
            .finish()
    }
}

/// A record as stored in a changelog, with its offset and timestamp.
#[derive(Clone, PartialEq, Eq)]
pub struct LoggedRecord {
    /// Position in the log.
    pub offset: u64,
    /// Milliseconds since the Unix epoch at which the record was appended.
    pub timestamp_ms: i64,
    /// The key.
    pub key: Bytes,
    /// The value, or `None` for a tombstone.
    pub value: Option<Bytes>,
}

impl LoggedRecord {
    /// The record without its position.
    pub fn into_record(self) -> Record {
        Record {
            key: self.key,
            value: self.value,
        }
    }
}

impl fmt::Debug for LoggedRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LoggedRecord")
            .field("offset", &self.offset)
            .field("timestamp_ms", &self.timestamp_ms)
            .field("key", &crate::util::DebugBytes(&self.key))
            .field("value", &self.value.as_deref().map(crate::util::DebugBytes))
            .finish()
    }
}

/// Which log a store follows: a topic and a partition, as in Kafka.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ChangelogId {
    /// Topic name, `<application>-<store>-changelog` by convention.
    pub topic: String,
    /// Partition number.
    pub partition: u32,
}

/// Longest topic name Kafka accepts.
const MAX_TOPIC_LEN: usize = 249;

impl ChangelogId {
    /// A changelog id, validating the topic name with Kafka's rules
    /// (1..=249 characters of `[A-Za-z0-9._-]`, not `.` or `..`).
    pub fn new(topic: impl Into<String>, partition: u32) -> Result<Self> {
        let topic = topic.into();
        validate_topic(&topic)?;
        Ok(ChangelogId { topic, partition })
    }
}

impl fmt::Display for ChangelogId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.topic, self.partition)
    }
}

fn validate_topic(topic: &str) -> Result<()> {
    if topic.is_empty() || topic.len() > MAX_TOPIC_LEN {
        return Err(Error::config(format!(
            "invalid changelog topic: length must be 1..={MAX_TOPIC_LEN} topic=`{}` length={}",
            topic.escape_debug(),
            topic.len()
        )));
    }
    if topic == "." || topic == ".." {
        return Err(Error::config(format!(
            "invalid changelog topic: `{topic}` is reserved"
        )));
    }
    if let Some(c) = topic
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(Error::config(format!(
            "invalid changelog topic: only [A-Za-z0-9._-] allowed topic=`{}` char=`{}`",
            topic.escape_debug(),
            c.escape_debug()
        )));
    }
    Ok(())
}

/// Identifies one incarnation of a changelog. It changes when the log is
/// deleted and recreated (a UUID for the file log, the topic id for Kafka), so
/// a store or snapshot that followed an older incarnation is never replayed
/// onto a new one.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Lineage(pub String);

impl fmt::Display for Lineage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Which changelog incarnation a store follows: the changelog's id and its
/// lineage (invariant 10). A store records it durably before it
/// applies its first record and never changes it, so its `applied_offset`
/// always means an offset *of that incarnation*: a store left on disk is never
/// caught up onto another changelog, or onto the same one recreated.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ChangelogBinding {
    /// The changelog's topic and partition.
    pub changelog: ChangelogId,
    /// The changelog's incarnation.
    pub lineage: Lineage,
}

impl ChangelogBinding {
    /// The binding of `changelog` as it is now (reads its lineage).
    pub fn of<C: Changelog + ?Sized>(changelog: &C) -> Result<Self> {
        Ok(ChangelogBinding {
            changelog: changelog.id().clone(),
            lineage: changelog.lineage()?,
        })
    }
}

impl fmt::Display for ChangelogBinding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} lineage {}", self.changelog, self.lineage)
    }
}

/// How far back a changelog still holds everything replay needs
/// (invariant 7).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Horizon {
    /// Tombstones at offsets below this may have been purged by compaction.
    /// Replaying from an offset below it could miss a delete.
    pub tombstones_before: u64,
    /// Records at offsets below this were deleted outright (retention,
    /// DeleteRecords), not merely compacted away: even a full replay from 0
    /// cannot rebuild the state. 0 for a log that only ever compacts.
    pub deleted_before: u64,
    /// Records at offsets below this may have been removed by compaction
    /// because a newer record of the same key, also below this offset,
    /// replaced them. Replaying up to the log's end is exact whatever this
    /// says (the newer record is replayed instead); replaying only up to an
    /// earlier offset `o` (a point-in-time read) may miss the value a key
    /// had at `o` when `o + 1 < superseded_before`. 0 for a log that never
    /// compacted. See [`Horizon::exact_as_of`].
    #[serde(default)]
    pub superseded_before: u64,
}

impl Horizon {
    /// Whether a store or snapshot that has applied everything up to and
    /// including `applied_offset` (`None`: nothing) can be brought up to date
    /// exactly by replaying from `applied_offset + 1`.
    pub fn can_resume_after(&self, applied_offset: Option<u64>) -> bool {
        let next = applied_offset.map_or(0, |o| o.saturating_add(1));
        if next == 0 {
            // Full replay: compaction is harmless (every key's newest record
            // survives, and a purged tombstone purged its key too); a deleted
            // prefix is not.
            return self.deleted_before == 0;
        }
        next >= self.tombstones_before && next >= self.deleted_before
    }

    /// Whether a store that has applied everything up to and including
    /// `applied_offset` (`None`: nothing) reaches exactly the state the log
    /// had at offset `until` by replaying the records in
    /// `(applied_offset, until]` (`until >= applied_offset`).
    ///
    /// Besides [`Horizon::can_resume_after`], this needs every record of
    /// that range whose key was written again *after* `until` to be still
    /// in the log: compaction may have dropped it in favour of the newer
    /// record, which a replay that stops at `until` never reads. So it
    /// holds when nothing is replayed (`applied_offset == Some(until)`), or
    /// when compaction never looked past `until` (`until + 1 >=
    /// superseded_before`: every record it dropped was replaced at or
    /// before `until`).
    pub fn exact_as_of(&self, applied_offset: Option<u64>, until: u64) -> bool {
        if !self.can_resume_after(applied_offset) {
            return false;
        }
        applied_offset == Some(until) || until.saturating_add(1) >= self.superseded_before
    }
}

/// Reads a changelog forward from an offset, in batches, up to the end offset
/// seen when the reader was opened.
pub trait ChangelogReader: Send {
    /// The next batch of at most `max_records` records in offset order, or
    /// `None` once the reader has reached [`ChangelogReader::end_offset`].
    /// Offsets may have gaps where compaction removed records.
    ///
    /// An error ends the reader: every later call must fail too, never
    /// return the records after ones the caller did not receive, nor `None`
    /// as if the end had been reached. To retry, open a new reader after the
    /// last record applied. The built-in readers do this with
    /// [`FusedReader`].
    fn next_batch(&mut self, max_records: usize) -> Result<Option<Vec<LoggedRecord>>>;

    /// The end offset (exclusive) this reader stops at.
    fn end_offset(&self) -> u64;
}

/// Wraps a [`ChangelogReader`] so that it fails for good after its first
/// error.
///
/// A reader that failed half way through a batch may already have moved past
/// records it never handed out (the file log's position, a prefetch
/// thread that has ended); retrying `next_batch` on it could skip them
/// silently, or see `None` as if the end had been reached. Every later call
/// on a `FusedReader` fails instead, with the first error's kind and
/// message. The built-in changelogs return their readers wrapped in it; a
/// custom [`Changelog`] can do the same.
#[derive(Debug)]
pub struct FusedReader<R> {
    inner: R,
    failed: Option<(crate::error::ErrorKind, String)>,
}

impl<R: ChangelogReader> FusedReader<R> {
    /// Wraps `inner`.
    pub fn new(inner: R) -> Self {
        FusedReader {
            inner,
            failed: None,
        }
    }
}

impl<R: ChangelogReader> ChangelogReader for FusedReader<R> {
    fn next_batch(&mut self, max_records: usize) -> Result<Option<Vec<LoggedRecord>>> {
        if let Some((kind, message)) = &self.failed {
            return Err(Error::new(
                *kind,
                format!(
                    "this changelog reader failed earlier and cannot go on; open a new reader after the last record applied. first error: {message}"
                ),
            ).with_reason(crate::Reason::FailedEarlier));
        }
        let result = self.inner.next_batch(max_records);
        if let Err(e) = &result {
            self.failed = Some((e.kind(), e.message().to_string()));
        }
        result
    }

    fn end_offset(&self) -> u64 {
        self.inner.end_offset()
    }
}

/// A writer's claim on one changelog handle: what
/// [`Changelog::begin_writer`] hands out and [`Changelog::append_as`]
/// checks. A newer claim on the same handle fences every older one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriterClaim(u64);

impl WriterClaim {
    /// Its number: claims on one handle count up from 1.
    pub fn number(&self) -> u64 {
        self.0
    }
}

/// The claims of one changelog handle, for backends that implement
/// [`Changelog::begin_writer`]: the newest claim is the only one whose
/// appends are accepted.
#[derive(Debug, Default)]
pub(crate) struct WriterClaims {
    newest: std::sync::atomic::AtomicU64,
}

impl WriterClaims {
    /// A new claim, fencing every older one.
    pub(crate) fn begin(&self) -> WriterClaim {
        WriterClaim(
            self.newest
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst)
                .saturating_add(1),
        )
    }

    /// Refuses (`stale`, [`crate::Reason::Fenced`]) a claim that is not the
    /// newest.
    pub(crate) fn check(&self, claim: WriterClaim, id: &ChangelogId) -> Result<()> {
        let newest = self.newest.load(std::sync::atomic::Ordering::SeqCst);
        if claim.0 == newest {
            return Ok(());
        }
        Err(crate::Error::stale(format!(
            "this writer was fenced: a newer writer claimed the changelog changelog=`{id}` \
             claim={} newest_claim={newest}; the store has a new owner (a promoted standby or a \
             newer open): close this handle, its later writes are refused",
            claim.0
        ))
        .with_reason(crate::Reason::Fenced))
    }
}

/// An offset-addressed log of writes. Implementations must be safe to read
/// from one thread while another appends.
///
/// A conformance suite every implementation should pass lives in
/// `statesnap::conformance::changelog` (feature `conformance`).
pub trait Changelog: Send + Sync {
    /// Which topic and partition this is.
    fn id(&self) -> &ChangelogId;

    /// Appends `batch` in order and returns the offset of each record. The
    /// call returns only once the records are as durable as the backend's
    /// policy promises; on error nothing in the batch may be assumed written
    /// (but some may have been — replay decides).
    fn append(&self, batch: &[Record]) -> Result<Vec<u64>>;

    /// Opens a reader that returns records with offsets in
    /// `[max(from, start_offset), end)`, where `end` is the end offset at the
    /// time of this call.
    fn read_from(&self, from: u64) -> Result<Box<dyn ChangelogReader + '_>>;

    /// The lowest offset the log may still hold.
    fn start_offset(&self) -> Result<u64>;

    /// The offset the next appended record will get.
    fn end_offset(&self) -> Result<u64>;

    /// The incarnation of this log.
    fn lineage(&self) -> Result<Lineage>;

    /// Up to where compaction or retention may have removed what replay needs.
    fn horizon(&self) -> Result<Horizon>;

    /// Makes every appended record durable now, whatever the sync policy.
    fn flush(&self) -> Result<()>;

    /// [`Changelog::flush`] for an async caller (a snapshot being
    /// committed): the same guarantee, with the wait (an fsync, the
    /// acknowledgements) on a blocking thread, so it stalls no executor
    /// thread. The default calls `flush` on the polling thread: a log whose
    /// `flush` blocks overrides it (the file log and Kafka do).
    fn flush_async(&self) -> BoxFuture<'_, Result<()>> {
        Box::pin(std::future::ready(self.flush()))
    }

    /// The writer epoch that appended the record at `offset`, if this log
    /// keeps an epoch history and it covers `offset` (`None` otherwise: the
    /// check is skipped).
    ///
    /// A log that may lose acknowledged records (a file log after a power
    /// loss under a lazy sync policy, or a disk that loses synced data)
    /// starts a new epoch whenever a writer session first appends, so
    /// offsets handed out again after a loss carry a new epoch. Snapshots
    /// record the epoch of their offset, and one whose epoch differs from
    /// the log's at that offset covers a history the log no longer has
    /// (invariant 11). The default keeps no history.
    fn epoch_at(&self, offset: u64) -> Result<Option<u64>> {
        let _ = offset;
        Ok(None)
    }

    /// Claims this handle for a new writer (a store handle that becomes
    /// the owner: an open, a promoted standby): from now on appends made
    /// under any older claim ([`Changelog::append_as`]) are refused
    /// (`stale`, reason `fenced`), so two owners in one process that share
    /// the handle can never both write. `None`: the backend does not fence
    /// through claims ([`Changelog::append_as`] then appends as usual).
    /// Across processes, the file log's directory lock and the Kafka
    /// changelog's writer claim record keep one writer.
    fn begin_writer(&self) -> Result<Option<WriterClaim>> {
        Ok(None)
    }

    /// [`Changelog::append`] under `claim`: refused (`stale`, reason
    /// `fenced`), with nothing written, when a newer claim was begun on this
    /// handle. The default appends (for a backend that hands out no claims).
    fn append_as(&self, claim: WriterClaim, batch: &[Record]) -> Result<Vec<u64>> {
        let _ = claim;
        self.append(batch)
    }
}

/// Forwards every [`Changelog`] method through a smart pointer (no method may
/// fall back to a default, so a wrapper can never silently diverge).
macro_rules! forward_changelog {
    ($($ptr:tt)+) => {
        impl<C: Changelog + ?Sized> Changelog for $($ptr)+ {
            fn id(&self) -> &ChangelogId {
                (**self).id()
            }
            fn append(&self, batch: &[Record]) -> Result<Vec<u64>> {
                (**self).append(batch)
            }
            fn read_from(&self, from: u64) -> Result<Box<dyn ChangelogReader + '_>> {
                (**self).read_from(from)
            }
            fn start_offset(&self) -> Result<u64> {
                (**self).start_offset()
            }
            fn end_offset(&self) -> Result<u64> {
                (**self).end_offset()
            }
            fn lineage(&self) -> Result<Lineage> {
                (**self).lineage()
            }
            fn horizon(&self) -> Result<Horizon> {
                (**self).horizon()
            }
            fn flush(&self) -> Result<()> {
                (**self).flush()
            }
            fn flush_async(&self) -> BoxFuture<'_, Result<()>> {
                (**self).flush_async()
            }
            fn epoch_at(&self, offset: u64) -> Result<Option<u64>> {
                (**self).epoch_at(offset)
            }
            fn begin_writer(&self) -> Result<Option<WriterClaim>> {
                (**self).begin_writer()
            }
            fn append_as(&self, claim: WriterClaim, batch: &[Record]) -> Result<Vec<u64>> {
                (**self).append_as(claim, batch)
            }
        }
    };
}

forward_changelog!(Box<C>);
forward_changelog!(std::sync::Arc<C>);
forward_changelog!(&C);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::repo::StoreKey;

    #[test]
    fn topic_names_follow_kafka_rules() {
        let id = StoreKey::new("app", "counts", 3)
            .expect("valid")
            .changelog_id();
        assert_eq!(id.topic, "app-counts-changelog");
        assert_eq!(id.to_string(), "app-counts-changelog/3");
        for bad in ["", ".", "..", "a/b", "a b", "é", &"x".repeat(250)] {
            let err = ChangelogId::new(bad, 0).expect_err(bad);
            assert_eq!(err.kind(), crate::ErrorKind::Config, "{bad}");
        }
    }

    #[test]
    fn horizon_refuses_resume_below_tombstone_or_deleted_prefix() {
        let h = Horizon {
            tombstones_before: 100,
            ..Horizon::default()
        };
        assert!(
            h.can_resume_after(None),
            "full replay is exact under compaction"
        );
        assert!(!h.can_resume_after(Some(50)));
        assert!(h.can_resume_after(Some(99)));
        assert!(h.can_resume_after(Some(500)));
        let d = Horizon {
            deleted_before: 10,
            ..Horizon::default()
        };
        assert!(!d.can_resume_after(None));
        assert!(!d.can_resume_after(Some(5)));
        assert!(d.can_resume_after(Some(9)));
    }

    #[test]
    fn a_point_in_time_below_what_compaction_examined_is_exact_only_without_replay() {
        let h = Horizon {
            tombstones_before: 10,
            deleted_before: 0,
            superseded_before: 100,
        };
        // Nothing to replay: the source already is the state at `until`.
        assert!(h.exact_as_of(Some(50), 50));
        // A replay that stops below what compaction examined may miss a
        // record replaced after `until`.
        assert!(!h.exact_as_of(Some(50), 60));
        assert!(!h.exact_as_of(None, 60));
        // Every record compaction dropped was replaced at or before 99.
        assert!(h.exact_as_of(Some(50), 99));
        assert!(h.exact_as_of(Some(50), 500));
        assert!(h.exact_as_of(None, 99));
        // The tombstone horizon still applies to the start.
        assert!(!h.exact_as_of(Some(5), 99));
        // A log that never compacted: every point in time is exact.
        let never = Horizon::default();
        assert!(never.exact_as_of(None, 3));
        assert!(never.exact_as_of(Some(1), 3));
    }

    /// Hands out scripted results, then `None` forever.
    struct Scripted(std::collections::VecDeque<Result<Option<Vec<LoggedRecord>>>>);

    impl ChangelogReader for Scripted {
        fn next_batch(&mut self, _max: usize) -> Result<Option<Vec<LoggedRecord>>> {
            self.0.pop_front().unwrap_or(Ok(None))
        }
        fn end_offset(&self) -> u64 {
            10
        }
    }

    #[test]
    fn a_fused_reader_fails_for_good_after_its_first_error() {
        use crate::error::ErrorKind;
        let rec = LoggedRecord {
            offset: 3,
            timestamp_ms: 0,
            key: Bytes::from_static(b"k"),
            value: None,
        };
        let mut r = FusedReader::new(Scripted(
            vec![
                Ok(Some(vec![rec.clone()])),
                Err(Error::new(ErrorKind::Transient, "broker gone at=`b:9092`")),
                Err(Error::new(ErrorKind::Corrupt, "other")),
                Ok(Some(vec![rec.clone()])),
            ]
            .into(),
        ));
        assert_eq!(r.end_offset(), 10);
        assert_eq!(r.next_batch(5).unwrap(), Some(vec![rec]));
        let first = r.next_batch(5).unwrap_err();
        assert_eq!(first.kind(), ErrorKind::Transient);
        assert_eq!(first.reason(), None);
        // The inner reader would now give another error, then records, then
        // `None`: the fused one repeats the first error instead.
        for _ in 0..4 {
            let again = r.next_batch(5).unwrap_err();
            assert_eq!(again.kind(), ErrorKind::Transient);
            assert_eq!(again.reason(), Some(crate::Reason::FailedEarlier));
        }
    }
}
