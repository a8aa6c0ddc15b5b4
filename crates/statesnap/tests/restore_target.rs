//! Defect 7: a restore replaced its target without looking at what it was,
//! and local-first reuse followed symlinks. Now a restore replaces only an
//! absent path, an empty directory or a marked store; symlinks are never
//! followed or carried into a restored store.
#![cfg(feature = "rocksdb")]
#![allow(clippy::unwrap_used)]

mod common;

use std::path::{Path, PathBuf};

use statesnap::ErrorKind;
use statesnap::changelog::file::FileChangelog;
use statesnap::format::rocks::RocksFormat;
use statesnap::repo::{Repository, StoreKey};
use statesnap::restore::{RestoreOptions, RestoreReport, restore_store};
use statesnap::store::logged::LoggedStore;
use statesnap::store::rocks::{RocksOptions, RocksStore};
use statesnap::store::{STORE_MARKER, StateStore};

fn sk() -> StoreKey {
    StoreKey::new("app", "target", 0).unwrap()
}

/// A repository holding one RocksDB snapshot of a few thousand keys, the
/// changelog it follows, and the format that wrote it.
struct Fixture {
    dir: tempfile::TempDir,
    repo: Repository,
    log: FileChangelog,
    format: RocksFormat,
}

impl Fixture {
    /// A path in the fixture's directory.
    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `restore_store` of the fixture's store into `target`.
    async fn restore(
        &self,
        target: &Path,
        opts: &RestoreOptions,
    ) -> statesnap::Result<(RocksStore, RestoreReport)> {
        restore_store(&self.format, &self.repo, &sk(), &self.log, target, opts).await
    }
}

async fn setup() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let log = common::file_log(&dir.path().join("log"), "app", "target");
    let format = RocksFormat::new(RocksOptions::default());
    let store = RocksStore::open(dir.path().join("source"), &RocksOptions::default()).unwrap();
    let mut s = LoggedStore::new(store, log).unwrap();
    for i in 0..5_000u32 {
        s.put(format!("k{i:05}"), vec![b'v'; 200]);
        if i % 1000 == 999 {
            s.commit().unwrap();
        }
    }
    s.store().flush().unwrap();
    let (repo, _) = common::memory_repo();
    common::snapshot(&format, s.store(), &repo, &sk(), s.changelog(), None).await;
    let (_, log) = s.into_parts();
    Fixture {
        dir,
        repo,
        log,
        format,
    }
}

/// Restoring into `target` fails `config` naming `why`, from a snapshot and
/// by full replay, even with `replace_unmarked`.
async fn refused_even_when_adopted(fx: &Fixture, target: &Path, why: &str) {
    for full_replay in [false, true] {
        let opts = RestoreOptions {
            full_replay,
            replace_unmarked: true,
            ..RestoreOptions::default()
        };
        let err = fx.restore(target, &opts).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Config, "{err}");
        assert!(err.message().contains(why), "{err}");
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
    assert!(err.message().contains("not a statesnap store"), "{err}");
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
    refused_even_when_adopted(&fx, &link, "symbolic link").await;
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
    // Swap one SST of the local store for a symlink to a copy of it outside.
    let sst = std::fs::read_dir(&target)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "sst"))
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
    refused_even_when_adopted(&fx, &target, "mount point").await;
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
