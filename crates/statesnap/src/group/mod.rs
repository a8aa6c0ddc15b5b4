//! Consumer-group glue (feature `kafka`): an rdkafka consumer whose
//! rebalances open and close statesnap stores.
//!
//! A stream processor keeps one store per input partition it consumes. When
//! the group moves a partition, its state has to move with it: the old
//! owner hands it off ([`StateHandle::close`]: a snapshot at the last
//! committed offset) and the new owner opens it ([`StateManager::open`]:
//! the local store if still valid, else that snapshot and the tail, else an
//! older snapshot, else a replay). [`GroupContext`] is an rdkafka
//! [`ConsumerContext`] that does both inside the rebalance callback, so a
//! partition is never consumed without its state:
//!
//! - **assigned** → the stores are opened (concurrently, retrying transient
//!   failures for [`GroupOptions::open_timeout`]), and each partition is
//!   assigned at the input position its own state recorded — not at the
//!   group's committed offset, which may disagree with the state after a
//!   crash;
//! - **revoked** → the last processed position is committed into the state
//!   and the stores are closed (handoff snapshots, concurrently) before the
//!   partitions are given up, so the next owner replays nothing;
//! - **lost** (the session expired: another member may own them already) →
//!   the stores are abandoned without a handoff.
//!
//! Both the eager and the cooperative (`cooperative-sticky`) protocols work.
//! Cooperative revokes only the partitions that move; eager closes and
//! reopens every partition on every rebalance (the reopen takes the local
//! store, but each close takes a handoff snapshot). In both, the group does
//! not hand a revoked partition to its next owner before the old owner's
//! callback returned, which orders the handoff snapshot before the next
//! `open`; should a broker assign a partition twice all the same, the Kafka
//! changelog's writer fence turns the old owner's appends `stale` and
//! [`GroupContext::commit_all`] gives its store up. `docs/consumer-group.md`
//! says which protocol the example uses against tansu, and why.
//!
//! # Input positions and exactness
//!
//! Each store keeps its input partition's position under
//! [`INPUT_POSITION_KEY`], written by [`Partition::commit`] in the same
//! changelog batch as the state it goes with. The position written with a
//! batch is the one the *previous* successful commit made good: a changelog
//! append that fails may have landed any subset of its records, so a
//! position written with the batch it covers could land without part of
//! that batch. After a crash, consumption therefore resumes at the start of
//! the last batch, and the records of that batch are delivered again. State
//! stays exact if every update is idempotent per key: record in each value
//! the input offset that last changed it, and skip a record at or below it
//! (the `pageviews` example does). A graceful handoff writes the final
//! position on its own, so the next owner redelivers nothing.
//!
//! # Threads
//!
//! rdkafka runs the rebalance callback inside `poll`, on the polling
//! thread, and the callback blocks there until the stores are open or
//! closed. Poll from a plain thread (or `spawn_blocking`), not from an
//! async task: the callback drives the manager's async calls with
//! [`tokio::runtime::Handle::block_on`]. Give it the handle of a
//! multi-thread runtime: the background snapshot a `close` waits for runs on
//! that runtime's workers, which a current-thread runtime does not have
//! while another thread blocks on its handle.
//!
//! ```no_run
//! use rdkafka::ClientConfig;
//! use rdkafka::consumer::{BaseConsumer, Consumer};
//! use rdkafka::message::Message;
//! use statesnap::group::{GroupContext, GroupOptions, PartitionStores};
//! use statesnap::runtime::StoreSpec;
//! use statesnap::{KafkaChangelog, KafkaOptions, RocksFormat, StateManager, StoreKey};
//!
//! struct Counts {
//!     kafka: KafkaOptions,
//!     dir: std::path::PathBuf,
//! }
//!
//! impl PartitionStores for Counts {
//!     type Format = RocksFormat;
//!     type Changelog = KafkaChangelog;
//!     fn spec(&self, _topic: &str, partition: i32) -> statesnap::Result<StoreSpec<RocksFormat, KafkaChangelog>> {
//!         let p = partition as u32;
//!         let key = StoreKey::new("app", "counts", p)?;
//!         let log = KafkaChangelog::open(key.changelog_id(), self.kafka.clone())?;
//!         Ok(StoreSpec::rocksdb(key, log, self.dir.join(format!("counts-{p}"))))
//!     }
//! }
//!
//! # fn run(manager: StateManager, runtime: tokio::runtime::Handle) -> statesnap::Result<()> {
//! let stores = Counts { kafka: KafkaOptions::new("127.0.0.1:9092"), dir: "/var/lib/app".into() };
//! let context = GroupContext::new(manager, runtime, stores, GroupOptions::default());
//! let consumer: BaseConsumer<_> = ClientConfig::new()
//!     .set("bootstrap.servers", "127.0.0.1:9092")
//!     .set("group.id", "app")
//!     .set("partition.assignment.strategy", "cooperative-sticky")
//!     .set("enable.auto.offset.store", "false")
//!     .create_with_context(context)
//!     .expect("consumer");
//! consumer.subscribe(&["events"]).expect("subscribe");
//! loop {
//!     let Some(Ok(m)) = consumer.poll(std::time::Duration::from_millis(100)) else { continue };
//!     let (topic, partition, offset) = (m.topic().to_owned(), m.partition(), m.offset());
//!     let key = m.key().unwrap_or_default().to_vec();
//!     consumer.context().with_partition(&topic, partition, |p| -> statesnap::Result<()> {
//!         if !p.is_new(offset) {
//!             return Ok(()); // already in the state
//!         }
//!         // ... read and update p.handle_mut() ...
//!         p.handle_mut().put(key, "value");
//!         p.processed(offset);
//!         Ok(())
//!     });
//!     consumer.context().commit_all(&consumer)?; // usually once per batch of messages
//! #   break;
//! }
//! consumer.context().close_all(); // handoff before leaving the group
//! # Ok(()) }
//! ```

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use bytes::Bytes;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, RebalanceProtocol};
use rdkafka::types::RDKafkaRespErr;
use rdkafka::{ClientContext, Offset, TopicPartitionList};

