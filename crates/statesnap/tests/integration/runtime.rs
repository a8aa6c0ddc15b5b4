//! The runtime (StateManager / StateHandle): open along the fastest exact
//! path, plan = open's decision, background snapshots by policy, handoff on
//! close, abandon, shutdown — for the in-memory (portable) and the RocksDB
//! formats, against a real local-directory repository (and the
//! fault-injecting object store where faults are the point).
#![allow(clippy::unwrap_used)]

use crate::common;

use bytes::Bytes;
use object_store::ObjectStore;
use object_store::memory::InMemory;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::recorder::Recorded;
use common::{Kv, Rng, contents, key};
use statesnap::clock::{ManualClock, SharedClock};
use statesnap::repo::faulty::{FaultConfig, FaultyStore};
use statesnap::restore::Source;
use statesnap::runtime::{SnapshotPolicy, StateHandle, StateManager, StoreSpec, Trigger};
use statesnap::{ErrorKind, Reason};
use statesnap::{FileChangelog, Repository, StoreKey};

type Log = FileChangelog;

fn log(dir: &Path) -> statesnap::Result<Log> {
    FileChangelog::open(
        dir.join("log"),
        StoreKey::new("app", "rt", 0)?.changelog_id(),
        Default::default(),
    )
}

async fn repo(dir: &Path, clock: &ManualClock) -> Repository {
    let url = format!("file://{}", dir.join("repo").display());
    let opts = statesnap::RepositoryOptions {
        clock: Arc::new(clock.clone()),
        ..Default::default()
    };
    Repository::init(&url, opts).await.unwrap()
}

/// A temporary directory, a manual clock and a repository in the
/// directory using it.
async fn setup() -> (tempfile::TempDir, ManualClock, Repository) {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(1_000_000);
    let repo = repo(dir.path(), &clock).await;
    (dir, clock, repo)
}

fn manager(repo: Repository, clock: &ManualClock, policy: SnapshotPolicy) -> StateManager {
    let clock: SharedClock = Arc::new(clock.clone());
    StateManager::builder(repo)
        .clock(clock)
        .policy(policy)
        .build()
        .unwrap()
}

/// Which store type a test runs on.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    Memory,
    Rocks,
}

/// Opens `kind`'s store in `dir` through `m`, returning a type-erased
/// handle wrapper.
#[derive(Debug)]
enum Handle {
    Memory(StateHandle<statesnap::PortableFormat<statesnap::MemoryStore>, Log>),
    Rocks(StateHandle<statesnap::RocksFormat, Log>),
}

macro_rules! each {
    ($h:expr, $v:ident => $e:expr) => {
        match $h {
            Handle::Memory($v) => $e,
            Handle::Rocks($v) => $e,
        }
    };
}

impl Handle {
    async fn open(
        m: &StateManager,
        kind: Kind,
        dir: &Path,
        store_dir: &str,
        at: Option<u64>,
    ) -> statesnap::Result<Handle> {
        let target = dir.join(store_dir);
        Ok(match kind {
            Kind::Memory => {
                let mut spec = StoreSpec::memory(StoreKey::new("app", "rt", 0)?, log(dir)?, target);
                spec.at_offset = at;
                Handle::Memory(m.open(spec).await?)
            }
            Kind::Rocks => {
                let mut spec =
                    StoreSpec::rocksdb(StoreKey::new("app", "rt", 0)?, log(dir)?, target);
                spec.at_offset = at;
                Handle::Rocks(m.open(spec).await?)
            }
        })
    }

    fn contents(&self) -> Kv {
        each!(self, h => contents(h.store()))
    }

    fn report(&self) -> &statesnap::RestoreReport {
        each!(self, h => h.report())
    }

    fn write(&mut self, k: Bytes, v: Option<Bytes>) {
        each!(self, h => match v {
            Some(v) => h.put(k, v),
            None => h.delete(k),
        })
    }

    fn commit(&mut self) -> statesnap::Result<()> {
        each!(self, h => h.commit().map(|_| ()))
    }

    fn snapshot_now(&mut self) -> bool {
        each!(self, h => h.snapshot_now().unwrap())
    }

    async fn wait(&self) -> statesnap::runtime::StoreStatus {
        each!(self, h => h.wait_for_snapshot().await)
    }

    async fn close(self) -> statesnap::runtime::CloseReport {
        each!(self, h => h.close().await.unwrap())
    }

    async fn abandon(self) {
        each!(self, h => h.abandon().await)
    }

    /// Compacts a RocksDB store's data fully: its files replace every
    /// earlier one, so later snapshots share no SST with earlier ones.
    fn compact(&self) {
        if let Handle::Rocks(h) = self {
            h.store().db().compact_range::<&[u8], &[u8]>(None, None);
        }
    }
}

fn sk() -> StoreKey {
    StoreKey::new("app", "rt", 0).unwrap()
}

/// Commits `n` writes of distinct keys below `keys` (`n` records) to `h`
/// and the model.
fn write_batch(h: &mut Handle, model: &mut Kv, rng: &mut Rng, n: usize, keys: u64) {
    assert!(n as u64 <= keys);
    let start = rng.below(keys);
    for i in 0..n as u64 {
        let k = key(((start + i) % keys) as u8);
        let v = if rng.chance(15) {
            None
        } else {
            Some(Bytes::from(format!("v{}", rng.next() % 1000)))
        };
        h.write(k.clone(), v.clone());
        match v {
            Some(v) => model.insert(k, v),
            None => model.remove(&k),
        };
    }
    h.commit().unwrap();
}

