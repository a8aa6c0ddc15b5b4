//! Defect 7: a restore replaced its target without looking at what it was,
//! and local-first reuse followed symlinks. Now a restore replaces only an
//! absent path, an empty directory or a marked store; symlinks are never
//! followed or carried into a restored store.
//!
//! And what a refused, failed or cancelled restore leaves: the target as it
//! was, byte for byte, and no staging beside it — however the target is
//! written (`link/`, `link/.`), whatever failed, wherever it was cancelled.
#![cfg(feature = "rocksdb")]
#![allow(clippy::unwrap_used)]

use crate::common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use object_store::ObjectStore;
use proptest::prelude::*;
use statesnap::changelog::file::FileChangelog;
use statesnap::format::StoreFormat;
use statesnap::format::portable::PortableFormat;
use statesnap::format::portable::chunk::ChunkParams;
use statesnap::format::rocks::RocksFormat;
use statesnap::repo::faulty::{FaultConfig, FaultyStore};
use statesnap::repo::{Repository, StoreKey};
use statesnap::restore::{RestoreOptions, RestoreReport, restore_into, restore_store};
use statesnap::store::LoggedStore;
use statesnap::store::MemoryStore;
use statesnap::store::{RocksOptions, RocksStore};
use statesnap::store::{STORE_MARKER, StateStore};
use statesnap::{ErrorKind, Reason};

fn sk() -> StoreKey {
    StoreKey::new("app", "target", 0).unwrap()
}

/// Keys the fixtures write: `KEYS` before the snapshot, `TAIL` after it.
const KEYS: u32 = 5_000;
const TAIL: u32 = 500;

/// A repository holding one snapshot of a few thousand keys (in several
/// files or chunks), a changelog with a tail after it, and the format to
/// restore it with.
struct Fixture<F = RocksFormat> {
    dir: tempfile::TempDir,
    repo: Repository,
    /// The object store under `repo`, to wrap in faults.
    base: Arc<dyn ObjectStore>,
    log: FileChangelog,
    format: F,
}

impl<F: StoreFormat> Fixture<F> {
    /// A path in the fixture's directory.
    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `restore_store` of the fixture's store into `target`.
    async fn restore(
        &self,
        target: &Path,
        opts: &RestoreOptions,
    ) -> statesnap::Result<(F::Store, RestoreReport)> {
        restore_store(&self.format, &self.repo, &sk(), &self.log, target, opts).await
    }

    /// `restore_into` of the fixture's store into `target`.
    async fn restore_into(
        &self,
        target: &Path,
        opts: &RestoreOptions,
    ) -> statesnap::Result<RestoreReport> {
        restore_into(&self.format, &self.repo, &sk(), &self.log, target, opts).await
    }

    /// The repository over the same objects, with `faults`.
    fn faulty(&self, faults: FaultConfig) -> (Repository, Arc<FaultyStore>) {
        let f = Arc::new(FaultyStore::new(Arc::clone(&self.base), faults));
        let repo = Repository::from_store(Arc::clone(&f) as Arc<dyn ObjectStore>, "").unwrap();
        (repo, f)
    }
}

/// Writes the fixture's keys through `s`, committing every thousand (and
/// calling `after_commit`: a RocksDB store flushes, for several files).
fn write_keys<S: StateStore>(
    s: &mut LoggedStore<S, FileChangelog>,
    range: std::ops::Range<u32>,
    after_commit: impl Fn(&S),
) {
    for i in range {
        s.put(format!("k{i:05}"), vec![b'v'; 200]);
        if i % 1000 == 999 {
            s.commit().unwrap();
            after_commit(s.store());
        }
    }
    s.commit().unwrap();
}

/// The RocksDB fixture without a changelog tail (its restored store holds
/// only the snapshot's files).
async fn setup() -> Fixture {
    setup_rocks(0).await
}

