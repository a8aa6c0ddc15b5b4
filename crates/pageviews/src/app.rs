//! The stream processor: one process of the consumer group.
//!
//! It consumes the input topic in a consumer group (eager `roundrobin`
//! assignment by default; see `docs/consumer-group.md`), keeps each user's
//! [`UserState`] in a RocksDB store per input partition (changelog: a Kafka
//! topic; snapshots: the repository), and
//! writes one [`Output`](crate::model::Output) per input record to the
//! output topic. Per batch of input records: apply them to the stores'
//! pending writes, produce their outputs and wait until the broker has
//! them, then commit the stores (state and input position in one changelog
//! batch per partition). Rebalances open and close the stores through
//! [`statesnap::group::GroupContext`].
//!
//! Guarantees: the state is exact (every input record applied once) through
//! crashes, rebalances and outages; the output is at least once — a record
//! delivered again after a crash produces an output identical to the first,
//! identified by its input `(partition, offset)`.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rdkafka::ClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{BorrowedMessage, DeliveryResult, Message};
use rdkafka::producer::{BaseRecord, Producer, ProducerContext, ThreadedProducer};
use serde::{Deserialize, Serialize};
use statesnap::group::{
    GroupContext, GroupOptions, MoveKind, PartitionMove, PartitionStores, place_standbys,
};
use statesnap::restore::Source;
use statesnap::runtime::{Bootstrap, SnapshotPolicy, StoreSpec};
use statesnap::{KafkaChangelog, KafkaOptions, Repository, RocksFormat, StateManager, StoreKey};

use crate::Result;
use crate::board::{Board, members_topic};
use crate::kafka::create_topics;
use crate::model::{Event, Position, UserState, apply, output, state_key};

/// The store name in the repository and in the changelog topic
/// (`<app>-users-changelog`).
pub const STORE: &str = "users";

/// One process's settings.
#[derive(Debug, Clone)]
pub struct AppConfig {
    /// This process's name, in reports.
    pub name: String,
    /// Kafka bootstrap servers.
    pub bootstrap: String,
    /// Repository URL (`s3://bucket/prefix`, `file:///dir`).
    pub repo: String,
    /// Application id: the consumer group, and the prefix of the store and
    /// changelog names.
    pub app_id: String,
    /// Input topic (page-view events keyed by user).
    pub input: String,
    /// Output topic.
    pub output: String,
    /// Partitions of the changelog topic (= the input's).
    pub partitions: i32,
    /// The input generation: 0, bumped each time the app moves to a new
    /// input topic with another partition count (after a reshard of its
    /// state), so that offsets of the new input, which start at 0 again,
    /// are ahead of the old ones recorded in each user's state.
    pub generation: u32,
    /// Where this process keeps its stores.
    pub data_dir: PathBuf,
    /// JSON-lines file the partition moves are appended to.
    pub report: Option<PathBuf>,
    /// Background snapshot interval.
    pub snapshot_every: Duration,
    /// Consumer group session timeout (how long a crashed member holds its
    /// partitions).
    pub session_timeout: Duration,
    /// Records per batch (one store commit per partition per batch).
    pub batch: usize,
    /// `partition.assignment.strategy`: `roundrobin` / `range` (eager) or
    /// `cooperative-sticky`.
    pub assignment: String,
    /// Warm standbys per partition (0 or 1): with 1, each partition is
    /// followed by one other process, placed from the membership board
    /// ([`crate::board`]).
    pub standbys: u32,
}

