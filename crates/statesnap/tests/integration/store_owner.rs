//! One owner per store directory: an open or a restore that finds the
//! directory held by a live handle — of the same manager, of another
//! manager, or the lower layer's `restore_store` — is refused before it
//! reads or writes anything (`config` for two specs of one manager,
//! `transient` otherwise), and the live handle goes on as if nothing
//! happened: its files are untouched, it commits, and its handoff snapshot
//! succeeds. An open that fails part way (the repository failing at any
//! point) leaves its target as it was.
#![allow(clippy::unwrap_used)]

use crate::common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use object_store::ObjectStore;
use object_store::local::LocalFileSystem;
use proptest::prelude::*;

use common::contents;
use statesnap::repo::faulty::{FaultConfig, FaultyStore};
use statesnap::runtime::{StateHandle, StateManager, StoreSpec};
use statesnap::{
    ErrorKind, FileChangelog, MemoryStore, PortableFormat, Repository, RestoreOptions, RocksFormat,
    StoreKey, restore_store,
};

type Log = FileChangelog;

fn log(dir: &Path, partition: u32) -> Log {
    FileChangelog::open(
        dir.join(format!("log-{partition}")),
        StoreKey::new("app", "own", partition)
            .unwrap()
            .changelog_id(),
        Default::default(),
    )
    .unwrap()
}

fn key(partition: u32) -> StoreKey {
    StoreKey::new("app", "own", partition).unwrap()
}

/// The repository in `dir/repo`, created on first use.
async fn repo(dir: &Path) -> Repository {
    let url = format!("file://{}", dir.join("repo").display());
    if dir.join("repo").exists() {
        Repository::open(&url, Default::default()).await.unwrap()
    } else {
        Repository::init(&url, Default::default()).await.unwrap()
    }
}

/// Every entry under `dir` (`common::tree`), RocksDB's info logs left out
/// (a live RocksDB appends to them on its own).
fn tree(dir: &Path) -> BTreeMap<PathBuf, common::Node> {
    let mut t = common::tree(dir);
    t.retain(|p, _| {
        p.file_name()
            .is_none_or(|n| !n.to_string_lossy().starts_with("LOG"))
    });
    t
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    Memory,
    Rocks,
}

#[derive(Debug)]
enum Handle {
    Memory(StateHandle<PortableFormat<MemoryStore>, Log>),
    Rocks(StateHandle<RocksFormat, Log>),
}

macro_rules! each {
    ($h:expr, $v:ident => $e:expr) => {
        match $h {
            Handle::Memory($v) => $e,
            Handle::Rocks($v) => $e,
        }
    };
}

async fn open(
    m: &StateManager,
    kind: Kind,
    partition: u32,
    logs: &Path,
    dir: &Path,
) -> statesnap::Result<Handle> {
    let l = log(logs, partition);
    Ok(match kind {
        Kind::Memory => Handle::Memory(
            m.open(StoreSpec::new(
                key(partition),
                l,
                PortableFormat::memory(),
                dir,
            ))
            .await?,
        ),
        Kind::Rocks => Handle::Rocks(
            m.open(StoreSpec::new(
                key(partition),
                l,
                RocksFormat::new(Default::default()),
                dir,
            ))
            .await?,
        ),
    })
}

impl Handle {
    fn write(&mut self, from: u32, n: u32) {
        for i in from..from + n {
            let k = Bytes::from(format!("k{}", i % 50));
            let v = Bytes::from(format!("v{i}"));
            each!(self, h => h.put(k, v));
        }
        each!(self, h => h.commit().unwrap());
    }

    fn contents(&self) -> common::Kv {
        each!(self, h => contents(h.store()))
    }

    async fn close(self) -> statesnap::runtime::CloseReport {
        each!(self, h => h.close().await.unwrap())
    }
}

