//! Reading: [`KafkaReader`], one consumer reading a partition from an offset
//! to a fixed end, and [`PrefetchReader`], which runs one on its own thread.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Headers, Message};
use rdkafka::{Offset, TopicPartitionList};

use super::KafkaChangelog;
use super::client::{Ctx, Where, consumer_config, ctx, kind_of, millis};
use super::lineage::{
    LINEAGE_MARKER_KEY, MARKER_HEADER, MARKER_HEADER_VALUE, WRITER_HEADER_VALUE, WRITER_MARKER_KEY,
};
use crate::changelog::{ChangelogReader, LoggedRecord};
use crate::error::{Error, ErrorKind, Result};

/// A record as read, with whether it is a statesnap marker (lineage or
/// writer claim; the key says which).
pub(super) struct RawRecord {
    pub(super) record: LoggedRecord,
    pub(super) marker: bool,
}

/// Reads one partition from an offset to a fixed end with its own consumer.
pub(super) struct KafkaReader {
    pub(super) consumer: Option<BaseConsumer<Ctx>>,
    at: Where,
    /// The next offset expected: records below it are dropped (tansu returns
    /// duplicates when asked for offsets below its log start).
    next: u64,
    end: u64,
    idle_timeout: Duration,
    pub(super) keep_markers: bool,
    /// Set by the owner of a prefetching reader to make it return early.
    stop: Option<Arc<AtomicBool>>,
}

/// The fetch size of [`KafkaReader::open_small`].
const SMALL_FETCH_BYTES: &str = "65536";

/// Records a prefetch thread hands over at once (at most).
const PREFETCH_RECORDS: usize = 8192;
/// Bytes (keys + values) a prefetch thread hands over at once (at most, bar
/// one record).
const PREFETCH_BYTES: usize = 8 << 20;
/// Chunks queued between the prefetch thread and the reader's caller.
const PREFETCH_DEPTH: usize = 2;

impl KafkaReader {
    pub(super) fn open(log: &KafkaChangelog, from: u64, end: u64) -> Result<Self> {
        Self::open_with(log, from, end, consumer_config(&log.options))
    }

    /// A reader for a record or two: fetches 64 KiB at a time instead of
    /// the bulk reader's 50 MB (a broker still returns a larger first
    /// batch whole, KIP-74). Reading one record at the start of a long
    /// tansu log with the bulk settings took 0.7 s, the broker sending the
    /// whole fetch; with these, 0.23 s (one 10 000-record batch).
    pub(super) fn open_small(log: &KafkaChangelog, from: u64, end: u64) -> Result<Self> {
        let mut config = consumer_config(&log.options);
        // librdkafka wants fetch.max.bytes >= message.max.bytes.
        let sizes = [
            "fetch.max.bytes",
            "max.partition.fetch.bytes",
            "message.max.bytes",
        ];
        if sizes
            .iter()
            .all(|k| !log.options.properties.contains_key(*k))
        {
            for k in sizes {
                config.set(k, SMALL_FETCH_BYTES);
            }
        }
        Self::open_with(log, from, end, config)
    }

    fn open_with(log: &KafkaChangelog, from: u64, end: u64, config: ClientConfig) -> Result<Self> {
        let mut r = KafkaReader {
            consumer: None,
            at: log.at.clone(),
            next: from,
            end,
            idle_timeout: log.options.request_timeout,
            keep_markers: false,
            stop: None,
        };
        if from >= end {
            return Ok(r);
        }
        let consumer: BaseConsumer<Ctx> = config
            .create_with_context(ctx(&log.options))
            .map_err(|e| log.at.err("consumer creation", e))?;
        let start = i64::try_from(from)
            .map_err(|_| Error::config(format!("kafka offset out of range offset={from}")))?;
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(&log.id.topic, log.partition, Offset::Offset(start))
            .map_err(|e| log.at.err("partition assignment", e))?;
        consumer
            .assign(&tpl)
            .map_err(|e| log.at.err("partition assignment", e))?;
        r.consumer = Some(consumer);
        Ok(r)
    }

    fn finish(&mut self) {
        self.next = self.end;
        self.consumer = None;
    }

    pub(super) fn next_raw(&mut self, max_records: usize) -> Result<Option<Vec<RawRecord>>> {
        self.next_raw_bounded(max_records, usize::MAX)
    }

    fn stopped(&self) -> bool {
        self.stop
            .as_ref()
            .is_some_and(|s| s.load(Ordering::Relaxed))
    }

