//! Appending: the idempotent producer, the delivery reports an append waits
//! for, and the writer claim that fences zombie writers.

use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, Message, OwnedHeaders};
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};

use super::client::{Ctx, Where, base_config, ctx, lock, millis};
use super::lineage::{MARKER_HEADER, WRITER_HEADER_VALUE, WRITER_MARKER_KEY};
use super::reader::KafkaReader;
use super::{KafkaChangelog, KafkaOptions};
use crate::error::{Error, Result};

/// A record to produce: key, value, and the marker header value if it is a
/// statesnap marker.
pub(super) type RawOut = (Bytes, Option<Bytes>, Option<&'static [u8]>);

/// One record's delivery report slot.
pub(super) struct Slot {
    batch: Arc<Batch>,
    index: usize,
}

/// The batch being appended: its delivery reports, and a condition variable
/// the appending thread waits on while the producer's polling thread fills
/// them in.
struct Batch {
    pending: Mutex<Pending>,
    reported: Condvar,
}

/// Delivery reports of the batch being appended.
struct Pending {
    offsets: Vec<Option<std::result::Result<i64, KafkaError>>>,
    remaining: usize,
}

impl ProducerContext for Ctx {
    type DeliveryOpaque = Box<Slot>;

    fn delivery(&self, result: &DeliveryResult<'_>, slot: Box<Slot>) {
        let outcome = match result {
            Ok(m) => Ok(m.offset()),
            Err((e, _)) => Err(e.clone()),
        };
        let mut guard = lock(&slot.batch.pending);
        let p = &mut *guard;
        if let Some(s) = p.offsets.get_mut(slot.index) {
            if s.is_none() {
                p.remaining = p.remaining.saturating_sub(1);
            }
            *s = Some(outcome);
        }
        drop(guard);
        // Reports arrive in bursts (one per produce response); waking the
        // appender for each is cheap next to a broker round trip.
        slot.batch.reported.notify_all();
    }
}

/// A handle's standing as the partition's writer.
#[derive(Debug)]
pub(super) struct WriterClaim {
    /// `writer:<uuid>`, made at open.
    pub(super) id: String,
    /// Offset of this handle's claim record, once written.
    pub(super) claimed_at: Option<u64>,
    /// Offsets below this were checked for newer claims (or are ours).
    pub(super) checked_to: u64,
    /// Set once a newer claim by another writer was seen: for good.
    pub(super) fenced: Option<String>,
}

pub(super) fn create_producer(options: &KafkaOptions, at: &Where) -> Result<ThreadedProducer<Ctx>> {
    let mut c = base_config(options);
    let defaults = [
        ("linger.ms", "5"),
        ("batch.num.messages", "10000"),
        ("batch.size", "1048576"),
        ("queue.buffering.max.messages", "200000"),
        ("compression.type", "none"),
        // Values of a few MiB are legal (the store suites use 3 MiB); the
        // topic is created with a matching max.message.bytes.
        ("message.max.bytes", "16777216"),
    ];
    for (k, v) in defaults {
        if !options.properties.contains_key(k) {
            c.set(k, v);
        }
    }
    // Durability: never lose or duplicate an acknowledged record, never reorder.
    c.set("enable.idempotence", "true")
        .set("acks", "all")
        .set("message.timeout.ms", millis(options.delivery_timeout))
        .set("partitioner", "consistent");
    c.create_with_context(ctx(options))
        .map_err(|e| at.err("producer creation", e))
}

/// Hands one record to librdkafka, waiting while its local queue is full
/// (until `deadline`).
fn enqueue(
    producer: &ThreadedProducer<Ctx>,
    mut rec: BaseRecord<'_, [u8], [u8], Box<Slot>>,
    batch: &Batch,
    deadline: Instant,
) -> std::result::Result<(), KafkaError> {
    loop {
        match producer.send(rec) {
            Ok(()) => return Ok(()),
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                // The local queue is full: wait for the polling
                // thread to serve some delivery reports.
                rec = back;
                if Instant::now() >= deadline {
                    return Err(KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull));
                }
                let guard = lock(&batch.pending);
                let _ = batch
                    .reported
                    .wait_timeout(guard, Duration::from_millis(5))
                    .unwrap_or_else(|e| e.into_inner());
            }
            Err((e, _)) => return Err(e),
        }
    }
}

