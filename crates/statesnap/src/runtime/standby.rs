//! [`StandbyHandle`]: a warm copy of a store partition another process
//! owns, bootstrapped from a snapshot and kept current by following the
//! changelog, so a failover is a promotion instead of a restore.
//!
//! A standby is one background task on the manager's runtime. It first
//! bootstraps the way [`StateManager::open`] restores (the local store if
//! it is still valid, else the newest usable snapshot and the tail, a full
//! replay only when no snapshot is usable), then polls the changelog and
//! replays whatever it holds beyond the standby's offset, to its end at
//! that moment: the state it holds is always exactly the log's state at
//! one offset. It never appends to the changelog and never writes a
//! snapshot; its bootstraps share the manager's transfer budget.
//!
//! It rebootstraps, instead of replaying what cannot be replayed exactly,
//! when the log's horizon passes its offset (it fell too far behind a
//! compacting log), when the log has a new lineage or lost records it had
//! applied, and when its directory disappears. A changelog or repository
//! that cannot be reached is retried with a backoff; the lag grows
//! meanwhile and [`StandbyStatus`] says why.
//!
//! [`StandbyHandle::promote`] stops the follower, replays what is left
//! up to the log's end and hands the store to a [`StateHandle`], which
//! registers as the partition's writer in this manager; its first append
//! claims the changelog and fences the old owner, as every new owner's
//! does. Nothing is downloaded: time to ready is the remaining lag.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::handle::{self, OwnedDir, Parts};
use super::{StateHandle, StateManager, StoreSpec, cancelled, lock};
use crate::changelog::Changelog;
use crate::error::{Error, ErrorKind, Reason, Result};
use crate::format::StoreFormat;
use crate::repo::StoreKey;
use crate::restore::{ReplayOptions, ReplayReport, RestoreOptions, RestoreReport, Source, replay};
use crate::store::StateStore;

/// How standbys follow their changelog.
#[derive(Debug, Clone)]
pub struct StandbyOptions {
    /// How often the changelog's end is polled when the standby is caught
    /// up (default 50 ms). Each poll that finds new records replays all of
    /// them before the next.
    pub poll_interval: Duration,
    /// The first retry's delay after a failed poll or bootstrap (broker or
    /// repository unreachable); each retry doubles it, up to
    /// `max_backoff` (defaults 200 ms and 5 s).
    pub retry_backoff: Duration,
    /// The longest delay between retries.
    pub max_backoff: Duration,
    /// How often the lineage and horizon are checked on an idle log, where
    /// no replay runs to check them (default 5 s).
    pub idle_check_interval: Duration,
    /// Replay tuning for each poll.
    pub replay: ReplayOptions,
}

impl Default for StandbyOptions {
    fn default() -> Self {
        StandbyOptions {
            poll_interval: Duration::from_millis(50),
            retry_backoff: Duration::from_millis(200),
            max_backoff: Duration::from_secs(5),
            idle_check_interval: Duration::from_secs(5),
            replay: ReplayOptions::default(),
        }
    }
}

/// What a standby is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StandbyState {
    /// Restoring its store (the first time, or after a
    /// [`RebootstrapCause`]); reads fail `transient` until it is ready.
    Bootstrapping,
    /// Following the changelog.
    Following,
    /// The last poll or bootstrap failed (the changelog or the repository
    /// is unreachable, or refused): retried with a backoff, the lag grows.
    /// [`StandbyStatus::last_error`] says what failed.
    Retrying,
    /// Stopped: promoted, or the manager shut down.
    Stopped,
}

/// Why a standby threw its store away and bootstrapped again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RebootstrapCause {
    /// The changelog's horizon passed the standby's offset (compaction or
    /// retention removed what its replay needs).
    BelowHorizon,
    /// The changelog was recreated (new lineage), or the store follows
    /// another log.
    LineageChanged,
    /// The changelog lost records the standby had applied (it is ahead of
    /// the log, or offsets were handed out again).
    HistoryLost,
    /// The standby's directory disappeared under it.
    DirectoryLost,
    /// A promotion failed after it had taken the store (the changelog
    /// could not be reached when the handle was made).
    PromotionFailed,
}

