//! Warm standbys (`StateManager::standby`): bootstrapped from a snapshot,
//! following the changelog, read at one offset, promoted with only their
//! lag to replay, rebootstrapped when they cannot follow exactly, and
//! patient with a changelog or repository that cannot be reached. Every
//! state a standby shows is checked against a model of the log at the
//! offset it claims.
#![allow(clippy::unwrap_used)]

use crate::common;

use std::collections::BTreeMap;
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::recorder::Recorded;
use common::{Kv, Rng, contents};
use proptest::prelude::*;
use statesnap::changelog::file::{CompactOptions, FileChangelog, FileChangelogOptions};
use statesnap::changelog::{
    Changelog, ChangelogId, ChangelogReader, Horizon, Lineage, LoggedRecord, Record,
};
use statesnap::format::StoreFormat;
use statesnap::format::portable::PortableFormat;
use statesnap::repo::faulty::{FaultConfig, FaultyStore};
use statesnap::restore::Source;
use statesnap::runtime::{
    RebootstrapCause, SnapshotPolicy, StandbyHandle, StandbyOptions, StandbyState, StandbyStatus,
    StateHandle, StateManager, StoreSpec,
};
use statesnap::store::StateStore;
use statesnap::{Error, ErrorKind, MemoryStore, Reason, Repository, Result, RocksFormat, StoreKey};

/// A view of one or two file logs (the second: the same log recreated,
/// a new lineage) that a test can make unreachable or slow. The owner and
/// the standby each get their own view of the same logs.
struct Tap {
    logs: Arc<[OnceLock<FileChangelog>; 2]>,
    current: AtomicUsize,
    down: AtomicBool,
    delay_ms: AtomicU64,
    /// How many calls are inside their delay now.
    delaying: AtomicUsize,
}

impl Tap {
    fn new(log: FileChangelog) -> Arc<Tap> {
        let logs: Arc<[OnceLock<FileChangelog>; 2]> = Arc::new([OnceLock::new(), OnceLock::new()]);
        let _ = logs[0].set(log);
        Arc::new(Tap {
            logs,
            current: AtomicUsize::new(0),
            down: AtomicBool::new(false),
            delay_ms: AtomicU64::new(0),
            delaying: AtomicUsize::new(0),
        })
    }

    /// Another view of the same logs.
    fn view(&self) -> Arc<Tap> {
        Arc::new(Tap {
            logs: self.logs.clone(),
            current: AtomicUsize::new(self.current.load(Ordering::SeqCst)),
            down: AtomicBool::new(false),
            delay_ms: AtomicU64::new(0),
            delaying: AtomicUsize::new(0),
        })
    }

    fn log(&self) -> &FileChangelog {
        self.logs[self.current.load(Ordering::SeqCst)]
            .get()
            .unwrap()
    }

    fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::SeqCst);
    }

    fn check(&self) -> Result<()> {
        if self.down.load(Ordering::SeqCst) {
            return Err(Error::new(
                ErrorKind::Transient,
                "changelog unreachable (test) at=`tap`",
            ));
        }
        match self.delay_ms.load(Ordering::SeqCst) {
            0 => Ok(()),
            ms => {
                self.delaying.fetch_add(1, Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(ms));
                self.delaying.fetch_sub(1, Ordering::SeqCst);
                Ok(())
            }
        }
    }
}

struct TapReader<'a> {
    inner: Box<dyn ChangelogReader + 'a>,
    tap: &'a Tap,
}

impl ChangelogReader for TapReader<'_> {
    fn next_batch(&mut self, max_records: usize) -> Result<Option<Vec<LoggedRecord>>> {
        self.tap.check()?;
        self.inner.next_batch(max_records)
    }
    fn end_offset(&self) -> u64 {
        self.inner.end_offset()
    }
}

impl Changelog for Tap {
    fn id(&self) -> &ChangelogId {
        self.log().id()
    }
    fn append(&self, batch: &[Record]) -> Result<Vec<u64>> {
        self.check()?;
        self.log().append(batch)
    }
    fn begin_writer(&self) -> Result<Option<statesnap::changelog::WriterClaim>> {
        self.check()?;
        self.log().begin_writer()
    }
    fn append_as(
        &self,
        claim: statesnap::changelog::WriterClaim,
        batch: &[Record],
    ) -> Result<Vec<u64>> {
        self.check()?;
        self.log().append_as(claim, batch)
    }
    fn read_from(&self, from: u64) -> Result<Box<dyn ChangelogReader + '_>> {
        self.check()?;
        Ok(Box::new(TapReader {
            inner: self.log().read_from(from)?,
            tap: self,
        }))
    }
    fn start_offset(&self) -> Result<u64> {
        self.check()?;
        self.log().start_offset()
    }
    fn end_offset(&self) -> Result<u64> {
        self.check()?;
        self.log().end_offset()
    }
    fn lineage(&self) -> Result<Lineage> {
        self.check()?;
        self.log().lineage()
    }
    fn horizon(&self) -> Result<Horizon> {
        self.check()?;
        self.log().horizon()
    }
    fn flush(&self) -> Result<()> {
        self.check()?;
        self.log().flush()
    }
    fn epoch_at(&self, offset: u64) -> Result<Option<u64>> {
        self.log().epoch_at(offset)
    }
}

type Log = Arc<Tap>;

fn key() -> StoreKey {
    StoreKey::new("app", "counts", 0).unwrap()
}

