//! [`KafkaChangelog`]: the production changelog backend, one partition of a
//! compacted Apache Kafka topic (feature `kafka`, via `rdkafka`).
//!
//! ```no_run
//! use statesnap::changelog::{Changelog, ChangelogId, Record};
//! use statesnap::changelog::kafka::{KafkaChangelog, KafkaOptions};
//!
//! # fn main() -> statesnap::Result<()> {
//! let id = ChangelogId::for_store("orders-app", "counts", 0)?; // topic `orders-app-counts-changelog`
//! let options = KafkaOptions::new("broker-1:9092,broker-2:9092")
//!     .property("security.protocol", "plaintext")
//!     .replication_factor(3);
//! let log = KafkaChangelog::open(id, options)?;
//! let offsets = log.append(&[Record::put("k", "v")])?;
//! # let _ = offsets; Ok(()) }
//! ```
//!
//! # What it does
//!
//! - **Topic.** One topic-partition per changelog, named by
//!   [`ChangelogId`] (`<application>-<store>-changelog`). When the topic is
//!   missing, [`KafkaChangelog::open`] creates it with the AdminClient, with
//!   `cleanup.policy=compact` and the configured partition count and
//!   replication factor (plus any [`KafkaOptions::topic_config`]). A topic
//!   whose `cleanup.policy` does not include `compact` is refused (kind
//!   `config`) or accepted with a warning, per [`NonCompactedPolicy`].
//! - **Append.** An idempotent producer (`enable.idempotence=true`,
//!   `acks=all`) sends the whole batch, then waits for every delivery report;
//!   the offsets come from the reports. If any record fails or times out
//!   (`message.timeout.ms` = [`KafkaOptions::delivery_timeout`]) the call
//!   returns an error, so [`LoggedStore`](crate::store::logged::LoggedStore)
//!   applies nothing. Appends are serialised so a batch's offsets are
//!   consecutive. Record timestamps come from the injected
//!   [`Clock`](crate::clock::Clock).
//! - **One writer.** With [`KafkaOptions::fence_writers`] (default), a
//!   handle's first append writes a writer claim record
//!   ([`WRITER_MARKER_KEY`]); a handle that finds a newer claim by another
//!   writer refuses every later append (kind `stale`). See
//!   [`KafkaChangelog::claim_writer`] and `docs/kafka.md`.
//! - **Read.** A fresh `BaseConsumer` per reader, no consumer group: the
//!   partition is assigned at `max(from, start_offset)` and read up to the
//!   high watermark seen when the reader was opened (`enable.auto.commit=false`,
//!   nothing is ever committed).
//! - **Offsets.** `start_offset` / `end_offset` are the low / high watermark.
//!
//! # Lineage
//!
//! The design asks for the topic id (KIP-516). librdkafka receives it but the
//! `rdkafka` crate does not expose it and this crate forbids `unsafe`, so
//! [`LineageSource::TopicId`] reads it itself: a plaintext TCP connection to a
//! bootstrap server, `ApiVersions` v0, then `Metadata` v10–v12 for the topic
//! (a small wire-protocol reader in `kafka/wire.rs`). The lineage is
//! `topic-id:<uuid>`; deleting and recreating the topic changes it.
//!
//! TLS/SASL connections cannot be made that way, and brokers older than
//! Kafka 2.8 have no topic ids. There [`LineageSource::Marker`] is used (the
//! default [`LineageSource::Auto`] picks it when `security.protocol` is not
//! plaintext or the broker has no ids): a **marker record** with a reserved
//! key ([`LINEAGE_MARKER_KEY`]) and the header `statesnap-marker: lineage`,
//! whose value is `marker:<random uuid>`. The first `lineage()` call writes
//! one when the partition holds none; the lineage is the value of the
//! *lowest-offset* marker (so two processes that race agree). Readers skip
//! markers (they look like a compaction gap). Limits of the marker:
//!
//! - It takes an offset: after the first `lineage()` call on an empty
//!   changelog, the first user record is offset 1.
//! - Compaction keeps it (its key is never written again). Deleting and
//!   recreating the topic loses it, and the next `lineage()` writes a new one,
//!   so the lineage changes. A *deleted* prefix (retention, DeleteRecords)
//!   that held it changes the lineage too — the safe direction: older stores
//!   and snapshots are refused and rebuilt.
//! - A topic with no marker is scanned to its end once before one is written.
//! - Switching sources changes the lineage (`topic-id:` vs `marker:`), again
//!   the safe direction.
//!
//! # Tombstone horizon (design invariant 7)
//!
//! Kafka's log cleaner removes a tombstone no earlier than
//! `delete.retention.ms` after the segment holding it was cleaned, which is
//! after the tombstone was written. So a tombstone whose timestamp is newer
//! than `now - delete.retention.ms` is still in the log. [`Changelog::horizon`]
//! reports:
//!
//! - `tombstones_before` = the first offset whose record timestamp is
//!   `>= now - delete.retention.ms` (ListOffsets by time, `offsets_for_times`),
//!   or the high watermark when every record is older. `now` is the injected
//!   clock, `delete.retention.ms` is read from the topic config by every
//!   `horizon()` call, so a change an operator makes while we run is
//!   followed (Kafka's default of 1 day if the broker does not say; the
//!   values at `open` if the broker does not answer DescribeConfigs at all).
//! - `deleted_before` = the low watermark unless `cleanup.policy` is exactly
//!   `compact` (then 0).
//!
//! [`replay`](crate::restore::replay) checks the horizon before it reads and
//! again after, so a tombstone purged while a long replay ran fails it
//! (`stale`) instead of leaving a store with a deleted key back. A reader
//! whose position falls below the log start while it reads (retention,
//! DeleteRecords) fails `stale` too: readers run with
//! `auto.offset.reset=error`, never jumping silently over deleted records.
//!
//! What is guaranteed: replay from an offset `>= tombstones_before` sees
//! every delete, *provided* record timestamps do not run ahead of the time
//! they were written (CreateTime from this client's clock, or LogAppendTime)
//! and the clock is not far behind the brokers'. What is not: with a
//! compact-only topic a log-start offset moved by DeleteRecords cannot be told
//! apart from one moved by compaction, so it is reported as compaction
//! (`deleted_before = 0`).
//!
//! # Settings
//!
//! `bootstrap.servers` and any librdkafka property
//! ([`KafkaOptions::property`]) are passed to every client (security,
//! SASL, timeouts, ...). statesnap owns `enable.idempotence`, `acks`,
//! `enable.auto.commit` and `transactional.id`; setting them to anything
//! unsafe is a `config` error. Properties are never logged with their
//! secrets: keys containing `password`, `secret`, `sasl.jaas`, `token`,
//! `key.pem` or `oauthbearer.config` are shown as `[redacted]`
//! ([`redact`]). TLS and SASL need `rdkafka`'s `ssl` / `sasl` features,
//! which the default build does not compile in (see `docs/kafka.md`).

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::Bytes;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, ResourceSpecifier, TopicReplication};
use rdkafka::config::{ClientConfig, RDKafkaLogLevel};
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::{ClientContext, Offset, TopicPartitionList};