/// One line of the move report.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MoveLine {
    /// The process.
    pub process: String,
    /// When the move ended (ms since the epoch, the manager's clock; the
    /// processes run on one machine, so their moves sort by it).
    pub at_ms: i64,
    /// Input partition.
    pub partition: i32,
    /// `opened`, `closed`, `abandoned`, `failed`, or `standby` (a standby
    /// of the partition finished a (re)bootstrap here).
    pub event: String,
    /// For `opened`: `local`, `snapshot`, `replay` or `standby` (a
    /// promoted standby); for `standby`: where its store came from.
    pub source: Option<String>,
    /// For `opened` and `standby`: bytes downloaded from the repository.
    #[serde(default)]
    pub downloaded: Option<u64>,
    /// The snapshot opened from or handed off.
    pub snapshot: Option<String>,
    /// For `opened`: changelog records replayed.
    pub records_replayed: Option<u64>,
    /// Input offset consumption resumes at / was handed over at.
    pub position: Option<i64>,
    /// For `closed`: whether it took a new snapshot.
    pub took_snapshot: Option<bool>,
    /// For `opened`: attempts.
    pub attempts: Option<u32>,
    /// How long the move took (open: until ready).
    pub duration_ms: u64,
    /// Error or reason.
    pub detail: Option<String>,
}

impl MoveLine {
    fn new(process: &str, m: &PartitionMove) -> MoveLine {
        let mut line = MoveLine {
            process: process.to_owned(),
            at_ms: m.at_ms,
            partition: m.partition,
            duration_ms: u64::try_from(m.duration.as_millis()).unwrap_or(u64::MAX),
            ..MoveLine::default()
        };
        match &m.kind {
            MoveKind::Opened {
                source,
                records_replayed,
                bytes_downloaded,
                resume_at,
                attempts,
                ..
            } => {
                line.downloaded = Some(*bytes_downloaded);
                line.event = "opened".into();
                let (kind, snapshot) = source_name(source);
                line.source = Some(kind.into());
                line.snapshot = snapshot;
                line.records_replayed = Some(*records_replayed);
                line.position = *resume_at;
                line.attempts = Some(*attempts);
            }
            MoveKind::Closed {
                snapshot,
                took_snapshot,
                position,
                ..
            } => {
                line.event = "closed".into();
                line.snapshot = snapshot.map(|s| s.to_string());
                line.took_snapshot = Some(*took_snapshot);
                line.position = *position;
            }
            MoveKind::Abandoned { reason } => {
                line.event = "abandoned".into();
                line.detail = Some(reason.clone());
            }
            MoveKind::Failed { error } => {
                line.event = "failed".into();
                line.detail = Some(error.clone());
            }
        }
        line
    }

    /// A standby of `partition` finished `b`.
    fn standby(process: &str, partition: i32, b: &Bootstrap) -> MoveLine {
        let (kind, snapshot) = source_name(&b.source);
        MoveLine {
            process: process.to_owned(),
            at_ms: b.at_ms,
            partition,
            event: "standby".into(),
            source: Some(kind.into()),
            snapshot,
            downloaded: Some(b.bytes_downloaded),
            records_replayed: Some(b.records_replayed),
            duration_ms: u64::try_from(b.duration.as_millis()).unwrap_or(u64::MAX),
            detail: b.cause.map(|c| c.to_string()),
            ..MoveLine::default()
        }
    }
}

/// A source's name in the report, and its snapshot.
fn source_name(source: &Source) -> (&'static str, Option<String>) {
    match source {
        Source::Local { .. } => ("local", None),
        Source::Snapshot { id, .. } => ("snapshot", Some(id.to_string())),
        Source::FullReplay => ("replay", None),
        Source::Standby { .. } => ("standby", None),
    }
}

/// The stores of the app: one RocksDB store per input partition, its
/// changelog a partition of `<app>-users-changelog`.
#[derive(Debug)]
pub struct Stores {
    app_id: String,
    kafka: KafkaOptions,
    dir: PathBuf,
}

impl Stores {
    /// The stores of `config`.
    pub fn new(config: &AppConfig) -> Stores {
        Stores {
            app_id: config.app_id.clone(),
            kafka: changelog_options(&config.bootstrap, config.partitions),
            dir: config.data_dir.clone(),
        }
    }
}

/// The changelog's Kafka options.
pub fn changelog_options(bootstrap: &str, partitions: i32) -> KafkaOptions {
    KafkaOptions::new(bootstrap).partitions(partitions)
}