async fn close_hands_off(kind: Kind) {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(1_000_000);
    let m = manager(
        repo(dir.path(), &clock).await,
        &clock,
        SnapshotPolicy::manual(),
    );
    let mut model = Kv::new();
    let mut rng = Rng(7);
    let mut h = Handle::open(&m, kind, dir.path(), "s", None).await.unwrap();
    assert_eq!(h.report().source, Source::FullReplay);
    for _ in 0..20 {
        write_batch(&mut h, &mut model, &mut rng, 25, 60);
    }
    let closed = h.close().await;
    assert!(closed.took_snapshot);
    assert_eq!(closed.offset, Some(499));
    // Same directory: the local store (RocksDB) or the handoff snapshot
    // (memory keeps nothing locally) — either way nothing to replay.
    let h = Handle::open(&m, kind, dir.path(), "s", None).await.unwrap();
    assert_eq!(h.report().replay.records, 0, "{:?}", h.report().source);
    let expected = match kind {
        Kind::Memory => Source::Snapshot {
            id: closed.snapshot.unwrap(),
            offset: 499,
        },
        Kind::Rocks => Source::Local {
            applied_offset: Some(499),
        },
    };
    assert_eq!(h.report().source, expected);
    assert_eq!(h.contents(), model);
    // Closing again with nothing new takes no snapshot.
    let again = h.close().await;
    assert!(!again.took_snapshot);
    assert_eq!(again.snapshot, closed.snapshot);
    // Another machine (a fresh directory): the handoff snapshot, no replay.
    let h = Handle::open(&m, kind, dir.path(), "elsewhere", None)
        .await
        .unwrap();
    assert_eq!(
        h.report().source,
        Source::Snapshot {
            id: closed.snapshot.unwrap(),
            offset: 499
        }
    );
    assert_eq!(h.report().replay.records, 0);
    assert_eq!(h.contents(), model);
    h.abandon().await;
    m.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_hands_off_and_the_next_open_replays_nothing_memory() {
    close_hands_off(Kind::Memory).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_hands_off_and_the_next_open_replays_nothing_rocks() {
    close_hands_off(Kind::Rocks).await;
}

/// `plan` names the source `open` then uses, with the figures it reports,
/// for every kind of candidate: full replay, snapshot, local store (ahead of
/// and behind the newest snapshot), fallback past a rotten snapshot, and a
/// point in time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plan_agrees_with_open_for_every_candidate_kind() {
    let (dir, clock, repo) = setup().await;
    let m = manager(repo.clone(), &clock, SnapshotPolicy::manual());
    let spec = |store_dir: &str| {
        StoreSpec::rocksdb(
            StoreKey::new("app", "rt", 0).unwrap(),
            log(dir.path()).unwrap(),
            dir.path().join(store_dir),
        )
    };
    let mut model = Kv::new();
    let mut rng = Rng(11);

    // Nothing anywhere: full replay.
    let s = spec("a");
    let plan = m.plan(&s).await.unwrap();
    drop(s);
    assert_eq!(plan.chosen().unwrap().source, Source::FullReplay);
    assert_eq!(plan.steps.len(), 1);
    let mut a = Handle::Rocks(m.open(spec("a")).await.unwrap());
    assert_eq!(a.report().source, Source::FullReplay);
    for _ in 0..10 {
        write_batch(&mut a, &mut model, &mut rng, 20, 80);
    }
    let s10 = a.close().await; // snapshot at 199
    let at_199 = model.clone();

    // A fresh directory: the snapshot; figures as planned.
    let s = spec("b");
    let plan = m.plan(&s).await.unwrap();
    drop(s);
    let step = plan.chosen().unwrap().clone();
    assert_eq!(
        step.source,
        Source::Snapshot {
            id: s10.snapshot.unwrap(),
            offset: 199
        }
    );
    assert_eq!(step.records_to_replay, 0);
    assert!(step.bytes_to_download > 0);
    assert_eq!(step.bytes_local, 0);
    let mut b = Handle::Rocks(m.open(spec("b")).await.unwrap());
    assert_eq!(b.report().source, step.source);
    assert_eq!(b.report().transfer.bytes_downloaded, step.bytes_to_download);
    for _ in 0..10 {
        write_batch(&mut b, &mut model, &mut rng, 20, 80);
    }
    let s20 = b.close().await; // snapshot at 399, sharing files with "a"

    // "a" is a local store at 199, behind the snapshot at 399: the
    // snapshot, reusing the local files it shares.
    let s = spec("a");
    let plan = m.plan(&s).await.unwrap();
    drop(s);
    let step = plan.chosen().unwrap().clone();
    assert_eq!(
        step.source,
        Source::Snapshot {
            id: s20.snapshot.unwrap(),
            offset: 399
        }
    );
    assert!(step.bytes_local > 0, "{step:?}");
    // Fallbacks: the local store, then the older snapshot... then replay.
    let order: Vec<_> = plan.steps.iter().map(|s| s.source.clone()).collect();
    assert_eq!(
        order,
        vec![
            step.source.clone(),
            Source::Local {
                applied_offset: Some(199)
            },
            Source::Snapshot {
                id: s10.snapshot.unwrap(),
                offset: 199
            },
            Source::FullReplay
        ]
    );
    let mut a = Handle::Rocks(m.open(spec("a")).await.unwrap());
    let r = a.report();
    assert_eq!(r.source, step.source);
    assert_eq!(r.transfer.bytes_reused_locally, step.bytes_local);
    assert_eq!(r.transfer.bytes_downloaded, step.bytes_to_download);
    assert_eq!(a.contents(), model);
    // Local ahead of the newest snapshot: kept, only its tail replayed.
    write_batch(&mut a, &mut model, &mut rng, 20, 80); // offsets 400..419
    a.abandon().await;
    write_batch_elsewhere(&m, dir.path(), &mut model, &mut rng).await; // 420..439 via "c", abandoned
    let s = spec("a");
    let plan = m.plan(&s).await.unwrap();
    drop(s);
    let step = plan.chosen().unwrap().clone();
    assert_eq!(
        step.source,
        Source::Local {
            applied_offset: Some(419)
        }
    );
    assert_eq!(step.records_to_replay, 20);
    let a = Handle::Rocks(m.open(spec("a")).await.unwrap());
    assert_eq!(a.report().source, step.source);
    assert_eq!(a.report().replay.records, step.records_to_replay);
    assert_eq!(a.contents(), model);
    a.abandon().await;

    // Rot a blob of the newest snapshot: plan cannot see it (blobs are
    // verified by the restore), open falls back to the next step.
    let newest = repo
        .catalog()
        .get_snapshot(&sk(), s20.snapshot.unwrap())
        .await
        .unwrap();
    let older = repo
        .catalog()
        .get_snapshot(&sk(), s10.snapshot.unwrap())
        .await
        .unwrap();
    // An SST only the newest snapshot has (a shared one would rot both).
    let rotten = newest
        .manifest
        .files
        .iter()
        .find(|f| {
            f.path.ends_with(".sst") && !older.manifest.files.iter().any(|o| o.blake3 == f.blake3)
        })
        .unwrap();
    common::rot_blob(&repo.object_store(), &sk(), &rotten.blake3, 0x10).await;
    let s = spec("d");
    let plan = m.plan(&s).await.unwrap();
    drop(s);
    assert_eq!(plan.steps[0].source.start_offset(), Some(399));
    let d = Handle::Rocks(m.open(spec("d")).await.unwrap());
    assert_eq!(d.report().source, plan.steps[1].source);
    assert_eq!(d.report().skipped[0].id, s20.snapshot.unwrap());
    assert_eq!(d.report().skipped[0].kind, ErrorKind::Corrupt);
    assert_eq!(d.contents(), model);
    d.abandon().await;

    // Point in time: offset 199 = the older snapshot, nothing replayed;
    // read-only.
    let s = spec("pit").at_offset(199);
    let plan = m.plan(&s).await.unwrap();
    drop(s);
    assert_eq!(plan.chosen().unwrap().source.start_offset(), Some(199));
    // The newer snapshot is no candidate for this point in time, and
    // nothing is wrong with it: it is not reported as rejected.
    assert!(
        !plan
            .rejected
            .iter()
            .any(|r| r.source.start_offset() == Some(399)),
        "{:?}",
        plan.rejected
    );
    let mut pit = m.open(spec("pit").at_offset(199)).await.unwrap();
    assert_eq!(pit.report().source, plan.chosen().unwrap().source);
    assert_eq!(contents(pit.store()), at_199);
    pit.put("x", "y");
    assert_eq!(pit.commit().unwrap_err().kind(), ErrorKind::Config);
    drop(pit);
    m.shutdown().await;
}

/// Writes 20 records through another directory's store and abandons it
/// (the log moves on without "a").
async fn write_batch_elsewhere(m: &StateManager, dir: &Path, model: &mut Kv, rng: &mut Rng) {
    let mut c = Handle::open(m, Kind::Rocks, dir, "c", None).await.unwrap();
    write_batch(&mut c, model, rng, 20, 80);
    c.abandon().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_is_open_once_per_manager_and_not_after_shutdown() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(1_000_000);
    let m = manager(
        repo(dir.path(), &clock).await,
        &clock,
        SnapshotPolicy::manual(),
    );
    let h = m
        .open(StoreSpec::memory(
            StoreKey::new("app", "rt", 0).unwrap(),
            log(dir.path()).unwrap(),
            dir.path().join("s"),
        ))
        .await
        .unwrap();
    let other = dir.path().join("other");
    let err = m
        .open(StoreSpec::memory(
            StoreKey::new("app", "rt", 0).unwrap(),
            log(&other).unwrap(),
            dir.path().join("t"),
        ))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Config, "{err}");
    assert_eq!(m.status().len(), 1);
    h.abandon().await;
    assert!(m.status().is_empty());
    m.shutdown().await;
    let err = m
        .open(StoreSpec::memory(
            StoreKey::new("app", "rt", 0).unwrap(),
            log(dir.path()).unwrap(),
            dir.path().join("s"),
        ))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Cancelled, "{err}");
}