mod wire;

use super::{
    Changelog, ChangelogId, ChangelogReader, FusedReader, Horizon, Lineage, LoggedRecord, Record,
};
use crate::clock::{SharedClock, system_clock};
use crate::error::{Error, ErrorKind, Result};

/// The reserved key of lineage marker records. Applications must not write it.
pub const LINEAGE_MARKER_KEY: &[u8] = b"\x00statesnap\x00lineage";
/// The reserved key of writer claim records (writer fencing). Applications
/// must not write it.
pub const WRITER_MARKER_KEY: &[u8] = b"\x00statesnap\x00writer";
/// The header that marks a statesnap marker record, and its values.
const MARKER_HEADER: &str = "statesnap-marker";
const MARKER_HEADER_VALUE: &[u8] = b"lineage";
const WRITER_HEADER_VALUE: &[u8] = b"writer";

/// A record to produce: key, value, and the marker header value if it is a
/// statesnap marker.
type RawOut = (Bytes, Option<Bytes>, Option<&'static [u8]>);

/// Kafka's default `delete.retention.ms` (1 day), used when the broker does
/// not report the topic's value.
pub const DEFAULT_DELETE_RETENTION_MS: i64 = 86_400_000;

/// `max.message.bytes` of a created topic unless set in
/// [`KafkaOptions::topic_config`]: 16 MiB, so values of a few MiB fit.
pub const DEFAULT_MAX_MESSAGE_BYTES: &str = "16777216";

/// What [`KafkaChangelog::open`] does with a topic whose `cleanup.policy`
/// does not include `compact` (its size grows without bound, or — with
/// `delete` — old state is lost after retention).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum NonCompactedPolicy {
    /// Log a warning and use the topic.
    Warn,
    /// Refuse to open it (kind `config`). The default.
    #[default]
    Error,
}

/// Where [`Changelog::lineage`] comes from (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LineageSource {
    /// The topic id over plaintext connections; a marker record when
    /// `security.protocol` is anything else, or the broker has no topic ids.
    #[default]
    Auto,
    /// The topic id (KIP-516), read with a Metadata request over a plaintext
    /// connection. Fails if the broker does not serve topic ids.
    TopicId,
    /// A marker record in the partition.
    Marker,
}

/// How to connect to Kafka and what topic to create.
///
/// `Debug` redacts secrets.
#[derive(Clone)]
pub struct KafkaOptions {
    /// `bootstrap.servers`: comma-separated `host:port` list.
    pub bootstrap_servers: String,
    /// librdkafka properties passed to every client (producer, consumers,
    /// admin), e.g. `security.protocol`, `sasl.mechanisms`, `client.id`.
    pub properties: BTreeMap<String, String>,
    /// Extra topic configs used when the topic is created
    /// (`cleanup.policy` defaults to `compact`).
    pub topic_config: BTreeMap<String, String>,
    /// Create the topic if it is missing (default true). If false, a missing
    /// topic is a `not-found` error.
    pub create_topic: bool,
    /// Partition count for a created topic (default 1).
    pub partitions: i32,
    /// Replication factor for a created topic (default 1; use 3 in production).
    pub replication_factor: i32,
    /// What to do with a topic that is not compacted.
    pub non_compacted_policy: NonCompactedPolicy,
    /// Timeout for metadata, watermark, admin requests and for a reader that
    /// receives nothing (default 10 s). Bounds how long `open` waits for an
    /// unreachable broker.
    pub request_timeout: Duration,
    /// How long a record may wait for delivery before `append` fails
    /// (`message.timeout.ms`, default 30 s).
    pub delivery_timeout: Duration,
    /// The clock for record timestamps and the tombstone horizon.
    pub clock: SharedClock,
    /// Where the lineage comes from.
    pub lineage_source: LineageSource,
    /// Fence zombie writers (default true): the first append of a handle
    /// writes a writer claim record, and a handle that finds a newer claim
    /// by another writer in the log refuses every later append (kind
    /// `stale`). See `docs/kafka.md`, "Writers, fencing and durability".
    pub fence_writers: bool,
}

impl KafkaOptions {
    /// Options for `bootstrap_servers`, everything else default.
    pub fn new(bootstrap_servers: impl Into<String>) -> Self {
        KafkaOptions {
            bootstrap_servers: bootstrap_servers.into(),
            properties: BTreeMap::new(),
            topic_config: BTreeMap::new(),
            create_topic: true,
            partitions: 1,
            replication_factor: 1,
            non_compacted_policy: NonCompactedPolicy::default(),
            request_timeout: Duration::from_secs(10),
            delivery_timeout: Duration::from_secs(30),
            clock: system_clock(),
            lineage_source: LineageSource::default(),
            fence_writers: true,
        }
    }

    /// Builds options from `key=value` pairs: `bootstrap.servers`, the
    /// statesnap settings below, and any other key as a librdkafka property.
    ///
    /// | key | meaning |
    /// | --- | --- |
    /// | `statesnap.create.topic` | `true` / `false` |
    /// | `statesnap.partitions` | partition count for a created topic |
    /// | `statesnap.replication.factor` | replication factor for a created topic |
    /// | `statesnap.non.compacted.policy` | `warn` / `error` |
    /// | `statesnap.request.timeout.ms` | [`KafkaOptions::request_timeout`] |
    /// | `statesnap.delivery.timeout.ms` | [`KafkaOptions::delivery_timeout`] |
    /// | `statesnap.lineage` | `auto` / `topic-id` / `marker` ([`LineageSource`]) |
    /// | `statesnap.fence.writers` | `true` / `false` ([`KafkaOptions::fence_writers`]) |
    /// | `statesnap.topic.<name>` | topic config `<name>` for a created topic |
    pub fn from_pairs<I, K, V>(pairs: I) -> Result<Self>
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<str>,
        V: AsRef<str>,
    {
        let mut o = KafkaOptions::new(String::new());
        for (k, v) in pairs {
            let (k, v) = (k.as_ref().trim(), v.as_ref().trim());
            let bad = |what: &str| {
                Error::config(format!(
                    "invalid kafka option: {what} key=`{k}` value=`{}`",
                    redact(k, v)
                ))
            };
            match k {
                "bootstrap.servers" | "metadata.broker.list" => o.bootstrap_servers = v.to_owned(),
                "statesnap.create.topic" => {
                    o.create_topic = v.parse().map_err(|_| bad("expected true or false"))?
                }
                "statesnap.partitions" => {
                    o.partitions = v.parse().map_err(|_| bad("expected an integer"))?
                }
                "statesnap.replication.factor" => {
                    o.replication_factor = v.parse().map_err(|_| bad("expected an integer"))?
                }
                "statesnap.non.compacted.policy" => {
                    o.non_compacted_policy = match v.to_ascii_lowercase().as_str() {
                        "warn" => NonCompactedPolicy::Warn,
                        "error" => NonCompactedPolicy::Error,
                        _ => return Err(bad("expected warn or error")),
                    }
                }
                "statesnap.lineage" => {
                    o.lineage_source = match v.to_ascii_lowercase().as_str() {
                        "auto" => LineageSource::Auto,
                        "topic-id" => LineageSource::TopicId,
                        "marker" => LineageSource::Marker,
                        _ => return Err(bad("expected auto, topic-id or marker")),
                    }
                }
                "statesnap.fence.writers" => {
                    o.fence_writers = v.parse().map_err(|_| bad("expected true or false"))?
                }
                "statesnap.request.timeout.ms" => {
                    o.request_timeout =
                        Duration::from_millis(v.parse().map_err(|_| bad("expected milliseconds"))?)
                }
                "statesnap.delivery.timeout.ms" => {
                    o.delivery_timeout =
                        Duration::from_millis(v.parse().map_err(|_| bad("expected milliseconds"))?)
                }
                _ => {
                    if let Some(name) = k.strip_prefix("statesnap.topic.") {
                        o.topic_config.insert(name.to_owned(), v.to_owned());
                    } else if k.starts_with("statesnap.") {
                        return Err(bad("unknown statesnap setting"));
                    } else if k.is_empty() {
                        return Err(bad("empty key"));
                    } else {
                        o.properties.insert(k.to_owned(), v.to_owned());
                    }
                }
            }
        }
        o.validate()?;
        Ok(o)
    }

