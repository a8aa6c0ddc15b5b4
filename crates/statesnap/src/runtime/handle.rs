//! [`StateHandle`]: one open store partition, its background snapshots and
//! its handoff.

use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tracing::Instrument;

use super::policy::{self, PolicyInput, SnapshotPolicy, Trigger};
use super::status::{Shared, StoreStatus};
use super::{DirUse, StateManager, StoreSpec, cancelled, lock};
use crate::changelog::Changelog;
use crate::error::{Error, ErrorKind, Result};
use crate::format::StoreFormat;
use crate::repo::{Manifest, Repository, SnapshotId, StoreKey};
use crate::restore::{ReplayOptions, ReplayReport, RestoreOptions, RestoreReport, Source};
use crate::snapshot::{SnapshotOptions, commit_snapshot_with};
use crate::store::logged::{CommitInfo, LoggedStore};
use crate::store::owner::{DirLock, canonical_dir};
use crate::store::{KvIter, StateStore};

/// What [`StateHandle::close`] did.
#[derive(Debug, Clone, PartialEq)]
pub struct CloseReport {
    /// The snapshot the next owner restores from: the handoff snapshot, or
    /// the last one if it already covered every committed record.
    pub snapshot: Option<SnapshotId>,
    /// Its offset (= the last committed offset when the handoff worked).
    pub offset: Option<u64>,
    /// Whether close took a new snapshot.
    pub took_snapshot: bool,
    /// Uncommitted writes that were dropped.
    pub discarded_pending: usize,
    /// From the start of `close` to its end.
    pub duration: Duration,
}

/// One open store partition: a [`LoggedStore`] (read-your-writes, commit
/// = changelog then store) that snapshots itself in the background by
/// policy and hands off on [`StateHandle::close`]. Dropping a handle is
/// [`StateHandle::abandon`].
pub struct StateHandle<F: StoreFormat + 'static, C: Changelog + 'static> {
    logged: LoggedStore<F::Store, Arc<C>>,
    format: Arc<F>,
    changelog: Arc<C>,
    manager: StateManager,
    shared: Arc<Shared>,
    policy: SnapshotPolicy,
    report: RestoreReport,
    opened_in: Duration,
    read_only: Option<u64>,
    /// Last: released once the store above is closed.
    _owner: Arc<OwnedDir>,
}

impl<F: StoreFormat, C: Changelog> std::fmt::Debug for StateHandle<F, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StateHandle")
            .field("store_key", &self.shared.key)
            .field("changelog", self.changelog.id())
            .field("read_only", &self.read_only)
            .finish_non_exhaustive()
    }
}

/// Removes a failed open's registration.
pub(super) struct Registered {
    manager: StateManager,
    key: Option<StoreKey>,
}

impl Drop for Registered {
    fn drop(&mut self) {
        if let Some(k) = self.key.take() {
            self.manager.deregister(&k);
        }
    }
}

pub(super) async fn open<F, C>(
    manager: StateManager,
    spec: StoreSpec<F, C>,
) -> Result<StateHandle<F, C>>
where
    F: StoreFormat + 'static,
    F::Store: 'static,
    C: Changelog + 'static,
{
    let started = Instant::now();
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
        return Err(cancelled("open", &store_key));
    }
    let changelog = Arc::new(changelog);
    let (shared, registered) = register(&manager, &store_key, &changelog, at_offset)?;
    // The directory is this handle's before anything reads or changes it:
    // one spec per directory in a manager (config), one owner per
    // directory anywhere (transient).
    let by = match at_offset {
        Some(_) => DirUse::PointInTime,
        None => DirUse::Handle,
    };
    let owner = Arc::new(OwnedDir::take(&manager, &store_key, &dir, by)?);
    let options = RestoreOptions {
        local_first: true,
        until: at_offset,
        verify_digest,
        ..RestoreOptions::default()
    };
    let format = Arc::new(format);
    let (store, report) = restore_into(
        &manager, &store_key, &owner, &format, &changelog, dir, options,
    )
    .await?;
    manager.seed_rates(&report.plan.manifests);
    manager.observe(
        report.transfer.bytes_downloaded,
        report.snapshot_duration.as_secs_f64(),
        report.replay.records,
        report.replay.duration.as_secs_f64(),
    );
    let parts = Parts {
        format,
        changelog,
        store,
        report,
        policy,
        owner,
        read_only: at_offset,
    };
    assemble(manager, shared, registered, parts, started)
}