impl KafkaChangelog {
    fn send_batch(&self, producer: &ThreadedProducer<Ctx>, records: &[RawOut]) -> Result<Vec<u64>> {
        let n = records.len();
        let batch = Arc::new(Batch {
            pending: Mutex::new(Pending {
                offsets: vec![None; n],
                remaining: n,
            }),
            reported: Condvar::new(),
        });
        let now = self.options.clock.now_ms();
        let deadline =
            Instant::now() + self.options.delivery_timeout + self.options.request_timeout;
        let mut send_error: Option<KafkaError> = None;
        let mut sent = 0usize;
        for (i, raw) in records.iter().enumerate() {
            let rec = self.base_record(&batch, i, raw, now);
            if let Err(e) = enqueue(producer, rec, &batch, deadline) {
                send_error = Some(e);
                break;
            }
            sent += 1;
        }
        // Send what is queued now instead of after linger.ms (a zero-timeout
        // flush only raises librdkafka's "flushing" flag and returns; the
        // polling thread serves the reports).
        let _ = producer.flush(Duration::ZERO);
        self.await_reports(&batch, n, n - sent, deadline)?;
        if let Some(e) = send_error {
            return Err(self
                .at
                .err(&format!("append (enqueue of record {sent} of {n})"), e));
        }
        self.delivered_offsets(&batch, n)
    }

