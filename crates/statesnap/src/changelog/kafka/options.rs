//! [`KafkaOptions`]: how to connect to Kafka and what topic to create (and
//! how they are parsed, checked and shown with secrets redacted).

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use crate::clock::{SharedClock, system_clock};
use crate::error::{Error, Result};

/// Kafka's default `delete.retention.ms` (1 day), used when the broker does
/// not report the topic's value.
pub const DEFAULT_DELETE_RETENTION_MS: i64 = 86_400_000;

/// `max.message.bytes` of a created topic unless set in
/// [`KafkaOptions::topic_config`]: 16 MiB, so values of a few MiB fit.
pub const DEFAULT_MAX_MESSAGE_BYTES: &str = "16777216";

/// What [`KafkaChangelog::open`](super::KafkaChangelog::open) does with a topic whose `cleanup.policy`
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

/// Where [`Changelog::lineage`](crate::changelog::Changelog::lineage) comes from (see the module docs).
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
    pub(super) fn is_plaintext(&self) -> bool {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

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
}