/// What a ready handle is made of, however the store got ready (restored
/// by [`open`], or a promoted standby).
pub(super) struct Parts<F: StoreFormat, C> {
    pub(super) format: Arc<F>,
    pub(super) changelog: Arc<C>,
    pub(super) store: F::Store,
    pub(super) report: RestoreReport,
    pub(super) policy: Option<SnapshotPolicy>,
    pub(super) owner: Arc<OwnedDir>,
    pub(super) read_only: Option<u64>,
}

/// Builds the handle over a ready store: binds it to its changelog
/// ([`LoggedStore::new`]), records its applied offset and snapshot parent,
/// and hands the manager's registration over to the handle.
pub(super) fn assemble<F, C>(
    manager: StateManager,
    shared: Arc<Shared>,
    mut registered: Registered,
    parts: Parts<F, C>,
    started: Instant,
) -> Result<StateHandle<F, C>>
where
    F: StoreFormat + 'static,
    F::Store: 'static,
    C: Changelog + 'static,
{
    let Parts {
        format,
        changelog,
        store,
        report,
        policy,
        owner,
        read_only,
    } = parts;
    let mut logged = LoggedStore::new(store, changelog.clone())?;
    if read_only.is_none() {
        // The new owner fences every older writer that shares this
        // changelog handle (an old owner whose standby was promoted here).
        logged.claim_writer()?;
    }
    let applied = logged.store().applied_offset()?;
    note_applied(&shared, &report, applied);
    record_open(started, &shared, &report);
    registered.key = None; // the handle deregisters from now on
    let policy = policy.unwrap_or_else(|| manager.inner.policy.clone());
    Ok(StateHandle {
        logged,
        format,
        changelog,
        policy,
        manager,
        shared,
        report,
        opened_in: started.elapsed(),
        read_only,
        _owner: owner,
    })
}

/// Restores the store into `dir`, which `owner` holds, on a blocking thread
/// under one of the manager's transfer permits; gives the store and the
/// restore's report. A standby's (re)bootstrap runs through here too.
pub(super) async fn restore_into<F, C>(
    manager: &StateManager,
    store_key: &StoreKey,
    owner: &Arc<OwnedDir>,
    format: &Arc<F>,
    changelog: &Arc<C>,
    dir: PathBuf,
    options: RestoreOptions,
) -> Result<(F::Store, RestoreReport)>
where
    F: StoreFormat + 'static,
    F::Store: 'static,
    C: Changelog + 'static,
{
    let inner = &manager.inner;
    let span = tracing::info_span!("open", store_key = %store_key, until = ?options.until);
    let permit = inner
        .transfers
        .clone()
        .acquire_owned()
        .await
        .map_err(|_| cancelled("open", store_key))?;
    let (f, c, repo, key, rt) = (
        format.clone(),
        changelog.clone(),
        inner.repo.clone(),
        store_key.clone(),
        inner.rt.clone(),
    );
    let held = owner.clone();
    // Restore downloads (async) and replays (blocking): all of it on a
    // blocking thread so no executor worker stalls on the replay.
    let restored = crate::util::blocking(move || {
        let _g = span.enter();
        rt.block_on(crate::restore::restore_owned(
            &*f, &repo, &key, &*c, &dir, &options, &held.lock,
        ))
    })
    .await;
    drop(permit);
    restored
}