impl RebootstrapCause {
    /// The name used in logs, metrics and reports.
    pub fn as_str(&self) -> &'static str {
        match self {
            RebootstrapCause::BelowHorizon => "below_horizon",
            RebootstrapCause::LineageChanged => "lineage_changed",
            RebootstrapCause::HistoryLost => "history_lost",
            RebootstrapCause::DirectoryLost => "directory_lost",
            RebootstrapCause::PromotionFailed => "promotion_failed",
        }
    }

    /// The cause an error from a poll's replay names, if it is one a
    /// rebootstrap answers.
    fn of(e: &Error) -> Option<RebootstrapCause> {
        match e.reason()? {
            Reason::BelowHorizon => Some(RebootstrapCause::BelowHorizon),
            Reason::LineageChanged | Reason::OtherChangelog | Reason::Unbound => {
                Some(RebootstrapCause::LineageChanged)
            }
            Reason::AheadOfLog | Reason::HistoryLost => Some(RebootstrapCause::HistoryLost),
            _ => None,
        }
    }
}

impl std::fmt::Display for RebootstrapCause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One (re)bootstrap of a standby.
#[derive(Debug, Clone, PartialEq)]
pub struct Bootstrap {
    /// Why it ran (`None`: the first one).
    pub cause: Option<RebootstrapCause>,
    /// Where the store came from.
    pub source: Source,
    /// Bytes downloaded from the repository.
    pub bytes_downloaded: u64,
    /// Changelog records replayed on top.
    pub records_replayed: u64,
    /// How long it took.
    pub duration: Duration,
    /// When it ended, by the manager's clock (ms since the epoch).
    pub at_ms: i64,
}

/// How far a standby is behind its changelog.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Lag {
    /// Records between the standby's offset and the log's end as of the
    /// last poll (a poll that succeeds replays them all).
    pub records: u64,
    /// How long ago the standby last held everything the log held (the
    /// start of its last poll that reached the end); grows while the log
    /// cannot be reached.
    pub time: Duration,
}

/// A standby's status.
#[derive(Debug, Clone, PartialEq)]
pub struct StandbyStatus {
    /// The store partition.
    pub store_key: StoreKey,
    /// What it is doing.
    pub state: StandbyState,
    /// The last offset its store applied (`None`: nothing, or not
    /// bootstrapped yet).
    pub applied_offset: Option<u64>,
    /// The changelog's end offset at the last poll.
    pub end_offset: Option<u64>,
    /// Its lag.
    pub lag: Lag,
    /// Every (re)bootstrap, oldest first.
    pub bootstraps: Vec<Bootstrap>,
    /// The last failure, while [`StandbyState::Retrying`]: its kind, its
    /// refusal if any, and its message.
    pub last_error: Option<(ErrorKind, Option<Reason>, String)>,
    /// Changelog records applied by polls (bootstraps not counted).
    pub records_followed: u64,
    /// Records per second of the last poll that applied 10 000 or more.
    pub replay_records_per_sec: Option<f64>,
}

/// The store and everything the follower, the reads and the promotion
/// share.
struct Follower<F: StoreFormat, C> {
    key: StoreKey,
    manager: StateManager,
    format: Arc<F>,
    changelog: Arc<C>,
    owner: Arc<OwnedDir>,
    dir: PathBuf,
    verify_digest: bool,
    options: StandbyOptions,
    /// `None` until bootstrapped, and while rebootstrapping.
    store: Mutex<Option<F::Store>>,
    state: Mutex<FollowState>,
    /// Whether a store is ready for reads (watchable: `ready` waits on it).
    ready: tokio::sync::watch::Sender<bool>,
    metrics: Metrics,
}