use crate::changelog::Changelog;
use crate::error::{Error, ErrorKind, Result};
use crate::format::StoreFormat;
use crate::repo::SnapshotId;
use crate::restore::Source;
use crate::runtime::{StandbyHandle, StateHandle, StateManager, StoreSpec};
use crate::store::logged::CommitInfo;

mod standby;
pub use standby::place_standbys;

/// The key under which each store keeps its input partition's position
/// (the next input offset its committed state does not cover), as 8
/// big-endian bytes. Starts with a NUL byte; keep application keys clear of
/// it. A reshard leaves it behind
/// ([`PARTITION_LOCAL_PREFIX`](crate::reshard::PARTITION_LOCAL_PREFIX)): the
/// resharded application starts its new input partitions at their
/// beginning.
pub const INPUT_POSITION_KEY: &[u8] = b"\x00statesnap/input-position";

/// Which store serves an input partition. Implement it for your
/// application; [`GroupContext`] calls it on every assignment.
pub trait PartitionStores: Send + Sync + 'static {
    /// The stores' format.
    type Format: StoreFormat + 'static;
    /// Their changelog.
    type Changelog: Changelog + 'static;

    /// The store of input `partition` of `topic`. Called again on a retry,
    /// so it may connect (a transient error is retried).
    fn spec(&self, topic: &str, partition: i32)
    -> Result<StoreSpec<Self::Format, Self::Changelog>>;
}

/// How [`GroupContext`] opens stores.
#[derive(Debug, Clone)]
pub struct GroupOptions {
    /// How long an assignment retries a store whose open fails with a
    /// `transient` error (repository or broker unreachable) before it gives
    /// up (default 2 min; keep it under `max.poll.interval.ms`).
    pub open_timeout: Duration,
    /// The first retry's delay; each retry doubles it, up to 5 s (default
    /// 200 ms).
    pub retry_backoff: Duration,
    /// How long an assignment waits for a standby of the partition to
    /// catch up with its changelog when it is promoted (default 30 s);
    /// past it the store is opened instead.
    pub promote_deadline: Duration,
}

impl Default for GroupOptions {
    fn default() -> Self {
        GroupOptions {
            open_timeout: Duration::from_secs(120),
            retry_backoff: Duration::from_millis(200),
            promote_deadline: Duration::from_secs(30),
        }
    }
}