/// The open store's shared status, registered with the manager unless the
/// handle is a point-in-time one (`at_offset`); the registration is removed
/// when the returned [`Registered`] is dropped with its key still set.
pub(super) fn register<C: Changelog + 'static>(
    manager: &StateManager,
    store_key: &StoreKey,
    changelog: &Arc<C>,
    at_offset: Option<u64>,
) -> Result<(Arc<Shared>, Registered)> {
    let inner = &manager.inner;
    let weak: std::sync::Weak<dyn Changelog> = Arc::downgrade(changelog) as _;
    let shared = Arc::new(Shared::new(
        store_key.clone(),
        weak,
        inner.clock.now_ms(),
        inner.cancel.child_token(),
    ));
    // A point-in-time handle is read-only and may sit beside the live one.
    let mut registered = Registered {
        manager: manager.clone(),
        key: None,
    };
    if at_offset.is_none() {
        manager.register(store_key, shared.clone())?;
        registered.key = Some(store_key.clone());
    }
    Ok((shared, registered))
}

/// Records the restored store's applied offset, and the parent of its next
/// snapshot, in its shared status.
fn note_applied(shared: &Shared, report: &RestoreReport, applied: Option<u64>) {
    // The newest usable snapshot at or below the store is the parent of
    // the next one (not one whose restore just failed).
    let failed: Vec<SnapshotId> = report.skipped.iter().map(|s| s.id).collect();
    let parent = report
        .plan
        .manifests
        .iter()
        .filter(|m| !failed.contains(&m.id()))
        .find(|m| applied.is_some_and(|a| m.offset() <= a))
        .map(|m| m.manifest.clone());
    let mut st = lock(&shared.state);
    st.applied_offset = applied;
    st.parent = parent;
}

/// The open's metrics and its "store ready" log line.
fn record_open(started: Instant, shared: &Shared, report: &RestoreReport) {
    let source = match report.source {
        Source::Local { .. } => "local",
        Source::Snapshot { .. } => "snapshot",
        Source::FullReplay => "full-replay",
        Source::Standby { .. } => "standby",
    };
    metrics::histogram!("statesnap_open_seconds", "source" => source)
        .record(started.elapsed().as_secs_f64());
    metrics::counter!("statesnap_open_replayed_records_total").increment(report.replay.records);
    metrics::counter!("statesnap_open_downloaded_bytes_total")
        .increment(report.transfer.bytes_downloaded);
    tracing::info!(
        store_key = %shared.key,
        source = %report.source,
        replayed = report.replay.records,
        downloaded = report.transfer.bytes_downloaded,
        ms = started.elapsed().as_millis() as u64,
        "store ready"
    );
}

/// A handle's ownership of its directory: the lock (other handles and
/// processes) and the manager's registration of the directory (its other
/// specs), both released on drop, after the store is closed.
#[derive(Debug)]
pub(super) struct OwnedDir {
    lock: DirLock,
    manager: StateManager,
    canonical: PathBuf,
}

impl OwnedDir {
    /// Takes `dir` for `key`'s handle, or its standby's (`by`).
    pub(super) fn take(
        manager: &StateManager,
        key: &StoreKey,
        dir: &Path,
        by: DirUse,
    ) -> Result<OwnedDir> {
        let canonical = canonical_dir(dir)?;
        manager.register_dir(&canonical, key, by)?;
        match DirLock::acquire(dir) {
            Ok(lock) => Ok(OwnedDir {
                lock,
                manager: manager.clone(),
                canonical,
            }),
            Err(e) => {
                manager.deregister_dir(&canonical);
                Err(e)
            }
        }
    }
}

impl OwnedDir {
    /// The directory passes from a standby to its promoted handle.
    pub(super) fn promoted(&self) {
        self.manager.held_by_handle(&self.canonical);
    }
}

impl Drop for OwnedDir {
    fn drop(&mut self) {
        self.manager.deregister_dir(&self.canonical);
    }
}

/// One snapshot's background work: write and commit `cut` under the
/// manager's transfer budget.
struct SnapshotJob<F: StoreFormat, C> {
    format: Arc<F>,
    cut: F::Cut,
    repo: Repository,
    key: StoreKey,
    changelog: Arc<C>,
    parent: Option<Manifest>,
    transfers: Arc<tokio::sync::Semaphore>,
    options: SnapshotOptions,
}