    /// Record `i` of the batch as librdkafka takes it: this handle's
    /// partition, the append's timestamp, the marker header if it is one,
    /// and its delivery report slot.
    fn base_record<'a>(
        &'a self,
        batch: &Arc<Batch>,
        i: usize,
        (key, value, marker): &'a RawOut,
        now: i64,
    ) -> BaseRecord<'a, [u8], [u8], Box<Slot>> {
        let mut rec: BaseRecord<'_, [u8], [u8], Box<Slot>> = BaseRecord::with_opaque_to(
            &self.id.topic,
            Box::new(Slot {
                batch: batch.clone(),
                index: i,
            }),
        )
        .partition(self.partition)
        .key(key.as_ref())
        .timestamp(now);
        if let Some(v) = value {
            rec = rec.payload(v.as_ref());
        }
        if let Some(kind) = marker {
            rec = rec.headers(OwnedHeaders::new().insert(Header {
                key: MARKER_HEADER,
                value: Some(*kind),
            }));
        }
        rec
    }

    /// Waits for the report of every record that was handed to librdkafka
    /// (all but `unsent` of the batch's `n`), even after a send error, so
    /// no report of this batch is left behind.
    fn await_reports(
        &self,
        batch: &Batch,
        n: usize,
        unsent: usize,
        deadline: Instant,
    ) -> Result<()> {
        let mut guard = lock(&batch.pending);
        while guard.remaining > unsent {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::transient(format!(
                    "kafka append timed out waiting for delivery reports changelog=`{}` \
                     bootstrap_servers=`{}` records={n} unacknowledged={} timeout_ms={}; \
                     nothing may be assumed written",
                    self.id,
                    self.at.bootstrap,
                    guard.remaining - unsent,
                    millis(self.options.delivery_timeout + self.options.request_timeout)
                )));
            }
            guard = batch
                .reported
                .wait_timeout(guard, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        Ok(())
    }

    /// The offsets the delivery reports of all `n` records gave, checked to
    /// be present and ascending.
    fn delivered_offsets(&self, batch: &Batch, n: usize) -> Result<Vec<u64>> {
        let mut p = lock(&batch.pending);
        let mut out = Vec::with_capacity(n);
        for (i, slot) in p.offsets.iter_mut().enumerate() {
            match slot.take() {
                Some(Ok(o)) => {
                    let o = u64::try_from(o).map_err(|_| {
                        Error::internal(format!(
                            "kafka delivery report without an offset changelog=`{}` record={i}",
                            self.id
                        ))
                    })?;
                    out.push(o);
                }
                Some(Err(e)) => {
                    return Err(self
                        .at
                        .err(&format!("append (delivery of record {i} of {n})"), e));
                }
                None => {
                    return Err(Error::internal(format!(
                        "kafka delivery report missing changelog=`{}` record={i}",
                        self.id
                    )));
                }
            }
        }
        if out.windows(2).any(|w| w[1] <= w[0]) {
            return Err(Error::internal(format!(
                "kafka returned offsets out of order for one batch changelog=`{}` first={:?} last={:?}",
                self.id,
                out.first(),
                out.last()
            )));
        }
        Ok(out)
    }

    /// Claims the partition for this handle now: writes a writer claim
    /// record, so any other handle that appended before (a zombie instance
    /// after a rebalance, a process still closing) is fenced at its next
    /// append. `append` claims on its own; call this when taking over a
    /// partition to stop the previous owner before the first commit.
    /// Does nothing if this handle already claimed, or fencing is off.
    pub fn claim_writer(&self) -> Result<()> {
        if !self.options.fence_writers {
            return Ok(());
        }
        self.claimed().map(drop)
    }

    /// This handle's claim, locked for the caller: refused if fenced,
    /// written first if this handle has not claimed yet.
    fn claimed(&self) -> Result<std::sync::MutexGuard<'_, WriterClaim>> {
        let mut w = lock(&self.writer);
        self.check_not_fenced(&w)?;
        if w.claimed_at.is_none() {
            self.claim_locked(&mut w)?;
        }
        Ok(w)
    }

    fn check_not_fenced(&self, w: &WriterClaim) -> Result<()> {
        match &w.fenced {
            Some(why) => Err(Error::stale(format!(
                "this kafka changelog handle was fenced: another writer claimed the partition \
                 changelog=`{}` bootstrap_servers=`{}` {why}; one writer per partition — this \
                 instance no longer owns it (close it; reopen only if it is assigned again)",
                self.id, self.at.bootstrap
            ))
            .with_reason(crate::Reason::Fenced)),
            None => Ok(()),
        }
    }

    fn claim_locked(&self, w: &mut WriterClaim) -> Result<()> {
        let claim = (
            Bytes::from_static(WRITER_MARKER_KEY),
            Some(Bytes::from(w.id.clone())),
            Some(WRITER_HEADER_VALUE),
        );
        let offsets = self.append_raw(&[claim])?;
        let at = offsets.first().copied().ok_or_else(|| {
            Error::internal(format!(
                "kafka writer claim got no offset changelog=`{}`",
                self.id
            ))
        })?;
        tracing::info!(changelog = %self.id, writer = %w.id, offset = at, "claimed kafka changelog partition for this writer");
        // Claims below ours are older: this one supersedes them.
        w.claimed_at = Some(at);
        w.checked_to = at + 1;
        Ok(())
    }

    /// Reads `[max(w.checked_to, lo), to)` for a claim by another writer; fences this
    /// handle (for good) if there is one.
    fn check_claims(&self, w: &mut WriterClaim, lo: u64, to: u64) -> Result<()> {
        if to <= w.checked_to {
            return Ok(());
        }
        // Below `lo` the log was deleted: no claim left to find there.
        let mut reader = KafkaReader::open(self, w.checked_to.max(lo), to)?;
        reader.keep_markers = true;
        while let Some(batch) = reader.next_raw(1024)? {
            for r in batch {
                if r.marker && r.record.key.as_ref() == WRITER_MARKER_KEY {
                    let by = String::from_utf8_lossy(r.record.value.as_deref().unwrap_or_default())
                        .into_owned();
                    if by != w.id {
                        let why = format!(
                            "claimed_by=`{}` claim_offset={} our_claim_offset={:?}",
                            by.escape_debug(),
                            r.record.offset,
                            w.claimed_at
                        );
                        tracing::warn!(changelog = %self.id, writer = %w.id, %why, "kafka changelog writer fenced");
                        w.fenced = Some(why);
                        return self.check_not_fenced(w);
                    }
                }
            }
        }
        w.checked_to = to;
        Ok(())
    }

    /// One append under the writer claim: claim first, refuse if a newer
    /// claim is already in the log, and check what others wrote before our
    /// batch landed.
    pub(super) fn append_fenced(&self, records: &[RawOut]) -> Result<Vec<u64>> {
        let mut w = self.claimed()?;
        // Before writing: anything past what we checked is another
        // writer's (or a failed append of ours); a newer claim there stops
        // this append before it writes.
        let (lo, hi) = self.watermarks()?;
        check_log_holds_acknowledged(&self.id.to_string(), *lock(&self.acked_to), hi)?;
        self.check_claims(&mut w, lo, hi)?;
        let offsets = self.append_raw(records)?;
        if let (Some(&first), Some(&last)) = (offsets.first(), offsets.last()) {
            // A claim that raced in between the check and our batch: our
            // records are written (replay will see them), but this handle
            // writes no more.
            self.check_claims(&mut w, lo, first)?;
            w.checked_to = w.checked_to.max(last + 1);
        }
        Ok(offsets)
    }

    pub(super) fn append_raw(&self, records: &[RawOut]) -> Result<Vec<u64>> {
        // One batch at a time, so a batch's offsets are consecutive.
        let mut producer = lock(&self.producer);
        let result = self.send_batch(&producer, records).and_then(|offsets| {
            let mut acked_to = lock(&self.acked_to);
            check_acknowledged(&self.id.to_string(), *acked_to, &offsets)?;
            if let Some(&last) = offsets.last() {
                *acked_to = last + 1;
            }
            Ok(offsets)
        });
        if let Err(err) = &result {
            // Start a new producer (a new producer id, sequence numbers from
            // 0) for the next append after *any* failed one, not only after a
            // fatal idempotence error: the failed batch's outcome is unknown
            // anyway (the retry writes it again), and an idempotent producer
            // whose records timed out carries sequence/epoch state a broker
            // may not accept. tansu 0.6.0, restarted under a producer that
            // kept its id, panics a storage task on its next Produce and
            // answers every later Produce with UNKNOWN_SERVER_ERROR.
            match producer.client().fatal_error() {
                Some((code, reason)) => {
                    tracing::warn!(changelog = %self.id, ?code, %reason, "kafka producer failed fatally; recreating it")
                }
                None => {
                    tracing::info!(changelog = %self.id, error = %err, "kafka append failed; recreating the producer")
                }
            }
            match create_producer(&self.options, &self.at) {
                Ok(p) => *producer = p,
                Err(e) => {
                    tracing::warn!(changelog = %self.id, error = %e, "could not recreate kafka producer")
                }
            }
        }
        result
    }
}