/// Records and time triggers fire in the background, each snapshot is
/// restorable, and nothing fires without new records.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policy_triggers_take_snapshots_in_the_background() {
    let (dir, clock, repo) = setup().await;
    let policy = SnapshotPolicy::manual()
        .every_records(100)
        .min_interval(Duration::ZERO);
    let m = manager(repo.clone(), &clock, policy);
    let mut model = Kv::new();
    let mut rng = Rng(3);
    let mut h = Handle::open(&m, Kind::Memory, dir.path(), "s", None)
        .await
        .unwrap();
    // 99 records: not yet.
    write_batch(&mut h, &mut model, &mut rng, 99, 200);
    assert_eq!(h.wait().await.snapshots_taken, 0);
    write_batch(&mut h, &mut model, &mut rng, 1, 200);
    let st = h.wait().await;
    assert_eq!(st.snapshots_taken, 1);
    assert_eq!(st.last_trigger, Some(Trigger::Records));
    assert_eq!(st.last_snapshot_offset, Some(99));
    assert_eq!(st.records_since_snapshot, 0);
    h.abandon().await;

    // Time: every 10 s (records off); the injected clock decides.
    let policy = SnapshotPolicy::manual()
        .every(Duration::from_secs(10))
        .min_interval(Duration::ZERO);
    let m2 = manager(repo.clone(), &clock, policy);
    let mut h = Handle::open(&m2, Kind::Memory, dir.path(), "s", None)
        .await
        .unwrap();
    assert_eq!(h.report().source.start_offset(), Some(99));
    write_batch(&mut h, &mut model, &mut rng, 5, 50);
    clock.advance_ms(9_999);
    write_batch(&mut h, &mut model, &mut rng, 5, 50);
    assert_eq!(h.wait().await.snapshots_taken, 0);
    clock.advance_ms(1);
    write_batch(&mut h, &mut model, &mut rng, 5, 50);
    let st = h.wait().await;
    assert_eq!(
        (st.snapshots_taken, st.last_trigger),
        (1, Some(Trigger::Time))
    );
    assert_eq!(st.last_snapshot_offset, Some(114));
    // Time passing without records: nothing to snapshot.
    clock.advance_ms(60_000);
    each!(&mut h, x => assert!(x.commit().unwrap().is_none()));
    assert_eq!(h.wait().await.snapshots_taken, 1);
    h.abandon().await;
    // Every snapshot restores exactly what the log held at its offset.
    let list = repo.catalog().list_snapshots(&sk()).await.unwrap();
    assert_eq!(list.snapshots.len(), 2);
    let last = Handle::open(&m2, Kind::Memory, dir.path(), "check", None)
        .await
        .unwrap();
    assert_eq!(last.contents(), model);
    last.abandon().await;
    m.shutdown().await;
    m2.shutdown().await;
}

/// A manager over the fault-injecting store, sharing `clock`.
async fn faulty_manager(
    clock: &ManualClock,
    policy: SnapshotPolicy,
) -> (StateManager, FaultyStore, Repository) {
    let base: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let faulty = FaultyStore::new(base, FaultConfig::default());
    let repo = Repository::from_store(Arc::new(faulty.clone()), "")
        .unwrap()
        .with_clock(Arc::new(clock.clone()));
    repo.create_marker().await.unwrap();
    (manager(repo.clone(), clock, policy), faulty, repo)
}