impl<F: StoreFormat, C: Changelog> SnapshotJob<F, C> {
    async fn run(self) -> Result<Manifest> {
        let _permit = self
            .transfers
            .acquire_owned()
            .await
            .map_err(|_| cancelled("snapshot", &self.key))?;
        commit_snapshot_with(
            &*self.format,
            self.cut,
            &self.repo,
            &self.key,
            &*self.changelog,
            self.parent.as_ref(),
            &self.options,
        )
        .await
    }
}

impl<F: StoreFormat, C: Changelog> StateHandle<F, C> {
    /// The value of `key`: the pending write if any, else the store's.
    pub fn get(&self, key: &[u8]) -> Result<Option<Bytes>> {
        self.logged.get(key)
    }

    /// Ordered iteration over `[start, end)` including pending writes.
    pub fn range<'a>(&'a self, start: Bound<&[u8]>, end: Bound<&[u8]>) -> Result<KvIter<'a>> {
        self.logged.range(start, end)
    }

    /// Writes `key` = `value` (pending until [`StateHandle::commit`]).
    pub fn put(&mut self, key: impl Into<Bytes>, value: impl Into<Bytes>) {
        self.logged.put(key, value);
    }

    /// Deletes `key` (pending until [`StateHandle::commit`]).
    pub fn delete(&mut self, key: impl Into<Bytes>) {
        self.logged.delete(key);
    }

    /// Pending writes.
    pub fn pending_len(&self) -> usize {
        self.logged.pending_len()
    }

    /// Drops the pending writes.
    pub fn discard(&mut self) {
        self.logged.discard();
    }

    /// Commits the pending writes (changelog first, then the store; see
    /// [`LoggedStore::commit`]) and, when the policy says a snapshot is
    /// due, captures a cut here and writes it in the background. A failing
    /// capture or snapshot never fails the commit: it is recorded in
    /// [`StateHandle::status`] and retried after a backoff.
    pub fn commit(&mut self) -> Result<Option<CommitInfo>> {
        self.check_writable()?;
        let info = self.logged.commit()?;
        self.after_commit(None);
        Ok(info)
    }

    /// Starts a snapshot now (after the next commit's records, whatever the
    /// policy's triggers say). Returns `false` if one is already in flight
    /// or there is nothing new since the last one.
    pub fn snapshot_now(&mut self) -> Result<bool> {
        self.check_writable()?;
        Ok(self.after_commit(Some(Trigger::Requested)))
    }

    /// Waits until no snapshot of this store is in flight, and returns its
    /// status.
    pub async fn wait_for_snapshot(&self) -> StoreStatus {
        let mut rx = self.shared.in_flight.subscribe();
        // The sender lives in `self.shared`: it cannot be dropped here.
        let _ = rx.wait_for(|f| !*f).await;
        self.status()
    }

    /// Replays changelog records the store has not applied (after a
    /// failed store write; see [`LoggedStore::catch_up`]).
    pub fn catch_up(&mut self) -> Result<ReplayReport> {
        let r = self.logged.catch_up(&ReplayOptions::default())?;
        self.after_commit(None);
        Ok(r)
    }

    /// How the store was opened: its source (local / snapshot / full
    /// replay), every candidate with its verdict, bytes moved, records
    /// replayed.
    pub fn report(&self) -> &RestoreReport {
        &self.report
    }

    /// From the call to [`StateManager::open`] to a ready store.
    pub fn opened_in(&self) -> Duration {
        self.opened_in
    }

    /// This store's snapshot status.
    pub fn status(&self) -> StoreStatus {
        self.shared
            .status(self.manager.inner.clock.now_ms(), &self.manager.rates())
    }

    /// The store (committed state only).
    pub fn store(&self) -> &F::Store {
        self.logged.store()
    }

    /// The changelog.
    pub fn changelog(&self) -> &C {
        &self.changelog
    }

    /// The store partition.
    pub fn store_key(&self) -> &StoreKey {
        &self.shared.key
    }

    /// Hands the partition off: waits for a snapshot in flight, then takes
    /// a snapshot at the last committed offset unless the last one already
    /// covers it, and waits for it — all within the policy's
    /// `close_deadline`. The next owner's `open` then replays nothing.
    /// Pending (uncommitted) writes are dropped, as a crash would. On error
    /// (`transient` for the deadline) the handle is gone all the same;
    /// nothing committed is lost (the changelog has it), the next owner
    /// replays more.
    pub async fn close(mut self) -> Result<CloseReport> {
        let started = Instant::now();
        let deadline = tokio::time::Instant::now() + self.policy.close_deadline;
        let discarded_pending = self.logged.pending_len();
        if discarded_pending > 0 {
            tracing::warn!(store_key = %self.shared.key, pending = discarded_pending, "close drops uncommitted writes");
            self.logged.discard();
        }
        let key = self.shared.key.clone();
        let late = |what: &str| {
            Error::new(
                ErrorKind::Transient,
                format!(
                    "{what} did not finish within the close deadline store_key=`{key}` \
                     deadline_ms={}; nothing committed is lost, the next owner replays more",
                    self.policy.close_deadline.as_millis()
                ),
            )
        };
        if self.read_only.is_some() {
            return Ok(CloseReport {
                snapshot: None,
                offset: None,
                took_snapshot: false,
                discarded_pending,
                duration: started.elapsed(),
            });
        }
        let mut rx = self.shared.in_flight.subscribe();
        if tokio::time::timeout_at(deadline, rx.wait_for(|f| !*f))
            .await
            .is_err()
        {
            return Err(late("the snapshot in flight"));
        }
        let applied = self.logged.store().applied_offset()?;
        let parent = lock(&self.shared.state).parent.clone();
        let covered = match (applied, &parent) {
            (None, _) => true,
            (Some(a), Some(p)) => p.changelog.offset >= a,
            (Some(_), None) => false,
        };
        if covered {
            return Ok(CloseReport {
                snapshot: parent.as_ref().map(|p| p.snapshot_id),
                offset: parent.as_ref().map(|p| p.changelog.offset),
                took_snapshot: false,
                discarded_pending,
                duration: started.elapsed(),
            });
        }
        let cut = self.format.capture(self.logged.store())?;
        let snap_started = Instant::now();
        lock(&self.shared.state).last_trigger = Some(Trigger::Handoff);
        self.shared.start();
        let inner = &self.manager.inner;
        let span = tracing::info_span!("snapshot", store_key = %key, trigger = %Trigger::Handoff);
        let write = self.job(cut, parent).run().instrument(span);
        let result = match tokio::time::timeout_at(deadline, write).await {
            Ok(r) => r,
            Err(_) => Err(late("the handoff snapshot")),
        };
        self.shared
            .finish(&result, snap_started, inner.clock.now_ms(), &self.policy);
        let m = result?;
        Ok(CloseReport {
            snapshot: Some(m.snapshot_id),
            offset: Some(m.changelog.offset),
            took_snapshot: true,
            discarded_pending,
            duration: started.elapsed(),
        })
    }

    /// Drops the handle without a handoff snapshot: a snapshot in flight
    /// is cancelled (it commits nothing; its blobs are collected by gc) and
    /// this waits until its task let go of the changelog, so the partition
    /// can be reopened at once. The next owner restores from the last
    /// snapshot and replays the tail. Dropping a handle cancels the same
    /// way without waiting.
    pub async fn abandon(self) {
        self.shared.cancel.cancel();
        let mut rx = self.shared.in_flight.subscribe();
        // The sender lives in `self.shared`: it cannot be dropped here.
        let _ = rx.wait_for(|f| !*f).await;
    }

    fn job(&self, cut: F::Cut, parent: Option<Manifest>) -> SnapshotJob<F, C> {
        let inner = &self.manager.inner;
        SnapshotJob {
            format: self.format.clone(),
            cut,
            repo: inner.repo.clone(),
            key: self.shared.key.clone(),
            changelog: self.changelog.clone(),
            parent,
            transfers: inner.transfers.clone(),
            options: self.snapshot_options(),
        }
    }

    fn snapshot_options(&self) -> SnapshotOptions {
        SnapshotOptions {
            logical_digest: self.policy.logical_digest,
            replay_records_per_sec: self.manager.measured_replay_rate().map(|r| r as u64),
        }
    }

    fn check_writable(&self) -> Result<()> {
        match self.read_only {
            Some(o) => Err(Error::config(format!(
                "this handle was opened at a point in time and is read-only store_key=`{}` \
                 at_offset={o}; open it without at_offset to write",
                self.shared.key
            ))
            .with_reason(crate::Reason::ReadOnly)),
            None => Ok(()),
        }
    }

    /// Updates the status after the store moved and starts a snapshot when
    /// `forced` or the policy says so. Returns whether one was started.
    fn after_commit(&mut self, forced: Option<Trigger>) -> bool {
        let applied = match self.logged.store().applied_offset() {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!(store_key = %self.shared.key, error = %e, "cannot read the applied offset");
                return false;
            }
        };
        let inner = &self.manager.inner;
        let now = inner.clock.now_ms();
        let in_flight = *self.shared.in_flight.borrow();
        let trigger = {
            let mut st = lock(&self.shared.state);
            st.applied_offset = applied;
            if self.manager.is_shut_down() {
                return false;
            }
            let records_since = Shared::records_since(&st);
            let rate = self.manager.rates().replay_records_per_sec;
            self.shared.metrics.records_since.set(records_since as f64);
            self.shared
                .metrics
                .estimated_tail_replay
                .set(policy::replay_time(records_since, rate).as_secs_f64());
            match forced {
                Some(t) if records_since > 0 && !in_flight => t,
                Some(_) => return false,
                None => {
                    let input = PolicyInput {
                        now_ms: now,
                        records_since,
                        since_ms: st
                            .parent
                            .as_ref()
                            .map_or(st.opened_at_ms, |p| p.created_at.max(st.opened_at_ms)),
                        last_attempt_ms: st.last_attempt_ms,
                        retry_at_ms: st.retry_at_ms,
                        in_flight,
                        replay_records_per_sec: rate,
                    };
                    match policy::due(&self.policy, &input) {
                        Ok(Some(t)) => t,
                        Ok(None) => return false,
                        Err(()) => {
                            self.shared.metrics.coalesced.increment(1);
                            st.coalesced += 1;
                            return false;
                        }
                    }
                }
            }
        };
        self.start_snapshot(trigger, now)
    }

    fn start_snapshot(&mut self, trigger: Trigger, now: i64) -> bool {
        let started = Instant::now();
        let key = self.shared.key.clone();
        {
            let mut st = lock(&self.shared.state);
            st.last_attempt_ms = Some(now);
            st.last_trigger = Some(trigger);
        }
        // The only step on the processing thread.
        let cut = match self.format.capture(self.logged.store()) {
            Ok(c) => c,
            Err(e) => {
                self.shared.finish(&Err(e), started, now, &self.policy);
                return false;
            }
        };
        self.shared
            .metrics
            .capture_seconds
            .record(started.elapsed().as_secs_f64());
        self.shared.start();
        let parent = lock(&self.shared.state).parent.clone();
        let inner = &self.manager.inner;
        let span = tracing::info_span!("snapshot", store_key = %key, trigger = %trigger);
        let write = self.job(cut, parent).run();
        let (shared, policy, clock) = (
            self.shared.clone(),
            self.policy.clone(),
            inner.clock.clone(),
        );
        inner.tasks.spawn_on(
            async move {
                let result = tokio::select! {
                    r = write => r,
                    () = shared.cancel.cancelled() => Err(cancelled("snapshot", &key)),
                };
                if let Ok(m) = &result {
                    tracing::info!(snapshot = %m.snapshot_id, offset = m.changelog.offset, "snapshot committed");
                }
                shared.finish(&result, started, clock.now_ms(), &policy);
            }
            .instrument(span),
            inner.background.handle(),
        );
        true
    }
}

impl<F: StoreFormat, C: Changelog> Drop for StateHandle<F, C> {
    fn drop(&mut self) {
        self.shared.cancel.cancel();
        if self.read_only.is_none() {
            self.manager.deregister(&self.shared.key);
        }
    }
}
