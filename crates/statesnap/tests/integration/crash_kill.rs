//! Crash test: a child process commits through `LoggedStore<RocksStore,
//! FileChangelog>` in a loop and is killed with SIGKILL mid-commit. After
//! reopen + replay the store must equal the changelog's committed prefix, and
//! every commit the child acknowledged must still be in the changelog.
#![cfg(feature = "rocksdb")]
#![allow(clippy::unwrap_used)]

use bytes::Bytes;

use crate::common;
use statesnap::StoreKey;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};

use statesnap::changelog::file::{FileChangelog, FileChangelogOptions};
use statesnap::changelog::{Changelog, ChangelogId};
use statesnap::restore::ReplayOptions;
use statesnap::store::LoggedStore;
use statesnap::store::{RocksOptions, RocksStore};
use statesnap::store::{StateStore, StateStoreExt};

const CHILD_ENV: &str = "STATESNAP_CRASH_CHILD_DIR";

fn id() -> ChangelogId {
    StoreKey::new("crash", "store", 0).unwrap().changelog_id()
}

fn log_options() -> FileChangelogOptions {
    // Small segments so kills also land around segment rolls.
    FileChangelogOptions {
        segment_bytes: 256 << 10,
        ..FileChangelogOptions::default()
    }
}

/// Opens the file log for writing. Its directory lock is an `flock`: the
/// other test in this binary spawns children concurrently, and a child
/// between `fork` and `exec` holds a copy of every descriptor this process
/// has open — the lock of a log this process just closed included — until
/// `exec` closes it (close-on-exec). That shows as a transient "locked by
/// another writer" naming this very process; it clears within moments, so
/// the opens here retry it for up to 60 s (a slow machine may take a while
/// to get a forked child to its `exec`).
fn open_log(dir: &Path) -> FileChangelog {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        match FileChangelog::open(dir.join("log"), id(), log_options()) {
            Ok(log) => return log,
            Err(e) if e.is_transient() => {
                assert!(
                    std::time::Instant::now() < deadline,
                    "waited 60 s for the changelog's lock to be let go: {e}"
                );
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            Err(e) => panic!("open the changelog: {e}"),
        }
    }
}

fn open(dir: &Path) -> LoggedStore<RocksStore, FileChangelog> {
    let log = open_log(dir);
    let store = RocksStore::open(dir.join("db"), &RocksOptions::default()).unwrap();
    let mut ls = LoggedStore::new(store, log).unwrap();
    ls.catch_up(&ReplayOptions::default()).unwrap();
    ls
}

/// The child: commits forever, printing each acknowledged last offset.
/// Only runs when spawned by `sigkill_mid_commit_recovers_committed_prefix`.
#[test]
#[ignore = "spawned as a child process by sigkill_mid_commit_recovers_committed_prefix"]
fn crash_child() {
    let Ok(dir) = std::env::var(CHILD_ENV) else {
        panic!("run only as a child of sigkill_mid_commit_recovers_committed_prefix");
    };
    let mut ls = open(Path::new(&dir));
    let mut n: u64 = ls.changelog().end_offset().unwrap();
    loop {
        // Batches of varying size, with deletes, spread over 500 keys.
        let size = 1 + (n % 97) as usize * 13;
        for j in 0..size {
            let k = (n.wrapping_mul(31) + j as u64 * 7) % 500;
            if (n + j as u64).is_multiple_of(5) {
                ls.delete(format!("k{k:04}"));
            } else {
                ls.put(format!("k{k:04}"), vec![(n % 251) as u8; 64 + (j % 300)]);
            }
        }
        let info = ls.commit().unwrap().unwrap();
        println!("committed {}", info.last_offset);
        n += 1;
    }
}

fn changelog_contents(log: &FileChangelog) -> BTreeMap<Bytes, Bytes> {
    let mut m = BTreeMap::new();
    let mut r = log.read_from(0).unwrap();
    while let Some(batch) = r.next_batch(4096).unwrap() {
        for rec in batch {
            match rec.value {
                Some(v) => m.insert(rec.key, v),
                None => m.remove(&rec.key),
            };
        }
    }
    m
}

