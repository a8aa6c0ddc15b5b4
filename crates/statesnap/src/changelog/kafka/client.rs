//! librdkafka plumbing shared by the producer, the readers and the admin
//! calls: the client context ([`Ctx`]), client configs, topic admin
//! helpers, and how Kafka errors become statesnap errors ([`Where`]).

use std::time::Duration;

use rdkafka::ClientContext;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, ResourceSpecifier, TopicReplication};
use rdkafka::config::{ClientConfig, RDKafkaLogLevel};
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};

use super::{
    DEFAULT_DELETE_RETENTION_MS, DEFAULT_MAX_MESSAGE_BYTES, KafkaOptions, is_secret_key, redact,
};
use crate::changelog::ChangelogId;
use crate::error::{Error, ErrorKind, Result};

/// Routes librdkafka's log lines and global errors to `tracing`.
#[derive(Debug, Clone)]
pub(super) struct Ctx {
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

// A panic while holding one of these locks cannot leave the data
// inconsistent (plain slots and handles), so poisoning is ignored.
pub(super) use crate::util::lock;

/// What the caller should do about a Kafka error.
pub(super) fn kind_of(err: &KafkaError) -> ErrorKind {
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

pub(super) fn millis(d: Duration) -> String {
    d.as_millis().to_string()
}

/// Builds statesnap errors that name the brokers and the changelog.
#[derive(Debug, Clone)]
pub(super) struct Where {
    pub(super) bootstrap: String,
    pub(super) id: ChangelogId,
}

impl Where {
    pub(super) fn err(&self, what: &str, e: KafkaError) -> Error {
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

pub(super) fn ctx(options: &KafkaOptions) -> Ctx {
    Ctx {
        bootstrap: options.bootstrap_servers.clone(),
    }
}

pub(super) fn base_config(options: &KafkaOptions) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", &options.bootstrap_servers);
    let timeout = millis(options.request_timeout);
    c.set("socket.timeout.ms", &timeout);
    for (k, v) in &options.properties {
        c.set(k, v);
    }
    c
}

pub(super) fn consumer_config(options: &KafkaOptions) -> ClientConfig {
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

pub(super) fn admin_client(options: &KafkaOptions, at: &Where) -> Result<AdminClient<Ctx>> {
    base_config(options)
        .create_with_context(ctx(options))
        .map_err(|e| at.err("admin client creation", e))
}

pub(super) fn admin_options(options: &KafkaOptions) -> AdminOptions {
    AdminOptions::new()
        .request_timeout(Some(options.request_timeout))
        .operation_timeout(Some(options.request_timeout))
}

/// The topic's partition count, or `None` if it does not exist.
pub(super) fn topic_partitions(
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

pub(super) fn create_topic(
    admin: &AdminClient<Ctx>,
    options: &KafkaOptions,
    at: &Where,
) -> Result<()> {
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

/// The topic configs the horizon depends on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct TopicConfigs {
    /// `cleanup.policy`, lowercase (`unknown` when the broker did not say).
    pub cleanup_policy: String,
    /// `delete.retention.ms`.
    pub delete_retention_ms: i64,
    /// `min.compaction.lag.ms`: records younger than this are never
    /// compacted (Kafka's default, 0, lets the cleaner take any record
    /// outside the active segment).
    pub min_compaction_lag_ms: i64,
}

impl TopicConfigs {
    pub(super) fn assumed_unknown() -> Self {
        TopicConfigs {
            cleanup_policy: "unknown".to_owned(),
            delete_retention_ms: DEFAULT_DELETE_RETENTION_MS,
            min_compaction_lag_ms: 0,
        }
    }

    /// Whether the policy lets the cleaner compact (or, unknown, may).
    pub(super) fn may_compact(&self) -> bool {
        self.cleanup_policy == "unknown"
            || self
                .cleanup_policy
                .split(',')
                .any(|p| p.trim() == "compact")
    }
}

/// `cleanup.policy`, `delete.retention.ms` and `min.compaction.lag.ms` of
/// the topic.
pub(super) fn describe_topic(
    admin: &AdminClient<Ctx>,
    options: &KafkaOptions,
    at: &Where,
) -> Result<TopicConfigs> {
    let spec = ResourceSpecifier::Topic(&at.id.topic);
    let results =
        futures::executor::block_on(admin.describe_configs([&spec], &admin_options(options)))
            .map_err(|e| at.err("topic config lookup", e))?;
    let mut policy = None;
    let mut retention = None;
    let mut lag = None;
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
        if let Some(v) = res
            .get("min.compaction.lag.ms")
            .and_then(|e| e.value.as_deref()?.parse::<i64>().ok())
        {
            lag = Some(v);
        }
    }
    let policy = policy.unwrap_or_else(|| {
        // Brokers that do not report it use Kafka's default.
        tracing::warn!(changelog = %at.id, "kafka broker did not report cleanup.policy; assuming `delete`");
        "delete".to_owned()
    });
    Ok(TopicConfigs {
        cleanup_policy: policy.to_ascii_lowercase(),
        delete_retention_ms: retention.unwrap_or(DEFAULT_DELETE_RETENTION_MS),
        // Kafka's default when the broker does not report it.
        min_compaction_lag_ms: lag.unwrap_or(0).max(0),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::changelog::kafka::KafkaChangelog;

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
        assert_eq!(err.kind(), crate::ErrorKind::Config);
        // Not a check of the wording: the secret must appear nowhere.
        assert!(!format!("{err:#} {err:?}").contains("hunter7"), "{err:?}");
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