/// The spec of partition `partition`'s store, living in `dir`.
pub fn store_spec(
    app_id: &str,
    kafka: &KafkaOptions,
    partition: u32,
    dir: PathBuf,
) -> statesnap::Result<StoreSpec<RocksFormat, KafkaChangelog>> {
    let key = StoreKey::new(app_id, STORE, partition)?;
    let log = KafkaChangelog::open(key.changelog_id(), kafka.clone())?;
    Ok(StoreSpec::rocksdb(key, log, dir))
}

impl PartitionStores for Stores {
    type Format = RocksFormat;
    type Changelog = KafkaChangelog;

    fn spec(
        &self,
        _topic: &str,
        partition: i32,
    ) -> statesnap::Result<StoreSpec<RocksFormat, KafkaChangelog>> {
        let p = u32::try_from(partition).map_err(|_| {
            statesnap::Error::new(
                statesnap::ErrorKind::Config,
                format!("negative partition {partition}"),
            )
        })?;
        store_spec(
            &self.app_id,
            &self.kafka,
            p,
            self.dir.join(format!("{STORE}-{p}")),
        )
    }
}

/// Counts output records the broker refused for good.
#[derive(Debug, Default)]
struct Delivery {
    failed: AtomicU64,
}

impl ClientContext for Delivery {}

impl ProducerContext for Delivery {
    type DeliveryOpaque = ();
    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        if let Err((e, _)) = result {
            tracing::error!(error = %e, "output record not delivered");
            self.failed.fetch_add(1, Ordering::Relaxed);
        }
    }
}

type Consumer_ = BaseConsumer<GroupContext<Stores>>;

/// Runs one process of the app until `stop` is set (or SIGTERM / Ctrl-C
/// arrives), then hands its partitions off and leaves the group.
pub fn run(config: AppConfig, stop: Arc<AtomicBool>) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let _enter = runtime.enter();
    stop_on_signal(&runtime, &stop)?;
    let repo = runtime.block_on(Repository::open(&config.repo, Default::default()))?;
    let manager = StateManager::builder(repo)
        .policy(
            SnapshotPolicy::default()
                .every(config.snapshot_every)
                .close_deadline(Duration::from_secs(60)),
        )
        .build()?;
    let context = GroupContext::new(
        manager.clone(),
        runtime.handle().clone(),
        Stores::new(&config),
        GroupOptions::default(),
    );
    let (consumer, producer) = clients(&config, context)?;
    consumer.subscribe(&[&config.input])?;
    let mut report = match &config.report {
        Some(path) => Some(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)?,
        ),
        None => None,
    };
    let mut write_moves = |consumer: &Consumer_, more: Vec<MoveLine>| -> Result<()> {
        let moves = consumer.context().take_moves();
        let lines = moves.iter().map(|m| MoveLine::new(&config.name, m));
        for line in lines.chain(more) {
            if let Some(f) = report.as_mut() {
                writeln!(f, "{}", serde_json::to_string(&line)?)?;
                f.flush()?;
            }
        }
        Ok(())
    };
    let mut standbys = match config.standbys {
        0 => None,
        _ => Some(Standbys::new(&config, &runtime)?),
    };
    tracing::info!(name = %config.name, "consuming `{}`", config.input);
    while !stop.load(Ordering::Relaxed) {
        let produced = poll_batch(&consumer, &producer, &config)?;
        let ready = match standbys.as_mut() {
            // Standbys are an optimisation: a board the broker cannot serve
            // now is tried again at the next sync.
            Some(s) => s
                .sync(consumer.context(), &config, manager.now_ms())
                .unwrap_or_else(|e| {
                    tracing::warn!(error = %e, "membership board sync failed; retried");
                    Vec::new()
                }),
            None => Vec::new(),
        };
        write_moves(&consumer, ready)?;
        if let Some(e) = consumer.context().take_error() {
            return Err(format!("{}: a store could not be opened: {e}", config.name).into());
        }
        if produced > 0 {
            // Outputs before state: a crash between the two repeats outputs
            // (identical ones), never loses them.
            producer.flush(Duration::from_secs(300))?;
            let failed = producer.context().failed.load(Ordering::Relaxed);
            if failed > 0 {
                return Err(format!(
                    "{}: {failed} output records were not delivered; exiting without committing \
                     their state (the next owner processes them again)",
                    config.name
                )
                .into());
            }
        }
        if let Err(e) = consumer.context().commit_all(&consumer) {
            tracing::warn!(error = %e, "store commit failed; retried with the next batch");
        }
    }
    tracing::info!(name = %config.name, "stopping: handing partitions off");
    if let Some(s) = standbys.as_mut()
        && let Err(e) = s.board.leave()
    {
        tracing::warn!(error = %e, "could not leave the membership board");
    }
    consumer.context().close_all();
    write_moves(&consumer, Vec::new())?;
    drop(consumer);
    runtime.block_on(manager.shutdown());
    Ok(())
}