/// Failures back off exponentially on the injected clock, are surfaced in
/// the status, never fail a commit and never commit a partial snapshot; the
/// first attempt after the repository heals succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_snapshots_back_off_and_recover() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(1_000_000);
    let policy = SnapshotPolicy::manual()
        .every_records(1)
        .min_interval(Duration::ZERO);
    let (m, faulty, repo) = faulty_manager(&clock, policy).await;
    let mut model = Kv::new();
    let mut rng = Rng(5);
    let mut h = Handle::open(&m, Kind::Memory, dir.path(), "s", None)
        .await
        .unwrap();
    faulty.set_config(FaultConfig {
        error_probability: 1.0,
        ..FaultConfig::default()
    });
    write_batch(&mut h, &mut model, &mut rng, 10, 20); // attempt 1 fails
    let st = h.wait().await;
    assert_eq!((st.snapshots_failed, st.consecutive_failures), (1, 1));
    assert_eq!(st.last_error_kind, Some(ErrorKind::Transient), "{st:?}");
    // Within the 1 s backoff: no attempt.
    clock.advance_ms(999);
    write_batch(&mut h, &mut model, &mut rng, 10, 20);
    assert_eq!(h.wait().await.snapshots_failed, 1);
    clock.advance_ms(1);
    write_batch(&mut h, &mut model, &mut rng, 10, 20); // attempt 2 fails
    assert_eq!(h.wait().await.consecutive_failures, 2);
    // Now 2 s.
    clock.advance_ms(1_999);
    write_batch(&mut h, &mut model, &mut rng, 10, 20);
    assert_eq!(h.wait().await.snapshots_failed, 2);
    faulty.set_config(FaultConfig::default());
    clock.advance_ms(1);
    write_batch(&mut h, &mut model, &mut rng, 10, 20);
    let st = h.wait().await;
    assert_eq!((st.snapshots_taken, st.consecutive_failures), (1, 0));
    assert_eq!(st.last_error, None);
    assert_eq!(st.last_snapshot_offset, Some(49));
    let list = repo.catalog().list_snapshots(&sk()).await.unwrap();
    assert_eq!(list.snapshots.len(), 1, "failed attempts committed nothing");
    assert!(list.unreadable.is_empty());
    h.abandon().await;
    m.shutdown().await;
}

/// One snapshot in flight per store: a trigger meanwhile is counted and
/// folded into the next snapshot; shutdown cancels one in flight without
/// committing it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn triggers_coalesce_while_a_snapshot_is_in_flight_and_shutdown_cancels() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(1_000_000);
    let policy = SnapshotPolicy::manual()
        .every_records(1)
        .min_interval(Duration::ZERO);
    let (m, faulty, repo) = faulty_manager(&clock, policy).await;
    let mut model = Kv::new();
    let mut rng = Rng(9);
    let mut h = Handle::open(&m, Kind::Memory, dir.path(), "s", None)
        .await
        .unwrap();
    let mut pause = faulty.pause_before(faulty.ops());
    write_batch(&mut h, &mut model, &mut rng, 10, 20); // starts snapshot 1
    assert!(pause.reached().await);
    write_batch(&mut h, &mut model, &mut rng, 10, 20); // coalesced
    write_batch(&mut h, &mut model, &mut rng, 10, 20); // coalesced
    let st = each!(&h, x => x.status());
    assert!(st.in_flight);
    assert_eq!(st.coalesced_triggers, 2);
    pause.resume();
    let st = h.wait().await;
    assert_eq!(st.snapshots_taken, 1);
    assert_eq!(st.last_snapshot_offset, Some(9));
    assert_eq!(st.records_since_snapshot, 20);
    // The next commit folds the coalesced records into one snapshot.
    let mut pause = faulty.pause_before(faulty.ops());
    write_batch(&mut h, &mut model, &mut rng, 1, 20);
    assert!(pause.reached().await);
    m.shutdown().await; // cancels the paused snapshot, waits for its task
    drop(pause);
    let st = h.wait().await;
    assert_eq!(st.snapshots_taken, 1);
    assert_eq!(st.last_error_kind, Some(ErrorKind::Cancelled), "{st:?}");
    let list = repo.catalog().list_snapshots(&sk()).await.unwrap();
    assert_eq!(list.snapshots.len(), 1);
    // After shutdown the handle still commits, and takes no snapshots.
    write_batch(&mut h, &mut model, &mut rng, 5, 20);
    assert!(!h.snapshot_now());
    assert_eq!(h.wait().await.snapshots_taken, 1);
    assert_eq!(h.contents(), model);
}

/// The lifecycle model: random writes, policy-driven and requested
/// snapshots, close / abandon / drop, reopen in the same or another
/// directory — every reopen equals the model, and after a close the next
/// open replays nothing.
async fn lifecycle(kind: Kind, seed: u64) {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(1_000_000);
    let policy = SnapshotPolicy::manual()
        .every_records(40)
        .every(Duration::from_secs(30))
        .min_interval(Duration::from_millis(100));
    let m = manager(repo(dir.path(), &clock).await, &clock, policy);
    let mut rng = Rng(seed);
    let mut model = Kv::new();
    let dirs = ["x", "y"];
    let mut h = Handle::open(&m, kind, dir.path(), "x", None).await.unwrap();
    let mut after_close = false;
    for step in 0..40 {
        match rng.below(10) {
            0..=5 => {
                let n = 1 + rng.below(15) as usize;
                write_batch(&mut h, &mut model, &mut rng, n, 40);
                clock.advance_ms(rng.below(5_000) as i64);
            }
            6 => {
                h.snapshot_now();
            }
            7 => {
                // Uncommitted writes are dropped by close, abandon and crash.
                h.write(key(250), Some(Bytes::from_static(b"never committed")));
                let closed = h.close().await;
                assert_eq!(closed.discarded_pending, 1);
                after_close = true;
                h = reopen(&m, kind, &dir, &mut rng, &dirs, &model, after_close).await;
                after_close = false;
            }
            8 => {
                h.abandon().await;
                h = reopen(&m, kind, &dir, &mut rng, &dirs, &model, after_close).await;
            }
            _ => {
                // A crash as far as the runtime can tell: dropped mid-flight.
                drop(h);
                // The dropped handle's cancelled task may still hold the
                // changelog for a moment; a reopen waits for its lock.
                let deadline = Instant::now() + Duration::from_secs(60);
                h = loop {
                    let to = dirs[rng.below(2) as usize];
                    match Handle::open(&m, kind, dir.path(), to, None).await {
                        Ok(h) => break h,
                        Err(e) if e.reason() == Some(Reason::InUse) => {
                            assert!(
                                Instant::now() < deadline,
                                "seed {seed} step {step}: waited 60 s for the dropped \
                                 handle to let go: {e}"
                            );
                            tokio::time::sleep(Duration::from_millis(5)).await;
                        }
                        Err(e) => panic!("seed {seed} step {step}: {e}"),
                    }
                };
                assert_eq!(h.contents(), model, "seed {seed} step {step}");
            }
        }
    }
    assert_eq!(h.contents(), model);
    h.abandon().await;
    m.shutdown().await;
}