#[derive(Debug)]
struct FollowState {
    state: StandbyState,
    applied: Option<u64>,
    end: Option<u64>,
    caught_up_ms: i64,
    last_check_ms: i64,
    /// A bootstrap is due, and why (`None` inside: the first).
    due: Option<Option<RebootstrapCause>>,
    /// Whether the directory existed after the last bootstrap (a memory
    /// store keeps none: its loss means nothing).
    dir_present: bool,
    bootstraps: Vec<Bootstrap>,
    last_report: Option<RestoreReport>,
    last_error: Option<(ErrorKind, Option<Reason>, String)>,
    records_followed: u64,
    rate: Option<f64>,
}

/// A standby's handles in the `metrics` facade (label `store`).
struct Metrics {
    lag_records: metrics::Gauge,
    lag_seconds: metrics::Gauge,
    followed: metrics::Counter,
}

impl Metrics {
    fn new(key: &StoreKey) -> Metrics {
        let store = key.to_string();
        Metrics {
            lag_records: metrics::gauge!("statesnap_standby_lag_records", "store" => store.clone()),
            lag_seconds: metrics::gauge!("statesnap_standby_lag_seconds", "store" => store.clone()),
            followed: metrics::counter!("statesnap_standby_followed_records_total", "store" => store),
        }
    }
}

/// A warm standby of one store partition: see the [module docs](self).
/// Reads see the state at one changelog offset
/// ([`StandbyHandle::applied_offset`]); a read waits while a poll applies
/// records. Dropping it stops the follower and releases its directory (the
/// store stays there for a later standby or open to pick up).
pub struct StandbyHandle<F: StoreFormat + 'static, C: Changelog + 'static> {
    follower: Arc<Follower<F, C>>,
    policy: Option<super::SnapshotPolicy>,
    task: Option<(JoinHandle<()>, CancellationToken)>,
}

impl<F: StoreFormat, C: Changelog> std::fmt::Debug for StandbyHandle<F, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StandbyHandle")
            .field("store_key", &self.follower.key)
            .field("changelog", self.follower.changelog.id())
            .finish_non_exhaustive()
    }
}

/// A failed [`StandbyHandle::promote`]: the error, and the standby,
/// following again. Fall back to [`StateManager::open`] with
/// [`StandbyHandle::into_spec`], or try again.
pub struct PromoteError<F: StoreFormat + 'static, C: Changelog + 'static> {
    /// What failed (`transient` for the deadline).
    pub error: Error,
    /// The standby, following again.
    pub standby: StandbyHandle<F, C>,
}

impl<F: StoreFormat, C: Changelog> std::fmt::Debug for PromoteError<F, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PromoteError")
            .field("error", &self.error)
            .field("standby", &self.standby)
            .finish()
    }
}

impl<F: StoreFormat, C: Changelog> std::fmt::Display for PromoteError<F, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "standby promotion failed: {}", self.error)
    }
}

impl<F: StoreFormat, C: Changelog> std::error::Error for PromoteError<F, C> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

impl<F: StoreFormat, C: Changelog> From<PromoteError<F, C>> for Error {
    fn from(e: PromoteError<F, C>) -> Error {
        e.error
    }
}

