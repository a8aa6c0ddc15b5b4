//! A store never claims records it did not apply, and never follows another
//! changelog incarnation than its own (invariant 9 and 10), driven
//! through the public API the way a new user would misuse it.
#![allow(clippy::unwrap_used)]

use crate::common;

use bytes::Bytes;
use statesnap::StoreKey;
use std::path::Path;
use std::sync::Arc;

use statesnap::changelog::file::{FileChangelog, FileChangelogOptions};
use statesnap::changelog::{Changelog, ChangelogBinding, ChangelogId};
use statesnap::restore::{ReplayOptions, replay};
use statesnap::store::LoggedStore;
use statesnap::store::MemoryStore;
use statesnap::store::StateStore;
use statesnap::{ErrorKind, Reason};

fn id() -> ChangelogId {
    StoreKey::new("app", "counts", 0).unwrap().changelog_id()
}

fn open_log(dir: &Path) -> FileChangelog {
    FileChangelog::open(dir, id(), FileChangelogOptions::default()).unwrap()
}

use common::{contents, replayed};

/// Defect 1a: a store behind its changelog that commits without catching
/// up used to apply its batch at the batch's own offset, skipping the records
/// in between forever.
#[test]
fn a_commit_on_a_store_behind_its_log_applies_the_missed_records_first() {
    let dir = tempfile::tempdir().unwrap();
    let log = open_log(dir.path());
    let mut first = LoggedStore::new(MemoryStore::new(), log).unwrap();
    for i in 0..5 {
        first.put(format!("k{i}"), "old");
    }
    first.commit().unwrap();
    let (_, log) = first.into_parts();

    // A new, empty store over the same log: never caught up.
    let mut late = LoggedStore::new(MemoryStore::new(), log).unwrap();
    late.put("k0", "new");
    let info = late.commit().unwrap().unwrap();
    assert_eq!(info.first_offset, 5);
    let (want, want_offset) = replayed(late.changelog());
    assert_eq!(contents(late.store()), want);
    assert_eq!(late.store().applied_offset().unwrap(), want_offset);
    assert_eq!(want.len(), 5, "k1..k4 from the first writer, k0 rewritten");
}

/// Defect 1b: two writers on one changelog (two handles in one process, or
/// a zombie): each commit used to claim the other's records.
#[test]
fn interleaved_writers_on_one_log_each_stay_exact() {
    let dir = tempfile::tempdir().unwrap();
    let log = Arc::new(open_log(dir.path()));
    let mut a = LoggedStore::new(MemoryStore::new(), Arc::clone(&log)).unwrap();
    let mut b = LoggedStore::new(MemoryStore::new(), Arc::clone(&log)).unwrap();
    for round in 0..20u32 {
        a.put(format!("a{}", round % 7), format!("{round}"));
        a.delete(format!("b{}", round % 5));
        a.commit().unwrap();
        b.put(format!("b{}", round % 5), format!("{round}"));
        if round % 3 == 0 {
            b.delete(format!("a{}", round % 7));
        }
        b.commit().unwrap();
    }
    let (want, want_offset) = replayed(&*log);
    assert_eq!(contents(b.store()), want, "b saw every one of a's records");
    assert_eq!(b.store().applied_offset().unwrap(), want_offset);
    // `a` is one commit behind b's last; its next commit catches up too.
    a.put("a-last", "x");
    a.commit().unwrap();
    let (want, want_offset) = replayed(&*log);
    assert_eq!(contents(a.store()), want);
    assert_eq!(a.store().applied_offset().unwrap(), want_offset);
}