async fn reopen(
    m: &StateManager,
    kind: Kind,
    dir: &tempfile::TempDir,
    rng: &mut Rng,
    dirs: &[&str],
    model: &Kv,
    after_close: bool,
) -> Handle {
    let h = Handle::open(m, kind, dir.path(), dirs[rng.below(2) as usize], None)
        .await
        .unwrap();
    assert_eq!(&h.contents(), model, "source {:?}", h.report().source);
    if after_close {
        assert_eq!(h.report().replay.records, 0, "{:?}", h.report().source);
    }
    h
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_model_memory() {
    for seed in 1..=12 {
        lifecycle(Kind::Memory, seed).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_model_rocks() {
    for seed in 1..=6 {
        lifecycle(Kind::Rocks, seed).await;
    }
}

/// The status a handle reports reaches the `metrics` facade too.
#[test]
fn snapshots_and_opens_are_reported_through_the_metrics_facade() {
    let rec = Recorded::default();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    // Handles are registered on this thread (inside `open`), so they stay
    // bound to `rec` wherever the background tasks run.
    metrics::with_local_recorder(&rec, || {
        rt.block_on(async {
            let dir = tempfile::tempdir().unwrap();
            let clock = ManualClock::new(1_000_000);
            let policy = SnapshotPolicy::manual()
                .every_records(10)
                .min_interval(Duration::ZERO);
            let m = manager(repo(dir.path(), &clock).await, &clock, policy);
            let mut h = Handle::open(&m, Kind::Memory, dir.path(), "s", None)
                .await
                .unwrap();
            let (mut model, mut rng) = (Kv::new(), Rng(1));
            for _ in 0..3 {
                write_batch(&mut h, &mut model, &mut rng, 10, 40);
                h.wait().await;
            }
            write_batch(&mut h, &mut model, &mut rng, 4, 40);
            let st = h.wait().await;
            assert_eq!(st.snapshots_taken, 3);
            assert_eq!(rec.counter("statesnap_snapshots_total"), 3);
            assert_eq!(rec.counter("statesnap_snapshot_failures_total"), 0);
            assert_eq!(
                rec.counter("statesnap_snapshot_bytes_uploaded_total"),
                st.bytes_uploaded
            );
            assert!(st.bytes_uploaded > 0);
            assert_eq!(rec.gauge("statesnap_last_snapshot_offset"), 29.0);
            assert_eq!(rec.gauge("statesnap_records_since_snapshot"), 4.0);
            assert_eq!(rec.gauge("statesnap_snapshot_in_flight"), 0.0);
            assert_eq!(rec.samples("statesnap_capture_seconds"), 3);
            assert_eq!(rec.samples("statesnap_snapshot_seconds"), 3);
            assert_eq!(rec.samples("statesnap_open_seconds"), 1);
            h.abandon().await;
            m.shutdown().await;
        });
    });
}

/// Retention keeps what the policy says among each open store's usable
/// snapshots; gc frees the dropped snapshots' blobs only after the grace
/// period; what is kept still restores exactly. The scheduled loop runs the
/// same pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn maintenance_applies_retention_and_collects_after_the_grace_period() {
    use statesnap::clock::{Clock, SystemClock};
    use statesnap::repo::RetentionPolicy;
    use statesnap::runtime::Maintenance;
    let dir = tempfile::tempdir().unwrap();
    // gc compares blob ages (the object store's real mtimes) with the
    // clock: start it at the real time.
    let clock = ManualClock::new(SystemClock.now_ms());
    let repo = repo(dir.path(), &clock)
        .await
        .with_max_commit_duration(Duration::from_secs(1));
    let maintenance = Maintenance {
        retention: RetentionPolicy {
            keep_last: Some(2),
            keep_newer_than: None,
        },
        grace: Duration::from_secs(2),
        every: Duration::from_millis(20),
    };
    let m = manager(repo.clone(), &clock, SnapshotPolicy::manual());
    let (mut model, mut rng) = (Kv::new(), Rng(21));
    let mut h = Handle::open(&m, Kind::Rocks, dir.path(), "s", None)
        .await
        .unwrap();
    for i in 0..5 {
        write_batch(&mut h, &mut model, &mut rng, 10, 40);
        if i == 3 {
            // The two snapshots retention keeps then share no SST with the
            // three it drops: those have blobs of their own to sweep.
            h.compact();
        }
        assert!(h.snapshot_now());
        assert!(h.wait().await.last_error.is_none());
        clock.advance_ms(1_000);
    }
    let before = repo
        .catalog()
        .list_snapshots(&sk())
        .await
        .unwrap()
        .snapshots;
    assert_eq!(before.len(), 5);
    let blobs = |snaps: &[statesnap::repo::SnapshotInfo]| -> std::collections::BTreeMap<_, u64> {
        snaps
            .iter()
            .flat_map(|s| s.manifest.files.iter().map(|f| (f.blake3, f.size)))
            .collect()
    };
    let kept_blobs = blobs(&before[3..]);
    let only_dropped: u64 = blobs(&before[..3])
        .iter()
        .filter(|(h, _)| !kept_blobs.contains_key(h))
        .map(|(_, s)| s)
        .sum();
    assert!(only_dropped > 0);
    // Snapshots slower than the second the clock moved for each may have
    // left it behind the real time, and so behind the blobs' mtimes. Moved
    // up to the real time, it has every blob older than the grace period by
    // the second pass, which condemns what the first found too young.
    clock.set_ms(clock.now_ms().max(SystemClock.now_ms()));
    let first = m.maintain_now(&maintenance).await.unwrap();
    assert_eq!(first.len(), 1);
    let dropped: Vec<_> = first[0].dropped.iter().map(|(id, _)| *id).collect();
    let expected: Vec<_> = before[..3].iter().rev().map(|s| s.id()).collect();
    assert_eq!(dropped, expected, "the three oldest, newest first");
    assert!(
        first[0].gc.blobs_deleted.is_empty(),
        "nothing swept inside the grace period"
    );
    let kept = repo
        .catalog()
        .list_snapshots(&sk())
        .await
        .unwrap()
        .snapshots;
    assert_eq!(kept.len(), 2);
    // Past the grace period a pass sweeps what only the dropped ones used.
    let mut swept = 0;
    for _ in 0..3 {
        clock.advance_ms(3_000);
        let r = m.maintain_now(&maintenance).await.unwrap();
        assert!(r[0].dropped.is_empty());
        swept += r[0].gc.bytes_deleted;
    }
    assert_eq!(
        swept, only_dropped,
        "exactly the blobs only the dropped ones named"
    );
    // The kept snapshots are whole: a fresh directory restores the newest.
    h.abandon().await;
    let fresh = Handle::open(&m, Kind::Rocks, dir.path(), "fresh", None)
        .await
        .unwrap();
    assert_eq!(fresh.report().source.start_offset(), Some(49));
    assert_eq!(fresh.contents(), model);

    // Scheduled: another manager with passes every 20 ms drops down to one.
    let one = Maintenance {
        retention: RetentionPolicy {
            keep_last: Some(1),
            keep_newer_than: None,
        },
        ..maintenance
    };
    let clock_arc: SharedClock = Arc::new(clock.clone());
    fresh.abandon().await;
    let scheduled = StateManager::builder(repo.clone())
        .clock(clock_arc)
        .policy(SnapshotPolicy::manual())
        .maintenance(one)
        .build()
        .unwrap();
    let h = Handle::open(&scheduled, Kind::Rocks, dir.path(), "fresh", None)
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let left = repo
            .catalog()
            .list_snapshots(&sk())
            .await
            .unwrap()
            .snapshots
            .len();
        if left == 1 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "waited 60 s for a scheduled pass to leave one snapshot: {left} left"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    h.abandon().await;
    scheduled.shutdown().await;
    m.shutdown().await;
}

/// Logical digests: recorded by the portable and RocksDB formats by
/// default (RocksDB: with exact counts instead of its estimates), not when
/// the policy turns them off; equal across formats for the same state;
/// `verify_deep` restores and compares, and says when there was nothing to
/// compare; a manifest whose digest disagrees
/// with its contents fails `verify_deep` and is skipped by a
/// digest-checking open (and only by it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logical_digests_are_recorded_compared_and_enforced() {
    use statesnap::restore::{DigestCheck, verify_deep};
    let (dir, clock, repo) = setup().await;
    let m = manager(repo.clone(), &clock, SnapshotPolicy::manual());
    let (mut model, mut rng) = (Kv::new(), Rng(31));
    let mut h = Handle::open(&m, Kind::Memory, dir.path(), "mem", None)
        .await
        .unwrap();
    for _ in 0..10 {
        write_batch(&mut h, &mut model, &mut rng, 20, 60);
    }
    let portable = h.close().await;
    let portable = repo
        .catalog()
        .get_snapshot(&sk(), portable.snapshot.unwrap())
        .await
        .unwrap()
        .manifest;
    let d_portable = portable
        .logical_digest
        .expect("the portable format records one");
    assert_eq!(d_portable.keys(), model.len() as u64);

    // RocksDB: one by default, equal to the portable one (same state),
    // with the key count counted, not estimated...
    let mut r = Handle::open(&m, Kind::Rocks, dir.path(), "r", None)
        .await
        .unwrap();
    assert!(r.snapshot_now());
    let plain = r.wait().await.last_snapshot.unwrap();
    r.abandon().await;
    let plain = repo
        .catalog()
        .get_snapshot(&sk(), plain)
        .await
        .unwrap()
        .manifest;
    assert_eq!(plain.logical_digest, Some(d_portable));
    assert!(plain.stats.counts_exact);
    assert_eq!(plain.exact_keys(), Some(model.len() as u64));
    // ...none when the policy turns it off: the counts are then RocksDB's
    // estimates, and the manifest says so.
    let off = manager(
        repo.clone(),
        &clock,
        SnapshotPolicy::manual().logical_digest(false),
    );
    let mut r = Handle::open(&off, Kind::Rocks, dir.path(), "r", None)
        .await
        .unwrap();
    write_batch(&mut r, &mut model, &mut rng, 5, 60);
    let d_off = statesnap::LogicalDigest::of_pairs(model.iter().map(|(k, v)| (&k[..], &v[..])));
    assert!(r.snapshot_now());
    let undigested = r.wait().await.last_snapshot.unwrap();
    r.abandon().await;
    let undigested = repo
        .catalog()
        .get_snapshot(&sk(), undigested)
        .await
        .unwrap()
        .manifest;
    assert_eq!(undigested.logical_digest, None);
    assert!(!undigested.stats.counts_exact);
    assert_eq!(undigested.exact_keys(), None);
    let mut r = Handle::open(&m, Kind::Rocks, dir.path(), "r", None)
        .await
        .unwrap();
    write_batch(&mut r, &mut model, &mut rng, 5, 60);
    assert!(r.snapshot_now());
    let id = r.wait().await.last_snapshot.unwrap();
    r.abandon().await;
    let rocks = repo
        .catalog()
        .get_snapshot(&sk(), id)
        .await
        .unwrap()
        .manifest;
    let d_rocks = rocks.logical_digest.expect("recorded by default");
    let expected = statesnap::LogicalDigest::of_pairs(model.iter().map(|(k, v)| (&k[..], &v[..])));
    assert_eq!(d_rocks, expected);
    assert_ne!(d_rocks, d_portable, "five more records");

    // verify_deep: restore into scratch, compare.
    let scratch = dir.path().join("scratch");
    let rf = statesnap::RocksFormat::new(Default::default());
    let deep = verify_deep(&rf, &repo, &rocks, &scratch).await.unwrap();
    assert!(deep.is_ok());
    assert_eq!(deep.digest_check(), DigestCheck::Matched);
    assert_eq!(deep.actual, d_rocks);
    assert!(!scratch.exists(), "scratch removed");
    // No digest recorded: nothing compared, and not reported as a match
    // (nor as a mismatch).
    let deep = verify_deep(&rf, &repo, &undigested, &scratch)
        .await
        .unwrap();
    assert_eq!(deep.digest_check(), DigestCheck::NotRecorded);
    assert!(!deep.is_ok());
    assert!(!deep.found_mismatch());
    assert_eq!(deep.actual, d_off, "restored all the same");
    // An existing directory is never used (nor removed) as scratch.
    std::fs::create_dir_all(scratch.join("precious")).unwrap();
    let err = verify_deep(&rf, &repo, &rocks, &scratch).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Config, "{err}");
    assert!(scratch.join("precious").exists());
    std::fs::remove_dir_all(&scratch).unwrap();
    let pf = statesnap::PortableFormat::memory();
    assert!(
        verify_deep(&pf, &repo, &portable, &scratch)
            .await
            .unwrap()
            .is_ok()
    );

    // A manifest whose recorded digest disagrees with its (intact) blobs.
    let mut lying = rocks.clone();
    lying.logical_digest = Some(d_portable);
    lying.seal().unwrap();
    repo.catalog()
        .delete_snapshot(&sk(), rocks.snapshot_id)
        .await
        .unwrap();
    repo.commit_manifest(&lying).await.unwrap();
    let deep = verify_deep(&rf, &repo, &lying, &scratch).await.unwrap();
    assert!(!deep.is_ok());
    assert_eq!(deep.digest_check(), DigestCheck::Mismatch);
    assert_eq!((deep.expected, deep.actual), (Some(d_portable), d_rocks));
    let spec = StoreSpec::rocksdb(
        StoreKey::new("app", "rt", 0).unwrap(),
        log(dir.path()).unwrap(),
        dir.path().join("v"),
    )
    .verify_digest();
    let checked = m.open(spec).await.unwrap();
    let report = checked.report();
    assert_eq!(report.skipped[0].id, lying.snapshot_id);
    assert_eq!(report.skipped[0].kind, ErrorKind::Corrupt);
    assert_ne!(report.source.start_offset(), Some(lying.changelog.offset));
    assert_eq!(contents(checked.store()), model);
    checked.abandon().await;
    let unchecked = Handle::open(&m, Kind::Rocks, dir.path(), "w", None)
        .await
        .unwrap();
    assert_eq!(
        unchecked.report().source,
        Source::Snapshot {
            id: lying.snapshot_id,
            offset: lying.changelog.offset
        }
    );
    assert_eq!(unchecked.contents(), model);
    unchecked.abandon().await;
    m.shutdown().await;
    off.shutdown().await;
}