/// This process's standbys: the membership board, synced every half
/// second, and the bootstraps already reported.
struct Standbys {
    board: Board,
    last_sync: Option<Instant>,
    reported: BTreeMap<i32, usize>,
}

impl Standbys {
    fn new(config: &AppConfig, runtime: &tokio::runtime::Runtime) -> Result<Standbys> {
        let topic = members_topic(&config.app_id);
        runtime.block_on(create_topics(&config.bootstrap, &[(&topic, 1)]))?;
        // A killed process's entry outlives it by this much: long enough
        // for the group to notice and reassign its partitions.
        let expire = config.session_timeout * 4;
        Ok(Standbys {
            board: Board::new(&config.bootstrap, &topic, &config.name, expire)?,
            last_sync: None,
            reported: BTreeMap::new(),
        })
    }

    /// Publishes what this process owns, reads the board, follows what the
    /// placement gives this process; returns the report lines of
    /// bootstraps that finished since the last call.
    fn sync(
        &mut self,
        context: &GroupContext<Stores>,
        config: &AppConfig,
        now_ms: i64,
    ) -> Result<Vec<MoveLine>> {
        if self
            .last_sync
            .is_some_and(|t| t.elapsed() < Duration::from_millis(500))
        {
            return Ok(Vec::new());
        }
        self.last_sync = Some(Instant::now());
        let mine: Vec<i32> = context
            .assigned()
            .into_iter()
            .filter(|(t, _)| *t == config.input)
            .map(|(_, p)| p)
            .collect();
        self.board.publish(&mine, now_ms)?;
        self.board.read()?;
        let mut owners = self.board.owners(now_ms);
        owners.insert(config.name.clone(), mine.into_iter().collect());
        let placed = place_standbys(&owners);
        let wanted: Vec<(String, i32)> = placed
            .get(&config.name)
            .into_iter()
            .flatten()
            .map(|p| (config.input.clone(), *p))
            .collect();
        for e in context.set_standbys(wanted) {
            tracing::warn!(error = %e, "standby not started; retried at the next sync");
        }
        let mut lines = Vec::new();
        let standbys = context.standbys();
        for ((_, p), status) in &standbys {
            let seen = self.reported.entry(*p).or_default();
            for b in status.bootstraps.iter().skip(*seen) {
                lines.push(MoveLine::standby(&config.name, *p, b));
            }
            *seen = status.bootstraps.len();
        }
        // A standby stopped and started again reports its bootstraps anew.
        let running: BTreeSet<i32> = standbys.iter().map(|((_, p), _)| *p).collect();
        self.reported.retain(|p, _| running.contains(p));
        Ok(lines)
    }
}

/// Sets `stop` when SIGTERM or Ctrl-C arrives.
fn stop_on_signal(runtime: &tokio::runtime::Runtime, stop: &Arc<AtomicBool>) -> Result<()> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let on_signal = stop.clone();
    runtime.spawn(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
        on_signal.store(true, Ordering::Relaxed);
    });
    Ok(())
}

