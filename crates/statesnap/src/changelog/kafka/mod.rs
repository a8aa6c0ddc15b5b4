//! [`KafkaChangelog`]: the production changelog backend, one partition of a
//! compacted Apache Kafka topic (feature `kafka`, via `rdkafka`).
//!
//! ```no_run
//! use statesnap::StoreKey;
//! use statesnap::changelog::{Changelog, Record};
//! use statesnap::changelog::kafka::{KafkaChangelog, KafkaOptions};
//!
//! # fn main() -> statesnap::Result<()> {
//! let id = StoreKey::new("orders-app", "counts", 0)?.changelog_id(); // topic `orders-app-counts-changelog`
//! let options = KafkaOptions::new("broker-1:9092,broker-2:9092")
//!     .property("security.protocol", "plaintext")
//!     .replication_factor(3);
//! let log = KafkaChangelog::open(id, options)?;
//! let offsets = log.append(&[Record::put("k", "v")])?;
//! # let _ = offsets; Ok(()) }
//! ```
//!
//! - **Append**: an idempotent producer with `acks=all`; the offsets are
//!   returned only when every record of the batch is acknowledged, else the
//!   call fails and nothing may be assumed written.
//! - **One writer**: with [`KafkaOptions::fence_writers`] (default), a handle
//!   that finds a newer writer claim ([`WRITER_MARKER_KEY`]) by another
//!   writer refuses every later append (kind `stale`).
//! - **Read**: a fresh consumer per reader, no consumer group, no commits,
//!   up to the high watermark seen at open; records deleted under a reader
//!   fail it `stale`.
//! - **Lineage**: the topic id (KIP-516), or a marker record
//!   ([`LINEAGE_MARKER_KEY`]) where that cannot work ([`LineageSource`]).
//! - **Tombstone horizon** (invariant 7): from `delete.retention.ms`,
//!   read from the topic at every [`Changelog::horizon`] call, and record
//!   timestamps from the injected [`Clock`](crate::clock::Clock).
//! - **Point-in-time reads**: from `min.compaction.lag.ms` the same way
//!   ([`Horizon::superseded_before`]); with Kafka's default (0) a compacted
//!   topic is exact only at a snapshot's offset or at its end.
//! - **Settings**: statesnap owns `enable.idempotence`, `acks`,
//!   `enable.auto.commit` and `transactional.id`; secrets are never shown
//!   ([`redact`]).
//!
//! What each guarantee means, what it assumes, the lineage marker's limits,
//! TLS/SASL builds and how it is all tested: `docs/kafka.md`.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::admin::AdminClient;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::producer::{Producer, ThreadedProducer};
use rdkafka::{Offset, TopicPartitionList};

mod client;
mod lineage;
mod options;
mod producer;
mod reader;
mod wire;

/// The wire-protocol response parsers, for the `kafka_wire` fuzz target
/// only (feature `fuzzing`); not part of the API.
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod wire_fuzz {
    pub use super::wire::{TopicId, parse_api_versions, parse_metadata_response};
}

pub use lineage::{LINEAGE_MARKER_KEY, WRITER_MARKER_KEY};
pub use options::{
    DEFAULT_DELETE_RETENTION_MS, DEFAULT_MAX_MESSAGE_BYTES, KafkaOptions, LineageSource,
    NonCompactedPolicy, is_secret_key, redact,
};

use super::{Changelog, ChangelogId, ChangelogReader, FusedReader, Horizon, Lineage, Record};
use crate::error::{Error, Result};
use client::{
    Ctx, TopicConfigs, Where, admin_client, admin_options, consumer_config, create_topic, ctx,
    describe_topic, lock, topic_partitions,
};

/// How far the broker's clock may run ahead of this process's when the
/// horizon compares record timestamps with `min.compaction.lag.ms`: a lag
/// at or below it leaves no record safe from the cleaner.
const CLOCK_SKEW_ALLOWANCE_MS: i64 = 60_000;
use producer::{RawOut, WriterClaim, create_producer};
use reader::{KafkaReader, PrefetchReader};

