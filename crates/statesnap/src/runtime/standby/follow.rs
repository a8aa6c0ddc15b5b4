//! The follower: the store, and the task that bootstraps it and keeps it
//! current with its changelog.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::{Bootstrap, Lag, RebootstrapCause, StandbyOptions, StandbyState, StandbyStatus};
use crate::changelog::Changelog;
use crate::error::{Error, ErrorKind, Reason, Result};
use crate::format::StoreFormat;
use crate::repo::StoreKey;
use crate::restore::{ReplayReport, RestoreOptions, RestoreReport, replay};
use crate::runtime::handle::{self, OwnedDir};
use crate::runtime::{StateManager, lock};
use crate::store::StateStore;

/// The store and everything the follower, the reads and the promotion
/// share.
pub(super) struct Follower<F: StoreFormat, C> {
    pub(super) key: StoreKey,
    pub(super) manager: StateManager,
    pub(super) format: Arc<F>,
    pub(super) changelog: Arc<C>,
    pub(super) owner: Arc<OwnedDir>,
    pub(super) dir: PathBuf,
    pub(super) verify_digest: bool,
    pub(super) options: StandbyOptions,
    /// `None` until bootstrapped, and while rebootstrapping.
    pub(super) store: Mutex<Option<F::Store>>,
    /// Shared with its [`Listing`].
    pub(super) state: Arc<Mutex<FollowState>>,
    /// Whether a store is ready for reads (watchable: `ready` waits on it).
    pub(super) ready: tokio::sync::watch::Sender<bool>,
    pub(super) metrics: Metrics,
    /// What its manager lists of it.
    pub(super) listing: Arc<Listing>,
}

/// A standby as its manager lists it ([`StateManager::standbys`]): its
/// state, without its store (the manager keeps a weak reference, and a
/// listing never ends up owning a store to drop).
pub(crate) struct Listing {
    pub(super) key: StoreKey,
    pub(super) manager: StateManager,
    pub(super) state: Arc<Mutex<FollowState>>,
    /// Whether its handle runs the follower task now.
    pub(super) running: AtomicBool,
    /// Whether its handle lives (cleared when it is dropped, promoted or
    /// given back with `into_spec`).
    pub(super) alive: AtomicBool,
}

impl Listing {
    /// Whether this is a live standby (its handle not yet dropped, promoted
    /// or given back) of store `key`.
    pub(crate) fn is_live_for(&self, key: &StoreKey) -> bool {
        self.key == *key && self.alive.load(Ordering::Acquire)
    }

    /// Its status; `None` once its handle is gone.
    pub(crate) fn status(&self) -> Option<StandbyStatus> {
        self.alive
            .load(Ordering::Acquire)
            .then(|| self.status_now())
    }

    pub(super) fn status_now(&self) -> StandbyStatus {
        let now = self.manager.now_ms();
        let st = lock(&self.state);
        let stopped = !self.running.load(Ordering::Acquire) || self.manager.is_shut_down();
        StandbyStatus {
            store_key: self.key.clone(),
            state: if stopped {
                StandbyState::Stopped
            } else {
                st.state
            },
            applied_offset: st.applied,
            end_offset: st.end,
            lag: st.lag(now),
            bootstraps: st.bootstraps.clone(),
            last_error: st.last_error.clone(),
            records_followed: st.records_followed,
            replay_records_per_sec: st.rate,
        }
    }
}

#[derive(Debug)]
pub(super) struct FollowState {
    pub(super) state: StandbyState,
    pub(super) applied: Option<u64>,
    pub(super) end: Option<u64>,
    pub(super) caught_up_ms: i64,
    pub(super) last_check_ms: i64,
    /// A bootstrap is due, and why (`None` inside: the first).
    pub(super) due: Option<Option<RebootstrapCause>>,
    /// Whether the directory existed after the last bootstrap (a memory
    /// store keeps none: its loss means nothing).
    pub(super) dir_present: bool,
    pub(super) bootstraps: Vec<Bootstrap>,
    pub(super) last_report: Option<RestoreReport>,
    pub(super) last_error: Option<(ErrorKind, Option<Reason>, String)>,
    pub(super) records_followed: u64,
    pub(super) rate: Option<f64>,
}

/// A standby's handles in the `metrics` facade (label `store`).
pub(super) struct Metrics {
    pub(super) lag_records: metrics::Gauge,
    pub(super) lag_seconds: metrics::Gauge,
    pub(super) followed: metrics::Counter,
}

impl Metrics {
    pub(super) fn new(key: &StoreKey) -> Metrics {
        let store = key.to_string();
        Metrics {
            lag_records: metrics::gauge!("statesnap_standby_lag_records", "store" => store.clone()),
            lag_seconds: metrics::gauge!("statesnap_standby_lag_seconds", "store" => store.clone()),
            followed: metrics::counter!("statesnap_standby_followed_records_total", "store" => store),
        }
    }
}

impl<F, C> Follower<F, C>
where
    F: StoreFormat + 'static,
    F::Store: 'static,
    C: Changelog + 'static,
{
    /// Bootstraps when one is due, else polls; then waits a poll interval
    /// (or a backoff after a failure) — until `stop`.
    pub(super) async fn run(self: Arc<Self>, stop: CancellationToken) {
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
    pub(super) fn poll(&self, force: bool) -> Result<Option<ReplayReport>> {
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

    pub(super) fn due(&self, cause: RebootstrapCause) {
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

    pub(super) fn lag(&self) -> Lag {
        lock(&self.state).lag(self.manager.now_ms())
    }
}

impl FollowState {
    /// The lag as of the last poll, seen at `now_ms`.
    fn lag(&self, now_ms: i64) -> Lag {
        let next = self.applied.map_or(0, |a| a.saturating_add(1));
        Lag {
            records: self.end.map_or(0, |e| e.saturating_sub(next)),
            time: Duration::from_millis(now_ms.saturating_sub(self.caught_up_ms).max(0) as u64),
        }
    }
}