    /// Up to `max_records` records, ending early once their keys and values
    /// reach `max_bytes`.
    fn next_raw_bounded(
        &mut self,
        max_records: usize,
        max_bytes: usize,
    ) -> Result<Option<Vec<RawRecord>>> {
        let max_records = max_records.max(1);
        loop {
            if self.next >= self.end || self.stopped() {
                self.finish();
                return Ok(None);
            }
            let Some(consumer) = self.consumer.as_ref() else {
                return Ok(None);
            };
            let want = usize::try_from(self.end - self.next)
                .unwrap_or(usize::MAX)
                .min(max_records);
            let mut out: Vec<RawRecord> = Vec::with_capacity(want);
            let mut idle_deadline = Instant::now() + self.idle_timeout;
            let mut done = false;
            let mut bytes = 0usize;
            while out.len() < max_records && bytes < max_bytes {
                match consumer.poll(poll_wait(out.is_empty(), idle_deadline)) {
                    Some(Ok(m)) => {
                        idle_deadline = Instant::now() + self.idle_timeout;
                        let Ok(off) = u64::try_from(m.offset()) else {
                            continue;
                        };
                        if off < self.next {
                            continue; // a duplicate from below log start
                        }
                        if off >= self.end {
                            done = true;
                            break;
                        }
                        self.next = off + 1;
                        let Some(r) = raw_record(&m, off, self.keep_markers) else {
                            continue;
                        };
                        bytes += r.record.key.len() + r.record.value.as_ref().map_or(0, Bytes::len);
                        out.push(r);
                        if self.next >= self.end {
                            done = true;
                            break;
                        }
                    }
                    Some(Err(KafkaError::PartitionEOF(_))) => {
                        // Everything below the current high watermark (>= end)
                        // was fetched: compaction removed the rest.
                        done = true;
                        break;
                    }
                    Some(Err(e)) => {
                        if self.fetch_error(e)? {
                            self.finish();
                            return Ok(None);
                        }
                    }
                    None => {
                        if !out.is_empty() {
                            break;
                        }
                        if self.stopped() {
                            self.finish();
                            return Ok(None);
                        }
                        if Instant::now() >= idle_deadline {
                            return Err(self.nothing_received());
                        }
                    }
                }
            }
            if done {
                self.finish();
            }
            if !out.is_empty() {
                return Ok(Some(out));
            }
        }
    }

    /// A fetch error: records deleted before they were read are stale, a
    /// transient error is retried (librdkafka retries by itself; the read
    /// gives up at the idle deadline), others fail. `Ok(true)` if the owner
    /// stopped the reader meanwhile.
    fn fetch_error(&self, e: KafkaError) -> Result<bool> {
        if matches!(
            e.rdkafka_error_code(),
            Some(RDKafkaErrorCode::AutoOffsetReset | RDKafkaErrorCode::OffsetOutOfRange)
        ) {
            return Err(Error::stale(format!(
                "kafka changelog records were deleted before they were read changelog=`{}` \
                 bootstrap_servers=`{}` next_offset={} end_offset={}: the log start moved past \
                 the reader (retention or DeleteRecords); a replay from here cannot be exact — \
                 restore from a newer snapshot, or rebuild if none is usable",
                self.at.id, self.at.bootstrap, self.next, self.end
            ))
            .with_reason(crate::Reason::BelowHorizon)
            .with_source(e));
        }
        if self.stopped() {
            return Ok(true);
        }
        if matches!(kind_of(&e), ErrorKind::Transient) {
            // librdkafka retries by itself; give up at the idle deadline.
            tracing::debug!(changelog = %self.at.id, error = %e, "kafka fetch error, retrying");
            Ok(false)
        } else {
            Err(self.at.err("read", e))
        }
    }

    /// The error for a read that received nothing before its idle deadline.
    fn nothing_received(&self) -> Error {
        Error::transient(format!(
            "kafka read received nothing within the timeout changelog=`{}` \
             bootstrap_servers=`{}` next_offset={} end_offset={} timeout_ms={}; \
             the broker is unreachable or overloaded, or will not send the \
             record at next_offset in one fetch (it may exceed the broker's \
             fetch cap: tansu 0.6.0 never sends a record of 5 MiB or more) — \
             retry later, or raise fetch.max.bytes / max.partition.fetch.bytes",
            self.at.id,
            self.at.bootstrap,
            self.next,
            self.end,
            millis(self.idle_timeout)
        ))
    }
}

/// How long one poll waits: up to 100 ms (within the idle deadline) for
/// the first record of a chunk, 5 ms for more once there is one.
fn poll_wait(first: bool, idle_deadline: Instant) -> Duration {
    if first {
        idle_deadline
            .saturating_duration_since(Instant::now())
            .min(Duration::from_millis(100))
    } else {
        Duration::from_millis(5)
    }
}