/// A changelog stored in one partition of a compacted Kafka topic.
///
/// See the [module docs](self) for what is guaranteed.
pub struct KafkaChangelog {
    id: ChangelogId,
    partition: i32,
    options: KafkaOptions,
    at: Where,
    /// A producer with its own polling thread, so delivery reports are
    /// served the moment they arrive (rdkafka's `BaseProducer::poll(t)`
    /// always blocks for all of `t`).
    /// Shared with a flush running on a blocking thread.
    producer: Arc<Mutex<ThreadedProducer<Ctx>>>,
    /// One past the highest offset the broker acknowledged to this handle:
    /// a later append acknowledged below it means the broker reused
    /// offsets (see `producer::check_acknowledged`).
    acked_to: Mutex<u64>,
    /// Metadata, watermark and offset-by-time queries (never polled).
    meta: BaseConsumer<Ctx>,
    /// Topic config lookups.
    admin: AdminClient<Ctx>,
    /// `cleanup.policy`, `delete.retention.ms` and `min.compaction.lag.ms`,
    /// as last read (at open and at every [`Changelog::horizon`]).
    configs: Mutex<TopicConfigs>,
    /// False when the broker did not answer DescribeConfigs at open (then the
    /// values above are assumptions and are not asked for again).
    configs_known: bool,
    /// This handle's writer claim (fencing); held for a whole append.
    writer: Mutex<WriterClaim>,
    /// Claims of the owners that share this handle in this process
    /// ([`Changelog::begin_writer`]).
    claims: crate::changelog::WriterClaims,
}

impl fmt::Debug for KafkaChangelog {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KafkaChangelog")
            .field("id", &self.id)
            .field("options", &self.options)
            .field("configs", &*lock(&self.configs))
            .field("configs_known", &self.configs_known)
            .finish_non_exhaustive()
    }
}