pub(super) fn start<F, C>(
    manager: StateManager,
    spec: StoreSpec<F, C>,
    options: StandbyOptions,
) -> Result<StandbyHandle<F, C>>
where
    F: StoreFormat + 'static,
    F::Store: 'static,
    C: Changelog + 'static,
{
    let StoreSpec {
        store_key,
        changelog,
        format,
        dir,
        at_offset,
        policy,
        verify_digest,
    } = spec;
    if manager.is_shut_down() {
        return Err(cancelled("standby", &store_key));
    }
    if let Some(o) = at_offset {
        return Err(Error::config(format!(
            "a standby follows the changelog to its end; it cannot be opened at a point in \
             time store_key=`{store_key}` at_offset={o}; use StateManager::open for a \
             point-in-time handle"
        )));
    }
    // The directory is the standby's alone, as an open handle's is.
    let owner = Arc::new(OwnedDir::take(
        &manager,
        &store_key,
        &dir,
        super::DirUse::Standby,
    )?);
    let now = manager.now_ms();
    let follower = Arc::new(Follower {
        metrics: Metrics::new(&store_key),
        key: store_key,
        format: Arc::new(format),
        changelog: Arc::new(changelog),
        owner,
        dir,
        verify_digest,
        options,
        store: Mutex::new(None),
        state: Mutex::new(FollowState {
            state: StandbyState::Bootstrapping,
            applied: None,
            end: None,
            caught_up_ms: now,
            last_check_ms: now,
            due: Some(None),
            dir_present: false,
            bootstraps: Vec::new(),
            last_report: None,
            last_error: None,
            records_followed: 0,
            rate: None,
        }),
        ready: tokio::sync::watch::Sender::new(false),
        manager,
    });
    let mut standby = StandbyHandle {
        follower,
        policy,
        task: None,
    };
    standby.resume();
    Ok(standby)
}

