//! The runtime: the one way in for a stream processor.
//!
//! One [`StateManager`] per process holds the repository, the clock, the
//! snapshot policy, the budget of concurrent transfers shared by all stores,
//! and the measured rates its estimates use. [`StateManager::open`] turns a
//! [`StoreSpec`] (store partition, changelog, format, local directory) into
//! a ready [`StateHandle`] along the fastest exact path — the local store,
//! else the newest usable snapshot and the tail, else a full replay — and
//! reports which it took and why ([`StateHandle::report`]).
//! [`StateManager::plan`] is the same decision as a dry run.
//!
//! A handle takes snapshots in the background as its [`SnapshotPolicy`]
//! says: [`StateHandle::commit`] captures a cut on the caller's thread (an
//! O(1) clone or a RocksDB checkpoint of hard links) when one is due, and a
//! task on the manager's tokio runtime writes and commits it. One snapshot
//! is in flight per store; a failed one is retried after a backoff, never
//! blocks commits, and never leaves a partial snapshot (the manifest is the
//! last thing written). [`StateHandle::close`] takes a handoff snapshot at
//! the last committed offset so the next owner of the partition replays
//! nothing; [`StateHandle::abandon`] drops the handle without one.
//!
//! Each handle owns its format value, and with it the per-store writer
//! state incremental snapshots reuse (the portable format's last cut, the
//! RocksDB format's file-hash cache): nothing is shared between stores.
//!
//! ```
//! # #[tokio::main(flavor = "multi_thread", worker_threads = 2)]
//! # async fn main() -> statesnap::Result<()> {
//! use statesnap::runtime::{SnapshotPolicy, StateManager, StoreSpec};
//! use statesnap::{FileChangelog, Repository, StoreKey};
//! # let dir = tempfile::tempdir().expect("tempdir");
//! # let url = format!("file://{}", dir.path().join("repo").display());
//!
//! let repo = Repository::init(&url, Default::default()).await?;
//! let state = StateManager::builder(repo)
//!     .policy(SnapshotPolicy::default().every_records(10_000))
//!     .build()?;
//! // A partition is assigned to this process:
//! let key = StoreKey::new("shop", "carts", 0)?;
//! let log = FileChangelog::open(dir.path().join("log"), key.changelog_id(), Default::default())?;
//! let mut carts = state
//!     .open(StoreSpec::memory(key, log, dir.path().join("carts")))
//!     .await?;
//! carts.put("cart-1", "apples");
//! carts.commit()?;
//! // The partition is revoked: a handoff snapshot, so the next owner
//! // replays nothing.
//! let closed = carts.close().await?;
//! assert!(closed.snapshot.is_some());
//! state.shutdown().await;
//! # Ok(()) }
//! ```

mod background;
mod handle;
mod maintain;
mod policy;
mod standby;
mod status;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use self::background::Background;
use crate::changelog::Changelog;
use crate::clock::SharedClock;
use crate::error::{Error, ErrorKind, Result};
use crate::format::StoreFormat;
use crate::format::portable::PortableFormat;
use crate::repo::{Repository, StoreKey};
use crate::restore::{PlanOptions, Rates, RestorePlan, plan_restore};
use crate::store::memory::MemoryStore;

pub use background::BackgroundOptions;
pub use handle::{CloseReport, StateHandle};
pub use maintain::{Maintenance, MaintenanceReport};
pub use policy::{SnapshotPolicy, Trigger};
pub use standby::{
    Bootstrap, Lag, PromoteError, RebootstrapCause, StandbyHandle, StandbyOptions, StandbyState,
    StandbyStatus,
};
pub use status::StoreStatus;

/// One store partition to open: its key in the repository, its changelog,
/// its format (a fresh value per store: it carries the store's writer
/// state) and its local directory.
#[derive(Debug)]
pub struct StoreSpec<F, C> {
    /// The store partition in the repository.
    pub store_key: StoreKey,
    /// Its changelog.
    pub changelog: C,
    /// How it is snapshotted and restored.
    pub format: F,
    /// Where the local store lives (RocksDB files; restore staging).
    pub dir: PathBuf,
    /// Point in time: open the store as of this changelog offset, read-only.
    pub at_offset: Option<u64>,
    /// This store's policy instead of the manager's.
    pub policy: Option<SnapshotPolicy>,
    /// Check a restored snapshot's logical digest before replaying the
    /// tail (see [`crate::restore::RestoreOptions::verify_digest`]).
    pub verify_digest: bool,
}