/// The RocksDB fixture with `tail` keys written after the snapshot.
async fn setup_rocks(tail: u32) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let log = common::file_log(&dir.path().join("log"), "app", "target");
    let format = RocksFormat::new(RocksOptions::default());
    let store = RocksStore::open(dir.path().join("source"), &RocksOptions::default()).unwrap();
    let mut s = LoggedStore::new(store, log).unwrap();
    let flush = |s: &RocksStore| s.flush().unwrap();
    write_keys(&mut s, 0..KEYS, flush);
    let (repo, base) = common::memory_repo();
    common::snapshot(&format, s.store(), &repo, &sk(), s.changelog(), None).await;
    if tail > 0 {
        write_keys(&mut s, KEYS..KEYS + tail, flush);
    }
    let (_, log) = s.into_parts();
    Fixture {
        dir,
        repo,
        base,
        log,
        format,
    }
}

/// Small chunks, so a portable restore reads many blobs.
fn small_chunks() -> ChunkParams {
    ChunkParams {
        min: 16 << 10,
        target: 64 << 10,
        max: 256 << 10,
    }
}

/// The same store written from memory in the portable format, restored
/// with `format` (into RocksDB as the CLI does, or into memory).
async fn setup_portable<S: statesnap::format::portable::PortableSource + 'static>(
    format: PortableFormat<S>,
) -> Fixture<PortableFormat<S>> {
    let dir = tempfile::tempdir().unwrap();
    let log = common::file_log(&dir.path().join("log"), "app", "target");
    let writer = PortableFormat::memory()
        .with_chunking(small_chunks())
        .unwrap();
    let mut s = LoggedStore::new(MemoryStore::new(), log).unwrap();
    write_keys(&mut s, 0..KEYS, |_| ());
    let (repo, base) = common::memory_repo();
    common::snapshot(&writer, s.store(), &repo, &sk(), s.changelog(), None).await;
    write_keys(&mut s, KEYS..KEYS + TAIL, |_| ());
    let (_, log) = s.into_parts();
    Fixture {
        dir,
        repo,
        base,
        log,
        format,
    }
}

/// The portable format restoring into RocksDB at the target path.
fn portable_into_rocks() -> PortableFormat<RocksStore> {
    PortableFormat::new(|p: &Path| RocksStore::open(p, &RocksOptions::default()))
}

use common::{Node, tree};

/// Staging a restore (or a capture) made, left under `root`.
fn leftovers(root: &Path) -> Vec<PathBuf> {
    tree(root)
        .into_keys()
        .filter(|p| {
            p.file_name().is_some_and(|n| {
                let n = n.to_string_lossy();
                n.contains(".statesnap-restore-")
                    || n.contains(".statesnap-old-")
                    || n.ends_with(".statesnap-staging")
            })
        })
        .collect()
}

/// `tree` without the entries at or under `sub`.
fn tree_outside(root: &Path, sub: &Path) -> BTreeMap<PathBuf, Node> {
    let mut t = tree(root);
    t.retain(|p, _| !p.starts_with(sub));
    t
}

/// Checks that `dir` holds the fixture's store, caught up to the end of its
/// changelog (a fixture with a tail: [`TAIL`] keys after the snapshot).
fn assert_restored_rocks(dir: &Path, tail: u32) {
    let m = std::fs::symlink_metadata(dir).unwrap();
    assert!(m.is_dir(), "{}", dir.display());
    assert!(dir.join(STORE_MARKER).is_file());
    let store = RocksStore::open(dir, &RocksOptions::default()).unwrap();
    assert!(store.get(b"k00042").unwrap().is_some());
    let last = format!("k{:05}", KEYS + tail - 1);
    assert!(store.get(last.as_bytes()).unwrap().is_some(), "{last}");
}