fn open_log(dir: &Path) -> FileChangelog {
    let options = FileChangelogOptions {
        // Small segments: compaction reaches most of the log.
        segment_bytes: 4096,
        ..FileChangelogOptions::default()
    };
    FileChangelog::open(dir, key().changelog_id(), options).unwrap()
}

fn manager(repo: Repository, options: StandbyOptions) -> StateManager {
    StateManager::builder(repo)
        .policy(SnapshotPolicy::manual())
        .standby_options(options)
        .build()
        .unwrap()
}

fn fast() -> StandbyOptions {
    StandbyOptions {
        poll_interval: Duration::from_millis(5),
        retry_backoff: Duration::from_millis(10),
        max_backoff: Duration::from_millis(50),
        idle_check_interval: Duration::from_millis(50),
        ..StandbyOptions::default()
    }
}

/// Which store a test runs on.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Memory,
    Rocks,
}

/// The model: the log's state after every committed batch, by the batch's
/// last offset.
#[derive(Default)]
struct History {
    now: Kv,
    at: BTreeMap<u64, Kv>,
}

impl History {
    fn state_at(&self, offset: Option<u64>) -> Kv {
        offset.map_or_else(Kv::new, |o| {
            self.at
                .range(..=o)
                .next_back()
                .map(|(_, kv)| kv.clone())
                .unwrap_or_default()
        })
    }
}

/// Commits `n` random writes (puts, and deletes one in five) over 64 keys,
/// and records the log's state at each offset the batch took (a reader
/// may see a batch in part, as a replay after a crash would).
fn write_batch<F: StoreFormat>(
    h: &mut StateHandle<F, Log>,
    history: &mut History,
    rng: &mut Rng,
    n: usize,
) -> u64 {
    let mut batch = BTreeMap::new();
    for _ in 0..n {
        let k = Bytes::from(format!("k{:02}", rng.below(64)));
        if rng.chance(20) {
            h.delete(k.clone());
            batch.insert(k, None);
        } else {
            let v = Bytes::from(format!("v{}", rng.next()));
            h.put(k.clone(), v.clone());
            batch.insert(k, Some(v));
        }
    }
    let info = h.commit().unwrap().unwrap();
    // The batch is appended in key order, one record per key.
    assert_eq!(info.records, batch.len());
    for (offset, (k, v)) in (info.first_offset..).zip(batch) {
        match v {
            Some(v) => history.now.insert(k, v),
            None => history.now.remove(&k),
        };
        history.at.insert(offset, history.now.clone());
    }
    info.last_offset
}

async fn snapshot<F: StoreFormat>(h: &mut StateHandle<F, Log>) {
    assert!(h.snapshot_now().unwrap());
    let st = h.wait_for_snapshot().await;
    assert!(st.last_error.is_none(), "{:?}", st.last_error);
}