    /// Parses Java-properties-style text: one `key=value` per line, `#` and
    /// `!` start comments, blank lines are skipped. See
    /// [`KafkaOptions::from_pairs`] for the keys.
    pub fn parse(text: &str) -> Result<Self> {
        let mut pairs = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') || line.starts_with('!') {
                continue;
            }
            let Some((k, v)) = line.split_once('=') else {
                return Err(Error::config(format!(
                    "invalid kafka option line: expected key=value line={}",
                    n + 1
                )));
            };
            pairs.push((k.trim().to_owned(), v.trim().to_owned()));
        }
        KafkaOptions::from_pairs(pairs)
    }

    /// Sets a librdkafka property.
    pub fn property(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.properties.insert(key.into(), value.into());
        self
    }

    /// Sets a topic config used when the topic is created.
    pub fn topic_config(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.topic_config.insert(key.into(), value.into());
        self
    }

    /// Sets whether a missing topic is created.
    pub fn create_topic(mut self, create: bool) -> Self {
        self.create_topic = create;
        self
    }

    /// Sets the partition count for a created topic.
    pub fn partitions(mut self, partitions: i32) -> Self {
        self.partitions = partitions;
        self
    }

    /// Sets the replication factor for a created topic.
    pub fn replication_factor(mut self, replication_factor: i32) -> Self {
        self.replication_factor = replication_factor;
        self
    }

    /// Sets what to do with a non-compacted topic.
    pub fn non_compacted_policy(mut self, policy: NonCompactedPolicy) -> Self {
        self.non_compacted_policy = policy;
        self
    }

    /// Sets the request timeout.
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// Sets the delivery timeout.
    pub fn delivery_timeout(mut self, timeout: Duration) -> Self {
        self.delivery_timeout = timeout;
        self
    }

    /// Sets the clock.
    pub fn clock(mut self, clock: SharedClock) -> Self {
        self.clock = clock;
        self
    }

    /// Sets where the lineage comes from.
    pub fn lineage_source(mut self, source: LineageSource) -> Self {
        self.lineage_source = source;
        self
    }

    /// Sets whether zombie writers are fenced ([`KafkaOptions::fence_writers`]).
    pub fn fence_writers(mut self, fence: bool) -> Self {
        self.fence_writers = fence;
        self
    }

    /// Whether the clients connect without TLS or SASL.
    fn is_plaintext(&self) -> bool {
        self.properties
            .get("security.protocol")
            .is_none_or(|p| p.trim().eq_ignore_ascii_case("plaintext"))
    }

    /// The librdkafka properties with secret values replaced by `[redacted]`.
    pub fn redacted_properties(&self) -> BTreeMap<String, String> {
        self.properties
            .iter()
            .map(|(k, v)| (k.clone(), redact(k, v).to_owned()))
            .collect()
    }

    /// Checks the options without contacting a broker.
    pub fn validate(&self) -> Result<()> {
        if self.bootstrap_servers.trim().is_empty() {
            return Err(Error::config(
                "kafka bootstrap servers are empty: set bootstrap.servers",
            ));
        }
        if self.partitions < 1 {
            return Err(Error::config(format!(
                "invalid kafka partition count partitions={}",
                self.partitions
            )));
        }
        if self.replication_factor < 1 {
            return Err(Error::config(format!(
                "invalid kafka replication factor replication_factor={}",
                self.replication_factor
            )));
        }
        for (k, v) in &self.properties {
            let v = v.trim().to_ascii_lowercase();
            let unsafe_value = match k.as_str() {
                "enable.idempotence" => v != "true",
                "acks" | "request.required.acks" => v != "all" && v != "-1",
                "enable.auto.commit" => v != "false",
                "transactional.id" | "bootstrap.servers" | "metadata.broker.list" => true,
                _ => false,
            };
            if unsafe_value {
                return Err(Error::config(format!(
                    "kafka property is owned by statesnap key=`{k}` value=`{}`; the changelog needs \
                     enable.idempotence=true, acks=all, no auto commit, no transactions, and \
                     bootstrap servers set through KafkaOptions::bootstrap_servers",
                    redact(k, &v)
                )));
            }
        }
        for d in [self.request_timeout, self.delivery_timeout] {
            if d.is_zero() || d.as_millis() > i32::MAX as u128 {
                return Err(Error::config(format!(
                    "invalid kafka timeout timeout_ms={}",
                    d.as_millis()
                )));
            }
        }
        Ok(())
    }
}

impl fmt::Debug for KafkaOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KafkaOptions")
            .field("bootstrap_servers", &self.bootstrap_servers)
            .field("properties", &self.redacted_properties())
            .field("topic_config", &self.topic_config)
            .field("create_topic", &self.create_topic)
            .field("partitions", &self.partitions)
            .field("replication_factor", &self.replication_factor)
            .field("non_compacted_policy", &self.non_compacted_policy)
            .field("request_timeout", &self.request_timeout)
            .field("delivery_timeout", &self.delivery_timeout)
            .field("clock", &self.clock)
            .field("lineage_source", &self.lineage_source)
            .field("fence_writers", &self.fence_writers)
            .finish()
    }
}