/// Rates: a replay this process measured is recorded in the next
/// snapshot's manifest; a manager that measured nothing estimates with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn measured_replay_rates_travel_in_manifests() {
    let (dir, clock, repo) = setup().await;
    let (mut model, mut rng) = (Kv::new(), Rng(41));
    let a = manager(repo.clone(), &clock, SnapshotPolicy::manual());
    let mut h = Handle::open(&a, Kind::Memory, dir.path(), "s", None)
        .await
        .unwrap();
    for _ in 0..60 {
        write_batch(&mut h, &mut model, &mut rng, 200, 200);
    }
    h.abandon().await; // 12 000 records, no snapshot
    let b = manager(repo.clone(), &clock, SnapshotPolicy::manual());
    let mut h = Handle::open(&b, Kind::Memory, dir.path(), "s", None)
        .await
        .unwrap();
    assert_eq!(h.report().replay.records, 12_000);
    let measured = b.rates().replay_records_per_sec;
    assert_ne!(
        measured,
        statesnap::restore::Rates::default().replay_records_per_sec
    );
    assert!(h.snapshot_now());
    let id = h.wait().await.last_snapshot.unwrap();
    h.abandon().await;
    let manifest = repo
        .catalog()
        .get_snapshot(&sk(), id)
        .await
        .unwrap()
        .manifest;
    let recorded = manifest.measured.unwrap().replay_records_per_sec.unwrap();
    assert_eq!(recorded, measured as u64);
    let c = manager(repo.clone(), &clock, SnapshotPolicy::manual());
    let spec = StoreSpec::memory(
        StoreKey::new("app", "rt", 0).unwrap(),
        log(dir.path()).unwrap(),
        dir.path().join("s"),
    );
    let plan = c.plan(&spec).await.unwrap();
    let _ = c.estimate(&plan);
    assert_eq!(c.rates().replay_records_per_sec, recorded as f64);
    for m in [a, b, c] {
        m.shutdown().await;
    }
}