/// Waits until the standby's state reflects `offset` (or fails the test
/// after 60 s, with its status).
async fn caught_up<F: StoreFormat, C: Changelog>(sb: &StandbyHandle<F, C>, offset: u64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while sb.applied_offset().ok().flatten() != Some(offset) {
        assert!(
            Instant::now() < deadline,
            "standby did not reach offset {offset} within 60 s: {:?}",
            sb.status()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Polls the standby's status until `done` holds and returns it, or fails
/// the test after 60 s, naming what it waited for (`what` the standby
/// should do) with the last status.
async fn status_when<F: StoreFormat, C: Changelog>(
    sb: &StandbyHandle<F, C>,
    what: &str,
    done: impl Fn(&StandbyStatus) -> bool,
) -> StandbyStatus {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let st = sb.status();
        if done(&st) {
            return st;
        }
        assert!(
            Instant::now() < deadline,
            "waited 60 s for the standby to {what}: {st:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Checks that what the standby shows is the model's state at the offset
/// it claims.
fn check_read<F: StoreFormat, C: Changelog>(sb: &StandbyHandle<F, C>, history: &History) {
    let (kv, applied) = sb.read(|s, a| Ok((contents(s), a))).unwrap();
    assert_eq!(kv, history.state_at(applied), "standby at {applied:?}");
}

async fn open<F: StoreFormat + 'static>(
    m: &StateManager,
    spec: StoreSpec<F, Log>,
) -> StateHandle<F, Log> {
    m.open(spec).await.unwrap()
}

/// How a test makes its store type's spec.
type Make<F> = fn(Log, PathBuf) -> StoreSpec<F, Log>;

fn memory(log: Log, dir: PathBuf) -> StoreSpec<PortableFormat<MemoryStore>, Log> {
    StoreSpec::memory(key(), log, dir)
}

fn rocks(log: Log, dir: PathBuf) -> StoreSpec<RocksFormat, Log> {
    StoreSpec::rocksdb(key(), log, dir)
}

/// What each test starts from: a directory, a repository in memory (and
/// the object store under it), a manager, a file log behind a tap, and an
/// owner of the store on it (in directory `o`), with a model of the log.
struct World<F: StoreFormat + 'static> {
    dir: tempfile::TempDir,
    repo: Repository,
    base: Arc<dyn object_store::ObjectStore>,
    m: StateManager,
    log: Log,
    history: History,
    rng: Rng,
    owner: StateHandle<F, Log>,
}

impl<F: StoreFormat + 'static> World<F> {
    async fn new(make: Make<F>, options: StandbyOptions, seed: u64) -> World<F> {
        let dir = tempfile::tempdir().unwrap();
        let (repo, base) = common::memory_repo();
        let m = manager(repo.clone(), options);
        let log = Tap::new(open_log(&dir.path().join("log")));
        let owner = open(&m, make(log.clone(), dir.path().join("o"))).await;
        World {
            dir,
            repo,
            base,
            m,
            log,
            history: History::default(),
            rng: Rng(seed),
            owner,
        }
    }
}

/// The whole life of a standby on one store type: bootstrap from a
/// snapshot, follow while reads stay consistent, the owner dies, promote
/// with the lag replayed and nothing downloaded, then write on.
async fn follow_and_promote<F: StoreFormat + 'static>(make: Make<F>) {
    let World {
        dir,
        m,
        log,
        mut history,
        mut rng,
        mut owner,
        ..
    } = World::new(make, fast(), 7).await;
    for _ in 0..20 {
        write_batch(&mut owner, &mut history, &mut rng, 50);
    }
    snapshot(&mut owner).await;
    let mut last = 0;
    for _ in 0..5 {
        last = write_batch(&mut owner, &mut history, &mut rng, 50);
    }
    let sb = m
        .standby(make(log.view(), dir.path().join("standby")))
        .unwrap();
    sb.ready(Duration::from_secs(60)).await.unwrap();
    let st = sb.status();
    let first = &st.bootstraps[0];
    assert!(matches!(first.source, Source::Snapshot { .. }), "{first:?}");
    assert!(first.cause.is_none());
    assert!(first.bytes_downloaded > 0);
    check_read(&sb, &history);
    caught_up(&sb, last).await;
    // Writes go on; every read sees the log's state at one offset.
    for _ in 0..30 {
        last = write_batch(&mut owner, &mut history, &mut rng, 20);
        check_read(&sb, &history);
    }
    caught_up(&sb, last).await;
    check_read(&sb, &history);
    let scan = sb
        .scan(Bound::Included(b"k10"), Bound::Excluded(b"k20"), 5)
        .unwrap();
    let want: Vec<_> = history
        .now
        .range(Bytes::from_static(b"k10")..Bytes::from_static(b"k20"))
        .take(5)
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    assert_eq!(scan, want);
    let st = sb.status();
    assert_eq!(st.state, StandbyState::Following);
    assert_eq!(st.lag.records, 0);
    assert!(st.records_followed > 0);
    // The manager lists it beside its open stores.
    let listed = m.standbys();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].store_key, key());
    assert_eq!(listed[0].state, StandbyState::Following);
    assert_eq!(listed[0].applied_offset, Some(last));
    // The owner dies without a handoff; promote.
    owner.abandon().await;
    let mut h = sb.promote(Duration::from_secs(60)).await.unwrap();
    assert!(
        m.standbys().is_empty(),
        "a promoted standby is an open store"
    );
    assert_eq!(m.status().len(), 1);
    let report = h.report();
    assert_eq!(
        report.source,
        Source::Standby {
            applied_offset: Some(last)
        }
    );
    assert_eq!(report.transfer.bytes_downloaded, 0);
    assert_eq!(report.replay.records, 0);
    assert_eq!(contents(h.store()), history.now);
    // It is the writer now, and snapshots as one.
    last = write_batch(&mut h, &mut history, &mut rng, 10);
    snapshot(&mut h).await;
    assert_eq!(h.status().last_snapshot_offset, Some(last));
    let closed = h.close().await.unwrap();
    assert_eq!(closed.offset, Some(last));
    m.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_memory_standby_follows_and_is_promoted_exactly() {
    follow_and_promote(memory).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rocksdb_standby_follows_and_is_promoted_exactly() {
    follow_and_promote(rocks).await;
}

/// Promotion replays exactly the records the standby had not applied when
/// the owner died, and downloads nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promotion_replays_exactly_the_lag_at_the_kill() {
    // A standby that polls once an hour: its lag at the kill is all that
    // was written after its bootstrap.
    let hourly = StandbyOptions {
        poll_interval: Duration::from_secs(3600),
        ..StandbyOptions::default()
    };
    let World {
        dir,
        m,
        log,
        mut history,
        mut rng,
        mut owner,
        ..
    } = World::new(rocks, hourly, 11).await;
    for _ in 0..10 {
        write_batch(&mut owner, &mut history, &mut rng, 40);
    }
    snapshot(&mut owner).await;
    let sb = m
        .standby(StoreSpec::rocksdb(key(), log.view(), dir.path().join("s")))
        .unwrap();
    sb.ready(Duration::from_secs(60)).await.unwrap();
    let at_ready = sb.applied_offset().unwrap().unwrap();
    let mut last = 0;
    for _ in 0..7 {
        last = write_batch(&mut owner, &mut history, &mut rng, 30);
    }
    owner.abandon().await;
    let h = sb.promote(Duration::from_secs(60)).await.unwrap();
    assert_eq!(h.report().replay.records, last - at_ready);
    assert_eq!(h.report().transfer.bytes_downloaded, 0);
    assert_eq!(contents(h.store()), history.now);
    m.shutdown().await;
}