impl<F: StoreFormat, C: Changelog> StoreSpec<F, C> {
    /// A spec for `store_key` with the manager's policy.
    pub fn new(store_key: StoreKey, changelog: C, format: F, dir: impl Into<PathBuf>) -> Self {
        StoreSpec {
            store_key,
            changelog,
            format,
            dir: dir.into(),
            at_offset: None,
            policy: None,
            verify_digest: false,
        }
    }

    /// Checks a restored snapshot's logical digest (a full scan) before
    /// the tail is replayed; a mismatch falls back to the next candidate.
    pub fn verify_digest(mut self) -> Self {
        self.verify_digest = true;
        self
    }

    /// Opens the store as of changelog offset `offset` (the newest source
    /// at or before it, replayed up to it). The handle is read-only:
    /// `commit` refuses, and no snapshot is taken. Use a directory of its
    /// own: the local store there is replaced.
    pub fn at_offset(mut self, offset: u64) -> Self {
        self.at_offset = Some(offset);
        self
    }

    /// Uses `policy` for this store.
    pub fn policy(mut self, policy: SnapshotPolicy) -> Self {
        self.policy = Some(policy);
        self
    }
}

impl<C: Changelog> StoreSpec<PortableFormat<MemoryStore>, C> {
    /// An in-memory store (portable format) for `store_key`. Memory stores
    /// keep nothing locally: each open restores from the newest snapshot
    /// (or replays).
    pub fn memory(store_key: StoreKey, changelog: C, dir: impl Into<PathBuf>) -> Self {
        StoreSpec::new(store_key, changelog, PortableFormat::memory(), dir)
    }
}

#[cfg(feature = "rocksdb")]
impl<C: Changelog> StoreSpec<crate::format::rocks::RocksFormat, C> {
    /// A RocksDB store (default options) for `store_key`, living in `dir`.
    pub fn rocksdb(store_key: StoreKey, changelog: C, dir: impl Into<PathBuf>) -> Self {
        let format = crate::format::rocks::RocksFormat::new(Default::default());
        StoreSpec::new(store_key, changelog, format, dir)
    }
}

/// Builds a [`StateManager`].
#[derive(Debug)]
pub struct StateManagerBuilder {
    repo: Repository,
    policy: SnapshotPolicy,
    clock: Option<SharedClock>,
    max_transfers: usize,
    rates: Rates,
    maintenance: Option<Maintenance>,
    background: BackgroundOptions,
    standby: StandbyOptions,
}

impl StateManagerBuilder {
    /// How standbys follow their changelogs ([`StateManager::standby`]).
    pub fn standby_options(mut self, options: StandbyOptions) -> Self {
        self.standby = options;
        self
    }

    /// Where background snapshots and maintenance run (default: one
    /// low-priority thread of the manager's own; see
    /// [`BackgroundOptions`]).
    pub fn background(mut self, options: BackgroundOptions) -> Self {
        self.background = options;
        self
    }

    /// Runs retention and gc over the open stores every `m.every` (see
    /// [`StateManager::maintain_now`]). Off by default.
    pub fn maintenance(mut self, m: Maintenance) -> Self {
        self.maintenance = Some(m);
        self
    }

