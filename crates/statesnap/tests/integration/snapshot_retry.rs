//! Defect 4: a snapshot whose parent's blobs were swept by gc used to fail
//! `stale` on every retry (the RocksDB format reused the parent's files
//! without checking them, the portable format wrote a delta over them for
//! an idle store). Now the writer re-uploads what is gone, from the cut.
#![allow(clippy::unwrap_used)]

use crate::common;

use futures::TryStreamExt;
use object_store::{ObjectStore, ObjectStoreExt};
use std::sync::Arc;

use statesnap::format::StoreFormat;
use statesnap::format::portable::PortableFormat;
use statesnap::repo::StoreKey;
use statesnap::store::LoggedStore;
use statesnap::store::MemoryStore;
use statesnap::store::StateStore;

fn sk() -> StoreKey {
    StoreKey::new("app", "retry", 0).unwrap()
}

use common::{contents, file_log, memory_repo, restore_latest, snapshot};

/// Deletes every blob of the store (what retention + gc do once the
/// parent's manifest is dropped while the writer still holds it).
async fn sweep_blobs(base: &Arc<dyn ObjectStore>) -> usize {
    let all: Vec<_> = base.list(None).try_collect().await.unwrap();
    let mut n = 0;
    for m in all {
        if m.location.as_ref().contains("/blobs/") {
            base.delete(&m.location).await.unwrap();
            n += 1;
        }
    }
    n
}

/// Snapshot, sweep its blobs, snapshot again with it as parent (after
/// `between` more writes), then check the second snapshot restores exactly.
async fn retried_after_sweep<F: StoreFormat>(
    format: &F,
    store: F::Store,
    between: usize,
    dir: &std::path::Path,
) where
    F::Store: StateStore,
{
    let (repo, base) = memory_repo();
    let log = file_log(&dir.join("log"), "app", "retry");
    let mut s = LoggedStore::new(store, log).unwrap();
    for i in 0..2_000u32 {
        s.put(format!("key-{i:05}"), format!("value-{i}"));
        if i % 500 == 499 {
            s.commit().unwrap();
        }
    }
    let parent = snapshot(format, s.store(), &repo, &sk(), s.changelog(), None).await;
    for i in 0..between {
        s.put(format!("key-{i:05}"), "changed");
        s.delete(format!("key-{:05}", 1000 + i));
        s.commit().unwrap();
    }
    assert!(sweep_blobs(&base).await > 0);
    // Twice: the first retry must already succeed, and so must the next.
    let mut retried = Vec::new();
    for _ in 0..2 {
        let m = snapshot(
            format,
            s.store(),
            &repo,
            &sk(),
            s.changelog(),
            Some(&parent),
        )
        .await;
        assert!(
            repo.blobs().blobs_present(&sk(), &m.files).await.unwrap(),
            "every blob the new snapshot names is in the repository"
        );
        retried.push(m.snapshot_id);
    }
    let want = contents(s.store());
    let (_, log) = s.into_parts();
    let (restored, report) = restore_latest(format, &repo, &sk(), &log, &dir.join("restored"))
        .await
        .unwrap();
    // Any of them: the retries re-uploaded the parent's swept blobs (for an
    // idle store, the very same bytes), and snapshots at one offset whose
    // ids were minted in the same millisecond order at random.
    retried.push(parent.snapshot_id);
    assert!(
        report.snapshot.is_some_and(|id| retried.contains(&id)),
        "{report:?}"
    );
    assert!(report.skipped.is_empty(), "{report:?}");
    assert_eq!(report.replay.records, 0);
    assert_eq!(contents(&restored), want);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn portable_idle_store_snapshot_succeeds_after_its_parent_was_swept() {
    let dir = tempfile::tempdir().unwrap();
    retried_after_sweep(&PortableFormat::memory(), MemoryStore::new(), 0, dir.path()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn portable_delta_after_a_swept_parent_is_written_full() {
    let dir = tempfile::tempdir().unwrap();
    retried_after_sweep(
        &PortableFormat::memory(),
        MemoryStore::new(),
        10,
        dir.path(),
    )
    .await;
}

#[cfg(feature = "rocksdb")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rocksdb_snapshot_reuploads_swept_parent_files() {
    use statesnap::format::rocks::RocksFormat;
    use statesnap::store::{RocksOptions, RocksStore};
    let dir = tempfile::tempdir().unwrap();
    let format = RocksFormat::new(RocksOptions::default());
    let store = RocksStore::open(dir.path().join("store"), &RocksOptions::default()).unwrap();
    retried_after_sweep(&format, store, 10, dir.path()).await;
}