/// Restoring into `target` fails `config` (an unsafe target), from a
/// snapshot and by full replay, even with `replace_unmarked`.
async fn refused_even_when_adopted(fx: &Fixture, target: &Path) {
    for full_replay in [false, true] {
        let opts = RestoreOptions {
            full_replay,
            replace_unmarked: true,
            ..RestoreOptions::default()
        };
        let err = fx.restore(target, &opts).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Config, "{err}");
        assert_eq!(err.reason(), Some(Reason::UnsafeTarget), "{err}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_empty_foreign_directory_is_refused_unless_adopted() {
    let fx = setup().await;
    let target = fx.path("home");
    common::dir_with_file(&target, "thesis.tex", b"years of work");
    let err = fx
        .restore(&target, &RestoreOptions::default())
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Config, "{err}");
    assert_eq!(err.reason(), Some(Reason::UnmarkedTarget), "{err}");
    assert_eq!(
        std::fs::read(target.join("thesis.tex")).unwrap(),
        b"years of work"
    );
    // Full replay (create_empty) refuses it too.
    let opts = RestoreOptions {
        full_replay: true,
        ..RestoreOptions::default()
    };
    let err = fx.restore(&target, &opts).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Config, "{err}");
    assert!(target.join("thesis.tex").exists());

    // The caller says so: adopted and replaced.
    let opts = RestoreOptions {
        replace_unmarked: true,
        ..RestoreOptions::default()
    };
    let (store, report) = fx.restore(&target, &opts).await.unwrap();
    assert!(report.snapshot.is_some());
    assert!(!target.join("thesis.tex").exists());
    assert!(target.join(STORE_MARKER).is_file());
    assert!(store.get(b"k00042").unwrap().is_some());
    drop(store);
    // A restored store is marked: the next restore replaces it silently.
    fx.restore(&target, &RestoreOptions::default())
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_symlinked_target_is_refused_and_its_destination_untouched() {
    let fx = setup().await;
    let elsewhere = fx.path("elsewhere");
    common::dir_with_file(&elsewhere, "precious", b"keep me");
    // Even a marked directory behind a symlink.
    std::fs::write(elsewhere.join(STORE_MARKER), b"").unwrap();
    let link = fx.path("link");
    std::os::unix::fs::symlink(&elsewhere, &link).unwrap();
    refused_even_when_adopted(&fx, &link).await;
    assert_eq!(
        std::fs::read(elsewhere.join("precious")).unwrap(),
        b"keep me"
    );
    assert!(
        std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_first_reuse_never_follows_or_carries_a_symlink() {
    let fx = setup().await;
    let target = fx.path("restored");
    let (store, _) = fx
        .restore(&target, &RestoreOptions::default())
        .await
        .unwrap();
    drop(store);
    // Swap one SST of the local store (the largest: a data file, which the
    // snapshot carries as a blob) for a symlink to a copy of it outside.
    let sst = std::fs::read_dir(&target)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "sst"))
        .max_by_key(|p| std::fs::metadata(p).unwrap().len())
        .unwrap();
    let outside = fx.path("outside.sst");
    std::fs::copy(&sst, &outside).unwrap();
    std::fs::remove_file(&sst).unwrap();
    std::os::unix::fs::symlink(&outside, &sst).unwrap();

    let (store, report) = fx
        .restore(&target, &RestoreOptions::default())
        .await
        .unwrap();
    assert!(
        report.transfer.files_downloaded >= 1,
        "{:?}",
        report.transfer
    );
    let m = std::fs::symlink_metadata(&sst).unwrap();
    assert!(
        m.is_file(),
        "the restored SST is a regular file, not a link"
    );
    assert!(store.get(b"k00001").unwrap().is_some());
    // The file outside was not touched (nor linked into the store).
    assert_eq!(std::fs::metadata(&outside).unwrap().nlink(), 1);
}

use std::os::unix::fs::MetadataExt;

/// Unmounts when dropped, so a failing assertion leaves no mount behind.
struct Mounted(std::path::PathBuf);

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
    }
}