    /// The default snapshot policy of every store.
    pub fn policy(mut self, policy: SnapshotPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// The time source (default: the repository's clock).
    pub fn clock(mut self, clock: SharedClock) -> Self {
        self.clock = Some(clock);
        self
    }

    /// How many snapshot writes and restores run at once across all stores
    /// (each moves up to the repository's `transfer.parallelism` blobs at
    /// once). Default 4.
    pub fn max_concurrent_transfers(mut self, n: usize) -> Self {
        self.max_transfers = n.max(1);
        self
    }

    /// Limits all blob transfers of this manager (snapshot uploads and
    /// restore downloads of every store together) to `bytes_per_sec`.
    pub fn bandwidth_limit(self, bytes_per_sec: u64) -> Self {
        self.shared_bandwidth_limit(Arc::new(crate::repo::BandwidthLimit::new(bytes_per_sec)))
    }

    /// Draws every blob transfer of this manager from `limit`, which other
    /// managers (or repositories) may share.
    pub fn shared_bandwidth_limit(mut self, limit: Arc<crate::repo::BandwidthLimit>) -> Self {
        self.repo = self.repo.with_bandwidth_limit(limit);
        self
    }

    /// The rates estimates start from before anything was measured.
    pub fn initial_rates(mut self, rates: Rates) -> Self {
        self.rates = rates;
        self
    }

    /// Builds the manager. Must be called inside a tokio runtime: its
    /// background work runs there (fails `config` otherwise).
    pub fn build(self) -> Result<StateManager> {
        let rt = tokio::runtime::Handle::try_current().map_err(|e| {
            Error::config(format!(
                "StateManager::build needs a tokio runtime ({e}); call it from async code"
            ))
        })?;
        let clock = self.clock.unwrap_or_else(|| self.repo.clock().clone());
        let background = Background::start(self.background, rt.clone())?;
        let manager = StateManager {
            inner: Arc::new(Inner {
                repo: self.repo,
                policy: self.policy,
                clock,
                rt,
                background,
                standby: self.standby,
                cancel: CancellationToken::new(),
                tasks: TaskTracker::new(),
                transfers: Arc::new(tokio::sync::Semaphore::new(self.max_transfers)),
                open: Mutex::new(BTreeMap::new()),
                dirs: Mutex::new(BTreeMap::new()),
                standbys: Mutex::new(Vec::new()),
                rates: Mutex::new(RateBook {
                    rates: self.rates,
                    download_measured: false,
                    replay_measured: false,
                }),
            }),
        };
        if let Some(m) = self.maintenance {
            let inner = &manager.inner;
            inner.tasks.spawn_on(
                maintain::run(Arc::downgrade(inner), m),
                inner.background.handle(),
            );
        }
        Ok(manager)
    }
}

/// The runtime of one process: see the [module docs](self). Cheap to clone.
#[derive(Debug, Clone)]
pub struct StateManager {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    repo: Repository,
    policy: SnapshotPolicy,
    clock: SharedClock,
    /// The runtime that built the manager: restores run there.
    rt: tokio::runtime::Handle,
    /// Background snapshots and maintenance run here.
    background: Background,
    standby: StandbyOptions,
    cancel: CancellationToken,
    tasks: TaskTracker,
    transfers: Arc<tokio::sync::Semaphore>,
    /// Open stores, with the status cell their handle updates.
    open: Mutex<BTreeMap<StoreKey, Arc<status::Shared>>>,
    /// The directories of open handles and standbys (canonical paths),
    /// whose, and what holds it.
    dirs: Mutex<BTreeMap<PathBuf, (StoreKey, DirUse)>>,
    /// Standbys (listed while their handles live).
    standbys: Mutex<Vec<std::sync::Weak<standby::Listing>>>,
    rates: Mutex<RateBook>,
}

/// What holds a store directory in a manager.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DirUse {
    /// A handle that writes (or will).
    Handle,
    /// A read-only point-in-time handle.
    PointInTime,
    /// A standby.
    Standby,
}

/// The rates estimates use, and which of them this process measured.
#[derive(Debug, Clone, Copy)]
struct RateBook {
    rates: Rates,
    download_measured: bool,
    replay_measured: bool,
}

pub(crate) use crate::util::lock;

impl StateManager {
    /// A builder over `repo`.
    pub fn builder(repo: Repository) -> StateManagerBuilder {
        StateManagerBuilder {
            repo,
            policy: SnapshotPolicy::default(),
            clock: None,
            max_transfers: 4,
            rates: Rates::default(),
            maintenance: None,
            background: BackgroundOptions::default(),
            standby: StandbyOptions::default(),
        }
    }

    /// The repository.
    pub fn repository(&self) -> &Repository {
        &self.inner.repo
    }

    /// The manager's clock: milliseconds since the Unix epoch (the system
    /// clock unless one was injected).
    pub fn now_ms(&self) -> i64 {
        self.inner.clock.now_ms()
    }

    /// The rates estimates use: measured by this process's restores and
    /// replays (a moving average); before that, what the newest manifest
    /// seen recorded ([`crate::repo::MeasuredRates`]); before that, the
    /// initial figures.
    pub fn rates(&self) -> Rates {
        lock(&self.inner.rates).rates
    }

    /// The replay rate this process measured, if it measured one.
    fn measured_replay_rate(&self) -> Option<f64> {
        let book = lock(&self.inner.rates);
        book.replay_measured
            .then_some(book.rates.replay_records_per_sec)
    }