/// What happened to one partition in a rebalance.
#[derive(Debug, Clone, PartialEq)]
pub enum MoveKind {
    /// The store was opened and the partition assigned.
    Opened {
        /// Where its state came from.
        source: Source,
        /// Changelog records replayed on top of it.
        records_replayed: u64,
        /// Bytes downloaded from the repository (none for a local store
        /// or a promoted standby).
        bytes_downloaded: u64,
        /// Snapshots newer than the source that were not used.
        snapshots_skipped: usize,
        /// The input offset consumption resumes at (`None`: from the
        /// beginning).
        resume_at: Option<i64>,
        /// Open attempts (more than one after transient failures).
        attempts: u32,
    },
    /// The store was closed with a handoff.
    Closed {
        /// The snapshot the next owner restores from.
        snapshot: Option<SnapshotId>,
        /// Its changelog offset.
        offset: Option<u64>,
        /// Whether the close took a new snapshot.
        took_snapshot: bool,
        /// The input position handed over.
        position: Option<i64>,
    },
    /// The store was dropped without a handoff (assignment lost, writer
    /// fenced, or a failed close: nothing committed is lost, the next owner
    /// replays more).
    Abandoned {
        /// Why.
        reason: String,
    },
    /// The store could not be opened; the partition was not assigned and
    /// [`GroupContext::take_error`] returns the error.
    Failed {
        /// The error.
        error: String,
    },
}

/// One partition move, for reports.
#[derive(Debug, Clone, PartialEq)]
pub struct PartitionMove {
    /// Input topic.
    pub topic: String,
    /// Input partition.
    pub partition: i32,
    /// What happened.
    pub kind: MoveKind,
    /// How long it took (for an open: until the store was ready).
    pub duration: Duration,
    /// When it ended, by the manager's clock (ms since the epoch): moves
    /// of several processes on one machine can be put in order by it.
    pub at_ms: i64,
}

/// One assigned input partition and its store.
pub struct Partition<F: StoreFormat + 'static, C: Changelog + 'static> {
    handle: StateHandle<F, C>,
    /// The next input offset the committed state covers.
    committed: Option<i64>,
    /// The next input offset after the last processed record.
    next: Option<i64>,
    /// The position last written to the store.
    written: Option<i64>,
}

impl<F: StoreFormat, C: Changelog> std::fmt::Debug for Partition<F, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Partition")
            .field("handle", &self.handle)
            .field("committed", &self.committed)
            .field("next", &self.next)
            .finish_non_exhaustive()
    }
}

impl<F: StoreFormat, C: Changelog> Partition<F, C> {
    /// A partition resuming at the position its store recorded.
    fn new(handle: StateHandle<F, C>) -> Result<Self> {
        let position = recorded_position(&handle)?;
        Ok(Partition {
            handle,
            committed: position,
            next: None,
            written: position,
        })
    }

    /// The store.
    pub fn handle(&self) -> &StateHandle<F, C> {
        &self.handle
    }

    /// The store, to read and write.
    pub fn handle_mut(&mut self) -> &mut StateHandle<F, C> {
        &mut self.handle
    }

    /// The input offset the committed state covers up to (exclusive).
    pub fn position(&self) -> Option<i64> {
        self.committed
    }

    /// Whether the input record at `offset` is not yet covered by committed
    /// state. Records of the last batch before a crash are new again (see
    /// the module docs): keep updates idempotent per key.
    pub fn is_new(&self, offset: i64) -> bool {
        self.next.or(self.committed).is_none_or(|c| offset >= c)
    }

    /// Records that the input record at `offset` has been applied to the
    /// store's pending writes.
    pub fn processed(&mut self, offset: i64) {
        self.next = Some(offset.saturating_add(1));
    }

    /// Commits the pending writes together with the input position the
    /// previous commit made good; on success the processed position becomes
    /// the committed one. On error the pending writes stay: retry later
    /// (writes are absolute values, so a batch that partly landed is simply
    /// written again).
    pub fn commit(&mut self) -> Result<Option<CommitInfo>> {
        if self.committed != self.written
            && let Some(c) = self.committed
        {
            self.handle.put(
                Bytes::from_static(INPUT_POSITION_KEY),
                Bytes::copy_from_slice(&c.to_be_bytes()),
            );
        }
        let info = self.handle.commit()?;
        self.written = self.committed;
        if self.next.is_some() {
            self.committed = self.next;
        }
        Ok(info)
    }