/// A mount point is never emptied or replaced, even adopted: a restore
/// cannot rename it, and emptying it is not ours to do; adopting it writes
/// nothing into it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "mounts a tmpfs, so it needs root; scripts/test.sh runs it (--ignored) when root"]
async fn a_mount_point_target_is_refused_and_left_whole() {
    let fx = setup().await;
    let target = fx.path("mnt");
    std::fs::create_dir_all(&target).unwrap();
    let status = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=16m", "statesnap-test"])
        .arg(&target)
        .status()
        .unwrap();
    assert!(status.success(), "mount -t tmpfs failed: run as root");
    let _mounted = Mounted(target.clone());
    std::fs::write(target.join("precious"), b"keep me").unwrap();
    refused_even_when_adopted(&fx, &target).await;
    assert_eq!(std::fs::read(target.join("precious")).unwrap(), b"keep me");
    let mut names: Vec<_> = std::fs::read_dir(&target)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    names.sort();
    assert_eq!(
        names,
        ["precious"],
        "nothing written into the mount, not even a marker"
    );
    // A directory inside the mount is fine.
    let (store, _) = fx
        .restore(&target.join("store"), &RestoreOptions::default())
        .await
        .unwrap();
    assert!(store.get(b"k00042").unwrap().is_some());
}

/// The ways a symbolic link `link` may be written as a target: each names
/// the link itself, which no restore follows.
const LINK_FORMS: [&str; 4] = ["link", "link/", "link/.", "link//./"];

/// Defect: `restore --to LINK/ --force` followed the link (`lstat` of
/// `link/` is the directory behind it), wrote the store marker into the
/// user's directory there, then failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_symlink_target_is_refused_however_it_is_written() {
    let fx = setup().await;
    let area = fx.path("area");
    // Behind the link: a user's directory; then a marked store.
    for marked in [false, true] {
        let _ = std::fs::remove_dir_all(&area);
        let elsewhere = area.join("elsewhere");
        common::dir_with_file(&elsewhere, "precious", b"keep me");
        if marked {
            std::fs::write(elsewhere.join(STORE_MARKER), b"").unwrap();
        }
        std::os::unix::fs::symlink(&elsewhere, area.join("link")).unwrap();
        let before = tree(&area);
        for form in LINK_FORMS {
            let target = PathBuf::from(format!("{}/{form}", area.display()));
            for replace_unmarked in [false, true] {
                for full_replay in [false, true] {
                    let opts = RestoreOptions {
                        replace_unmarked,
                        full_replay,
                        ..RestoreOptions::default()
                    };
                    let err = fx.restore_into(&target, &opts).await.unwrap_err();
                    assert_eq!(err.kind(), ErrorKind::Config, "restore_into {form}: {err}");
                    assert_eq!(tree(&area), before, "restore_into {form} marked={marked}");
                    let err = fx.restore(&target, &opts).await.unwrap_err();
                    assert_eq!(err.kind(), ErrorKind::Config, "restore_store {form}: {err}");
                    assert_eq!(tree(&area), before, "restore_store {form} marked={marked}");
                }
            }
        }
    }
}

/// The rule for links above the target: followed, as for any path (the
/// store is made in the directory they lead to, its staging beside it
/// there); the last component is never followed, however written; a path
/// ending in `..` names no entry of its own and is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_link_in_a_parent_is_followed_and_the_last_component_never_is() {
    let fx = setup().await;
    let area = fx.path("area");
    let real = area.join("real");
    std::fs::create_dir_all(&real).unwrap();
    std::os::unix::fs::symlink(&real, area.join("plink")).unwrap();
    let plain = RestoreOptions::default();
    fx.restore_into(&area.join("plink/store"), &plain)
        .await
        .unwrap();
    assert_restored_rocks(&real.join("store"), 0);
    assert!(
        std::fs::symlink_metadata(area.join("plink"))
            .unwrap()
            .file_type()
            .is_symlink()
    );
    assert_eq!(leftovers(&area), Vec::<PathBuf>::new());
    // With a trailing slash: the same (real, marked) store, replaced.
    fx.restore_into(&area.join("plink/store/"), &plain)
        .await
        .unwrap();
    let (store, _) = fx
        .restore(&area.join("plink/store/."), &plain)
        .await
        .unwrap();
    drop(store);
    assert_restored_rocks(&real.join("store"), 0);
    assert_eq!(leftovers(&area), Vec::<PathBuf>::new());

    // A link as the last component behind a linked parent, and paths
    // ending in `..`: refused, nothing touched.
    let other = area.join("other");
    common::dir_with_file(&other, "precious", b"keep me");
    std::os::unix::fs::symlink(&other, real.join("sl")).unwrap();
    let before = tree(&area);
    for form in [
        "plink/sl",
        "plink/sl/",
        "plink/sl/.",
        "plink/..",
        "real/store/..",
    ] {
        for replace_unmarked in [false, true] {
            let opts = RestoreOptions {
                replace_unmarked,
                ..RestoreOptions::default()
            };
            let err = fx.restore_into(&area.join(form), &opts).await.unwrap_err();
            assert_eq!(err.kind(), ErrorKind::Config, "restore_into {form}: {err}");
            let err = fx.restore(&area.join(form), &opts).await.unwrap_err();
            assert_eq!(err.kind(), ErrorKind::Config, "restore_store {form}: {err}");
            assert_eq!(tree(&area), before, "{form}");
        }
    }
}