    /// Records a measured download (`bytes` in `secs`) and replay
    /// (`records` in `replay_secs`); small samples are ignored.
    fn observe(&self, bytes: u64, secs: f64, records: u64, replay_secs: f64) {
        let mut book = lock(&self.inner.rates);
        // Below these a measurement is mostly fixed costs, not a rate.
        if bytes >= 4 << 20 && secs > 0.0 {
            let sample = bytes as f64 / secs;
            book.rates.download_bytes_per_sec = if book.download_measured {
                blend(book.rates.download_bytes_per_sec, sample)
            } else {
                sample
            };
            book.download_measured = true;
        }
        if records >= 10_000 && replay_secs > 0.0 {
            let sample = records as f64 / replay_secs;
            book.rates.replay_records_per_sec = if book.replay_measured {
                blend(book.rates.replay_records_per_sec, sample)
            } else {
                sample
            };
            book.replay_measured = true;
        }
    }

    /// Takes rates the newest of `snapshots` recorded for those this
    /// process has not measured (its upload rate stands in for the
    /// download rate).
    fn seed_rates(&self, snapshots: &[crate::repo::SnapshotInfo]) {
        let Some(m) = snapshots.iter().filter_map(|s| s.manifest.measured).next() else {
            return;
        };
        let mut book = lock(&self.inner.rates);
        if !book.download_measured
            && let Some(r) = m.upload_bytes_per_sec
        {
            book.rates.download_bytes_per_sec = r as f64;
        }
        if !book.replay_measured
            && let Some(r) = m.replay_records_per_sec
        {
            book.rates.replay_records_per_sec = r as f64;
        }
    }

    /// The estimated time to a ready store along `plan`'s chosen step, at
    /// [`StateManager::rates`] (seeded from the plan's manifests where this
    /// process has measured nothing).
    pub fn estimate(&self, plan: &RestorePlan) -> std::time::Duration {
        self.seed_rates(&plan.manifests);
        plan.estimated_time(&self.rates())
    }

    /// The status of every open store.
    pub fn status(&self) -> Vec<StoreStatus> {
        let open: Vec<_> = lock(&self.inner.open).values().cloned().collect();
        let now = self.inner.clock.now_ms();
        let rates = self.rates();
        open.iter().map(|s| s.status(now, &rates)).collect()
    }

    /// The status of every standby whose handle is alive, by store key. A
    /// promoted standby is listed by [`StateManager::status`] instead.
    pub fn standbys(&self) -> Vec<StandbyStatus> {
        let live: Vec<_> = lock(&self.inner.standbys)
            .iter()
            .filter_map(std::sync::Weak::upgrade)
            .collect();
        let mut all: Vec<StandbyStatus> = live.iter().filter_map(|s| s.status()).collect();
        all.sort_by(|a, b| a.store_key.cmp(&b.store_key));
        all
    }

    fn register_standby(&self, listing: &Arc<standby::Listing>) {
        let mut all = lock(&self.inner.standbys);
        all.retain(|w| w.strong_count() > 0);
        all.push(Arc::downgrade(listing));
    }

    /// The restore decision [`StateManager::open`] would take for `spec`,
    /// without changing anything: every candidate with its verdict, bytes
    /// to download and found locally, records to replay, and an estimated
    /// time ([`RestorePlan::estimated_time`] with [`StateManager::rates`]).
    pub async fn plan<F: StoreFormat, C: Changelog>(
        &self,
        spec: &StoreSpec<F, C>,
    ) -> Result<RestorePlan> {
        plan_restore(
            &spec.format,
            &self.inner.repo,
            &spec.store_key,
            &spec.changelog,
            &spec.dir,
            &PlanOptions {
                local_first: true,
                full_replay: false,
                until: spec.at_offset,
            },
        )
        .await
    }

    /// Opens `spec`'s store, restored and caught up with its changelog:
    /// see [`StateHandle`]. The restore runs on a blocking thread, off the
    /// executor's workers, under the manager's transfer budget. Fails
    /// (`config`) if the store is already open in this manager.
    pub async fn open<F, C>(&self, spec: StoreSpec<F, C>) -> Result<StateHandle<F, C>>
    where
        F: StoreFormat + 'static,
        F::Store: 'static,
        C: Changelog + 'static,
    {
        handle::open(self.clone(), spec).await
    }