/// A bandwidth limit shared by the manager's transfers: every byte a
/// snapshot uploads and a restore downloads is drawn from it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_transferred_byte_goes_through_the_bandwidth_limit() {
    let (dir, clock, repo) = setup().await;
    let limit = Arc::new(statesnap::repo::BandwidthLimit::new(512 << 20));
    let m = StateManager::builder(repo.clone())
        .clock(Arc::new(clock.clone()))
        .policy(SnapshotPolicy::manual())
        .shared_bandwidth_limit(Arc::clone(&limit))
        .build()
        .unwrap();
    let (mut model, mut rng) = (Kv::new(), Rng(51));
    let mut h = Handle::open(&m, Kind::Rocks, dir.path(), "a", None)
        .await
        .unwrap();
    for _ in 0..20 {
        write_batch(&mut h, &mut model, &mut rng, 50, 200);
    }
    let closed = h.close().await;
    let uploaded = repo
        .catalog()
        .get_snapshot(&sk(), closed.snapshot.unwrap())
        .await
        .unwrap()
        .manifest
        .stats
        .bytes_uploaded;
    assert!(uploaded > 0);
    assert_eq!(limit.bytes_taken(), uploaded);
    let h = Handle::open(&m, Kind::Rocks, dir.path(), "b", None)
        .await
        .unwrap();
    let downloaded = h.report().transfer.bytes_downloaded;
    assert!(downloaded > 0);
    assert_eq!(limit.bytes_taken(), uploaded + downloaded);
    assert_eq!(h.contents(), model);
    h.abandon().await;
    m.shutdown().await;
}

// ---------------------------------------------------------------------------
// No blocking work on the polling thread.
//
// A snapshot and an open run on a current-thread runtime beside a watchdog
// task that must keep ticking. The changelog is the file log behind a gate:
// its `flush` and its readers' batches wait until the watchdog has ticked
// twice more. Called on the runtime's only thread, they would wait for a
// tick that cannot come, and give up (the test fails) after 60 s.

mod watchdog {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::{Duration, Instant};

    use futures::future::BoxFuture;
    use statesnap::changelog::{
        Changelog, ChangelogId, ChangelogReader, Horizon, Lineage, LoggedRecord, Record,
    };
    use statesnap::{Error, ErrorKind, FileChangelog, Result};

    /// Counts the watchdog's ticks and the gates it opened.
    #[derive(Debug, Default)]
    pub struct Ticks {
        pub ticks: AtomicU64,
        pub gates: AtomicU64,
    }

    impl Ticks {
        /// Starts the watchdog on the current runtime.
        pub fn start() -> Arc<Ticks> {
            let t = Arc::new(Ticks::default());
            let w = Arc::clone(&t);
            tokio::spawn(async move {
                let mut every = tokio::time::interval(Duration::from_millis(1));
                loop {
                    every.tick().await;
                    w.ticks.fetch_add(1, Ordering::SeqCst);
                }
            });
            t
        }

        /// Waits (blocking) until the watchdog has ticked twice more.
        fn gate(&self, what: &str) -> Result<()> {
            let from = self.ticks.load(Ordering::SeqCst);
            let deadline = Instant::now() + Duration::from_secs(60);
            while self.ticks.load(Ordering::SeqCst) < from + 2 {
                if Instant::now() > deadline {
                    return Err(Error::new(
                        ErrorKind::Internal,
                        format!("{what} ran on the polling thread: the watchdog starved"),
                    ));
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            self.gates.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }
    }

    /// The file log, with `flush` and reads gated on the watchdog.
    #[derive(Debug)]
    pub struct Gated {
        pub log: Arc<FileChangelog>,
        pub ticks: Arc<Ticks>,
    }

    struct GatedReader<'a> {
        inner: Box<dyn ChangelogReader + 'a>,
        ticks: Arc<Ticks>,
    }