/// Defect: with the old owner still live in manager A, a standby of the
/// same file log promoted in manager B did not fence it: A's later commits
/// reached the log and the promoted store. The promoted handle claims the
/// log: A's next commit is refused (`stale`, reason `fenced`) with nothing
/// appended, and the new owner writes on exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_promotion_in_another_manager_fences_the_old_owner() {
    let World {
        dir,
        repo,
        m,
        log,
        mut history,
        mut rng,
        mut owner,
        ..
    } = World::new(rocks, fast(), 31).await;
    for _ in 0..5 {
        write_batch(&mut owner, &mut history, &mut rng, 20);
    }
    snapshot(&mut owner).await;
    let b = manager(repo.clone(), fast());
    let sb = b
        .standby(StoreSpec::rocksdb(key(), log.view(), dir.path().join("s")))
        .unwrap();
    sb.ready(Duration::from_secs(60)).await.unwrap();
    let last = write_batch(&mut owner, &mut history, &mut rng, 10);
    let mut promoted = sb.promote(Duration::from_secs(60)).await.unwrap();
    assert_eq!(promoted.store().applied_offset().unwrap(), Some(last));
    let end = log.end_offset().unwrap();

    // The old owner, still open in manager A, tries to write on.
    owner.put("k00", "from the old owner");
    let e = owner.commit().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Stale, "{e}");
    assert_eq!(e.reason(), Some(Reason::Fenced), "{e}");
    assert_eq!(log.end_offset().unwrap(), end, "nothing reached the log");

    // The new owner writes on; the log and its store agree with the model.
    write_batch(&mut promoted, &mut history, &mut rng, 20);
    assert_eq!(contents(promoted.store()), history.now);
    let (from_log, _) = common::replayed(&*log);
    assert_eq!(
        from_log, history.now,
        "the log holds no write of the old owner"
    );
    owner.abandon().await;
    promoted.abandon().await;
    m.shutdown().await;
    b.shutdown().await;
}

/// The changelog cannot be reached: the standby says so, its lag grows,
/// and it resumes following once the log is back. A promotion meanwhile
/// fails `transient` and gives the standby back; so does one that cannot
/// catch up within its deadline, and `into_spec` then opens the store the
/// ordinary way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_changelog_grows_the_lag_and_following_resumes() {
    let World {
        dir,
        repo,
        m,
        log,
        mut history,
        mut rng,
        mut owner,
        ..
    } = World::new(memory, fast(), 5).await;
    // The standby's manager is another process's.
    let other = manager(repo, fast());
    let mut last = write_batch(&mut owner, &mut history, &mut rng, 40);
    snapshot(&mut owner).await;
    let view = log.view();
    let sb = other
        .standby(StoreSpec::memory(key(), view.clone(), dir.path().join("s")))
        .unwrap();
    sb.ready(Duration::from_secs(60)).await.unwrap();
    caught_up(&sb, last).await;
    view.set_down(true);
    for _ in 0..5 {
        last = write_batch(&mut owner, &mut history, &mut rng, 40);
    }
    let st = status_when(&sb, "retry with a lag of 200 ms or more", |st| {
        st.state == StandbyState::Retrying && st.lag.time >= Duration::from_millis(200)
    })
    .await;
    assert_eq!(st.last_error.as_ref().unwrap().0, ErrorKind::Transient);
    // Reads still see one consistent (older) state.
    check_read(&sb, &history);
    // A promotion cannot reach the log: transient, the standby is back.
    let err = sb.promote(Duration::from_secs(5)).await.unwrap_err();
    assert_eq!(err.error.kind(), ErrorKind::Transient);
    let sb = err.standby;
    view.set_down(false);
    caught_up(&sb, last).await;
    assert_eq!(sb.status().state, StandbyState::Following);
    check_read(&sb, &history);
    // A slow log: the catch-up cannot finish within the deadline.
    view.set_down(true);
    for _ in 0..10 {
        last = write_batch(&mut owner, &mut history, &mut rng, 40);
    }
    owner.abandon().await;
    view.delay_ms.store(300, Ordering::SeqCst);
    view.set_down(false);
    let err = sb.promote(Duration::from_millis(50)).await.unwrap_err();
    assert_eq!(err.error.kind(), ErrorKind::Transient, "{}", err.error);
    // The caller falls back to an ordinary open.
    view.delay_ms.store(0, Ordering::SeqCst);
    let spec = err.standby.into_spec().await.unwrap();
    let h = other.open(spec).await.unwrap();
    assert_eq!(contents(h.store()), history.now);
    assert_eq!(h.store().applied_offset().unwrap(), Some(last));
    m.shutdown().await;
    other.shutdown().await;
}

/// The repository is down when the standby starts: it retries with a
/// backoff, says why meanwhile, and bootstraps from the snapshot once the
/// repository is back — not by replaying the whole log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repository_down_at_bootstrap_is_retried() {
    let World {
        dir,
        base,
        m: owner_m,
        log,
        mut history,
        mut rng,
        mut owner,
        ..
    } = World::new(memory, fast(), 3).await;
    let faulty = Arc::new(FaultyStore::new(base, FaultConfig::default()));
    let flaky =
        Repository::from_store(faulty.clone() as Arc<dyn object_store::ObjectStore>, "").unwrap();
    let m = manager(flaky, fast());
    for _ in 0..10 {
        write_batch(&mut owner, &mut history, &mut rng, 40);
    }
    snapshot(&mut owner).await;
    let last = write_batch(&mut owner, &mut history, &mut rng, 40);
    faulty.set_config(FaultConfig {
        error_probability: 1.0,
        ..FaultConfig::default()
    });
    let sb = m
        .standby(StoreSpec::memory(key(), log.view(), dir.path().join("s")))
        .unwrap();
    let err = sb.ready(Duration::from_millis(300)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Transient);
    let st = status_when(&sb, "retry while the repository is down", |st| {
        st.state == StandbyState::Retrying
    })
    .await;
    assert!(st.bootstraps.is_empty(), "{st:?}");
    assert_eq!(
        sb.get(b"k01").unwrap_err().kind(),
        ErrorKind::Transient,
        "no reads before the bootstrap"
    );
    faulty.set_config(FaultConfig::default());
    sb.ready(Duration::from_secs(60)).await.unwrap();
    let b = &sb.status().bootstraps[0];
    assert!(matches!(b.source, Source::Snapshot { .. }), "{b:?}");
    caught_up(&sb, last).await;
    check_read(&sb, &history);
    m.shutdown().await;
    owner_m.shutdown().await;
}