/// Defect 2: a local store from an earlier incarnation of the changelog
/// (deleted and recreated: new lineage) used to be caught up onto the new
/// one, keeping the old incarnation's keys.
#[cfg(feature = "rocksdb")]
#[test]
fn a_rocksdb_store_of_a_recreated_changelog_is_refused() {
    use statesnap::store::{RocksOptions, RocksStore};
    let dir = tempfile::tempdir().unwrap();
    let log_dir = dir.path().join("log");
    let store_dir = dir.path().join("store");
    {
        let store = RocksStore::open(&store_dir, &RocksOptions::default()).unwrap();
        let mut s = LoggedStore::new(store, open_log(&log_dir)).unwrap();
        s.put("old-key", "from the first incarnation");
        s.commit().unwrap();
        s.put("old-key-2", "x");
        s.commit().unwrap();
    }
    // The changelog is deleted and recreated; new writes reach offset 5.
    std::fs::remove_dir_all(&log_dir).unwrap();
    let log = open_log(&log_dir);
    for i in 0..5 {
        log.append(&[statesnap::changelog::Record::put(format!("n{i}"), "v")])
            .unwrap();
    }
    let mut store = RocksStore::open(&store_dir, &RocksOptions::default()).unwrap();
    let err = replay(&mut store, &log, &ReplayOptions::default(), &mut |_| {}).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Stale, "{err}");
    assert_eq!(err.reason(), Some(Reason::OtherChangelog), "{err}");
    let err = LoggedStore::new(store, log).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Stale, "{err}");
    // Nothing of the new incarnation was applied on top of the old keys.
    let store = RocksStore::open(&store_dir, &RocksOptions::default()).unwrap();
    assert_eq!(store.applied_offset().unwrap(), Some(1));
    assert!(store.get(b"n0").unwrap().is_none());
}

/// The same for a memory store kept across a recreation (a long-running
/// process whose log was replaced under it), and a store bound to another
/// changelog id.
#[test]
fn a_memory_store_follows_one_changelog_for_life() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = LoggedStore::new(MemoryStore::new(), open_log(&dir.path().join("a"))).unwrap();
    s.put("k", "v");
    s.commit().unwrap();
    let (store, log) = s.into_parts();
    let bound = store.binding().unwrap().unwrap();
    assert_eq!(bound, ChangelogBinding::of(&log).unwrap());
    assert_eq!(store.cut().binding(), Some(&bound), "the cut carries it");
    drop(log);
    std::fs::remove_dir_all(dir.path().join("a")).unwrap();
    let recreated = open_log(&dir.path().join("a"));
    recreated
        .append(&[statesnap::changelog::Record::put("x", "1")])
        .unwrap();
    recreated
        .append(&[statesnap::changelog::Record::put("y", "1")])
        .unwrap();
    let err = LoggedStore::new(store.clone(), recreated).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Stale, "{err}");
    let other = common::file_log(&dir.path().join("b"), "app", "other");
    other
        .append(&[statesnap::changelog::Record::put("z", "1")])
        .unwrap();
    let err = LoggedStore::new(store, other).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Stale, "{err}");
}

/// A store whose offset is past what the log hands out next (the log lost
/// records the store applied) is refused instead of mixing two histories.
#[test]
fn a_store_ahead_of_its_log_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let log = Arc::new(open_log(dir.path()));
    // Store A applies offsets 0..=2 through the log.
    let mut a = LoggedStore::new(MemoryStore::new(), Arc::clone(&log)).unwrap();
    for i in 0..3 {
        a.put(format!("k{i}"), "v");
        a.commit().unwrap();
    }
    // A store that claims offset 9 on a log whose end is 3: refused at once.
    let mut ahead = MemoryStore::new();
    statesnap::store::ensure_follows(&mut ahead, &ChangelogBinding::of(&*log).unwrap()).unwrap();
    ahead.apply(&[], 9).unwrap();
    let err = LoggedStore::new(ahead, Arc::clone(&log)).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Stale, "{err}");
}

/// A changelog decorator that counts `flush` calls and records, at each,
/// how many snapshots the repository held.
struct FlushSpy<'a> {
    inner: &'a FileChangelog,
    repo_dir: std::path::PathBuf,
    flushes: std::sync::Mutex<Vec<usize>>,
}

fn manifests_in(dir: &Path) -> usize {
    fn walk(d: &Path, n: &mut usize) {
        for e in std::fs::read_dir(d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, n);
            } else if p.to_string_lossy().contains("/manifests/") {
                *n += 1;
            }
        }
    }
    let mut n = 0;
    walk(dir, &mut n);
    n
}