    /// Commits what is pending, then the final position on its own, so
    /// the store covers exactly the processed records.
    fn commit_final(&mut self) -> Result<()> {
        self.commit()?;
        if self.committed != self.written {
            self.commit()?;
        }
        Ok(())
    }
}

/// Reads the input position a store recorded (see [`INPUT_POSITION_KEY`]).
pub fn recorded_position<F: StoreFormat, C: Changelog>(
    handle: &StateHandle<F, C>,
) -> Result<Option<i64>> {
    let Some(v) = handle.get(INPUT_POSITION_KEY)? else {
        return Ok(None);
    };
    let bytes: [u8; 8] = v.as_ref().try_into().map_err(|_| {
        Error::new(
            ErrorKind::Corrupt,
            format!(
                "input position in store `{}` is {} bytes, expected 8; the key {:?} is reserved \
                 for the consumer-group glue",
                handle.store_key(),
                v.len(),
                String::from_utf8_lossy(INPUT_POSITION_KEY)
            ),
        )
    })?;
    Ok(Some(i64::from_be_bytes(bytes)))
}

type StandbyMap<F, C> = BTreeMap<(String, i32), StandbyHandle<F, C>>;
type PartitionMap<F, C> = BTreeMap<(String, i32), Partition<F, C>>;

/// An rdkafka [`ConsumerContext`] that opens and closes one statesnap store
/// per assigned partition (see the module docs).
pub struct GroupContext<S: PartitionStores> {
    manager: StateManager,
    runtime: tokio::runtime::Handle,
    stores: S,
    options: GroupOptions,
    partitions: Mutex<PartitionMap<S::Format, S::Changelog>>,
    /// Warm standbys of partitions other members own
    /// ([`GroupContext::set_standbys`]).
    standbys: Mutex<StandbyMap<S::Format, S::Changelog>>,
    moves: Mutex<Vec<PartitionMove>>,
    error: Mutex<Option<Error>>,
}

impl<S: PartitionStores> std::fmt::Debug for GroupContext<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupContext")
            .field("options", &self.options)
            .field("partitions", &self.assigned())
            .finish_non_exhaustive()
    }
}

use crate::util::lock;

impl<S: PartitionStores> GroupContext<S> {
    /// A context opening `stores` through `manager`; `runtime` drives the
    /// manager's async calls from the polling thread.
    pub fn new(
        manager: StateManager,
        runtime: tokio::runtime::Handle,
        stores: S,
        options: GroupOptions,
    ) -> Self {
        GroupContext {
            manager,
            runtime,
            stores,
            options,
            partitions: Mutex::new(BTreeMap::new()),
            standbys: Mutex::new(BTreeMap::new()),
            moves: Mutex::new(Vec::new()),
            error: Mutex::new(None),
        }
    }

    /// The state manager.
    pub fn manager(&self) -> &StateManager {
        &self.manager
    }

    /// The partitions whose stores are open.
    pub fn assigned(&self) -> Vec<(String, i32)> {
        lock(&self.partitions).keys().cloned().collect()
    }

    /// Runs `f` on the store of `partition` of `topic`; `None` if it is not
    /// open here (not assigned, or given up after its writer was fenced: the
    /// record belongs to another owner now).
    pub fn with_partition<R>(
        &self,
        topic: &str,
        partition: i32,
        f: impl FnOnce(&mut Partition<S::Format, S::Changelog>) -> R,
    ) -> Option<R> {
        let mut map = lock(&self.partitions);
        map.get_mut(&(topic.to_owned(), partition)).map(f)
    }