/// A standby left behind a compacting log (it could not reach it while
/// tombstones were purged) does not replay past the hole: it rebootstraps
/// from the newer snapshot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_below_the_horizon_rebootstraps_from_a_snapshot() {
    let World {
        dir,
        m,
        log,
        mut history,
        mut rng,
        mut owner,
        ..
    } = World::new(rocks, fast(), 9).await;
    let mut last = write_batch(&mut owner, &mut history, &mut rng, 40);
    snapshot(&mut owner).await;
    let view = log.view();
    let sb = m
        .standby(StoreSpec::rocksdb(
            key(),
            view.clone(),
            dir.path().join("s"),
        ))
        .unwrap();
    sb.ready(Duration::from_secs(60)).await.unwrap();
    caught_up(&sb, last).await;
    view.set_down(true);
    for _ in 0..40 {
        last = write_batch(&mut owner, &mut history, &mut rng, 40);
    }
    snapshot(&mut owner).await;
    let report = log
        .log()
        .compact(&CompactOptions {
            delete_retention: Duration::ZERO,
        })
        .unwrap();
    assert!(report.segments_rewritten > 0, "{report:?}");
    let horizon = log.log().horizon().unwrap();
    let behind = sb.status().applied_offset.unwrap();
    assert!(
        !horizon.can_resume_after(Some(behind)),
        "{horizon:?} {behind}"
    );
    view.set_down(false);
    caught_up(&sb, last).await;
    let st = sb.status();
    let again = st.bootstraps.last().unwrap();
    assert_eq!(again.cause, Some(RebootstrapCause::BelowHorizon), "{st:?}");
    assert!(matches!(again.source, Source::Snapshot { .. }), "{again:?}");
    check_read(&sb, &history);
    m.shutdown().await;
}

/// The log is recreated (a new lineage): the standby's store follows a
/// log that no longer exists; it rebootstraps from the new log's snapshot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_lineage_rebootstraps_the_standby() {
    let World {
        dir,
        m,
        log,
        mut history,
        mut rng,
        mut owner,
        ..
    } = World::new(memory, fast(), 13).await;
    let last = write_batch(&mut owner, &mut history, &mut rng, 40);
    snapshot(&mut owner).await;
    let view = log.view();
    let sb = m
        .standby(StoreSpec::memory(key(), view.clone(), dir.path().join("s")))
        .unwrap();
    sb.ready(Duration::from_secs(60)).await.unwrap();
    caught_up(&sb, last).await;
    owner.abandon().await;
    // The log is deleted and created again; a new owner writes into it.
    let _ = log.logs[1].set(open_log(&dir.path().join("log2")));
    log.current.store(1, Ordering::SeqCst);
    let (mut history, mut rng) = (History::default(), Rng(17));
    let mut owner = open(
        &m,
        StoreSpec::memory(key(), log.clone(), dir.path().join("o2")),
    )
    .await;
    let mut last = 0;
    for _ in 0..5 {
        last = write_batch(&mut owner, &mut history, &mut rng, 30);
    }
    snapshot(&mut owner).await;
    view.current.store(1, Ordering::SeqCst);
    caught_up(&sb, last).await;
    let st = sb.status();
    let again = st.bootstraps.last().unwrap();
    assert_eq!(
        again.cause,
        Some(RebootstrapCause::LineageChanged),
        "{st:?}"
    );
    assert!(matches!(again.source, Source::Snapshot { .. }), "{again:?}");
    check_read(&sb, &history);
    m.shutdown().await;
}

/// The standby's directory is deleted under it: it rebootstraps instead
/// of following in a store nobody can find again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_directory_rebootstraps_the_standby() {
    let World {
        dir,
        m,
        log,
        mut history,
        mut rng,
        mut owner,
        ..
    } = World::new(rocks, fast(), 19).await;
    let mut last = write_batch(&mut owner, &mut history, &mut rng, 40);
    snapshot(&mut owner).await;
    let sb = m
        .standby(StoreSpec::rocksdb(key(), log.view(), dir.path().join("s")))
        .unwrap();
    sb.ready(Duration::from_secs(60)).await.unwrap();
    caught_up(&sb, last).await;
    std::fs::remove_dir_all(dir.path().join("s")).unwrap();
    for _ in 0..3 {
        last = write_batch(&mut owner, &mut history, &mut rng, 40);
    }
    caught_up(&sb, last).await;
    let st = status_when(&sb, "bootstrap a second time", |st| {
        st.bootstraps.len() == 2
    })
    .await;
    let again = st.bootstraps.last().unwrap();
    assert_eq!(again.cause, Some(RebootstrapCause::DirectoryLost), "{st:?}");
    assert!(dir.path().join("s").exists());
    caught_up(&sb, last).await;
    check_read(&sb, &history);
    owner.abandon().await;
    let h = sb.promote(Duration::from_secs(60)).await.unwrap();
    assert_eq!(contents(h.store()), history.now);
    m.shutdown().await;
}