impl statesnap::changelog::Changelog for FlushSpy<'_> {
    fn id(&self) -> &ChangelogId {
        self.inner.id()
    }
    fn append(&self, b: &[statesnap::changelog::Record]) -> statesnap::Result<Vec<u64>> {
        self.inner.append(b)
    }
    fn read_from(
        &self,
        from: u64,
    ) -> statesnap::Result<Box<dyn statesnap::changelog::ChangelogReader + '_>> {
        self.inner.read_from(from)
    }
    fn start_offset(&self) -> statesnap::Result<u64> {
        self.inner.start_offset()
    }
    fn end_offset(&self) -> statesnap::Result<u64> {
        self.inner.end_offset()
    }
    fn lineage(&self) -> statesnap::Result<statesnap::changelog::Lineage> {
        self.inner.lineage()
    }
    fn horizon(&self) -> statesnap::Result<statesnap::changelog::Horizon> {
        self.inner.horizon()
    }
    fn flush(&self) -> statesnap::Result<()> {
        self.flushes
            .lock()
            .unwrap()
            .push(manifests_in(&self.repo_dir));
        self.inner.flush()
    }
}

/// Defect 5a: with a log that does not fsync every append, a snapshot used
/// to be committed over records still only in the page cache. Now the log is
/// flushed before the manifest is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_flushes_the_changelog_before_its_manifest_is_committed() {
    use statesnap::changelog::file::FsyncPolicy;
    use statesnap::format::StoreFormat;
    use statesnap::format::portable::PortableFormat;
    use statesnap::repo::{Repository, StoreKey};
    let dir = tempfile::tempdir().unwrap();
    let log = FileChangelog::open(
        dir.path().join("log"),
        id(),
        FileChangelogOptions {
            fsync: FsyncPolicy::Never,
            ..FileChangelogOptions::default()
        },
    )
    .unwrap();
    let mut s = LoggedStore::new(MemoryStore::new(), &log).unwrap();
    s.put("k", "v");
    s.commit().unwrap();
    let repo_dir = dir.path().join("repo");
    let repo = Repository::init(
        &format!("file://{}", repo_dir.display()),
        Default::default(),
    )
    .await
    .unwrap();
    let spy = FlushSpy {
        inner: &log,
        repo_dir: repo_dir.clone(),
        flushes: Default::default(),
    };
    let format = PortableFormat::memory();
    let cut = format.capture(s.store()).unwrap();
    let sk = StoreKey::new("app", "counts", 0).unwrap();
    statesnap::commit_snapshot(&format, cut, &repo, &sk, &spy, None)
        .await
        .unwrap();
    assert_eq!(
        *spy.flushes.lock().unwrap(),
        vec![0],
        "one flush, before any manifest existed"
    );
    assert_eq!(manifests_in(&repo_dir), 1);
}

/// A cut of a store that follows another changelog (or records none) is
/// never tagged with this one's id and lineage.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_is_only_committed_against_its_own_changelog() {
    use statesnap::format::StoreFormat;
    use statesnap::format::portable::PortableFormat;
    use statesnap::repo::StoreKey;
    let dir = tempfile::tempdir().unwrap();
    let (repo, _) = common::memory_repo();
    let sk = StoreKey::new("app", "counts", 0).unwrap();
    let a = open_log(&dir.path().join("a"));
    let b = common::file_log(&dir.path().join("b"), "app", "other");
    for _ in 0..3 {
        b.append(&[statesnap::changelog::Record::put("x", "y")])
            .unwrap();
    }
    let mut s = LoggedStore::new(MemoryStore::new(), &a).unwrap();
    s.put("k", "v");
    s.commit().unwrap();
    let format = PortableFormat::memory();
    // A store that was written without a binding.
    let mut unbound = MemoryStore::new();
    unbound
        .apply(&[statesnap::changelog::Record::put("k", "v")], 0)
        .unwrap();
    let cases: [(_, &FileChangelog, Reason); 2] = [
        (s.store(), &b, Reason::OtherChangelog),
        (&unbound, &a, Reason::Unbound),
    ];
    for (store, log, why) in cases {
        let cut = format.capture(store).unwrap();
        let err = statesnap::commit_snapshot(&format, cut, &repo, &sk, log, None)
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Stale, "{err}");
        assert_eq!(err.reason(), Some(why), "{err}");
    }
    assert!(
        repo.catalog()
            .list_snapshots(&sk)
            .await
            .unwrap()
            .snapshots
            .is_empty()
    );
}