/// Whether a librdkafka property holds a secret.
pub fn is_secret_key(key: &str) -> bool {
    let k = key.to_ascii_lowercase();
    [
        "password",
        "secret",
        "sasl.jaas",
        "token",
        "key.pem",
        "oauthbearer.config",
    ]
    .iter()
    .any(|s| k.contains(s))
}

/// `value`, or `[redacted]` if `key` names a secret.
pub fn redact<'a>(key: &str, value: &'a str) -> &'a str {
    if is_secret_key(key) {
        "[redacted]"
    } else {
        value
    }
}

/// Routes librdkafka's log lines and global errors to `tracing`.
#[derive(Debug, Clone)]
struct Ctx {
    bootstrap: String,
}

impl ClientContext for Ctx {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        match level {
            RDKafkaLogLevel::Emerg
            | RDKafkaLogLevel::Alert
            | RDKafkaLogLevel::Critical
            | RDKafkaLogLevel::Error
            | RDKafkaLogLevel::Warning => {
                tracing::warn!(target: "librdkafka", facility = fac, "{log_message}")
            }
            RDKafkaLogLevel::Notice | RDKafkaLogLevel::Info => {
                tracing::info!(target: "librdkafka", facility = fac, "{log_message}")
            }
            RDKafkaLogLevel::Debug => {
                tracing::debug!(target: "librdkafka", facility = fac, "{log_message}")
            }
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        // Unreachable brokers are reported again and again while librdkafka
        // retries; the caller sees a transient error when it matters.
        tracing::debug!(target: "librdkafka", bootstrap_servers = %self.bootstrap, %error, "{reason}");
    }
}

impl ConsumerContext for Ctx {}

/// One record's delivery report slot.
struct Slot {
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

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding one of these locks cannot leave the data
    // inconsistent (plain slots and handles), so poisoning is ignored.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// What the caller should do about a Kafka error.
fn kind_of(err: &KafkaError) -> ErrorKind {
    use RDKafkaErrorCode as C;
    let code = match err {
        KafkaError::AdminOp(c) => Some(*c),
        KafkaError::ClientConfig(..) | KafkaError::ClientCreation(_) | KafkaError::Nul(_) => {
            return ErrorKind::Config;
        }
        KafkaError::Canceled => return ErrorKind::Cancelled,
        other => other.rdkafka_error_code(),
    };
    match code {
        Some(
            C::UnknownTopicOrPartition | C::UnknownTopic | C::UnknownPartition | C::UnknownTopicId,
        ) => ErrorKind::NotFound,
        Some(
            C::InvalidConfig
            | C::InvalidArgument
            | C::InvalidReplicationFactor
            | C::InvalidPartitions
            | C::InvalidTopic
            | C::PolicyViolation
            | C::MessageSizeTooLarge
            | C::InvalidMessageSize
            | C::TopicAuthorizationFailed
            | C::ClusterAuthorizationFailed
            | C::TransactionalIdAuthorizationFailed
            | C::SaslAuthenticationFailed
            | C::Authentication
            | C::UnsupportedSASLMechanism
            | C::SSL
            | C::TopicDeletionDisabled
            | C::UnsupportedVersion
            | C::UnsupportedFeature
            | C::NotImplemented,
        ) => ErrorKind::Config,
        Some(C::TopicAlreadyExists) => ErrorKind::AlreadyExists,
        // Timeouts, transport failures, leader changes, not enough replicas,
        // fatal idempotence errors (the producer is recreated): retry.
        _ => ErrorKind::Transient,
    }
}

fn millis(d: Duration) -> String {
    d.as_millis().to_string()
}

/// Builds statesnap errors that name the brokers and the changelog.
#[derive(Debug, Clone)]
struct Where {
    bootstrap: String,
    id: ChangelogId,
}

impl Where {
    fn err(&self, what: &str, e: KafkaError) -> Error {
        if let KafkaError::ClientConfig(_, desc, key, value) = &e {
            // rdkafka's message repeats the value (a password, a key): keep
            // neither it nor the raw error.
            let desc = if is_secret_key(key) && !value.is_empty() {
                desc.replace(value.as_str(), "[redacted]")
            } else {
                desc.clone()
            };
            return Error::config(format!(
                "kafka {what} failed changelog=`{}` bootstrap_servers=`{}`: bad client property \
                 `{key}` = `{}` ({desc}); check the kafka settings",
                self.id,
                self.bootstrap,
                redact(key, value)
            ));
        }
        let kind = kind_of(&e);
        let hint = match kind {
            ErrorKind::Transient => "; is the broker reachable? retry later",
            ErrorKind::Config => "; check the kafka settings and permissions",
            _ => "",
        };
        Error::new(
            kind,
            format!(
                "kafka {what} failed changelog=`{}` bootstrap_servers=`{}`{hint}",
                self.id, self.bootstrap
            ),
        )
        .with_source(e)
    }
}

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
    producer: Mutex<ThreadedProducer<Ctx>>,
    /// Metadata, watermark and offset-by-time queries (never polled).
    meta: BaseConsumer<Ctx>,
    /// Topic config lookups.
    admin: AdminClient<Ctx>,
    /// `cleanup.policy` and `delete.retention.ms`, as last read (at open and
    /// at every [`Changelog::horizon`]).
    configs: Mutex<(String, i64)>,
    /// False when the broker did not answer DescribeConfigs at open (then the
    /// values above are assumptions and are not asked for again).
    configs_known: bool,
    /// This handle's writer claim (fencing); held for a whole append.
    writer: Mutex<WriterClaim>,
}