/// A standby never writes: no changelog record, no snapshot. Promoting it
/// while the store is open in the same manager is refused, the standby
/// given back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_writes_nothing_and_one_writer_per_manager_holds() {
    let World {
        dir,
        repo,
        m,
        log,
        mut history,
        mut rng,
        mut owner,
        ..
    } = World::new(memory, fast(), 23).await;
    let last = write_batch(&mut owner, &mut history, &mut rng, 40);
    snapshot(&mut owner).await;
    let snaps = repo.catalog().list_snapshots(&key()).await.unwrap();
    let sb = m
        .standby(StoreSpec::memory(key(), log.view(), dir.path().join("s")))
        .unwrap();
    sb.ready(Duration::from_secs(60)).await.unwrap();
    caught_up(&sb, last).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(log.log().end_offset().unwrap(), last + 1);
    let after = repo.catalog().list_snapshots(&key()).await.unwrap();
    assert_eq!(after.snapshots.len(), snaps.snapshots.len());
    let err = sb.promote(Duration::from_secs(5)).await.unwrap_err();
    assert_eq!(err.error.reason(), Some(Reason::InUse), "{}", err.error);
    check_read(&err.standby, &history);
    // A point in time is not something to follow.
    let e = m
        .standby(StoreSpec::memory(key(), log.view(), dir.path().join("p")).at_offset(0))
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Config);
    // Nor is a directory another handle of this manager uses, or another
    // standby of the same store: both are configuration errors, as is a
    // point-in-time open of the standby's directory.
    let e = m
        .standby(StoreSpec::memory(key(), log.view(), dir.path().join("o")))
        .unwrap_err();
    assert_eq!(e.reason(), Some(Reason::InUse));
    assert_eq!(e.kind(), ErrorKind::Config, "{e}");
    let standby = err.standby;
    let e = m
        .standby(StoreSpec::memory(key(), log.view(), dir.path().join("s")))
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Config, "{e}");
    let e = m
        .open(StoreSpec::memory(key(), log.view(), dir.path().join("s")).at_offset(0))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Config, "{e}");
    drop(standby);
    m.shutdown().await;
}