/// Defect 5b: the disk loses records the log had synced (or the user chose
/// `FsyncPolicy::Never` and the power failed), and the log hands their
/// offsets out again. A snapshot of the lost stretch sits at an offset the
/// log reaches again with other records: it is refused (`stale`), restore
/// falls back to the older snapshot + replay, retention counts it for
/// nothing, and no new snapshot builds on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_of_history_the_log_lost_is_never_restored() {
    use common::{restore_latest, snapshot};
    use statesnap::format::portable::PortableFormat;
    use statesnap::repo::StoreKey;
    use statesnap::repo::{DropReason, RetentionPolicy, plan_retention_for_changelog};

    let dir = tempfile::tempdir().unwrap();
    let log_dir = dir.path().join("log");
    let (repo, _) = common::memory_repo();
    let sk = StoreKey::new("app", "counts", 0).unwrap();
    let format = PortableFormat::memory();

    let log = open_log(&log_dir);
    let mut s = LoggedStore::new(MemoryStore::new(), &log).unwrap();
    s.put("a", "1");
    s.put("b", "1");
    s.commit().unwrap();
    let (segment, len_after_first) = log.durable_tail().unwrap();
    let older = snapshot(&format, s.store(), &repo, &sk, &log, None).await;
    for k in ["c", "d", "e"] {
        s.put(k, "lost");
        s.commit().unwrap();
    }
    let lost = snapshot(&format, s.store(), &repo, &sk, &log, Some(&older)).await;
    assert_eq!(lost.changelog.offset, 4);
    assert_eq!(lost.changelog.epoch, Some(1));
    drop(s);
    drop(log);

    // The disk keeps only what the first commit wrote.
    common::set_len(&segment, len_after_first);
    let log = open_log(&log_dir);
    assert_eq!(log.end_offset().unwrap(), 2);
    // Another store instance writes offsets 2..=4 again, with other records.
    let (store, _) = restore_latest(&format, &repo, &sk, &log, &dir.path().join("s1"))
        .await
        .unwrap();
    let mut s = LoggedStore::new(store, &log).unwrap();
    for k in ["x", "y", "z"] {
        s.put(k, "new");
        s.commit().unwrap();
    }
    assert_eq!(log.end_offset().unwrap(), 5);
    assert_eq!(log.epoch_at(4).unwrap(), Some(2));

    // Restore skips the lost snapshot, although its offset is in the log.
    let (store, report) = restore_latest(&format, &repo, &sk, &log, &dir.path().join("s2"))
        .await
        .unwrap();
    assert_eq!(report.snapshot, Some(older.snapshot_id));
    let skipped = report
        .skipped
        .iter()
        .find(|k| k.id == lost.snapshot_id)
        .expect("the lost snapshot is reported as skipped");
    assert_eq!(skipped.kind, ErrorKind::Stale, "{skipped:?}");
    let (want, want_offset) = replayed(&log);
    assert_eq!(contents(&store), want);
    assert_eq!(store.applied_offset().unwrap(), want_offset);
    assert!(!want.contains_key(&Bytes::from("c")));

    // Retention against the changelog keeps the usable one as "newest".
    let listing = repo.catalog().list_snapshots(&sk).await.unwrap();
    let keep_one = RetentionPolicy {
        keep_last: Some(1),
        keep_newer_than: None,
    };
    let plan = plan_retention_for_changelog(&listing.snapshots, &keep_one, 0, &log).unwrap();
    assert!(!plan.drops(older.snapshot_id), "{plan:?}");
    assert!(
        plan.drop
            .contains(&(lost.snapshot_id, DropReason::LostHistory)),
        "{plan:?}"
    );

    // A new snapshot never takes the lost one as its parent.
    let next = snapshot(&format, s.store(), &repo, &sk, &log, Some(&lost)).await;
    assert_eq!(next.parent, None);
    assert_eq!(next.changelog.epoch, Some(2));
}