    impl ChangelogReader for GatedReader<'_> {
        fn next_batch(&mut self, max_records: usize) -> Result<Option<Vec<LoggedRecord>>> {
            self.ticks.gate("a changelog read")?;
            self.inner.next_batch(max_records)
        }
        fn end_offset(&self) -> u64 {
            self.inner.end_offset()
        }
    }

    impl Changelog for Gated {
        fn id(&self) -> &ChangelogId {
            self.log.id()
        }
        fn append(&self, batch: &[Record]) -> Result<Vec<u64>> {
            self.log.append(batch)
        }
        fn read_from(&self, from: u64) -> Result<Box<dyn ChangelogReader + '_>> {
            Ok(Box::new(GatedReader {
                inner: self.log.read_from(from)?,
                ticks: Arc::clone(&self.ticks),
            }))
        }
        fn start_offset(&self) -> Result<u64> {
            self.log.start_offset()
        }
        fn end_offset(&self) -> Result<u64> {
            self.log.end_offset()
        }
        fn lineage(&self) -> Result<Lineage> {
            self.log.lineage()
        }
        fn horizon(&self) -> Result<Horizon> {
            self.log.horizon()
        }
        fn flush(&self) -> Result<()> {
            self.ticks.gate("a changelog flush")?;
            self.log.flush()
        }
        /// What a log whose flush blocks does: the wait on a blocking thread.
        fn flush_async(&self) -> BoxFuture<'_, Result<()>> {
            let (log, ticks) = (Arc::clone(&self.log), Arc::clone(&self.ticks));
            Box::pin(async move {
                tokio::task::spawn_blocking(move || {
                    ticks.gate("a changelog flush")?;
                    log.flush()
                })
                .await
                .map_err(|e| Error::new(ErrorKind::Internal, e.to_string()))?
            })
        }
        fn epoch_at(&self, offset: u64) -> Result<Option<u64>> {
            self.log.epoch_at(offset)
        }
    }
}

/// Snapshots on the caller's runtime (the lower layer), then opens through
/// the manager, which replays the tail: `kind`'s store, 20 000 records
/// before the snapshot and 5 000 after.
async fn snapshot_and_open_beside_a_watchdog(kind: Kind) {
    use statesnap::{Changelog, LoggedStore, StoreFormat, commit_snapshot};
    use std::sync::atomic::Ordering;
    use watchdog::{Gated, Ticks};

    let (dir, clock, repo) = setup().await;
    let ticks = Ticks::start();
    let file_log = Arc::new(log(dir.path()).unwrap());
    let gated = || Gated {
        log: Arc::clone(&file_log),
        ticks: Arc::clone(&ticks),
    };
    let mut model = Kv::new();
    let mut rng = Rng(7);
    let put_all = |model: &mut Kv, rng: &mut Rng, n: usize| {
        (0..n)
            .map(|_| {
                let k = Bytes::from(format!("k{:06}", rng.below(50_000)));
                let v = Bytes::from(rng.below(1 << 30).to_string());
                model.insert(k.clone(), v.clone());
                (k, v)
            })
            .collect::<Vec<_>>()
    };
    let before = put_all(&mut model, &mut rng, 20_000);
    let store_dir = dir.path().join("store");
    match kind {
        Kind::Memory => {
            let mut ls = LoggedStore::new(statesnap::MemoryStore::new(), gated()).unwrap();
            for (k, v) in before {
                ls.put(k, v);
            }
            ls.commit().unwrap();
            let format = statesnap::PortableFormat::memory();
            let cut = format.capture(ls.store()).unwrap();
            commit_snapshot(&format, cut, &repo, &sk(), ls.changelog(), None)
                .await
                .unwrap();
        }
        Kind::Rocks => {
            let store = statesnap::RocksStore::open(&store_dir, &Default::default()).unwrap();
            let mut ls = LoggedStore::new(store, gated()).unwrap();
            for (k, v) in before {
                ls.put(k, v);
            }
            ls.commit().unwrap();
            let format = statesnap::RocksFormat::new(Default::default());
            let cut = format.capture(ls.store()).unwrap();
            commit_snapshot(&format, cut, &repo, &sk(), ls.changelog(), None)
                .await
                .unwrap();
            drop(ls);
            // The next owner restores from the snapshot, not this directory.
            std::fs::remove_dir_all(&store_dir).unwrap();
        }
    }
    let flushed = ticks.gates.load(Ordering::SeqCst);
    assert!(flushed >= 1, "the snapshot flushed the changelog");
    // The tail, written through the plain log.
    let tail = put_all(&mut model, &mut rng, 5_000);
    let records: Vec<statesnap::Record> = tail
        .into_iter()
        .map(|(k, v)| statesnap::Record::put(k, v))
        .collect();
    file_log.append(&records).unwrap();
    let m = manager(repo, &clock, SnapshotPolicy::manual());
    let got = match kind {
        Kind::Memory => {
            let spec =
                StoreSpec::memory(StoreKey::new("app", "rt", 0).unwrap(), gated(), &store_dir);
            let h = m.open(spec).await.unwrap();
            assert_eq!(h.report().replay.records, 5_000);
            let got = contents(h.store());
            h.abandon().await;
            got
        }
        Kind::Rocks => {
            let spec =
                StoreSpec::rocksdb(StoreKey::new("app", "rt", 0).unwrap(), gated(), &store_dir);
            let h = m.open(spec).await.unwrap();
            assert_eq!(h.report().replay.records, 5_000);
            let got = contents(h.store());
            h.abandon().await;
            got
        }
    };
    assert_eq!(got, model);
    assert!(
        ticks.gates.load(Ordering::SeqCst) > flushed,
        "the open's replay read the changelog"
    );
}

#[tokio::test(flavor = "current_thread")]
async fn a_memory_snapshot_and_open_never_block_a_current_thread_runtime() {
    snapshot_and_open_beside_a_watchdog(Kind::Memory).await;
}

#[tokio::test(flavor = "current_thread")]
async fn a_rocksdb_snapshot_and_open_never_block_a_current_thread_runtime() {
    snapshot_and_open_beside_a_watchdog(Kind::Rocks).await;
}