/// Runs the ignored test `name` of this binary as a child process with
/// `env` = `dir`, hands each line it prints after `committed ` to `stop`,
/// and SIGKILLs it (no destructors, no flush) as soon as `stop` says so.
/// Returns how many commits it reported.
fn kill_child_when(
    exe: &Path,
    name: &str,
    env: &str,
    dir: &Path,
    mut stop: impl FnMut(&str) -> bool,
) -> u64 {
    let mut child = Command::new(exe)
        .args([
            "--exact",
            &common::test_name(module_path!(), name),
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(env, dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut seen = 0;
    for line in BufReader::new(stdout).lines() {
        let line = line.unwrap();
        // Not a prefix: on one core the harness prints "test NAME ... "
        // before the child's first line, on the same line.
        if let Some((_, rest)) = line.split_once("committed ") {
            seen += 1;
            if stop(rest.trim()) {
                break;
            }
        }
    }
    child.kill().unwrap();
    child.wait().unwrap();
    seen
}

#[test]
fn sigkill_mid_commit_recovers_committed_prefix() {
    let dir = tempfile::tempdir().unwrap();
    let exe = std::env::current_exe().unwrap();
    let mut acknowledged: Option<u64> = None;
    for round in 0..6u64 {
        let want = 5 + round * 37 % 60;
        let mut n = 0;
        let seen = kill_child_when(&exe, "crash_child", CHILD_ENV, dir.path(), |o| {
            acknowledged = Some(o.parse().unwrap());
            n += 1;
            n >= want
        });
        assert!(
            seen >= want,
            "child stopped early in round {round} after {seen} commits"
        );

        let ls = open(dir.path());
        let end = ls.changelog().end_offset().unwrap();
        let acked = acknowledged.unwrap();
        assert!(
            end > acked,
            "acknowledged commit lost: end_offset={end} acknowledged={acked}"
        );
        let applied = ls.store().applied_offset().unwrap().unwrap();
        assert!(applied < end, "store ahead of changelog");
        let want = changelog_contents(ls.changelog());
        let got: BTreeMap<Bytes, Bytes> =
            ls.store().iter().unwrap().map(|kv| kv.unwrap()).collect();
        assert_eq!(got.len(), want.len(), "round {round}: key count differs");
        assert!(
            got == want,
            "round {round}: store differs from the changelog's committed prefix"
        );
    }
}

// --- the runtime under SIGKILL --------------------------------------------

const RUNTIME_CHILD_ENV: &str = "STATESNAP_RUNTIME_KILL_CHILD_DIR";

fn runtime_repo_url(dir: &Path) -> String {
    format!("file://{}", dir.join("repo").display())
}

/// Small multipart threshold: killed uploads also leave staging objects.
fn runtime_repo_options(clock: statesnap::clock::SharedClock) -> statesnap::RepositoryOptions {
    statesnap::RepositoryOptions {
        clock,
        transfer: statesnap::repo::TransferOptions {
            parallelism: 4,
            multipart_threshold: 32 << 10,
            part_size: 32 << 10,
            download_part_size: 32 << 10,
            ..Default::default()
        },
        ..Default::default()
    }
}

fn runtime_spec(
    dir: &Path,
    store_dir: &str,
) -> statesnap::StoreSpec<statesnap::RocksFormat, FileChangelog> {
    let log = open_log(dir);
    statesnap::StoreSpec::rocksdb(
        StoreKey::new("crash", "store", 0).unwrap(),
        log,
        dir.join(store_dir),
    )
}

/// The child: a stream processor on the runtime, snapshotting every 150
/// records in the background, committing forever; prints each
/// acknowledged last offset and whether a snapshot was in flight.
#[test]
#[ignore = "spawned as a child process by sigkill_during_background_snapshots_reopens_exact"]
fn runtime_kill_child() {
    let Ok(dir) = std::env::var(RUNTIME_CHILD_ENV) else {
        panic!("run only as a child of sigkill_during_background_snapshots_reopens_exact");
    };
    let dir = Path::new(&dir);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let clock = statesnap::clock::system_clock();
        let repo = statesnap::Repository::open(&runtime_repo_url(dir), runtime_repo_options(clock))
            .await
            .unwrap();
        let policy = statesnap::SnapshotPolicy::manual()
            .every_records(150)
            .min_interval(std::time::Duration::ZERO);
        let m = statesnap::StateManager::builder(repo)
            .policy(policy)
            .build()
            .unwrap();
        let mut h = m.open(runtime_spec(dir, "db")).await.unwrap();
        let mut n: u64 = h.changelog().end_offset().unwrap();
        loop {
            let size = 1 + (n % 41) as usize;
            for j in 0..size {
                let k = (n.wrapping_mul(31) + j as u64 * 7) % 400;
                if (n + j as u64).is_multiple_of(6) {
                    h.delete(format!("k{k:04}"));
                } else {
                    h.put(format!("k{k:04}"), vec![(n % 251) as u8; 100 + (j % 200)]);
                }
            }
            let info = h.commit().unwrap().unwrap();
            let in_flight = h.status().in_flight;
            println!("committed {} {}", info.last_offset, u8::from(in_flight));
            n += 1;
            // Let the background task run between commits now and then.
            if n.is_multiple_of(8) {
                tokio::task::yield_now().await;
            }
        }
    });
}

/// ≥ 20 rounds: the child is SIGKILLed at random moments, half of them
/// right after it reported a background snapshot in flight. Each reopen
/// (local store) and each restore into a fresh directory (snapshot + tail)
/// equals the changelog; every snapshot in the repository stays usable (no
/// partial snapshot, nothing skipped); orphans of killed uploads (blobs,
/// multipart staging) are collected by gc after the grace period and what
/// is kept verifies.
#[test]
fn sigkill_during_background_snapshots_reopens_exact() {
    let dir = tempfile::tempdir().unwrap();
    let exe = std::env::current_exe().unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let sk = statesnap::StoreKey::new("crash", "store", 0).unwrap();
    let mut acknowledged: Option<u64> = None;
    let mut killed_in_flight = 0;
    std::fs::create_dir_all(dir.path().join("repo")).unwrap();
    rt.block_on(statesnap::Repository::init(
        &runtime_repo_url(dir.path()),
        Default::default(),
    ))
    .unwrap();
    for round in 0..20u64 {
        let want = 20 + round * 53 % 300;
        let wait_for_flight = round % 2 == 0;
        let mut stopped_in_flight = false;
        let mut n = 0;
        let seen = kill_child_when(
            &exe,
            "runtime_kill_child",
            RUNTIME_CHILD_ENV,
            dir.path(),
            |rest| {
                let (o, f) = rest.split_once(' ').unwrap();
                acknowledged = Some(o.parse().unwrap());
                n += 1;
                stopped_in_flight = f == "1";
                n >= want && (!wait_for_flight || stopped_in_flight || n >= want + 2000)
            },
        );
        assert!(
            seen >= want,
            "child stopped early in round {round} after {seen} commits"
        );
        killed_in_flight += usize::from(stopped_in_flight);

        rt.block_on(async {
            let repo = statesnap::Repository::open(
                &runtime_repo_url(dir.path()),
                runtime_repo_options(statesnap::clock::system_clock()),
            )
            .await
            .unwrap();
            let m = statesnap::StateManager::builder(repo.clone())
                .policy(statesnap::SnapshotPolicy::manual())
                .build()
                .unwrap();
            // The local store, caught up.
            let h = m.open(runtime_spec(dir.path(), "db")).await.unwrap();
            let want = changelog_contents(h.changelog());
            let end = h.changelog().end_offset().unwrap();
            let acked = acknowledged.unwrap();
            assert!(
                end > acked,
                "acknowledged commit lost: end={end} acked={acked}"
            );
            let got: BTreeMap<Bytes, Bytes> =
                h.store().iter().unwrap().map(|kv| kv.unwrap()).collect();
            assert!(
                got == want,
                "round {round}: local reopen differs from the changelog"
            );
            h.abandon().await;
            // Another machine: the newest snapshot + the tail.
            let fresh = format!("fresh-{round}");
            let h = m.open(runtime_spec(dir.path(), &fresh)).await.unwrap();
            let r = h.report();
            assert!(r.skipped.is_empty(), "round {round}: {:?}", r.skipped);
            assert!(r.unreadable.is_empty(), "round {round}: {:?}", r.unreadable);
            let got: BTreeMap<Bytes, Bytes> =
                h.store().iter().unwrap().map(|kv| kv.unwrap()).collect();
            assert!(
                got == want,
                "round {round}: snapshot + tail differs ({})",
                r.source
            );
            let listing = repo.catalog().list_snapshots(&sk).await.unwrap();
            if let Some(newest) = listing.latest() {
                assert_eq!(r.snapshot, Some(newest.id()), "round {round}");
            }
            h.abandon().await;
            m.shutdown().await;
            std::fs::remove_dir_all(dir.path().join(&fresh)).unwrap();
        });
    }
    eprintln!("kills with a background snapshot in flight: {killed_in_flight} of 20");
    assert!(
        killed_in_flight >= 5,
        "only {killed_in_flight} kills landed during a snapshot"
    );

    // Orphans: collected once past the grace period; what is kept verifies.
    rt.block_on(async {
        use futures::TryStreamExt;
        let real_now = statesnap::clock::Clock::now_ms(&statesnap::clock::SystemClock);
        let clock = statesnap::clock::ManualClock::new(real_now + 3_600_000 * 3);
        let repo = statesnap::Repository::open(
            &runtime_repo_url(dir.path()),
            runtime_repo_options(std::sync::Arc::new(clock.clone())),
        )
        .await
        .unwrap();
        let gc = statesnap::repo::GcOptions::default();
        repo.maintenance().gc_store(&sk, &gc).await.unwrap();
        clock.advance_ms(3_600_000 * 2);
        repo.maintenance().gc_store(&sk, &gc).await.unwrap();
        let listing = repo.catalog().list_snapshots(&sk).await.unwrap();
        assert!(!listing.snapshots.is_empty());
        let referenced: std::collections::BTreeSet<String> = listing
            .snapshots
            .iter()
            .flat_map(|s| s.manifest.files.iter().map(|f| f.blake3.to_string()))
            .collect();
        let objects: Vec<_> = repo.object_store().list(None).try_collect().await.unwrap();
        for o in &objects {
            let p = o.location.as_ref();
            assert!(!p.contains("/tmp/"), "staging object left: {p}");
            if p.contains("/blobs/") {
                let hash = p.rsplit('/').next().unwrap();
                assert!(referenced.contains(hash), "orphan blob left: {p}");
            }
        }
        let report = repo
            .maintenance()
            .verify_store(&sk, &Default::default(), &|_| {})
            .await
            .unwrap();
        assert!(report.is_ok(), "{report:?}");
    });
}