impl<F, C> Follower<F, C>
where
    F: StoreFormat + 'static,
    F::Store: 'static,
    C: Changelog + 'static,
{
    /// Bootstraps when one is due, else polls; then waits a poll interval
    /// (or a backoff after a failure) — until `stop`.
    async fn run(self: Arc<Self>, stop: CancellationToken) {
        let mut backoff = self.options.retry_backoff;
        loop {
            if stop.is_cancelled() {
                return;
            }
            let due = lock(&self.state).due;
            let result = match due {
                // A stop does not wait for the bootstrap: a restore already
                // on its blocking thread finishes there, holding the
                // directory until it ends.
                Some(cause) => tokio::select! {
                    r = self.clone().bootstrap(cause) => r,
                    () = stop.cancelled() => return,
                },
                None => {
                    let f = self.clone();
                    crate::util::blocking(move || f.poll(false))
                        .await
                        .map(|_| ())
                }
            };
            let wait = match result {
                Ok(()) => {
                    backoff = self.options.retry_backoff;
                    self.options.poll_interval
                }
                Err(e) => {
                    self.failed(&e);
                    let w = backoff;
                    backoff = (backoff * 2).min(self.options.max_backoff);
                    w
                }
            };
            self.publish_lag();
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// Restores the store through the open path (local store first) after
    /// dropping the one it replaces.
    async fn bootstrap(self: Arc<Self>, cause: Option<RebootstrapCause>) -> Result<()> {
        let started = Instant::now();
        {
            // RocksDB must be closed before its directory is replaced.
            let old = lock(&self.store).take();
            self.ready.send_replace(false);
            lock(&self.state).state = StandbyState::Bootstrapping;
            drop(old);
        }
        if let Some(c) = cause {
            tracing::warn!(store_key = %self.key, cause = %c, "standby rebootstraps");
            metrics::counter!("statesnap_standby_rebootstraps_total", "cause" => c.as_str())
                .increment(1);
        }
        let options = RestoreOptions {
            local_first: true,
            verify_digest: self.verify_digest,
            ..RestoreOptions::default()
        };
        let (store, report) = handle::restore_into(
            &self.manager,
            &self.key,
            &self.owner,
            &self.format,
            &self.changelog,
            self.dir.clone(),
            options,
        )
        .await?;
        let applied = store.applied_offset()?;
        let now = self.manager.now_ms();
        let bootstrap = Bootstrap {
            cause,
            source: report.source.clone(),
            bytes_downloaded: report.transfer.bytes_downloaded,
            records_replayed: report.replay.records,
            duration: started.elapsed(),
            at_ms: now,
        };
        tracing::info!(store_key = %self.key, source = %bootstrap.source,
            downloaded = bootstrap.bytes_downloaded, replayed = bootstrap.records_replayed,
            ms = started.elapsed().as_millis() as u64, "standby ready");
        *lock(&self.store) = Some(store);
        {
            let mut st = lock(&self.state);
            st.state = StandbyState::Following;
            st.applied = applied;
            st.end = Some(report.replay.end_offset.max(applied.map_or(0, |a| a + 1)));
            st.caught_up_ms = now;
            st.last_check_ms = now;
            st.due = None;
            st.dir_present = self.dir.exists();
            st.bootstraps.push(bootstrap);
            st.last_report = Some(report);
            st.last_error = None;
        }
        self.ready.send_replace(true);
        Ok(())
    }

    /// Replays what the log holds beyond the store, up to its end now, and
    /// marks a rebootstrap due when that cannot be done exactly. With
    /// `force`, replays (and so checks lineage and horizon) even when the
    /// log looks idle. Returns the replay, if one ran.
    fn poll(&self, force: bool) -> Result<Option<ReplayReport>> {
        let started_ms = self.manager.now_ms();
        let lost = {
            let st = lock(&self.state);
            st.dir_present && !self.dir.exists()
        };
        if lost {
            // Never read or promoted again: it follows in files nobody can
            // find.
            let gone = lock(&self.store).take();
            self.ready.send_replace(false);
            self.due(RebootstrapCause::DirectoryLost);
            drop(gone);
            return Ok(None);
        }
        // Asked before the store is locked: reads do not wait on the
        // broker.
        let end = self.changelog.end_offset()?;
        let mut guard = lock(&self.store);
        let Some(store) = guard.as_mut() else {
            return Ok(None);
        };
        let applied = store.applied_offset()?;
        let next = applied.map_or(0, |a| a.saturating_add(1));
        let check_due = {
            let st = lock(&self.state);
            let interval = self.options.idle_check_interval.as_millis() as i64;
            started_ms.saturating_sub(st.last_check_ms) >= interval
        };
        if next == end && !force && !check_due {
            let mut st = lock(&self.state);
            st.end = Some(end);
            st.caught_up_ms = started_ms;
            st.state = StandbyState::Following;
            st.last_error = None;
            return Ok(None);
        }
        match replay(store, &*self.changelog, &self.options.replay, &mut |_| {}) {
            Ok(r) => {
                drop(guard);
                self.metrics.followed.increment(r.records);
                let mut st = lock(&self.state);
                st.applied = r.applied_offset;
                st.end = Some(r.end_offset.max(end));
                st.caught_up_ms = started_ms;
                st.last_check_ms = started_ms;
                st.state = StandbyState::Following;
                st.last_error = None;
                st.records_followed += r.records;
                if r.records >= 10_000 {
                    st.rate = Some(r.records_per_sec());
                }
                Ok(Some(r))
            }
            Err(e) => match RebootstrapCause::of(&e) {
                Some(cause) => {
                    // The store may hold part of a replay that turned out
                    // inexact: it is thrown away, never read again.
                    guard.take();
                    drop(guard);
                    self.ready.send_replace(false);
                    tracing::warn!(store_key = %self.key, error = %e, "standby cannot follow exactly");
                    self.due(cause);
                    Ok(None)
                }
                None => Err(e),
            },
        }
    }

    fn due(&self, cause: RebootstrapCause) {
        let mut st = lock(&self.state);
        st.due = Some(Some(cause));
        st.state = StandbyState::Bootstrapping;
    }

    fn failed(&self, e: &Error) {
        tracing::warn!(store_key = %self.key, error = %e, "standby poll failed; retrying");
        let mut st = lock(&self.state);
        st.state = StandbyState::Retrying;
        st.last_error = Some((e.kind(), e.reason(), e.message().to_owned()));
    }

    fn publish_lag(&self) {
        let lag = self.lag();
        self.metrics.lag_records.set(lag.records as f64);
        self.metrics.lag_seconds.set(lag.time.as_secs_f64());
    }

    fn lag(&self) -> Lag {
        let now = self.manager.now_ms();
        let st = lock(&self.state);
        let next = st.applied.map_or(0, |a| a.saturating_add(1));
        Lag {
            records: st.end.map_or(0, |e| e.saturating_sub(next)),
            time: Duration::from_millis(now.saturating_sub(st.caught_up_ms).max(0) as u64),
        }
    }
}

impl<F, C> StandbyHandle<F, C>
where
    F: StoreFormat + 'static,
    F::Store: 'static,
    C: Changelog + 'static,
{
    /// Starts (or restarts) the follower task.
    fn resume(&mut self) {
        if self.task.is_some() {
            return;
        }
        let f = &self.follower;
        let inner = &f.manager.inner;
        let stop = inner.cancel.child_token();
        let task = inner.tasks.spawn_on(f.clone().run(stop.clone()), &inner.rt);
        self.task = Some((task, stop));
    }

    /// Stops the follower task and waits until it let go of the store.
    async fn pause(&mut self) {
        if let Some((task, stop)) = self.task.take() {
            stop.cancel();
            let _ = task.await;
        }
    }

    /// The store partition.
    pub fn store_key(&self) -> &StoreKey {
        &self.follower.key
    }

    /// The changelog it follows.
    pub fn changelog(&self) -> &C {
        &self.follower.changelog
    }

    /// Waits until the standby has a store to read (its first bootstrap
    /// finished), or `timeout` passes (`transient`).
    pub async fn ready(&self, timeout: Duration) -> Result<()> {
        let mut rx = self.follower.ready.subscribe();
        match tokio::time::timeout(timeout, rx.wait_for(|r| *r)).await {
            Ok(_) => Ok(()),
            Err(_) => {
                let st = self.status();
                let why = st
                    .last_error
                    .map_or_else(|| "still bootstrapping".to_owned(), |(_, _, m)| m);
                Err(Error::new(
                    ErrorKind::Transient,
                    format!(
                        "standby not ready within {} ms store_key=`{}`: {why}",
                        timeout.as_millis(),
                        self.follower.key
                    ),
                ))
            }
        }
    }

    /// Its lag behind the changelog (as of the last poll).
    pub fn lag(&self) -> Lag {
        self.follower.lag()
    }

    /// Its status.
    pub fn status(&self) -> StandbyStatus {
        let f = &self.follower;
        let lag = f.lag();
        let st = lock(&f.state);
        StandbyStatus {
            store_key: f.key.clone(),
            state: if self.task.is_none() || f.manager.is_shut_down() {
                StandbyState::Stopped
            } else {
                st.state
            },
            applied_offset: st.applied,
            end_offset: st.end,
            lag,
            bootstraps: st.bootstraps.clone(),
            last_error: st.last_error.clone(),
            records_followed: st.records_followed,
            replay_records_per_sec: st.rate,
        }
    }

    /// Runs `f` on the store at one applied offset (given to `f` too);
    /// `transient` while the standby is bootstrapping. The follower waits
    /// until `f` returns: keep it short.
    pub fn read<R>(&self, f: impl FnOnce(&F::Store, Option<u64>) -> Result<R>) -> Result<R> {
        let guard = lock(&self.follower.store);
        let Some(store) = guard.as_ref() else {
            return Err(Error::new(
                ErrorKind::Transient,
                format!(
                    "standby has no store to read yet (bootstrapping) store_key=`{}`; wait with \
                     ready()",
                    self.follower.key
                ),
            ));
        };
        let applied = store.applied_offset()?;
        f(store, applied)
    }

    /// The value of `key` in the standby's state.
    pub fn get(&self, key: &[u8]) -> Result<Option<Bytes>> {
        self.read(|s, _| s.get(key))
    }

    /// The entries with keys in `(start, end)`, in key order, at most
    /// `limit` of them, all at one offset.
    pub fn scan(
        &self,
        start: std::ops::Bound<&[u8]>,
        end: std::ops::Bound<&[u8]>,
        limit: usize,
    ) -> Result<Vec<(Bytes, Bytes)>> {
        self.read(|s, _| s.range(start, end)?.take(limit).collect())
    }

    /// The last offset the standby's state reflects (`None`: nothing yet).
    pub fn applied_offset(&self) -> Result<Option<u64>> {
        self.read(|_, a| Ok(a))
    }

    /// Turns the standby into the partition's [`StateHandle`]: stops the
    /// follower, replays what the log holds beyond the standby (its
    /// remaining lag) within `deadline`, and registers the handle as the
    /// store's writer in this manager. Its first commit claims the
    /// changelog, which fences the old owner's appends. Nothing is
    /// downloaded; [`StateHandle::report`] names the source
    /// [`Source::Standby`] and the records replayed.
    ///
    /// Fails with the standby back ([`PromoteError`]), following again:
    /// `transient` when it is not bootstrapped, cannot reach the log, or
    /// did not catch up within `deadline`; `config` when the store is
    /// already open in this manager. The caller may retry or fall back to
    /// [`StateManager::open`] ([`StandbyHandle::into_spec`]).
    pub async fn promote(
        mut self,
        deadline: Duration,
    ) -> std::result::Result<StateHandle<F, C>, PromoteError<F, C>> {
        let started = Instant::now();
        let now = tokio::time::Instant::now();
        // A deadline too far to represent is no deadline.
        let until = now
            .checked_add(deadline)
            .unwrap_or_else(|| now + Duration::from_secs(100 * 365 * 24 * 3600));
        // A standby that is bootstrapping is not paused: that would wait
        // for its restore.
        let result = match self.not_ready() {
            Some(e) => Err(e),
            None => {
                self.pause().await;
                self.try_promote(started, until).await
            }
        };
        // Following again (a no-op for a standby that was never paused).
        match result {
            Ok(h) => {
                metrics::histogram!("statesnap_standby_promote_seconds")
                    .record(started.elapsed().as_secs_f64());
                Ok(h)
            }
            Err(error) => {
                tracing::warn!(store_key = %self.follower.key, error = %error, "standby promotion failed; following again");
                self.resume();
                Err(PromoteError {
                    error,
                    standby: self,
                })
            }
        }
    }

    /// Why the standby cannot be promoted now: it has no store, or a
    /// rebootstrap is due.
    fn not_ready(&self) -> Option<Error> {
        let f = &self.follower;
        // `ready` says whether a store is in place without taking its lock
        // (a poll may hold it for a while).
        let has_store = *f.ready.borrow();
        let due = lock(&f.state).due;
        if has_store && due.is_none() {
            return None;
        }
        Some(Error::new(
            ErrorKind::Transient,
            format!(
                "standby is not bootstrapped{} store_key=`{}`; open the store instead",
                due.flatten()
                    .map_or(String::new(), |c| format!(" (rebootstrapping: {c})")),
                f.key
            ),
        ))
    }

    async fn try_promote(
        &mut self,
        started: Instant,
        until: tokio::time::Instant,
    ) -> Result<StateHandle<F, C>> {
        let f = self.follower.clone();
        let manager = f.manager.clone();
        if manager.is_shut_down() {
            return Err(cancelled("promote", &f.key));
        }
        if let Some(e) = self.not_ready() {
            return Err(e);
        }
        // The manager's registration first: nothing is lost if the store
        // is open here already.
        let (shared, registered) = handle::register(&manager, &f.key, &f.changelog, None)?;
        let applied_before = lock(&f.state).applied;
        let catch_up = {
            let f = f.clone();
            crate::util::blocking(move || f.poll(true))
        };
        let report = match tokio::time::timeout_at(until, catch_up).await {
            Ok(r) => r?,
            // The replay goes on in the background and the follower picks
            // the store up after it.
            Err(_) => {
                return Err(Error::new(
                    ErrorKind::Transient,
                    format!(
                        "standby did not catch up with its changelog within the promotion \
                         deadline store_key=`{}` lag_records={}; retry, or open the store",
                        f.key,
                        f.lag().records
                    ),
                ));
            }
        };
        let Some(bootstrap) = lock(&f.state).last_report.clone() else {
            return Err(Error::internal(format!(
                "a bootstrapped standby has no bootstrap report store_key=`{}`",
                f.key
            )));
        };
        let taken = match lock(&f.state).due {
            Some(_) => None,
            None => lock(&f.store).take(),
        };
        let Some(store) = taken else {
            let due = lock(&f.state).due.flatten();
            return Err(Error::new(
                ErrorKind::Transient,
                format!(
                    "standby cannot catch up exactly store_key=`{}` cause={}; it rebootstraps: \
                     open the store instead",
                    f.key,
                    due.map_or("unknown", |c| c.as_str())
                ),
            ));
        };
        f.ready.send_replace(false);
        lock(&f.state).state = StandbyState::Stopped;
        let report = promoted_report(bootstrap, applied_before, report);
        let parts = Parts {
            format: f.format.clone(),
            changelog: f.changelog.clone(),
            store,
            report,
            policy: self.policy.clone(),
            owner: f.owner.clone(),
            read_only: None,
        };
        match handle::assemble(manager, shared, registered, parts, started) {
            Ok(h) => {
                f.owner.promoted();
                Ok(h)
            }
            Err(e) => {
                // The store went into the failed handle: the standby
                // bootstraps again (from the local store if it is valid).
                f.due(RebootstrapCause::of(&e).unwrap_or(RebootstrapCause::PromotionFailed));
                Err(e)
            }
        }
    }

    /// Stops the standby and gives back what it was made from, to open the
    /// store instead ([`StateManager::open`] takes the standby's local
    /// store when it is still valid). Waits for a catch-up a timed-out
    /// promotion left running.
    pub async fn into_spec(mut self) -> Result<StoreSpec<F, C>> {
        self.pause().await;
        let policy = self.policy.take();
        let f = self.follower.clone();
        drop(self);
        // The follower task has ended and the handle is gone: the last
        // other reference is a replay a timed-out promotion left running.
        let follower = last_reference(f).await;
        let Follower {
            key,
            format,
            changelog,
            dir,
            verify_digest,
            store,
            owner,
            ..
        } = follower;
        // The store closes, then the directory is released.
        drop(store);
        drop(owner);
        // A restore a stop left running on its blocking thread holds them
        // until it ends.
        let format = last_reference(format).await;
        let changelog = last_reference(changelog).await;
        Ok(StoreSpec {
            store_key: key.clone(),
            changelog,
            format,
            dir,
            at_offset: None,
            policy,
            verify_digest,
        })
    }
}

impl<F: StoreFormat, C: Changelog> Drop for StandbyHandle<F, C> {
    fn drop(&mut self) {
        if let Some((_, stop)) = self.task.take() {
            stop.cancel();
        }
    }
}

/// What `shared` holds, once every other reference to it has gone (work
/// left running on a blocking thread ends on its own).
async fn last_reference<T>(mut shared: Arc<T>) -> T {
    loop {
        match Arc::try_unwrap(shared) {
            Ok(x) => return x,
            Err(back) => {
                shared = back;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    }
}

/// The promoted handle's report: the standby as its source, what the
/// promotion replayed, nothing downloaded; the bootstrap's plan (its
/// manifests name the next snapshot's parent).
fn promoted_report(
    bootstrap: RestoreReport,
    applied_before: Option<u64>,
    replayed: Option<ReplayReport>,
) -> RestoreReport {
    let replay = replayed.unwrap_or_else(|| {
        let next = applied_before.map_or(0, |a| a.saturating_add(1));
        ReplayReport {
            from_offset: next,
            end_offset: next,
            records: 0,
            bytes: 0,
            batches: 0,
            applied_offset: applied_before,
            duration: Duration::ZERO,
        }
    });
    RestoreReport {
        source: Source::Standby {
            applied_offset: applied_before,
        },
        plan: bootstrap.plan,
        snapshot: None,
        snapshot_offset: None,
        skipped: bootstrap.skipped,
        unreadable: Vec::new(),
        transfer: Default::default(),
        snapshot_duration: Duration::ZERO,
        replay,
    }
}
