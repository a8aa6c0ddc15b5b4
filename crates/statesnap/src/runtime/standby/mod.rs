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

mod follow;
mod types;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::handle::{self, OwnedDir, Parts};
use super::{StateHandle, StateManager, StoreSpec, cancelled, lock};
use crate::changelog::Changelog;
use crate::error::{Error, ErrorKind, Result};
use crate::format::StoreFormat;
use crate::repo::StoreKey;
use crate::restore::{ReplayReport, RestoreReport, Source};
use crate::store::StateStore;

pub(crate) use self::follow::Listing;
use self::follow::{FollowState, Follower, Metrics};
pub use self::types::{
    Bootstrap, Lag, RebootstrapCause, StandbyOptions, StandbyState, StandbyStatus,
};

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
    let state = Arc::new(Mutex::new(FollowState {
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
    }));
    let listing = Arc::new(Listing {
        key: store_key.clone(),
        manager: manager.clone(),
        state: state.clone(),
        running: AtomicBool::new(false),
        alive: AtomicBool::new(true),
    });
    manager.register_standby(&listing);
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
        state,
        ready: tokio::sync::watch::Sender::new(false),
        listing,
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
        f.listing.running.store(true, Ordering::Release);
    }

    /// Stops the follower task and waits until it let go of the store.
    async fn pause(&mut self) {
        self.follower
            .listing
            .running
            .store(false, Ordering::Release);
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

    /// Its status (also listed by [`StateManager::standbys`]).
    pub fn status(&self) -> StandbyStatus {
        self.follower.listing.status_now()
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
        let listing = &self.follower.listing;
        listing.running.store(false, Ordering::Release);
        listing.alive.store(false, Ordering::Release);
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
