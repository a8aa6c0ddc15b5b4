//! The group glue's unit tests.

#![allow(clippy::unwrap_used)]
use super::*;
use crate::format::portable::PortableFormat;
use crate::repo::StoreKey;
use crate::runtime::SnapshotPolicy;
use crate::store::memory::MemoryStore;
use crate::{FileChangelog, Repository};

type Handle = StateHandle<PortableFormat<MemoryStore>, FileChangelog>;

#[test]
fn the_input_position_is_left_behind_by_a_reshard() {
    // It names an offset in one input partition of the old layout.
    assert!(INPUT_POSITION_KEY.starts_with(crate::reshard::PARTITION_LOCAL_PREFIX));
    let defaults = crate::reshard::ReshardOptions::default();
    assert!(
        defaults
            .leave_behind
            .iter()
            .any(|p| INPUT_POSITION_KEY.starts_with(p))
    );
}

async fn open(manager: &StateManager, dir: &std::path::Path) -> Handle {
    let log = FileChangelog::open(
        dir.join("log"),
        StoreKey::new("app", "s", 0).unwrap().changelog_id(),
        Default::default(),
    )
    .unwrap();
    manager
        .open(StoreSpec::memory(
            StoreKey::new("app", "s", 0).unwrap(),
            log,
            dir.join("store"),
        ))
        .await
        .unwrap()
}

async fn manager(dir: &std::path::Path) -> StateManager {
    let url = format!("file://{}", dir.join("repo").display());
    let repo = match Repository::init(&url, Default::default()).await {
        Ok(r) => r,
        Err(_) => Repository::open(&url, Default::default()).await.unwrap(),
    };
    StateManager::builder(repo)
        .policy(SnapshotPolicy::manual())
        .build()
        .unwrap()
}

/// A commit writes the position the previous commit made good (a
/// failed append may land any subset of a batch), the final commit
/// writes the exact one on its own, and a reopened store resumes there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn positions_lag_one_commit_until_the_final_one() {
    let dir = tempfile::tempdir().unwrap();
    let manager = manager(dir.path()).await;
    let mut p = Partition::new(open(&manager, dir.path()).await).unwrap();
    assert_eq!(p.position(), None);
    assert!(p.is_new(0));

    p.handle_mut().put("k", "1");
    p.processed(0);
    p.processed(1);
    p.commit().unwrap();
    // Nothing was made good before this batch: no position yet.
    assert_eq!(recorded_position(p.handle()).unwrap(), None);
    assert_eq!(p.position(), Some(2));
    assert!(!p.is_new(1));
    assert!(p.is_new(2));

    p.handle_mut().put("k", "2");
    p.processed(2);
    p.commit().unwrap();
    assert_eq!(recorded_position(p.handle()).unwrap(), Some(2));
    assert_eq!(p.position(), Some(3));

    p.commit_final().unwrap();
    assert_eq!(recorded_position(p.handle()).unwrap(), Some(3));
    let end = p.handle().changelog().end_offset().unwrap();
    // Nothing left to write: another final commit appends nothing.
    p.commit_final().unwrap();
    assert_eq!(p.handle().changelog().end_offset().unwrap(), end);
    // Records before the position are not new, including ones the
    // caller has not processed in this incarnation.
    assert!(!p.is_new(0));

    p.handle.close().await.unwrap();
    let p = Partition::new(open(&manager, dir.path()).await).unwrap();
    assert_eq!(p.position(), Some(3));
    assert_eq!(p.handle().report().replay.records, 0);
    assert_eq!(
        p.handle().get(b"k").unwrap().as_deref(),
        Some(b"2".as_slice())
    );
    p.handle.abandon().await;
    manager.shutdown().await;
}

/// A position that is not 8 bytes is refused, not misread.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_position_is_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let manager = manager(dir.path()).await;
    let mut h = open(&manager, dir.path()).await;
    h.put(Bytes::from_static(INPUT_POSITION_KEY), "seven!!");
    h.commit().unwrap();
    let e = recorded_position(&h).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Corrupt, "{e}");
    assert!(Partition::new(h).is_err());
    manager.shutdown().await;
}