/// The group's consumer, on `context`, and the idempotent producer of the
/// outputs.
fn clients(
    config: &AppConfig,
    context: GroupContext<Stores>,
) -> Result<(Consumer_, ThreadedProducer<Delivery>)> {
    let mut consumer_config = ClientConfig::new();
    if let Ok(debug) = std::env::var("PAGEVIEWS_KAFKA_DEBUG") {
        // librdkafka's debug contexts, e.g. `cgrp` for the group protocol.
        consumer_config.set("debug", debug);
    }
    let consumer: Consumer_ = consumer_config
        .set("bootstrap.servers", &config.bootstrap)
        .set("group.id", &config.app_id)
        .set("client.id", &config.name)
        .set("partition.assignment.strategy", &config.assignment)
        .set(
            "session.timeout.ms",
            config.session_timeout.as_millis().to_string(),
        )
        .set("heartbeat.interval.ms", "1000")
        .set("enable.auto.commit", "true")
        .set("auto.commit.interval.ms", "500")
        .set("enable.auto.offset.store", "false")
        .create_with_context(context)?;
    let producer: ThreadedProducer<Delivery> = ClientConfig::new()
        .set("bootstrap.servers", &config.bootstrap)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("linger.ms", "5")
        .set("message.timeout.ms", "300000")
        .create_with_context(Delivery::default())?;
    Ok((consumer, producer))
}

/// Polls and processes up to `config.batch` records within 100 ms;
/// returns the number of outputs produced.
fn poll_batch(
    consumer: &Consumer_,
    producer: &ThreadedProducer<Delivery>,
    config: &AppConfig,
) -> Result<usize> {
    let batch_end = Instant::now() + Duration::from_millis(100);
    let mut produced = 0usize;
    let mut polled = 0usize;
    while polled < config.batch {
        let left = batch_end.saturating_duration_since(Instant::now());
        let Some(m) = consumer.poll(left) else { break };
        polled += 1;
        match m {
            Ok(m) => produced += process(consumer, producer, config, &m)?,
            Err(e) => tracing::warn!(error = %e, "consumer error"),
        }
        if left.is_zero() {
            break;
        }
    }
    Ok(produced)
}

/// Applies one input record; returns the number of outputs produced (0 or 1).
fn process(
    consumer: &Consumer_,
    producer: &ThreadedProducer<Delivery>,
    config: &AppConfig,
    m: &BorrowedMessage<'_>,
) -> Result<usize> {
    let (partition, offset) = (m.partition(), m.offset());
    let at = Position {
        generation: config.generation,
        offset,
    };
    let event: Option<Event> = m.payload().and_then(|p| serde_json::from_slice(p).ok());
    let out =
        consumer
            .context()
            .with_partition(m.topic(), partition, |p| -> statesnap::Result<_> {
                if !p.is_new(offset) {
                    return Ok(None);
                }
                let Some(event) = event else {
                    tracing::warn!(
                        partition,
                        offset,
                        "skipping a record that is not a page-view event"
                    );
                    p.processed(offset);
                    return Ok(None);
                };
                let key = state_key(&event.user);
                let prev: Option<UserState> = match p.handle().get(&key)? {
                    Some(v) => Some(serde_json::from_slice(&v).map_err(|e| {
                        statesnap::Error::new(
                            statesnap::ErrorKind::Corrupt,
                            format!("state of user `{}` does not decode: {e}", event.user),
                        )
                    })?),
                    None => None,
                };
                p.processed(offset);
                if prev.as_ref().is_some_and(|s| s.covers(at)) {
                    // Applied before a crash: its output went out then.
                    return Ok(None);
                }
                let next = apply(prev.as_ref(), &event, at);
                let value = serde_json::to_vec(&next).map_err(|e| {
                    statesnap::Error::new(
                        statesnap::ErrorKind::Internal,
                        format!("encoding user state: {e}"),
                    )
                })?;
                p.handle_mut().put(key, value);
                Ok(Some(output(&event.user, partition, offset, &next)))
            });
    let Some(out) = out.transpose()?.flatten() else {
        return Ok(0);
    };
    let payload = serde_json::to_vec(&out)?;
    let mut record = BaseRecord::to(&config.output)
        .key(out.user.as_bytes())
        .payload(&payload)
        .partition(partition);
    loop {
        match producer.send(record) {
            Ok(()) => return Ok(1),
            Err((e, r)) => {
                // Queue full: wait for deliveries.
                tracing::debug!(error = %e, "output queue full");
                std::thread::sleep(Duration::from_millis(10));
                record = r;
            }
        }
    }
}