/// A standby's lag, what it followed and its promotion reach the
/// `metrics` facade.
#[test]
fn standby_lag_and_promotion_reach_the_metrics_facade() {
    let rec = Recorded::default();
    let rt = common::rt();
    // The standby's handles are registered on this thread (in `standby`),
    // so they stay bound to `rec` wherever its task runs.
    metrics::with_local_recorder(&rec, || {
        rt.block_on(async {
            let World {
                dir,
                m,
                log,
                mut history,
                mut rng,
                mut owner,
                ..
            } = World::new(memory, fast(), 29).await;
            write_batch(&mut owner, &mut history, &mut rng, 40);
            snapshot(&mut owner).await;
            let sb = m
                .standby(StoreSpec::memory(key(), log.view(), dir.path().join("s")))
                .unwrap();
            sb.ready(Duration::from_secs(60)).await.unwrap();
            let mut last = 0;
            for _ in 0..5 {
                last = write_batch(&mut owner, &mut history, &mut rng, 40);
            }
            caught_up(&sb, last).await;
            let followed = sb.status().records_followed;
            assert!(followed > 0);
            // The counter is bumped right after the poll applied.
            let deadline = Instant::now() + Duration::from_secs(60);
            loop {
                let counted = rec.counter("statesnap_standby_followed_records_total");
                if counted == followed {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "waited 60 s for the followed-records counter to reach {followed}: {counted}"
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            assert_eq!(rec.gauge("statesnap_standby_lag_records"), 0.0);
            owner.abandon().await;
            let h = sb.promote(Duration::from_secs(60)).await.unwrap();
            assert_eq!(rec.samples("statesnap_standby_promote_seconds"), 1);
            // The owner's open and the promotion's.
            assert_eq!(rec.samples("statesnap_open_seconds"), 2);
            h.abandon().await;
            m.shutdown().await;
        });
    });
}

/// A standby dropped in the middle of its bootstrap holds its directory
/// until the step ends: an open of the same store meanwhile is refused
/// `transient` (not `config`), and succeeds once retried.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_standby_lets_its_directory_go_and_an_open_retries() {
    let World {
        dir,
        m,
        log,
        mut history,
        mut rng,
        mut owner,
        ..
    } = World::new(rocks, fast(), 31).await;
    for _ in 0..5 {
        write_batch(&mut owner, &mut history, &mut rng, 40);
    }
    snapshot(&mut owner).await;
    let last = write_batch(&mut owner, &mut history, &mut rng, 40);
    owner.abandon().await;
    // A slow log: the standby's bootstrap replays its tail for a while.
    let view = log.view();
    view.delay_ms.store(100, Ordering::SeqCst);
    let sb = m
        .standby(StoreSpec::rocksdb(
            key(),
            view.clone(),
            dir.path().join("s"),
        ))
        .unwrap();
    // Dropped once the bootstrap is inside a blocking step: a call to the
    // slow log, on the restore's blocking thread.
    let deadline = Instant::now() + Duration::from_secs(60);
    while view.delaying.load(Ordering::SeqCst) == 0 {
        assert!(
            Instant::now() < deadline,
            "waited 60 s for the standby's bootstrap to call the slow log"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    drop(sb);
    // Not listed once its handle is gone, though its last step runs on.
    assert!(m.standbys().is_empty(), "{:?}", m.standbys());
    let mut refusals = 0;
    let deadline = Instant::now() + Duration::from_secs(60);
    let h = loop {
        match m
            .open(StoreSpec::rocksdb(key(), log.view(), dir.path().join("s")))
            .await
        {
            Ok(h) => break h,
            Err(e) => {
                assert_eq!(e.kind(), ErrorKind::Transient, "{e}");
                assert_eq!(e.reason(), Some(Reason::InUse), "{e}");
                refusals += 1;
                assert!(
                    Instant::now() < deadline,
                    "the dropped standby did not let go of its directory within 60 s"
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    };
    assert!(refusals > 0, "the open came after the standby had let go");
    assert_eq!(h.store().applied_offset().unwrap(), Some(last));
    assert_eq!(contents(h.store()), history.now);
    m.shutdown().await;
}

/// A promotion asked for while the standby is still bootstrapping is
/// refused at once, the standby given back following; `into_spec` then
/// stops it (without waiting for more than the restore in flight) and an
/// ordinary open takes over. A standby whose directory was deleted is
/// never promoted with the store it lost: the promotion is refused until
/// it has bootstrapped again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_that_is_not_ready_is_never_promoted() {
    let World {
        dir,
        m,
        log,
        mut history,
        mut rng,
        mut owner,
        ..
    } = World::new(rocks, fast(), 37).await;
    for _ in 0..3 {
        write_batch(&mut owner, &mut history, &mut rng, 40);
    }
    snapshot(&mut owner).await;
    let last = write_batch(&mut owner, &mut history, &mut rng, 40);
    owner.abandon().await;
    let view = log.view();
    view.delay_ms.store(100, Ordering::SeqCst);
    let sb = m
        .standby(rocks(view.clone(), dir.path().join("s")))
        .unwrap();
    let err = sb.promote(Duration::from_secs(10)).await.unwrap_err();
    assert_eq!(err.error.kind(), ErrorKind::Transient, "{}", err.error);
    assert_eq!(
        m.standbys().len(),
        1,
        "a refused promotion leaves it listed"
    );
    let spec = tokio::time::timeout(Duration::from_secs(60), err.standby.into_spec())
        .await
        .expect("into_spec after a refused promotion does not hang")
        .unwrap();
    assert!(m.standbys().is_empty(), "given back: no longer listed");
    view.delay_ms.store(0, Ordering::SeqCst);
    let h = loop {
        match m.open(rocks(log.view(), spec.dir.clone())).await {
            Ok(h) => break h,
            Err(e) => {
                assert_eq!(e.kind(), ErrorKind::Transient, "{e}");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    };
    drop(spec);
    assert_eq!(h.store().applied_offset().unwrap(), Some(last));
    assert_eq!(contents(h.store()), history.now);
    h.abandon().await;

    // The directory goes; the promotion right after must not hand over
    // the store that followed in it.
    let sb = m.standby(rocks(log.view(), dir.path().join("s2"))).unwrap();
    sb.ready(Duration::from_secs(60)).await.unwrap();
    caught_up(&sb, last).await;
    std::fs::remove_dir_all(dir.path().join("s2")).unwrap();
    let sb = match sb.promote(Duration::from_secs(10)).await {
        Ok(_) => panic!("a standby whose directory is gone was promoted"),
        Err(e) => {
            assert_eq!(e.error.kind(), ErrorKind::Transient, "{}", e.error);
            e.standby
        }
    };
    let st = status_when(&sb, "bootstrap a second time and follow", |st| {
        st.bootstraps.len() == 2 && st.state == StandbyState::Following
    })
    .await;
    assert_eq!(
        st.bootstraps.last().unwrap().cause,
        Some(RebootstrapCause::DirectoryLost),
        "{st:?}"
    );
    let h = sb.promote(Duration::from_secs(60)).await.unwrap();
    assert!(dir.path().join("s2").exists());
    assert_eq!(contents(h.store()), history.now);
    m.shutdown().await;
}

#[derive(Debug, Clone)]
enum Op {
    /// Commit a batch of this many writes.
    Write(u8),
    /// Take a snapshot.
    Snapshot,
    /// Start the standby (if not started).
    Start,
    /// Cut the standby off from the log / give it back.
    Down(bool),
    /// Check a read against the model.
    Read,
    /// Drop the standby (if started): the log and the repository stay as
    /// they were, and its directory is let go (a later `Start` takes it).
    Drop,
    /// Ask for a promotion while the owner is still open and the standby
    /// is cut off from the log: it is refused, the standby given back, and
    /// nothing else changes: the log and the repository byte for byte, and
    /// the owner (not fenced) commits on.
    RefusedPromotion,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (1u8..40).prop_map(Op::Write),
        1 => Just(Op::Snapshot),
        1 => Just(Op::Start),
        1 => any::<bool>().prop_map(Op::Down),
        2 => Just(Op::Read),
        1 => Just(Op::Drop),
        1 => Just(Op::RefusedPromotion),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    /// Whatever happens between a standby's start and its promotion —
    /// snapshots, writes, outages, standbys dropped at any point of their
    /// life, promotions refused — every read shows the model's state at
    /// the offset it claims, a drop or a refusal writes nothing, and the
    /// promoted store is the model's final state, with the lag replayed
    /// and nothing downloaded.
    #[test]
    fn a_standby_is_exact_whatever_happens(
        ops in prop::collection::vec(op(), 1..40),
        on_rocks in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let rt = common::rt();
        rt.block_on(async move {
            let kind = if on_rocks { Kind::Rocks } else { Kind::Memory };
            match kind {
                Kind::Memory => model_run(ops, seed, memory).await,
                Kind::Rocks => model_run(ops, seed, rocks).await,
            }
        });
    }
}

/// A standby from `spec()`, retried while a dropped standby of the same
/// store still holds the directory (`transient`, `InUse`), for up to 60 s.
async fn start_standby<F: StoreFormat + 'static>(
    m: &StateManager,
    spec: impl Fn() -> StoreSpec<F, Log>,
) -> StandbyHandle<F, Log> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match m.standby(spec()) {
            Ok(s) => return s,
            Err(e) => {
                assert_eq!(e.kind(), ErrorKind::Transient, "{e}");
                assert_eq!(e.reason(), Some(Reason::InUse), "{e}");
                assert!(
                    Instant::now() < deadline,
                    "a dropped standby did not let go of its directory within 60 s"
                );
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    }
}

/// What a standby must never change: every file of the log directory and
/// every object of the repository, with their bytes.
async fn written(
    log_dir: &Path,
    repo: &Arc<dyn object_store::ObjectStore>,
) -> (BTreeMap<PathBuf, common::Node>, BTreeMap<String, Bytes>) {
    use futures::TryStreamExt;
    use object_store::ObjectStoreExt;
    let mut objects = BTreeMap::new();
    let listed: Vec<_> = repo.list(None).try_collect().await.unwrap();
    for meta in listed {
        let bytes = repo
            .get(&meta.location)
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap();
        objects.insert(meta.location.to_string(), bytes);
    }
    (common::tree(log_dir), objects)
}

async fn model_run<F: StoreFormat + 'static>(ops: Vec<Op>, seed: u64, make: Make<F>) {
    let World {
        dir,
        m,
        log,
        base,
        mut history,
        mut rng,
        mut owner,
        ..
    } = World::new(make, fast(), seed | 1).await;
    let view = log.view();
    let mut sb = None;
    let (mut last, mut dirty) = (None, false);
    for op in ops {
        match op {
            Op::Write(n) => {
                last = Some(write_batch(&mut owner, &mut history, &mut rng, n.into()));
                dirty = true;
            }
            Op::Snapshot if dirty => {
                snapshot(&mut owner).await;
                dirty = false;
            }
            Op::Snapshot => {}
            Op::Start if sb.is_none() => {
                let s = start_standby(&m, || make(view.clone(), dir.path().join("s"))).await;
                if !view.down.load(Ordering::SeqCst) {
                    s.ready(Duration::from_secs(60)).await.unwrap();
                }
                sb = Some(s);
            }
            Op::Start => {}
            Op::Down(d) => view.set_down(d),
            Op::Read => match sb.as_ref().map(|s| s.read(|s, a| Ok((contents(s), a)))) {
                Some(Ok((kv, applied))) => assert_eq!(kv, history.state_at(applied)),
                // Not bootstrapped yet: the log was down when it started.
                Some(Err(e)) => assert_eq!(e.kind(), ErrorKind::Transient),
                None => {}
            },
            Op::Drop => {
                if let Some(s) = sb.take() {
                    let before = written(&dir.path().join("log"), &base).await;
                    drop(s);
                    let after = written(&dir.path().join("log"), &base).await;
                    assert!(
                        before == after,
                        "a dropped standby wrote to the log or the repository"
                    );
                }
            }
            Op::RefusedPromotion => {
                if let Some(s) = sb.take() {
                    let was_down = view.down.load(Ordering::SeqCst);
                    view.set_down(true);
                    let before = written(&dir.path().join("log"), &base).await;
                    match s.promote(Duration::from_millis(200)).await {
                        Ok(_) => panic!("a standby cut off from its log was promoted"),
                        // Refused for either of two reasons: the owner is
                        // still open in this manager (`config`), or the
                        // log cannot be reached (`transient`).
                        Err(e) => {
                            assert!(
                                matches!(e.error.kind(), ErrorKind::Transient | ErrorKind::Config),
                                "{}",
                                e.error
                            );
                            sb = Some(e.standby);
                        }
                    }
                    let after = written(&dir.path().join("log"), &base).await;
                    assert!(
                        before == after,
                        "a refused promotion wrote to the log or the repository"
                    );
                    view.set_down(was_down);
                    // Not fenced: the owner's next commit goes through.
                    last = Some(write_batch(&mut owner, &mut history, &mut rng, 1));
                    dirty = true;
                }
            }
        }
    }
    view.set_down(false);
    let sb = match sb {
        Some(s) => s,
        None => start_standby(&m, || make(view.clone(), dir.path().join("s"))).await,
    };
    sb.ready(Duration::from_secs(60)).await.unwrap();
    owner.abandon().await;
    let before = sb.status().applied_offset;
    let h = sb.promote(Duration::from_secs(60)).await.unwrap();
    let report = h.report();
    assert_eq!(report.transfer.bytes_downloaded, 0);
    let next = |o: Option<u64>| o.map_or(0, |o| o + 1);
    assert!(report.replay.records <= next(last) - next(before).min(next(last)));
    assert_eq!(h.store().applied_offset().unwrap(), last);
    assert_eq!(contents(h.store()), history.now);
    m.shutdown().await;
}