/// How a restore run by [`run_restore`] ends early.
#[derive(Debug, Clone, Copy)]
enum Stop {
    /// It runs to its end.
    Never,
    /// The repository fails its operation `n` and every later one.
    Fail(u64),
    /// The restore's future is dropped when the repository reaches its
    /// operation `n` (other transfers may be under way).
    Cancel(u64),
    /// The restore's future is dropped after this long.
    After(Duration),
}

/// Which restore.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Api {
    /// `restore_into`: built aside, moved over the target at the end.
    Into,
    /// `restore_store`: in place (a snapshot is swapped in, a full replay
    /// rebuilds the target).
    InPlace,
}

/// Runs a restore of `fx`'s store into `target` on a runtime of its own,
/// stopped as `stop` says, then drops the runtime, which waits for the
/// steps still running on its blocking pool. `None`: cancelled. Also
/// returns how many repository operations it made.
fn run_restore<F: StoreFormat>(
    fx: &Fixture<F>,
    target: &Path,
    opts: &RestoreOptions,
    api: Api,
    stop: Stop,
) -> (Option<statesnap::Result<()>>, u64) {
    let rt = common::rt();
    let faults = match stop {
        Stop::Fail(n) => FaultConfig {
            crash_after: Some(n),
            ..FaultConfig::default()
        },
        _ => FaultConfig::default(),
    };
    let (repo, faulty) = fx.faulty(faults);
    let run = async {
        match api {
            Api::Into => restore_into(&fx.format, &repo, &sk(), &fx.log, target, opts)
                .await
                .map(drop),
            Api::InPlace => restore_store(&fx.format, &repo, &sk(), &fx.log, target, opts)
                .await
                .map(drop),
        }
    };
    let out = rt.block_on(async {
        match stop {
            Stop::Cancel(n) => {
                let mut pause = faulty.pause_before(n);
                let reached = async {
                    if !pause.reached().await {
                        std::future::pending::<()>().await;
                    }
                };
                tokio::select! {
                    biased;
                    r = run => Some(r),
                    () = reached => None,
                }
            }
            Stop::After(d) => tokio::time::timeout(d, run).await.ok(),
            Stop::Never | Stop::Fail(_) => Some(run.await),
        }
    });
    drop(rt);
    (out, faulty.ops())
}

/// What a restore into a store directory must leave in `area`: if it
/// finished, the store at `real` (relative to `area`; `None` for a store
/// kept in memory, which leaves no path) and everything else as it was;
/// else everything byte for byte as it was. Never any staging.
fn check_outcome(
    area: &Path,
    before: &BTreeMap<PathBuf, Node>,
    real: &Path,
    on_disk: bool,
    outcome: &Option<statesnap::Result<()>>,
    what: &str,
) {
    match outcome {
        Some(Ok(())) => {
            if on_disk {
                assert_restored_rocks(&area.join(real), TAIL);
            } else {
                assert!(
                    std::fs::symlink_metadata(area.join(real)).is_err(),
                    "{what}"
                );
            }
            let mut expected = before.clone();
            expected.retain(|p, _| !p.starts_with(real));
            assert_eq!(tree_outside(area, real), expected, "{what}");
        }
        Some(Err(_)) | None => assert_eq!(&tree(area), before, "{what}: {outcome:?}"),
    }
    assert_eq!(
        leftovers(area),
        Vec::<PathBuf>::new(),
        "{what}: {outcome:?}"
    );
}