impl KafkaChangelog {
    /// Connects, creates the topic if it is missing (compacted), checks its
    /// cleanup policy and reads its `delete.retention.ms`.
    ///
    /// Fails with kind `transient` (naming the bootstrap servers) if no broker
    /// answers within [`KafkaOptions::request_timeout`], `not-found` if the
    /// topic or partition is missing and may not be created, `config` for bad
    /// settings or a non-compacted topic under [`NonCompactedPolicy::Error`].
    pub fn open(id: ChangelogId, options: KafkaOptions) -> Result<Self> {
        options.validate()?;
        let at = Where {
            bootstrap: options.bootstrap_servers.clone(),
            id: id.clone(),
        };
        let partition = i32::try_from(id.partition).map_err(|_| {
            Error::config(format!("kafka partition number too large changelog=`{id}`"))
        })?;
        tracing::debug!(
            changelog = %id,
            bootstrap_servers = %options.bootstrap_servers,
            properties = ?options.redacted_properties(),
            "opening kafka changelog"
        );
        let meta: BaseConsumer<Ctx> = consumer_config(&options)
            .create_with_context(ctx(&options))
            .map_err(|e| at.err("consumer creation", e))?;

        // Topic creation, and the config lookups of open and every horizon().
        let admin = admin_client(&options, &at)?;
        let mut partitions = topic_partitions(&meta, &at, options.request_timeout)?;
        if partitions.is_none() {
            if !options.create_topic {
                return Err(Error::not_found(format!(
                    "kafka changelog topic does not exist changelog=`{id}` bootstrap_servers=`{}`; \
                     create it (compacted) or enable topic creation",
                    options.bootstrap_servers
                )));
            }
            create_topic(&admin, &options, &at)?;
            let deadline = Instant::now() + options.request_timeout;
            loop {
                partitions = topic_partitions(&meta, &at, options.request_timeout)?;
                if partitions.is_some() || Instant::now() >= deadline {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        let count = partitions.unwrap_or(0);
        if partition >= count {
            return Err(Error::not_found(format!(
                "kafka changelog partition does not exist changelog=`{id}` partitions={count} \
                 bootstrap_servers=`{}`",
                options.bootstrap_servers
            )));
        }

        let mut configs_known = true;
        let configs = match describe_topic(&admin, &options, &at) {
            Ok(c) => c,
            // The broker answered metadata but not DescribeConfigs (some
            // brokers and librdkafka's mock cluster do not implement it).
            Err(e)
                if e.is_transient() && options.non_compacted_policy == NonCompactedPolicy::Warn =>
            {
                tracing::warn!(changelog = %id, error = %e, "could not read the topic's configs; assuming it is not compacted");
                configs_known = false;
                TopicConfigs::assumed_unknown()
            }
            Err(e) => return Err(e),
        };
        let cleanup_policy = &configs.cleanup_policy;
        if !cleanup_policy.split(',').any(|p| p.trim() == "compact") {
            let msg = format!(
                "kafka changelog topic is not compacted changelog=`{id}` cleanup.policy=`{cleanup_policy}`; \
                 the log grows without bound or loses old state to retention — set cleanup.policy=compact"
            );
            match options.non_compacted_policy {
                NonCompactedPolicy::Error => return Err(Error::config(msg)),
                NonCompactedPolicy::Warn => tracing::warn!("{msg}"),
            }
        }

        let producer = create_producer(&options, &at)?;
        let log = KafkaChangelog {
            id,
            partition,
            options,
            at,
            producer: Arc::new(Mutex::new(producer)),
            acked_to: Mutex::new(0),
            meta,
            admin,
            configs: Mutex::new(configs),
            configs_known,
            writer: Mutex::new(WriterClaim {
                id: format!("writer:{}", uuid::Uuid::new_v4()),
                claimed_at: None,
                checked_to: 0,
                fenced: None,
            }),
            claims: Default::default(),
        };
        Ok(log)
    }

    /// The topic's `cleanup.policy` as last read (at open, and again by
    /// every [`Changelog::horizon`]), e.g. `compact`; `unknown` if the broker
    /// does not answer DescribeConfigs.
    pub fn cleanup_policy(&self) -> String {
        lock(&self.configs).cleanup_policy.clone()
    }

    /// The topic's `delete.retention.ms` as last read (see
    /// [`KafkaChangelog::cleanup_policy`]).
    pub fn delete_retention_ms(&self) -> i64 {
        lock(&self.configs).delete_retention_ms
    }

    /// The topic's `min.compaction.lag.ms` as last read (see
    /// [`KafkaChangelog::cleanup_policy`]): how far back point-in-time
    /// reads stay exact ([`Horizon::superseded_before`]).
    pub fn min_compaction_lag_ms(&self) -> i64 {
        lock(&self.configs).min_compaction_lag_ms
    }

    /// The topic's configs now: asked of the broker, because an operator may
    /// change `delete.retention.ms` or the policy while we run and the
    /// horizon must follow (a value cached since open could accept a
    /// snapshot compaction has overtaken).
    fn current_configs(&self) -> Result<TopicConfigs> {
        if !self.configs_known {
            return Ok(lock(&self.configs).clone());
        }
        let now = describe_topic(&self.admin, &self.options, &self.at)?;
        *lock(&self.configs) = now.clone();
        Ok(now)
    }

    /// Deletes `topic` (admin helper for tests and tooling). Every changelog
    /// in it loses its state and its lineage. Missing topics are `not-found`.
    pub fn delete_topic(options: &KafkaOptions, topic: &str) -> Result<()> {
        options.validate()?;
        let id = ChangelogId::new(topic, 0)?;
        let at = Where {
            bootstrap: options.bootstrap_servers.clone(),
            id,
        };
        let admin = admin_client(options, &at)?;
        let opts = admin_options(options);
        let results = futures::executor::block_on(admin.delete_topics(&[topic], &opts))
            .map_err(|e| at.err("topic deletion", e))?;
        for r in results {
            if let Err((_, code)) = r {
                return Err(at.err("topic deletion", KafkaError::AdminOp(code)));
            }
        }
        Ok(())
    }

    fn watermarks(&self) -> Result<(u64, u64)> {
        let (lo, hi) = self
            .meta
            .fetch_watermarks(&self.id.topic, self.partition, self.options.request_timeout)
            .map_err(|e| self.at.err("watermark fetch", e))?;
        // -1 is "unknown" (a new leader that has no high watermark yet): taking
        // it as 0 would make a full log look empty.
        match (u64::try_from(lo), u64::try_from(hi)) {
            (Ok(lo), Ok(hi)) if lo <= hi => Ok((lo, hi)),
            _ => Err(Error::transient(format!(
                "kafka broker returned unusable watermarks changelog=`{}` bootstrap_servers=`{}` \
                 low={lo} high={hi}; retry later (a leader election may be in progress)",
                self.id, self.at.bootstrap
            ))),
        }
    }

    /// Checks a broker's ListOffsets-by-time answer `o` by reading the first
    /// record at or after it: its timestamp must be `>= cutoff`. If it
    /// is older, the broker answered wrongly (tansu 0.6.0 answers offset 0,
    /// not -1, when no record is that recent) and the safe answer is `hi`
    /// (every record may be older than the cutoff).
    /// The first offset whose record's timestamp is at or after `cutoff`
    /// (ms), or `hi` when every record is older.
    fn first_offset_from_time(&self, cutoff: i64, hi: u64) -> Result<u64> {
        // A clock earlier than the retention (tests, a clock near the
        // epoch): every record is young. A negative timestamp would be
        // refused as an argument.
        let cutoff = cutoff.max(0);
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(&self.id.topic, self.partition, Offset::Offset(cutoff))
            .map_err(|e| self.at.err("offset lookup by time", e))?;
        let found = self
            .meta
            .offsets_for_times(tpl, self.options.request_timeout)
            .map_err(|e| self.at.err("offset lookup by time", e))?;
        let elem = found.find_partition(&self.id.topic, self.partition);
        match elem.map(|e| (e.offset(), e.error())) {
            Some((_, Err(e))) => Err(self.at.err("offset lookup by time", e)),
            Some((Offset::Offset(o), Ok(()))) => {
                let o = u64::try_from(o).unwrap_or(0).min(hi);
                self.check_offset_for_time(o, hi, cutoff)
            }
            // No record at or after the cutoff: every record is older.
            Some((Offset::End | Offset::Invalid, Ok(()))) => Ok(hi),
            other => Err(Error::internal(format!(
                "kafka offset lookup by time returned an unexpected answer changelog=`{}` answer={other:?}",
                self.id
            ))),
        }
    }

    fn check_offset_for_time(&self, o: u64, hi: u64, cutoff: i64) -> Result<u64> {
        if o >= hi {
            return Ok(hi);
        }
        let mut reader = KafkaReader::open_small(self, o.max(self.watermarks()?.0), hi)?;
        reader.keep_markers = true;
        let first = reader
            .next_raw(1)?
            .and_then(|b| b.into_iter().next())
            .map(|r| r.record);
        match first {
            Some(r) if r.timestamp_ms >= cutoff => Ok(r.offset.max(o)),
            Some(r) => {
                tracing::warn!(
                    changelog = %self.id, answer = o, record_timestamp_ms = r.timestamp_ms, cutoff_ms = cutoff,
                    "kafka offset lookup by time returned a record older than the cutoff; assuming every record is older"
                );
                Ok(hi)
            }
            None => Ok(hi),
        }
    }
}

impl Changelog for KafkaChangelog {
    fn id(&self) -> &ChangelogId {
        &self.id
    }

    fn begin_writer(&self) -> Result<Option<crate::changelog::WriterClaim>> {
        Ok(Some(self.claims.begin()))
    }

    fn append_as(
        &self,
        claim: crate::changelog::WriterClaim,
        batch: &[Record],
    ) -> Result<Vec<u64>> {
        self.claims.check(claim, &self.id)?;
        self.append(batch)
    }

    fn append(&self, batch: &[Record]) -> Result<Vec<u64>> {
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        if let Some(r) = batch
            .iter()
            .find(|r| r.key.as_ref() == LINEAGE_MARKER_KEY || r.key.as_ref() == WRITER_MARKER_KEY)
        {
            return Err(Error::config(format!(
                "record key is reserved for statesnap's marker records changelog=`{}` key={:?}",
                self.id,
                crate::util::DebugBytes(&r.key)
            )));
        }
        let records: Vec<RawOut> = batch
            .iter()
            .map(|r| (r.key.clone(), r.value.clone(), None))
            .collect();
        if self.options.fence_writers {
            self.append_fenced(&records)
        } else {
            self.append_raw(&records)
        }
    }

    fn read_from(&self, from: u64) -> Result<Box<dyn ChangelogReader + '_>> {
        let (lo, hi) = self.watermarks()?;
        let reader = KafkaReader::open(self, from.max(lo), hi)?;
        if reader.consumer.is_none() {
            return Ok(Box::new(reader)); // nothing to read
        }
        Ok(Box::new(FusedReader::new(PrefetchReader::start(reader)?)))
    }

    fn start_offset(&self) -> Result<u64> {
        Ok(self.watermarks()?.0)
    }

    fn end_offset(&self) -> Result<u64> {
        Ok(self.watermarks()?.1)
    }

    fn lineage(&self) -> Result<Lineage> {
        match self.options.lineage_source {
            LineageSource::Marker => self.marker_lineage(),
            LineageSource::TopicId => match self.topic_id()? {
                Ok(l) => Ok(l),
                Err(why) => Err(Error::config(format!(
                    "kafka broker does not serve topic ids changelog=`{}` bootstrap_servers=`{}` reason=`{why}`; \
                     use LineageSource::Marker",
                    self.id, self.at.bootstrap
                ))),
            },
            LineageSource::Auto if !self.options.is_plaintext() => self.marker_lineage(),
            LineageSource::Auto => match self.topic_id()? {
                Ok(l) => Ok(l),
                Err(why) => {
                    tracing::warn!(changelog = %self.id, reason = %why, "kafka broker does not serve topic ids; using a lineage marker record");
                    self.marker_lineage()
                }
            },
        }
    }

    fn horizon(&self) -> Result<Horizon> {
        let configs = self.current_configs()?;
        let (lo, hi) = self.watermarks()?;
        // A compact-only topic moves its log start only by compaction (or
        // DeleteRecords, which cannot be told apart); anything else may delete.
        let deleted_before = if configs
            .cleanup_policy
            .split(',')
            .all(|p| p.trim() == "compact")
        {
            0
        } else {
            lo
        };
        if lo >= hi {
            return Ok(Horizon {
                tombstones_before: hi,
                deleted_before,
                superseded_before: if configs.may_compact() { hi } else { 0 },
            });
        }
        let now = self.options.clock.now_ms();
        let tombstones_before =
            self.first_offset_from_time(now.saturating_sub(configs.delete_retention_ms), hi)?;
        // The cleaner compacts a segment only once its newest record is
        // older than `min.compaction.lag.ms` (by the broker's clock), and
        // stops at the first segment it may not compact: every record it
        // dropped was replaced below the first record younger than the lag.
        // The broker's clock may run ahead of ours by up to
        // CLOCK_SKEW_ALLOWANCE_MS.
        let superseded_before = if !configs.may_compact() {
            0
        } else if configs.min_compaction_lag_ms <= CLOCK_SKEW_ALLOWANCE_MS {
            hi
        } else {
            let young_from = now
                .saturating_sub(configs.min_compaction_lag_ms)
                .saturating_add(CLOCK_SKEW_ALLOWANCE_MS);
            self.first_offset_from_time(young_from, hi)?
        };
        Ok(Horizon {
            tombstones_before,
            deleted_before,
            superseded_before,
        })
    }

    fn flush(&self) -> Result<()> {
        // Every append already waited for acks=all; this only drains stragglers.
        let producer = lock(&self.producer);
        producer
            .flush(self.options.delivery_timeout)
            .map_err(|e| self.at.err("flush", e))
    }

    fn flush_async(&self) -> futures::future::BoxFuture<'_, Result<()>> {
        let (producer, at, timeout) = (
            Arc::clone(&self.producer),
            self.at.clone(),
            self.options.delivery_timeout,
        );
        Box::pin(crate::util::blocking(move || {
            lock(&producer)
                .flush(timeout)
                .map_err(|e| at.err("flush", e))
        }))
    }
}