/// A handle's standing as the partition's writer.
#[derive(Debug)]
struct WriterClaim {
    /// `writer:<uuid>`, made at open.
    id: String,
    /// Offset of this handle's claim record, once written.
    claimed_at: Option<u64>,
    /// Offsets below this were checked for newer claims (or are ours).
    checked_to: u64,
    /// Set once a newer claim by another writer was seen: for good.
    fenced: Option<String>,
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
        let (cleanup_policy, delete_retention_ms) = match describe_topic(&admin, &options, &at) {
            Ok(c) => c,
            // The broker answered metadata but not DescribeConfigs (some
            // brokers and librdkafka's mock cluster do not implement it).
            Err(e)
                if e.is_transient() && options.non_compacted_policy == NonCompactedPolicy::Warn =>
            {
                tracing::warn!(changelog = %id, error = %e, "could not read the topic's configs; assuming it is not compacted");
                configs_known = false;
                ("unknown".to_owned(), DEFAULT_DELETE_RETENTION_MS)
            }
            Err(e) => return Err(e),
        };
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
            producer: Mutex::new(producer),
            meta,
            admin,
            configs: Mutex::new((cleanup_policy, delete_retention_ms)),
            configs_known,
            writer: Mutex::new(WriterClaim {
                id: format!("writer:{}", uuid::Uuid::new_v4()),
                claimed_at: None,
                checked_to: 0,
                fenced: None,
            }),
        };
        Ok(log)
    }

    /// The topic's `cleanup.policy` as last read (at open, and again by
    /// every [`Changelog::horizon`]), e.g. `compact`; `unknown` if the broker
    /// does not answer DescribeConfigs.
    pub fn cleanup_policy(&self) -> String {
        lock(&self.configs).0.clone()
    }

    /// The topic's `delete.retention.ms` as last read (see
    /// [`KafkaChangelog::cleanup_policy`]).
    pub fn delete_retention_ms(&self) -> i64 {
        lock(&self.configs).1
    }

    /// The topic's configs now: asked of the broker, because an operator may
    /// change `delete.retention.ms` or the policy while we run and the
    /// horizon must follow (a value cached since open could accept a
    /// snapshot compaction has overtaken).
    fn current_configs(&self) -> Result<(String, i64)> {
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

    /// The lowest-offset marker in `[start, end)`, if any, and its offset.
    fn find_marker(&self) -> Result<Option<(u64, Lineage)>> {
        let (lo, hi) = self.watermarks()?;
        if lo >= hi {
            return Ok(None);
        }
        let mut reader = KafkaReader::open(self, lo, hi)?;
        reader.keep_markers = true;
        while let Some(batch) = reader.next_raw(1024)? {
            for r in batch {
                if r.marker && r.record.key.as_ref() == LINEAGE_MARKER_KEY {
                    let value = r.record.value.unwrap_or_default();
                    let s = String::from_utf8_lossy(&value).into_owned();
                    return Ok(Some((r.record.offset, Lineage(s))));
                }
            }
        }
        Ok(None)
    }

    /// `Ok(Ok(lineage))` from the topic id, `Ok(Err(why))` if the broker
    /// cannot serve one.
    fn topic_id(&self) -> Result<std::result::Result<Lineage, String>> {
        match wire::fetch_topic_id(&self.at.bootstrap, &self.id.topic, self.options.request_timeout) {
            Ok(wire::TopicId::Id(id)) => {
                Ok(Ok(Lineage(format!("topic-id:{}", uuid::Uuid::from_bytes(id)))))
            }
            Ok(wire::TopicId::UnknownTopic) => Err(Error::not_found(format!(
                "kafka changelog topic does not exist changelog=`{}` bootstrap_servers=`{}`; \
                 it was deleted — the lineage is gone with it",
                self.id, self.at.bootstrap
            ))),
            Ok(wire::TopicId::Unsupported(why)) => Ok(Err(why)),
            Err(e) => Err(Error::transient(format!(
                "kafka topic id lookup failed changelog=`{}` bootstrap_servers=`{}`; is the broker reachable? retry later",
                self.id, self.at.bootstrap
            ))
            .with_source(e)),
        }
    }

    /// The lineage from the lowest marker record, writing one if there is none.
    fn marker_lineage(&self) -> Result<Lineage> {
        if let Some((_, l)) = self.find_marker()? {
            return Ok(l);
        }
        let lineage = format!("marker:{}", uuid::Uuid::new_v4());
        let marker = (
            Bytes::from_static(LINEAGE_MARKER_KEY),
            Some(Bytes::from(lineage.clone())),
            Some(MARKER_HEADER_VALUE),
        );
        let offsets = self.append_raw(&[marker])?;
        tracing::info!(changelog = %self.id, %lineage, offset = ?offsets.first(), "wrote kafka changelog lineage marker");
        // Another process may have written one first: the lowest wins.
        match self.find_marker()? {
            Some((_, l)) => Ok(l),
            None => Err(Error::transient(format!(
                "kafka lineage marker not readable after writing it changelog=`{}` bootstrap_servers=`{}`",
                self.id, self.at.bootstrap
            ))),
        }
    }

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
        for (i, (key, value, marker)) in records.iter().enumerate() {
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
            loop {
                match producer.send(rec) {
                    Ok(()) => {
                        sent += 1;
                        break;
                    }
                    Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                        // The local queue is full: wait for the polling
                        // thread to serve some delivery reports.
                        rec = back;
                        if Instant::now() >= deadline {
                            send_error =
                                Some(KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull));
                            break;
                        }
                        let guard = lock(&batch.pending);
                        let _ = batch
                            .reported
                            .wait_timeout(guard, Duration::from_millis(5))
                            .unwrap_or_else(|e| e.into_inner());
                    }
                    Err((e, _)) => {
                        send_error = Some(e);
                        break;
                    }
                }
            }
            if send_error.is_some() {
                break;
            }
        }
        // Send what is queued now instead of after linger.ms (a zero-timeout
        // flush only raises librdkafka's "flushing" flag and returns; the
        // polling thread serves the reports).
        let _ = producer.flush(Duration::ZERO);
        // Wait for the report of every record that was handed to librdkafka,
        // even after a send error, so no report of this batch is left behind.
        let unsent = n - sent;
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
        drop(guard);
        if let Some(e) = send_error {
            return Err(self
                .at
                .err(&format!("append (enqueue of record {sent} of {n})"), e));
        }
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

    /// Checks a broker's ListOffsets-by-time answer `o` by reading the first
    /// record at or after it: its timestamp must be `>= cutoff`. If it
    /// is older, the broker answered wrongly (tansu 0.6.0 answers offset 0,
    /// not -1, when no record is that recent) and the safe answer is `hi`
    /// (every record may be older than the cutoff).
    fn check_offset_for_time(&self, o: u64, hi: u64, cutoff: i64) -> Result<u64> {
        if o >= hi {
            return Ok(hi);
        }
        let mut reader = KafkaReader::open(self, o.max(self.watermarks()?.0), hi)?;
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
        let mut w = lock(&self.writer);
        self.check_not_fenced(&w)?;
        if w.claimed_at.is_none() {
            self.claim_locked(&mut w)?;
        }
        Ok(())
    }

    fn check_not_fenced(&self, w: &WriterClaim) -> Result<()> {
        match &w.fenced {
            Some(why) => Err(Error::stale(format!(
                "this kafka changelog handle was fenced: another writer claimed the partition \
                 changelog=`{}` bootstrap_servers=`{}` {why}; one writer per partition — this \
                 instance no longer owns it (close it; reopen only if it is assigned again)",
                self.id, self.at.bootstrap
            ))),
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
    fn append_fenced(&self, records: &[RawOut]) -> Result<Vec<u64>> {
        let mut w = lock(&self.writer);
        self.check_not_fenced(&w)?;
        if w.claimed_at.is_none() {
            self.claim_locked(&mut w)?;
        }
        // Before writing: anything past what we checked is another
        // writer's (or a failed append of ours); a newer claim there stops
        // this append before it writes.
        let (lo, hi) = self.watermarks()?;
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

    fn append_raw(&self, records: &[RawOut]) -> Result<Vec<u64>> {
        // One batch at a time, so a batch's offsets are consecutive.
        let mut producer = lock(&self.producer);
        let result = self.send_batch(&producer, records);
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

impl Changelog for KafkaChangelog {
    fn id(&self) -> &ChangelogId {
        &self.id
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
        let (cleanup_policy, delete_retention_ms) = self.current_configs()?;
        let (lo, hi) = self.watermarks()?;
        // A compact-only topic moves its log start only by compaction (or
        // DeleteRecords, which cannot be told apart); anything else may delete.
        let deleted_before = if cleanup_policy.split(',').all(|p| p.trim() == "compact") {
            0
        } else {
            lo
        };
        if lo >= hi {
            return Ok(Horizon {
                tombstones_before: hi,
                deleted_before,
            });
        }
        let cutoff = self
            .options
            .clock
            .now_ms()
            .saturating_sub(delete_retention_ms)
            // A clock earlier than the retention (tests, a clock near the
            // epoch): every record is young. A negative timestamp would be
            // refused as an argument.
            .max(0);
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(&self.id.topic, self.partition, Offset::Offset(cutoff))
            .map_err(|e| self.at.err("offset lookup by time", e))?;
        let found = self
            .meta
            .offsets_for_times(tpl, self.options.request_timeout)
            .map_err(|e| self.at.err("offset lookup by time", e))?;
        let elem = found.find_partition(&self.id.topic, self.partition);
        let tombstones_before = match elem.map(|e| (e.offset(), e.error())) {
            Some((_, Err(e))) => return Err(self.at.err("offset lookup by time", e)),
            Some((Offset::Offset(o), Ok(()))) => {
                let o = u64::try_from(o).unwrap_or(0).min(hi);
                self.check_offset_for_time(o, hi, cutoff)?
            }
            // No record at or after the cutoff: every record is older, so any
            // tombstone may be gone.
            Some((Offset::End | Offset::Invalid, Ok(()))) => hi,
            other => {
                return Err(Error::internal(format!(
                    "kafka offset lookup by time returned an unexpected answer changelog=`{}` answer={other:?}",
                    self.id
                )));
            }
        };
        Ok(Horizon {
            tombstones_before,
            deleted_before,
        })
    }

    fn flush(&self) -> Result<()> {
        // Every append already waited for acks=all; this only drains stragglers.
        let producer = lock(&self.producer);
        producer
            .flush(self.options.delivery_timeout)
            .map_err(|e| self.at.err("flush", e))
    }
}

/// A record as read, with whether it is a statesnap marker (lineage or
/// writer claim; the key says which).
struct RawRecord {
    record: LoggedRecord,
    marker: bool,
}

/// Reads one partition from an offset to a fixed end with its own consumer.
struct KafkaReader {
    consumer: Option<BaseConsumer<Ctx>>,
    at: Where,
    /// The next offset expected: records below it are dropped (tansu returns
    /// duplicates when asked for offsets below its log start).
    next: u64,
    end: u64,
    idle_timeout: Duration,
    keep_markers: bool,
    /// Set by the owner of a prefetching reader to make it return early.
    stop: Option<Arc<AtomicBool>>,
}

/// Records a prefetch thread hands over at once (at most).
const PREFETCH_RECORDS: usize = 8192;
/// Bytes (keys + values) a prefetch thread hands over at once (at most, bar
/// one record).
const PREFETCH_BYTES: usize = 8 << 20;
/// Chunks queued between the prefetch thread and the reader's caller.
const PREFETCH_DEPTH: usize = 2;

impl KafkaReader {
    fn open(log: &KafkaChangelog, from: u64, end: u64) -> Result<Self> {
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
        let consumer: BaseConsumer<Ctx> = consumer_config(&log.options)
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

    fn next_raw(&mut self, max_records: usize) -> Result<Option<Vec<RawRecord>>> {
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
                let wait = if out.is_empty() {
                    idle_deadline
                        .saturating_duration_since(Instant::now())
                        .min(Duration::from_millis(100))
                } else {
                    Duration::from_millis(5)
                };
                match consumer.poll(wait) {
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
                        if marker && !self.keep_markers {
                            continue;
                        }
                        bytes += key.len() + m.payload().map_or(0, <[u8]>::len);
                        out.push(RawRecord {
                            record: LoggedRecord {
                                offset: off,
                                timestamp_ms: m.timestamp().to_millis().unwrap_or(0),
                                key: Bytes::copy_from_slice(key),
                                value: m.payload().map(Bytes::copy_from_slice),
                            },
                            marker,
                        });
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
                    Some(Err(e))
                        if matches!(
                            e.rdkafka_error_code(),
                            Some(
                                RDKafkaErrorCode::AutoOffsetReset
                                    | RDKafkaErrorCode::OffsetOutOfRange
                            )
                        ) =>
                    {
                        return Err(Error::stale(format!(
                            "kafka changelog records were deleted before they were read changelog=`{}` \
                             bootstrap_servers=`{}` next_offset={} end_offset={}: the log start moved past \
                             the reader (retention or DeleteRecords); a replay from here cannot be exact — \
                             restore from a newer snapshot, or rebuild if none is usable",
                            self.at.id, self.at.bootstrap, self.next, self.end
                        ))
                        .with_source(e));
                    }
                    Some(Err(e)) => {
                        if self.stopped() {
                            self.finish();
                            return Ok(None);
                        }
                        if matches!(kind_of(&e), ErrorKind::Transient) {
                            // librdkafka retries by itself; give up at the idle deadline.
                            tracing::debug!(changelog = %self.at.id, error = %e, "kafka fetch error, retrying");
                        } else {
                            return Err(self.at.err("read", e));
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
                            return Err(Error::transient(format!(
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
                            )));
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
}

/// A [`KafkaReader`] on its own thread, fetching the next chunk while the
/// caller applies the previous one, so replay overlaps the client's fetch
/// and decode work with the store's writes (two cores instead of one).
///
/// At most [`PREFETCH_DEPTH`] chunks of [`PREFETCH_RECORDS`] records /
/// [`PREFETCH_BYTES`] bytes wait in the queue. Dropping the reader stops the
/// thread (within one poll, ≤ 100 ms) and waits for it, so its consumer is
/// closed when `drop` returns.
struct PrefetchReader {
    rx: Option<std::sync::mpsc::Receiver<Result<Vec<LoggedRecord>>>>,
    thread: Option<std::thread::JoinHandle<()>>,
    stop: Arc<AtomicBool>,
    /// The chunk being handed out, and how far.
    chunk: std::vec::IntoIter<LoggedRecord>,
    end: u64,
    changelog: String,
}

impl PrefetchReader {
    fn start(mut reader: KafkaReader) -> Result<Self> {
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
/// end: `read_from` hands this reader out wrapped in a [`FusedReader`].
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

fn ctx(options: &KafkaOptions) -> Ctx {
    Ctx {
        bootstrap: options.bootstrap_servers.clone(),
    }
}

fn base_config(options: &KafkaOptions) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", &options.bootstrap_servers);
    let timeout = millis(options.request_timeout);
    c.set("socket.timeout.ms", &timeout);
    for (k, v) in &options.properties {
        c.set(k, v);
    }
    c
}

fn consumer_config(options: &KafkaOptions) -> ClientConfig {
    let mut c = base_config(options);
    c.set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("enable.partition.eof", "true")
        // A fetch below the log start (retention or DeleteRecords moved it
        // past the reader) must be an error: "earliest" would jump over the
        // deleted records without a word and the replay would look complete.
        .set("auto.offset.reset", "error")
        .set("isolation.level", "read_uncommitted")
        .set("allow.auto.create.topics", "false");
    if !options.properties.contains_key("group.id") {
        // librdkafka wants a group id for a consumer; nothing joins or commits to it.
        c.set(
            "group.id",
            format!("statesnap-reader-{}", uuid::Uuid::new_v4()),
        );
    }
    // Reads go to the partition leader: a follower's high watermark may lag
    // the leader's, and its partition EOF would end a replay early.
    c.remove("client.rack");
    if !options.properties.contains_key("fetch.max.bytes") {
        c.set("fetch.max.bytes", "52428800");
    }
    // A reader stops at the high watermark it saw when opened, so it never
    // waits for new data; librdkafka's default (500 ms) only matters to a
    // broker that holds a fetch for the full wait even when data is there
    // (tansu 0.6.0 does: replay ran at 120 k records/s with 500 ms, 800 k
    // with 10 ms). A real Kafka broker answers at once when data is
    // available, so this costs nothing there.
    if !options.properties.contains_key("fetch.wait.max.ms") {
        c.set("fetch.wait.max.ms", "10");
    }
    // One fetch can carry the largest batch a producer may write (the
    // topic's max.message.bytes default); Kafka returns an oversized first
    // batch anyway (KIP-74), other brokers may not.
    if !options.properties.contains_key("max.partition.fetch.bytes") {
        c.set("max.partition.fetch.bytes", DEFAULT_MAX_MESSAGE_BYTES);
    }
    c
}

fn create_producer(options: &KafkaOptions, at: &Where) -> Result<ThreadedProducer<Ctx>> {
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

fn admin_client(options: &KafkaOptions, at: &Where) -> Result<AdminClient<Ctx>> {
    base_config(options)
        .create_with_context(ctx(options))
        .map_err(|e| at.err("admin client creation", e))
}

fn admin_options(options: &KafkaOptions) -> AdminOptions {
    AdminOptions::new()
        .request_timeout(Some(options.request_timeout))
        .operation_timeout(Some(options.request_timeout))
}

/// The topic's partition count, or `None` if it does not exist.
fn topic_partitions(
    meta: &BaseConsumer<Ctx>,
    at: &Where,
    timeout: Duration,
) -> Result<Option<i32>> {
    let md = meta
        .fetch_metadata(Some(&at.id.topic), timeout)
        .map_err(|e| {
            let kind = kind_of(&e);
            if kind == ErrorKind::Transient {
                Error::transient(format!(
                "kafka brokers unreachable changelog=`{}` bootstrap_servers=`{}` timeout_ms={}; \
                 check that the brokers are up and bootstrap.servers is right",
                at.id,
                at.bootstrap,
                millis(timeout)
            ))
            .with_source(e)
            } else {
                at.err("metadata fetch", e)
            }
        })?;
    let Some(t) = md.topics().iter().find(|t| t.name() == at.id.topic) else {
        return Ok(None);
    };
    match t.error() {
        None => Ok(Some(
            i32::try_from(t.partitions().len()).unwrap_or(i32::MAX),
        )),
        Some(e) => {
            let code = RDKafkaErrorCode::from(e);
            match code {
                RDKafkaErrorCode::UnknownTopicOrPartition | RDKafkaErrorCode::UnknownTopic => {
                    Ok(None)
                }
                // Just created, leader not elected yet.
                RDKafkaErrorCode::LeaderNotAvailable => Ok(None),
                other => Err(at.err("metadata fetch", KafkaError::MetadataFetch(other))),
            }
        }
    }
}

fn create_topic(admin: &AdminClient<Ctx>, options: &KafkaOptions, at: &Where) -> Result<()> {
    let mut topic = NewTopic::new(
        &at.id.topic,
        options.partitions,
        TopicReplication::Fixed(options.replication_factor),
    );
    if !options.topic_config.contains_key("cleanup.policy") {
        topic = topic.set("cleanup.policy", "compact");
    }
    if !options.topic_config.contains_key("max.message.bytes") {
        // Kafka's default (1 MiB + 12) refuses a 1 MiB value with its key.
        topic = topic.set("max.message.bytes", DEFAULT_MAX_MESSAGE_BYTES);
    }
    for (k, v) in &options.topic_config {
        topic = topic.set(k, v);
    }
    let results =
        futures::executor::block_on(admin.create_topics([&topic], &admin_options(options)))
            .map_err(|e| at.err("topic creation", e))?;
    for r in results {
        match r {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((_, code)) => return Err(at.err("topic creation", KafkaError::AdminOp(code))),
        }
    }
    tracing::info!(
        changelog = %at.id,
        partitions = options.partitions,
        replication_factor = options.replication_factor,
        "created kafka changelog topic"
    );
    Ok(())
}

/// `cleanup.policy` and `delete.retention.ms` of the topic.
fn describe_topic(
    admin: &AdminClient<Ctx>,
    options: &KafkaOptions,
    at: &Where,
) -> Result<(String, i64)> {
    let spec = ResourceSpecifier::Topic(&at.id.topic);
    let results =
        futures::executor::block_on(admin.describe_configs([&spec], &admin_options(options)))
            .map_err(|e| at.err("topic config lookup", e))?;
    let mut policy = None;
    let mut retention = None;
    for r in results {
        let res = r.map_err(|code| at.err("topic config lookup", KafkaError::AdminOp(code)))?;
        if let Some(v) = res.get("cleanup.policy").and_then(|e| e.value.clone()) {
            policy = Some(v);
        }
        if let Some(v) = res
            .get("delete.retention.ms")
            .and_then(|e| e.value.as_deref()?.parse::<i64>().ok())
        {
            retention = Some(v);
        }
    }
    let policy = policy.unwrap_or_else(|| {
        // Brokers that do not report it use Kafka's default.
        tracing::warn!(changelog = %at.id, "kafka broker did not report cleanup.policy; assuming `delete`");
        "delete".to_owned()
    });
    Ok((
        policy.to_ascii_lowercase(),
        retention.unwrap_or(DEFAULT_DELETE_RETENTION_MS),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// librdkafka's own config errors repeat the offending value; a secret
    /// must not reach the message, the source chain or `Debug`.
    #[test]
    fn client_config_errors_never_show_secret_values() {
        let id = ChangelogId::new("t-redact", 0).unwrap();
        for (key, value) in [
            // Not a librdkafka property (a Java client's), with a password in it.
            ("sasl.jaas.config", "org.Foo required password=\"hunter7\";"),
            // A real property set to a value librdkafka rejects.
            // Secrets librdkafka refuses in a build without OpenSSL.
            ("ssl.key.password", "hunter8"),
            ("ssl.key.pem", "-----BEGIN hunter9"),
        ] {
            let o = KafkaOptions::new("127.0.0.1:1")
                .request_timeout(Duration::from_secs(1))
                .property(key, value);
            let err = KafkaChangelog::open(id.clone(), o).expect_err("bad config");
            assert_eq!(err.kind(), ErrorKind::Config, "{err}");
            for shown in [format!("{err}"), format!("{err:#}"), format!("{err:?}")] {
                for secret in ["hunter7", "hunter8", "hunter9"] {
                    assert!(!shown.contains(secret), "{secret} leaked: {shown}");
                }
            }
        }
        let o = KafkaOptions::new("127.0.0.1:1")
            .request_timeout(Duration::from_secs(1))
            .property("sasl.jaas.config", "password=hunter7");
        let err = KafkaChangelog::open(id, o).expect_err("not a librdkafka property");
        assert!(err.to_string().contains("sasl.jaas.config"), "{err}");
        assert!(!format!("{err:#} {err:?}").contains("hunter7"), "{err:?}");
    }

    #[test]
    fn secrets_are_redacted_in_debug_and_errors() {
        let o = KafkaOptions::new("b:9092")
            .property("sasl.password", "hunter2")
            .property("sasl.jaas.config", "org.Foo required password=\"hunter3\";")
            .property("ssl.key.password", "hunter4")
            .property("sasl.oauthbearer.client.secret", "hunter5")
            .property("client.id", "visible-client");
        let dbg = format!("{o:?}");
        for s in ["hunter2", "hunter3", "hunter4", "hunter5"] {
            assert!(!dbg.contains(s), "secret {s} leaked: {dbg}");
        }
        assert!(dbg.contains("visible-client"), "{dbg}");
        assert!(dbg.contains("[redacted]"), "{dbg}");
        assert_eq!(redact("SASL.PASSWORD", "x"), "[redacted]");
        assert_eq!(redact("security.protocol", "sasl_ssl"), "sasl_ssl");
        let err =
            KafkaOptions::from_pairs([("bootstrap.servers", "b:1"), ("statesnap.partitions", "x")])
                .expect_err("bad partitions");
        assert_eq!(err.kind(), ErrorKind::Config);
        let err = KafkaOptions::from_pairs([
            ("bootstrap.servers", "b:1"),
            ("statesnap.nope.password", "hunter6"),
        ])
        .expect_err("unknown statesnap key");
        assert!(!err.to_string().contains("hunter6"), "{err}");
    }

    #[test]
    fn options_parse_statesnap_keys_topic_configs_and_properties() {
        let o = KafkaOptions::parse(
            "# brokers\n bootstrap.servers = a:9092,b:9092\n\nsecurity.protocol=sasl_ssl\n\
             statesnap.partitions=6\nstatesnap.replication.factor=3\nstatesnap.create.topic=false\n\
             statesnap.non.compacted.policy=warn\nstatesnap.request.timeout.ms=2500\n\
             statesnap.delivery.timeout.ms=7000\nstatesnap.topic.min.insync.replicas=2\n! comment\n",
        )
        .expect("parse");
        assert_eq!(o.bootstrap_servers, "a:9092,b:9092");
        assert_eq!(
            o.properties.get("security.protocol").map(String::as_str),
            Some("sasl_ssl")
        );
        assert_eq!(o.partitions, 6);
        assert_eq!(o.replication_factor, 3);
        assert!(!o.create_topic);
        assert_eq!(o.non_compacted_policy, NonCompactedPolicy::Warn);
        assert_eq!(o.request_timeout, Duration::from_millis(2500));
        assert_eq!(o.delivery_timeout, Duration::from_millis(7000));
        assert_eq!(
            o.topic_config
                .get("min.insync.replicas")
                .map(String::as_str),
            Some("2")
        );
        assert!(!o.properties.keys().any(|k| k.starts_with("statesnap.")));

        assert_eq!(
            KafkaOptions::parse("no-equals-sign")
                .expect_err("line")
                .kind(),
            ErrorKind::Config
        );
        assert_eq!(
            KafkaOptions::parse("security.protocol=ssl")
                .expect_err("no bootstrap")
                .kind(),
            ErrorKind::Config
        );
    }

    #[test]
    fn unsafe_overrides_of_owned_properties_are_refused() {
        for (k, v) in [
            ("acks", "1"),
            ("enable.idempotence", "false"),
            ("enable.auto.commit", "true"),
            ("transactional.id", "t"),
            ("bootstrap.servers", "elsewhere:9092"),
        ] {
            let err = KafkaOptions::new("b:9092")
                .property(k, v)
                .validate()
                .expect_err(k);
            assert_eq!(err.kind(), ErrorKind::Config, "{k}");
            assert!(err.to_string().contains(k), "{err}");
        }
        KafkaOptions::new("b:9092")
            .property("acks", "all")
            .property("enable.idempotence", "true")
            .validate()
            .expect("ok");
        assert_eq!(
            KafkaOptions::new("b")
                .partitions(0)
                .validate()
                .expect_err("0")
                .kind(),
            ErrorKind::Config
        );
    }

    #[test]
    fn error_kinds_tell_the_caller_what_to_do() {
        assert_eq!(
            kind_of(&KafkaError::MessageProduction(
                RDKafkaErrorCode::MessageTimedOut
            )),
            ErrorKind::Transient
        );
        assert_eq!(
            kind_of(&KafkaError::MetadataFetch(RDKafkaErrorCode::AllBrokersDown)),
            ErrorKind::Transient
        );
        assert_eq!(
            kind_of(&KafkaError::AdminOp(
                RDKafkaErrorCode::InvalidReplicationFactor
            )),
            ErrorKind::Config
        );
        assert_eq!(
            kind_of(&KafkaError::AdminOp(
                RDKafkaErrorCode::UnknownTopicOrPartition
            )),
            ErrorKind::NotFound
        );
        assert_eq!(
            kind_of(&KafkaError::MessageProduction(
                RDKafkaErrorCode::MessageSizeTooLarge
            )),
            ErrorKind::Config
        );
    }
}