/// Lays out a user's directory (not a store) at `target`.
fn foreign_dir(target: &Path) {
    common::dir_with_file(target, "thesis.tex", b"years of work");
    common::dir_with_file(&target.join("figures"), "plot.svg", b"<svg/>");
}

/// Defect: adopting a user's directory (`replace_unmarked`, CLI `--force`)
/// wrote the store marker into it before the restore started, so a failed
/// or interrupted restore left it there. Now nothing is written to the
/// target before the final rename: failing every repository operation in
/// turn, dropping the future at each one and after several delays leaves
/// it byte for byte as it was (or, where the restore finished, the
/// restored store), and no staging.
#[test]
fn an_adopted_directory_is_untouched_until_the_swap_however_the_restore_ends() {
    let rt = common::rt();
    let fx = rt.block_on(setup_rocks(TAIL));
    drop(rt);
    let area = fx.path("area");
    let target = area.join("home");
    let opts = RestoreOptions {
        replace_unmarked: true,
        ..RestoreOptions::default()
    };
    let (probe, ops) = run_restore(
        &fx,
        &fx.path("probe"),
        &RestoreOptions::default(),
        Api::Into,
        Stop::Never,
    );
    assert!(matches!(probe, Some(Ok(()))), "{probe:?}");
    assert!(ops > 3, "{ops}");
    let mut stops = Vec::new();
    for n in 0..=ops {
        stops.push((Api::Into, Stop::Fail(n)));
        stops.push((Api::InPlace, Stop::Fail(n)));
        stops.push((Api::Into, Stop::Cancel(n)));
    }
    for ms in [0, 1, 2, 5, 10, 20, 50] {
        stops.push((Api::Into, Stop::After(Duration::from_millis(ms))));
    }
    let (mut cancelled, mut failed) = (0, 0);
    for (api, stop) in stops {
        let _ = std::fs::remove_dir_all(&area);
        foreign_dir(&target);
        let before = tree(&area);
        let (outcome, _) = run_restore(&fx, &target, &opts, api, stop);
        cancelled += usize::from(outcome.is_none());
        failed += usize::from(matches!(outcome, Some(Err(_))));
        let what = format!("{api:?} {stop:?}");
        check_outcome(&area, &before, Path::new("home"), true, &outcome, &what);
    }
    // Both kinds of ending were met (not only finished restores).
    assert!(cancelled > ops as usize / 2, "{cancelled}");
    assert!(failed > ops as usize / 2, "{failed}");
}

/// A restore into a new path, cancelled before each repository operation
/// and after several delays (downloads, the install and the portable load
/// still running on the blocking pool): once those steps are done, no
/// staging is left (they used to re-create a staging directory its guard
/// had just removed), and the target is absent or complete.
#[test]
fn a_cancelled_restore_leaves_no_staging() {
    let rt = common::rt();
    let rocks = rt.block_on(setup_rocks(TAIL));
    let portable = rt.block_on(setup_portable(portable_into_rocks()));
    drop(rt);
    let opts = RestoreOptions::default();
    let mut stops: Vec<Stop> = (0..16).map(Stop::Cancel).collect();
    stops.extend([0, 1, 2, 3, 5, 8, 13, 21, 34].map(|ms| Stop::After(Duration::from_millis(ms))));
    for stop in stops {
        for portable_format in [false, true] {
            let area = if portable_format {
                portable.path("area")
            } else {
                rocks.path("area")
            };
            let _ = std::fs::remove_dir_all(&area);
            std::fs::create_dir_all(&area).unwrap();
            let before = tree(&area);
            let target = area.join("t");
            let (outcome, _) = if portable_format {
                run_restore(&portable, &target, &opts, Api::Into, stop)
            } else {
                run_restore(&rocks, &target, &opts, Api::Into, stop)
            };
            let what = format!("portable={portable_format} {stop:?}");
            check_outcome(&area, &before, Path::new("t"), true, &outcome, &what);
        }
    }
}