    /// Starts a warm standby of `spec`'s store, for a partition another
    /// process owns: it bootstraps in the background as [`open`] restores
    /// (the local store, else the newest usable snapshot and the tail),
    /// then follows the changelog; [`StandbyHandle::promote`] turns it into
    /// a [`StateHandle`] replaying only its lag. It never writes to the
    /// changelog or the repository. Returns at once, with the directory
    /// claimed (`config` if another handle of this manager uses it,
    /// `transient` if another process does); wait for the first bootstrap
    /// with [`StandbyHandle::ready`]. Give it a changelog handle that sees
    /// new records as they are appended (Kafka; a file log shared with its
    /// writer in this process — a read-only file log is a frozen view).
    ///
    /// [`open`]: StateManager::open
    pub fn standby<F, C>(&self, spec: StoreSpec<F, C>) -> Result<StandbyHandle<F, C>>
    where
        F: StoreFormat + 'static,
        F::Store: 'static,
        C: Changelog + 'static,
    {
        standby::start(self.clone(), spec, self.inner.standby.clone())
    }

    /// Stops background work: snapshots in flight are cancelled (nothing
    /// partial is left: a cancelled snapshot committed no manifest, its
    /// uploaded blobs are collected by gc), and this waits for their tasks
    /// to end. Handles stay usable for reads and commits; they take no more
    /// snapshots.
    pub async fn shutdown(&self) {
        self.inner.cancel.cancel();
        self.inner.tasks.close();
        self.inner.tasks.wait().await;
    }

    fn is_shut_down(&self) -> bool {
        self.inner.cancel.is_cancelled()
    }

    fn register(&self, key: &StoreKey, shared: Arc<status::Shared>) -> Result<()> {
        let mut open = lock(&self.inner.open);
        if open.contains_key(key) {
            return Err(Error::config(format!(
                "store is already open in this manager store_key=`{key}`; close or abandon its \
                 handle first"
            ))
            .with_reason(crate::Reason::InUse));
        }
        open.insert(key.clone(), shared);
        Ok(())
    }

    fn deregister(&self, key: &StoreKey) {
        lock(&self.inner.open).remove(key);
    }

    /// Claims directory `canonical` for `key`'s handle: two specs naming
    /// one directory would each replace the other's store.
    fn register_dir(&self, canonical: &std::path::Path, key: &StoreKey, by: DirUse) -> Result<()> {
        // A second standby in a live standby's place is a mistake; in the
        // place of a dropped one still ending its last step, it only has
        // to wait. (Read before `dirs` is locked: `standbys` has its own.)
        let live_standby = by == DirUse::Standby
            && lock(&self.inner.standbys)
                .iter()
                .filter_map(std::sync::Weak::upgrade)
                .any(|s| s.is_live_for(key));
        let mut dirs = lock(&self.inner.dirs);
        if let Some((other, DirUse::Standby)) = dirs.get(canonical)
            && other == key
            && (by == DirUse::Handle || (by == DirUse::Standby && !live_standby))
        {
            // A standby of this very store: it is promoted, or, dropped,
            // lets go once its current step has ended.
            let instead = match by {
                DirUse::Handle => "promote the standby instead of opening, or retry",
                _ => "retry",
            };
            return Err(Error::new(
                ErrorKind::Transient,
                format!(
                    "store directory is held by a standby of the same store in this manager \
                     dir=`{}` store_key=`{key}`; {instead} once the dropped standby has let go",
                    canonical.display()
                ),
            )
            .with_reason(crate::Reason::InUse));
        }
        if let Some((other, _)) = dirs.get(canonical) {
            return Err(Error::config(format!(
                "store directory is already used by another open store or standby of this \
                 manager dir=`{}` store_key=`{key}` used_by=`{other}`; give each store \
                 partition a directory of its own (e.g. include the partition in the path)",
                canonical.display()
            ))
            .with_reason(crate::Reason::InUse));
        }
        dirs.insert(canonical.to_path_buf(), (key.clone(), by));
        Ok(())
    }

    /// Records that directory `canonical` is now held by a handle (a
    /// promoted standby's).
    fn held_by_handle(&self, canonical: &std::path::Path) {
        if let Some(entry) = lock(&self.inner.dirs).get_mut(canonical) {
            entry.1 = DirUse::Handle;
        }
    }

    fn deregister_dir(&self, canonical: &std::path::Path) {
        lock(&self.inner.dirs).remove(canonical);
    }
}

fn blend(old: f64, sample: f64) -> f64 {
    0.7 * old + 0.3 * sample
}

fn cancelled(what: &str, key: &StoreKey) -> Error {
    Error::new(
        ErrorKind::Cancelled,
        format!(
            "{what} cancelled (the state manager shut down, or the handle was abandoned) \
             store_key=`{key}`"
        ),
    )
}