/// Offsets a broker acknowledged for one append, against `acked_to` (one
/// past the highest it acknowledged to this handle before): they must all
/// lie at or above it. A partition's offsets only grow, so an acknowledged
/// offset below means the broker gave out an offset twice — it lost or
/// overwrote acknowledged records (tansu 0.6's memory engine ended a log of
/// 300 000 appended records at offset 298 322), or the topic was recreated
/// under this handle. Either way the store must not be tagged with these
/// offsets.
pub(super) fn check_acknowledged(changelog: &str, acked_to: u64, offsets: &[u64]) -> Result<()> {
    match offsets.first() {
        Some(&first) if first < acked_to => Err(Error::stale(format!(
            "kafka acknowledged offsets this changelog had already acknowledged changelog=`{changelog}` \
             first={first} last={:?} previously_acknowledged_up_to={} ; the broker lost or overwrote \
             records, or the topic was recreated: stop writing, check the broker, and rebuild the \
             store from what the log holds",
            offsets.last(),
            acked_to.saturating_sub(1)
        )).with_reason(crate::Reason::HistoryLost)),
        _ => Ok(()),
    }
}

/// The partition's end offset `hi`, read before an append, against
/// `acked_to` (one past the highest offset the broker acknowledged to this
/// handle): a log that ends below an offset it acknowledged has lost
/// acknowledged records (tansu 0.6's memory engine: 50 000 records
/// acknowledged, the log ends at 48 322) or was recreated under this
/// handle. Nothing more may be appended to it.
pub(super) fn check_log_holds_acknowledged(changelog: &str, acked_to: u64, hi: u64) -> Result<()> {
    if hi < acked_to {
        return Err(Error::stale(format!(
            "the kafka log ends below offsets it acknowledged changelog=`{changelog}` \
             end_offset={hi} acknowledged_up_to={} ; the broker lost acknowledged records, or the \
             topic was recreated: stop writing, check the broker, and rebuild the store from what \
             the log holds",
            acked_to.saturating_sub(1)
        ))
        .with_reason(crate::Reason::HistoryLost));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_log_ending_below_acknowledged_offsets_is_refused() {
        assert!(check_log_holds_acknowledged("c", 0, 0).is_ok());
        assert!(check_log_holds_acknowledged("c", 10, 10).is_ok());
        assert!(check_log_holds_acknowledged("c", 10, 12).is_ok());
        let e = check_log_holds_acknowledged("c", 50_000, 48_322).unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::Stale);
        assert_eq!(e.reason(), Some(crate::Reason::HistoryLost));
    }

    #[test]
    fn acknowledged_offsets_must_not_reach_below_earlier_ones() {
        assert!(check_acknowledged("c", 0, &[0, 1, 2]).is_ok());
        assert!(check_acknowledged("c", 3, &[3, 4]).is_ok());
        // Gaps are fine (another writer's claim, control records).
        assert!(check_acknowledged("c", 3, &[7, 9]).is_ok());
        assert!(check_acknowledged("c", 5, &[]).is_ok());
        let e = check_acknowledged("c", 5, &[4, 5, 6]).unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::Stale);
        assert_eq!(e.reason(), Some(crate::Reason::HistoryLost));
    }
}