/// After a restore that succeeded, nothing but the store is left in the
/// target's directory: no staging of the restore (nor of a capture).
#[test]
fn no_staging_is_left_beside_the_target_after_a_restore() {
    let rt = common::rt();
    let rocks = rt.block_on(setup_rocks(TAIL));
    let portable = rt.block_on(setup_portable(portable_into_rocks()));
    drop(rt);
    for api in [Api::Into, Api::InPlace] {
        for full_replay in [false, true] {
            let opts = RestoreOptions {
                full_replay,
                ..RestoreOptions::default()
            };
            for (fx_dir, outcome) in [
                {
                    let area = rocks.path("area");
                    let _ = std::fs::remove_dir_all(&area);
                    (
                        area.clone(),
                        run_restore(&rocks, &area.join("t"), &opts, api, Stop::Never).0,
                    )
                },
                {
                    let area = portable.path("area");
                    let _ = std::fs::remove_dir_all(&area);
                    (
                        area.clone(),
                        run_restore(&portable, &area.join("t"), &opts, api, Stop::Never).0,
                    )
                },
            ] {
                assert!(matches!(outcome, Some(Ok(()))), "{outcome:?}");
                assert_restored_rocks(&fx_dir.join("t"), TAIL);
                let names: Vec<_> = std::fs::read_dir(&fx_dir)
                    .unwrap()
                    .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                    .collect();
                assert_eq!(names, ["t"], "{api:?} full_replay={full_replay}");
            }
        }
    }
}

/// A target as a test lays it out.
#[derive(Debug, Clone, Copy)]
enum Shape {
    Absent,
    Empty,
    /// A user's directory (not a store).
    Foreign,
    /// A store directory (marked).
    Marked,
    /// A file.
    File,
    /// A symlink to a user's directory (or an empty one), written as
    /// `LINK_FORMS[form]`.
    Link {
        to_foreign: bool,
        form: usize,
    },
    /// An absent target under a linked parent directory.
    ParentLink,
    /// A path ending in `..`.
    DotDot,
}

/// Lays `shape` out in `area` (with a neighbour file, so stray writes
/// show); returns the target as written and its real path relative to
/// `area`, and whether every restore must refuse it.
fn lay_out(area: &Path, shape: Shape, force: bool) -> (PathBuf, PathBuf, bool) {
    std::fs::create_dir_all(area).unwrap();
    std::fs::write(area.join("neighbour"), b"next door").unwrap();
    let t = area.join("t");
    let rel = PathBuf::from("t");
    match shape {
        Shape::Absent => (t, rel, false),
        Shape::Empty => {
            std::fs::create_dir(&t).unwrap();
            (t, rel, false)
        }
        Shape::Foreign => {
            foreign_dir(&t);
            (t, rel, !force)
        }
        Shape::Marked => {
            common::dir_with_file(&t, STORE_MARKER, b"");
            std::fs::write(t.join("000001.sst"), b"an old store's file").unwrap();
            (t, rel, false)
        }
        Shape::File => {
            std::fs::write(&t, b"a file").unwrap();
            (t, rel, true)
        }
        Shape::Link { to_foreign, form } => {
            let elsewhere = area.join("elsewhere");
            if to_foreign {
                foreign_dir(&elsewhere);
            } else {
                std::fs::create_dir(&elsewhere).unwrap();
            }
            std::os::unix::fs::symlink(&elsewhere, area.join("link")).unwrap();
            let written = PathBuf::from(format!("{}/{}", area.display(), LINK_FORMS[form]));
            (written, PathBuf::from("link"), true)
        }
        Shape::ParentLink => {
            std::fs::create_dir(area.join("real")).unwrap();
            std::os::unix::fs::symlink(area.join("real"), area.join("p")).unwrap();
            (area.join("p/t"), PathBuf::from("real/t"), false)
        }
        Shape::DotDot => {
            common::dir_with_file(&area.join("d/x"), "f", b"f");
            (area.join("d/x/.."), PathBuf::from("d"), true)
        }
    }
}