/// How an intruder names the live store's directory.
fn spellings(dir: &Path) -> Vec<PathBuf> {
    let s = dir.to_string_lossy().into_owned();
    let parent = dir.parent().unwrap();
    let name = dir.file_name().unwrap();
    let link = parent.parent().unwrap().join("parent-link");
    if std::fs::symlink_metadata(&link).is_err() {
        std::os::unix::fs::symlink(parent, &link).unwrap();
    }
    vec![
        dir.to_path_buf(),
        PathBuf::from(format!("{s}/")),
        PathBuf::from(format!("{s}/.")),
        parent.join(".").join(name),
        link.join(name),
    ]
}

/// Who tries to take the live store's directory.
#[derive(Debug, Clone, Copy)]
enum Intruder {
    /// Another spec of the live handle's manager (another partition).
    SameManager,
    /// A handle of another manager in this process.
    OtherManager,
    /// The lower layer's restore (what the CLI's `restore` calls).
    Restore,
}

async fn intrude(
    who: Intruder,
    kind: Kind,
    live: &StateManager,
    dir: &Path,
    spelled: &Path,
) -> statesnap::Error {
    let logs = dir.join("intruder-logs");
    match who {
        Intruder::SameManager => open(live, kind, 1, &logs, spelled).await.unwrap_err(),
        Intruder::OtherManager => {
            let other = StateManager::builder(repo(dir).await).build().unwrap();
            let e = open(&other, kind, 1, &logs, spelled).await.unwrap_err();
            other.shutdown().await;
            e
        }
        Intruder::Restore => {
            let repo = repo(dir).await;
            let l = log(&logs, 1);
            let options = RestoreOptions::default();
            match kind {
                Kind::Memory => {
                    restore_err(&PortableFormat::memory(), &repo, &l, spelled, &options).await
                }
                Kind::Rocks => {
                    let format = RocksFormat::new(Default::default());
                    restore_err(&format, &repo, &l, spelled, &options).await
                }
            }
        }
    }
}

/// The error of a lower-layer restore of partition 1 into `target`.
async fn restore_err<F: statesnap::StoreFormat>(
    format: &F,
    repo: &Repository,
    log: &Log,
    target: &Path,
    options: &RestoreOptions,
) -> statesnap::Error {
    restore_store(format, repo, &key(1), log, target, options)
        .await
        .map(drop)
        .unwrap_err()
}

/// A live handle, then every intruder under every spelling of its
/// directory: each refused with the right kind, the live store untouched
/// and still working.
async fn live_store_survives_intruders(kind: Kind, intruders: &[(Intruder, usize)]) {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    std::fs::create_dir_all(root.join("state")).unwrap();
    let m = StateManager::builder(repo(&root).await).build().unwrap();
    let dir = root.join("state").join("store");
    let mut live = open(&m, kind, 0, &root, &dir).await.unwrap();
    live.write(0, 200);
    let before = live.contents();
    let files = tree(&dir);
    if kind == Kind::Rocks {
        assert!(
            files.contains_key(Path::new("CURRENT")),
            "{:?}",
            files.keys()
        );
    }
    let spelled = spellings(&dir);
    for &(who, s) in intruders {
        let e = intrude(who, kind, &m, &root, &spelled[s % spelled.len()]).await;
        let want = match who {
            Intruder::SameManager => ErrorKind::Config,
            _ => ErrorKind::Transient,
        };
        assert_eq!(
            e.kind(),
            want,
            "{who:?} {}: {e}",
            spelled[s % spelled.len()].display()
        );
        assert_eq!(tree(&dir), files, "{who:?} changed the live store's files");
    }
    assert_eq!(live.contents(), before);
    live.write(200, 30);
    let closed = live.close().await;
    assert!(closed.took_snapshot, "{closed:?}");
    // The next owner gets exactly what the live handle committed.
    let next = open(&m, kind, 0, &root, &dir).await.unwrap();
    let mut want = before;
    for i in 200..230u32 {
        want.insert(
            Bytes::from(format!("k{}", i % 50)),
            Bytes::from(format!("v{i}")),
        );
    }
    assert_eq!(next.contents(), want);
    next.close().await;
    m.shutdown().await;
}