/// The record message `m` at offset `off` holds, marked if it is a
/// statesnap marker (its key and header say so); `None` for a marker the
/// reader does not keep.
fn raw_record(m: &impl Message, off: u64, keep_markers: bool) -> Option<RawRecord> {
    let key = m.key().unwrap_or_default();
    let kind = if key == LINEAGE_MARKER_KEY {
        Some(MARKER_HEADER_VALUE)
    } else if key == WRITER_MARKER_KEY {
        Some(WRITER_HEADER_VALUE)
    } else {
        None
    };
    let marker = kind.is_some_and(|kind| {
        m.headers().is_some_and(|h| {
            h.iter()
                .any(|h| h.key == MARKER_HEADER && h.value == Some(kind))
        })
    });
    if marker && !keep_markers {
        return None;
    }
    Some(RawRecord {
        record: LoggedRecord {
            offset: off,
            timestamp_ms: m.timestamp().to_millis().unwrap_or(0),
            key: Bytes::copy_from_slice(key),
            value: m.payload().map(Bytes::copy_from_slice),
        },
        marker,
    })
}

/// A [`KafkaReader`] on its own thread, fetching the next chunk while the
/// caller applies the previous one, so replay overlaps the client's fetch
/// and decode work with the store's writes (two cores instead of one).
///
/// At most [`PREFETCH_DEPTH`] chunks of [`PREFETCH_RECORDS`] records /
/// [`PREFETCH_BYTES`] bytes wait in the queue. Dropping the reader stops the
/// thread (within one poll, ≤ 100 ms) and waits for it, so its consumer is
/// closed when `drop` returns.
pub(super) struct PrefetchReader {
    rx: Option<std::sync::mpsc::Receiver<Result<Vec<LoggedRecord>>>>,
    thread: Option<std::thread::JoinHandle<()>>,
    stop: Arc<AtomicBool>,
    /// The chunk being handed out, and how far.
    chunk: std::vec::IntoIter<LoggedRecord>,
    end: u64,
    changelog: String,
}

impl PrefetchReader {
    pub(super) fn start(mut reader: KafkaReader) -> Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        reader.stop = Some(stop.clone());
        let end = reader.end;
        let changelog = reader.at.id.to_string();
        let (tx, rx) = std::sync::mpsc::sync_channel(PREFETCH_DEPTH);
        let thread = std::thread::Builder::new()
            .name("statesnap-kafka-read".into())
            .spawn(move || {
                loop {
                    let item = reader
                        .next_raw_bounded(PREFETCH_RECORDS, PREFETCH_BYTES)
                        .map(|b| b.map(|b| b.into_iter().map(|r| r.record).collect::<Vec<_>>()));
                    let last = !matches!(item, Ok(Some(_)));
                    // A closed channel means the caller dropped the reader.
                    let sent = match item {
                        Ok(Some(b)) => tx.send(Ok(b)),
                        Ok(None) => break,
                        Err(e) => tx.send(Err(e)),
                    };
                    if sent.is_err() || last {
                        break;
                    }
                }
                // `reader` (and its consumer) is dropped here, on this thread.
            })
            .map_err(|e| Error::io("cannot start the kafka read thread", e))?;
        Ok(PrefetchReader {
            rx: Some(rx),
            thread: Some(thread),
            stop,
            chunk: Vec::new().into_iter(),
            end,
            changelog,
        })
    }
}

/// The thread ends after an error, and later calls must not look like the
/// end: `read_from` hands this reader out wrapped in a
/// [`FusedReader`](crate::changelog::FusedReader).
impl ChangelogReader for PrefetchReader {
    fn next_batch(&mut self, max_records: usize) -> Result<Option<Vec<LoggedRecord>>> {
        let max_records = max_records.max(1);
        if self.chunk.len() == 0 {
            let Some(rx) = self.rx.as_ref() else {
                return Ok(None);
            };
            match rx.recv() {
                Ok(Ok(chunk)) => self.chunk = chunk.into_iter(),
                Ok(Err(e)) => {
                    self.rx = None;
                    return Err(e);
                }
                Err(_) => {
                    // The thread ended: at the end offset, or by a panic.
                    self.rx = None;
                    let panicked = self.thread.take().is_some_and(|t| t.join().is_err());
                    if panicked {
                        return Err(Error::internal(format!(
                            "the kafka read thread panicked changelog=`{}`; retry the read",
                            self.changelog
                        )));
                    }
                    return Ok(None);
                }
            }
        }
        if self.chunk.len() <= max_records {
            return Ok(Some(std::mem::take(&mut self.chunk).collect()));
        }
        Ok(Some(self.chunk.by_ref().take(max_records).collect()))
    }

    fn end_offset(&self) -> u64 {
        self.end
    }
}

impl Drop for PrefetchReader {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.rx = None; // unblocks a thread waiting to send
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl ChangelogReader for KafkaReader {
    fn next_batch(&mut self, max_records: usize) -> Result<Option<Vec<LoggedRecord>>> {
        Ok(self
            .next_raw(max_records)?
            .map(|b| b.into_iter().map(|r| r.record).collect()))
    }

    fn end_offset(&self) -> u64 {
        self.end
    }
}