fn shape() -> impl Strategy<Value = Shape> {
    prop_oneof![
        Just(Shape::Absent),
        Just(Shape::Empty),
        Just(Shape::Foreign),
        Just(Shape::Marked),
        Just(Shape::File),
        (any::<bool>(), 0..LINK_FORMS.len())
            .prop_map(|(to_foreign, form)| Shape::Link { to_foreign, form }),
        Just(Shape::ParentLink),
        Just(Shape::DotDot),
    ]
}

/// How a case ends early; cancellation only for `restore_into` (an
/// in-place restore cancelled during its final step finishes it).
fn api_and_stop() -> impl Strategy<Value = (Api, Stop)> {
    prop_oneof![
        Just((Api::Into, Stop::Never)),
        (0..24u64).prop_map(|n| (Api::Into, Stop::Fail(n))),
        (0..24u64).prop_map(|n| (Api::Into, Stop::Cancel(n))),
        (0..40u64).prop_map(|ms| (Api::Into, Stop::After(Duration::from_millis(ms)))),
        Just((Api::InPlace, Stop::Never)),
        (0..24u64).prop_map(|n| (Api::InPlace, Stop::Fail(n))),
    ]
}

/// Which store and format a case restores.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Rocks,
    PortableIntoRocks,
    PortableIntoMemory,
}

/// Property: a refused, failed or cancelled restore leaves the target
/// directory (and everything beside it) byte for byte as it was, and no
/// staging; one that finishes leaves the restored store and nothing else
/// changed — for every target shape, failure point and format.
#[test]
fn a_refused_failed_or_cancelled_restore_leaves_the_target_as_it_was() {
    let rt = common::rt();
    let rocks = rt.block_on(setup_rocks(TAIL));
    let portable = rt.block_on(setup_portable(portable_into_rocks()));
    let memory = rt.block_on(setup_portable(PortableFormat::memory()));
    drop(rt);
    let kind = prop_oneof![
        Just(Kind::Rocks),
        Just(Kind::PortableIntoRocks),
        Just(Kind::PortableIntoMemory)
    ];
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: 40,
        failure_persistence: None,
        ..ProptestConfig::default()
    });
    runner
        .run(
            &(kind, shape(), any::<bool>(), any::<bool>(), api_and_stop()),
            |(kind, shape, force, full_replay, (api, stop))| {
                let dir = tempfile::tempdir().unwrap();
                let area = dir.path().join("area");
                let (target, real, refused) = lay_out(&area, shape, force);
                let before = tree(&area);
                let opts = RestoreOptions {
                    replace_unmarked: force,
                    full_replay,
                    ..RestoreOptions::default()
                };
                let (outcome, _) = match kind {
                    Kind::Rocks => run_restore(&rocks, &target, &opts, api, stop),
                    Kind::PortableIntoRocks => run_restore(&portable, &target, &opts, api, stop),
                    Kind::PortableIntoMemory => run_restore(&memory, &target, &opts, api, stop),
                };
                let what = format!("{kind:?} {shape:?} force={force} {api:?} {stop:?}");
                if refused {
                    prop_assert!(
                        matches!(&outcome, Some(Err(e)) if e.kind() == ErrorKind::Config),
                        "{what}: {outcome:?}"
                    );
                }
                let in_memory = matches!(kind, Kind::PortableIntoMemory);
                if in_memory && api == Api::Into {
                    // Nothing to put in a directory: refused at the end.
                    prop_assert!(
                        matches!(&outcome, Some(Err(_)) | None),
                        "{what}: {outcome:?}"
                    );
                }
                check_outcome(&area, &before, &real, !in_memory, &outcome, &what);
                Ok(())
            },
        )
        .unwrap();
}