const INTRUDERS: [Intruder; 3] = [
    Intruder::SameManager,
    Intruder::OtherManager,
    Intruder::Restore,
];

/// Every intruder with every spelling.
fn every_intrusion() -> Vec<(Intruder, usize)> {
    INTRUDERS
        .into_iter()
        .flat_map(|w| (0..5).map(move |s| (w, s)))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_rocksdb_store_is_never_touched_by_a_second_opener() {
    live_store_survives_intruders(Kind::Rocks, &every_intrusion()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_memory_store_is_never_touched_by_a_second_opener() {
    live_store_survives_intruders(Kind::Memory, &every_intrusion()).await;
}

#[test]
fn a_rocksdb_directory_open_elsewhere_is_a_transient_refusal() {
    let tmp = tempfile::tempdir().unwrap();
    let first = statesnap::RocksStore::open(tmp.path().join("db"), &Default::default()).unwrap();
    let e = statesnap::RocksStore::open(tmp.path().join("db"), &Default::default()).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Transient, "{e}");
    drop(first);
    statesnap::RocksStore::open(tmp.path().join("db"), &Default::default()).unwrap();
}

/// A closed store in `dir` behind a newer snapshot (so an open restores
/// over it), and a manager whose repository fails from its `fail_at`th
/// operation on: the open either works, exactly, or leaves `dir` as it was.
async fn open_failing_at(kind: Kind, fail_at: u64, error_probability: f64, seed: u64) {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let m = StateManager::builder(repo(root).await).build().unwrap();
    let dir = root.join("store");
    let mut h = open(&m, kind, 0, root, &dir).await.unwrap();
    h.write(0, 100);
    h.close().await;
    let mut h = open(&m, kind, 0, root, &root.join("elsewhere"))
        .await
        .unwrap();
    h.write(100, 100);
    let want = h.contents();
    h.close().await;
    m.shutdown().await;

    let files = tree(&dir);
    let base: Arc<dyn ObjectStore> =
        Arc::new(LocalFileSystem::new_with_prefix(root.join("repo")).unwrap());
    let faulty = FaultyStore::new(
        base,
        FaultConfig {
            seed,
            error_probability,
            crash_after: Some(fail_at),
            ..FaultConfig::default()
        },
    );
    let flaky = Repository::from_store(Arc::new(faulty), "").unwrap();
    let m = StateManager::builder(flaky).build().unwrap();
    match open(&m, kind, 0, root, &dir).await {
        Ok(h) => {
            assert_eq!(h.contents(), want);
            drop(h);
        }
        Err(e) => {
            assert_eq!(e.kind(), ErrorKind::Transient, "{e}");
            assert_eq!(tree(&dir), files, "a failed open changed its target");
            let leftovers: Vec<_> = std::fs::read_dir(root)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with('.'))
                .collect();
            assert!(leftovers.is_empty(), "{leftovers:?}");
        }
    }
    m.shutdown().await;
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, failure_persistence: None, ..ProptestConfig::default() })]

    /// A refused or failed open leaves the target, and any live handle's
    /// directory, as they were — both store kinds, random intruders and
    /// spellings, random failure points of the repository.
    #[test]
    fn a_refused_or_failed_open_changes_nothing(
        rocks in any::<bool>(),
        intruders in proptest::collection::vec((0..3usize, 0..5usize), 1..4),
        fail_at in 0u64..40,
        error_percent in 0u32..30,
        seed in 1u64..1_000,
    ) {
        let kind = if rocks { Kind::Rocks } else { Kind::Memory };
        let intruders: Vec<(Intruder, usize)> = intruders
            .into_iter()
            .map(|(w, s)| (INTRUDERS[w], s))
            .collect();
        common::rt().block_on(async {
            live_store_survives_intruders(kind, &intruders).await;
            open_failing_at(kind, fail_at, f64::from(error_percent) / 100.0, seed).await;
        });
    }
}