    /// Commits every open partition ([`Partition::commit`]) and stores the
    /// committed positions as the consumer's offsets (effective with
    /// `enable.auto.offset.store=false` and auto commit; the group's offsets
    /// are for lag monitoring only, the stores' positions are what
    /// consumption resumes at). A partition whose writer was fenced
    /// (`stale`: another member owns it now) is abandoned. Returns the first
    /// other error; the failed partitions keep their pending writes for the
    /// next call.
    pub fn commit_all<C2: ConsumerContext>(&self, consumer: &BaseConsumer<C2>) -> Result<()> {
        let mut first_error = None;
        let mut fenced = Vec::new();
        let mut map = lock(&self.partitions);
        for ((topic, partition), p) in map.iter_mut() {
            match p.commit() {
                Ok(_) => {
                    if let Some(c) = p.committed {
                        // Without enable.auto.offset.store=false this
                        // fails; the offsets are informational.
                        let _ = consumer.store_offset(topic, *partition, c);
                    }
                }
                Err(e) if e.kind() == ErrorKind::Stale => {
                    fenced.push(((topic.clone(), *partition), e));
                }
                Err(e) => {
                    tracing::warn!(topic, partition, error = %e, "commit failed; retrying with the next batch");
                    first_error.get_or_insert(e);
                }
            }
        }
        let dropped: Vec<_> = fenced
            .into_iter()
            .filter_map(|(k, e)| map.remove(&k).map(|p| (k, p, e)))
            .collect();
        drop(map);
        for ((topic, partition), p, e) in dropped {
            tracing::warn!(topic, partition, error = %e, "store given up: another member owns the partition");
            let started = Instant::now();
            self.runtime.block_on(p.handle.abandon());
            self.record(
                topic,
                partition,
                started,
                MoveKind::Abandoned {
                    reason: e.to_string(),
                },
            );
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Hands every open store off (as a revoke does) and stops the
    /// standbys — call it before leaving the group on a graceful shutdown,
    /// then drop the consumer.
    pub fn close_all(&self) {
        let keys = self.assigned();
        self.close(keys, false);
        self.set_standbys(Vec::new());
    }

    /// The moves so far, oldest first; clears the list.
    pub fn take_moves(&self) -> Vec<PartitionMove> {
        std::mem::take(&mut *lock(&self.moves))
    }

    /// An error that left partitions unassigned (a store that could not be
    /// opened within [`GroupOptions::open_timeout`]); clears it. The
    /// partition is not consumed here: leave the group (exit, or
    /// resubscribe) so it is assigned again.
    pub fn take_error(&self) -> Option<Error> {
        lock(&self.error).take()
    }

    fn record(&self, topic: String, partition: i32, started: Instant, kind: MoveKind) {
        let m = PartitionMove {
            topic,
            partition,
            kind,
            duration: started.elapsed(),
            at_ms: self.manager.now_ms(),
        };
        tracing::info!(topic = %m.topic, partition = m.partition, kind = ?m.kind, duration_ms = m.duration.as_millis() as u64, "partition moved");
        lock(&self.moves).push(m);
    }

    /// Opens the store of a newly assigned partition: promotes this
    /// member's standby of it if it has one, else (or if the promotion
    /// fails) opens it, retrying transient failures.
    async fn open_one(
        &self,
        topic: &str,
        partition: i32,
    ) -> (Result<Partition<S::Format, S::Changelog>>, u32) {
        let mut fallback = match self.take_standby(topic, partition) {
            Some(standby) => match self.promote(standby, topic, partition).await {
                Ok(handle) => return (Partition::new(handle), 1),
                Err(spec) => spec,
            },
            None => None,
        };
        let deadline = Instant::now() + self.options.open_timeout;
        let mut delay = self.options.retry_backoff;
        let mut attempts = 0;
        loop {
            attempts += 1;
            let result: Result<Partition<S::Format, S::Changelog>> = async {
                let spec = match fallback.take() {
                    Some(spec) => spec,
                    None => self.stores.spec(topic, partition)?,
                };
                Partition::new(self.manager.open(spec).await?)
            }
            .await;
            match result {
                Err(e) if e.kind() == ErrorKind::Transient && Instant::now() + delay < deadline => {
                    tracing::warn!(topic, partition, attempts, error = %e, "store open failed; retrying");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(5));
                }
                r => return (r, attempts),
            }
        }
    }

    fn assign(&self, tpl: &TopicPartitionList) -> TopicPartitionList {
        let started = Instant::now();
        let mut out = TopicPartitionList::new();
        let mut to_open = Vec::new();
        {
            let map = lock(&self.partitions);
            for key in keys(tpl) {
                match map.get(&key) {
                    // Still open here (a lost assignment given back): resume
                    // where its state is.
                    Some(p) => add(&mut out, &key.0, key.1, p.committed),
                    None => to_open.push(key),
                }
            }
        }
        let opened = self.runtime.block_on(futures::future::join_all(
            to_open.iter().map(|(t, p)| self.open_one(t, *p)),
        ));
        for ((topic, partition), (result, attempts)) in to_open.into_iter().zip(opened) {
            match result {
                Ok(p) => {
                    let report = p.handle.report();
                    let kind = MoveKind::Opened {
                        source: report.source.clone(),
                        records_replayed: report.replay.records,
                        bytes_downloaded: report.transfer.bytes_downloaded,
                        snapshots_skipped: report.skipped.len(),
                        resume_at: p.committed,
                        attempts,
                    };
                    add(&mut out, &topic, partition, p.committed);
                    lock(&self.partitions).insert((topic.clone(), partition), p);
                    self.record(topic, partition, started, kind);
                }
                Err(e) => {
                    tracing::error!(topic, partition, attempts, error = %e, "store could not be opened; partition left unassigned");
                    self.record(
                        topic,
                        partition,
                        started,
                        MoveKind::Failed {
                            error: e.to_string(),
                        },
                    );
                    lock(&self.error).get_or_insert(e);
                }
            }
        }
        out
    }

    fn close(&self, keys: Vec<(String, i32)>, lost: bool) {
        let started = Instant::now();
        let taken: Vec<_> = {
            let mut map = lock(&self.partitions);
            keys.into_iter()
                .filter_map(|k| map.remove(&k).map(|p| (k, p)))
                .collect()
        };
        let results = self
            .runtime
            .block_on(futures::future::join_all(taken.into_iter().map(
                |(key, mut p)| async move {
                    if lost {
                        p.handle.abandon().await;
                        return (key, Ok(None));
                    }
                    if let Err(e) = p.commit_final() {
                        p.handle.abandon().await;
                        return (key, Err(e));
                    }
                    let position = p.committed;
                    (key, p.handle.close().await.map(|r| Some((r, position))))
                },
            )));
        for ((topic, partition), r) in results {
            let kind = match r {
                Ok(Some((r, position))) => MoveKind::Closed {
                    snapshot: r.snapshot,
                    offset: r.offset,
                    took_snapshot: r.took_snapshot,
                    position,
                },
                Ok(None) => MoveKind::Abandoned {
                    reason: "assignment lost".into(),
                },
                Err(e) => {
                    tracing::warn!(topic, partition, error = %e, "handoff failed; the next owner replays more");
                    MoveKind::Abandoned {
                        reason: format!("handoff failed: {e}"),
                    }
                }
            };
            self.record(topic, partition, started, kind);
        }
    }
}

/// The `(topic, partition)` pairs of a rebalance's list.
fn keys(tpl: &TopicPartitionList) -> Vec<(String, i32)> {
    tpl.elements()
        .iter()
        .map(|e| (e.topic().to_owned(), e.partition()))
        .collect()
}

fn add(tpl: &mut TopicPartitionList, topic: &str, partition: i32, position: Option<i64>) {
    let offset = position.map_or(Offset::Beginning, Offset::Offset);
    // Only fails for an invalid offset value, which these are not.
    let _ = tpl.add_partition_offset(topic, partition, offset);
}

impl<S: PartitionStores> ClientContext for GroupContext<S> {}

impl<S: PartitionStores> ConsumerContext for GroupContext<S> {
    fn rebalance(
        &self,
        consumer: &BaseConsumer<Self>,
        err: RDKafkaRespErr,
        tpl: &mut TopicPartitionList,
    ) {
        let cooperative = matches!(
            consumer.rebalance_protocol(),
            RebalanceProtocol::Cooperative
        );
        let result = match err {
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => {
                let assigned = self.assign(tpl);
                if cooperative {
                    consumer.incremental_assign(&assigned)
                } else {
                    consumer.assign(&assigned)
                }
            }
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS => {
                self.close(keys(tpl), consumer.assignment_lost());
                if cooperative {
                    consumer.incremental_unassign(tpl)
                } else {
                    consumer.unassign()
                }
            }
            other => {
                tracing::error!(error = ?other, "rebalance error; giving up every partition without a handoff");
                self.close(self.assigned(), true);
                consumer.unassign()
            }
        };
        if let Err(e) = result {
            tracing::error!(error = %e, "rebalance: (un)assign failed");
            lock(&self.error).get_or_insert(Error::new(
                ErrorKind::Transient,
                format!("consumer (un)assign failed in a rebalance: {e}"),
            ));
        }
    }
}

#[cfg(test)]
mod tests;
