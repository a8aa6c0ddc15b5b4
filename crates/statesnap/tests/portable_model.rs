//! Model test for the portable format: random put/delete/commit sequences
//! over a `LoggedStore<MemoryStore>` with the file changelog, snapshots
//! (full and delta) at random points, and restores (snapshot + tail replay)
//! checked against a `BTreeMap` of committed writes.
#![allow(clippy::unwrap_used)]

mod common;

use bytes::Bytes;
use object_store::memory::InMemory;
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::sync::Arc;

use statesnap::changelog::ChangelogId;
use statesnap::changelog::file::{FileChangelog, FileChangelogOptions};
use statesnap::format::StoreFormat;
use statesnap::format::portable::chunk::ChunkParams;
use statesnap::format::portable::{DeltaPolicy, LayerKind, PortableFormat, PortableMetadata};
use statesnap::repo::{Manifest, Repository, StoreKey};
use statesnap::restore::{RestoreOptions, restore_store};
use statesnap::snapshot::commit_snapshot;
use statesnap::store::StateStore;
use statesnap::store::logged::LoggedStore;
use statesnap::store::memory::MemoryStore;

#[derive(Debug, Clone)]
enum Op {
    Put(u8, u16),
    Delete(u8),
    Commit,
    /// Commit, then snapshot with the latest snapshot as parent (may be a delta).
    Snapshot,
    /// Commit, then a snapshot that cannot be a delta (the format forgot its cut).
    FullSnapshot,
    /// Restore into a fresh store (with a fresh format) and compare.
    Restore,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        12 => (0u8..60, any::<u16>()).prop_map(|(k, v)| Op::Put(k, v)),
        4 => (0u8..60).prop_map(Op::Delete),
        4 => Just(Op::Commit),
        3 => Just(Op::Snapshot),
        1 => Just(Op::FullSnapshot),
        2 => Just(Op::Restore),
    ]
}

fn small_chunks() -> ChunkParams {
    ChunkParams {
        min: 32,
        target: 128,
        max: 512,
    }
}

fn format() -> PortableFormat<MemoryStore> {
    PortableFormat::memory()
        .with_chunking(small_chunks())
        .unwrap()
        .with_delta_policy(DeltaPolicy {
            enabled: true,
            max_chain_len: 3,
            max_delta_percent: 400,
        })
}

use common::{apply_to, contents, key};

fn commit(
    ls: &mut LoggedStore<MemoryStore, FileChangelog>,
    committed: &mut BTreeMap<Bytes, Bytes>,
    pending: &mut BTreeMap<Bytes, Option<Bytes>>,
) {
    ls.commit().unwrap();
    apply_to(committed, std::mem::take(pending));
}

async fn run(ops: Vec<Op>) {
    let dir = tempfile::tempdir().unwrap();
    let id = ChangelogId::for_store("model", "store", 0).unwrap();
    let log = FileChangelog::open(
        dir.path().join("log"),
        id.clone(),
        FileChangelogOptions::default(),
    )
    .unwrap();
    let mut ls = LoggedStore::new(MemoryStore::new(), log).unwrap();
    let repo = Repository::from_store(Arc::new(InMemory::new()), "").unwrap();
    let sk = StoreKey::new("model", "store", 0).unwrap();
    let fmt = format();
    let mut committed = BTreeMap::new();
    let mut pending = BTreeMap::new();
    let mut latest: Option<Manifest> = None;
    // (manifest, model at its offset)
    let mut taken: Vec<(Manifest, BTreeMap<Bytes, Bytes>)> = Vec::new();
    for op in ops {
        match op {
            Op::Put(k, v) => {
                let v = Bytes::from(v.to_le_bytes().to_vec());
                ls.put(key(k), v.clone());
                pending.insert(key(k), Some(v));
            }
            Op::Delete(k) => {
                ls.delete(key(k));
                pending.insert(key(k), None);
            }
            Op::Commit => commit(&mut ls, &mut committed, &mut pending),
            Op::Snapshot | Op::FullSnapshot => {
                commit(&mut ls, &mut committed, &mut pending);
                if ls.store().applied_offset().unwrap().is_none() {
                    continue;
                }
                if matches!(op, Op::FullSnapshot) {
                    fmt.forget_last_cut();
                }
                let cut = fmt.capture(ls.store()).unwrap();
                let m = commit_snapshot(&fmt, cut, &repo, &sk, ls.changelog(), latest.as_ref())
                    .await
                    .unwrap();
                let meta = PortableMetadata::of(&m).unwrap();
                if matches!(op, Op::FullSnapshot) {
                    assert_eq!(meta.layers.len(), 1);
                }
                if meta.layers.len() > 1 {
                    assert_eq!(meta.layers.last().unwrap().kind, LayerKind::Delta);
                    let parent = latest.as_ref().unwrap();
                    assert!(m.depends_on.contains(&parent.snapshot_id));
                    assert_eq!(m.depends_on.len(), meta.layers.len() - 1);
                }
                assert!(meta.layers.len() <= 4, "chain bound: {}", meta.layers.len());
                assert_eq!(m.stats.keys, committed.len() as u64);
                taken.push((m.clone(), committed.clone()));
                latest = Some(m);
            }
            Op::Restore => {
                commit(&mut ls, &mut committed, &mut pending);
                let rdir = tempfile::tempdir().unwrap();
                let (store, report) = restore_store(
                    &format(),
                    &repo,
                    &sk,
                    ls.changelog(),
                    &rdir.path().join("store"),
                    &RestoreOptions::default(),
                )
                .await
                .unwrap();
                assert!(report.skipped.is_empty(), "{:?}", report.skipped);
                // Two snapshots may share an offset; either is the newest.
                assert_eq!(
                    report.snapshot_offset,
                    latest.as_ref().map(|m| m.changelog.offset),
                    "restores from the newest snapshot"
                );
                assert_eq!(contents(&store), committed, "restore + tail replay");
                assert_eq!(
                    store.applied_offset().unwrap(),
                    ls.store().applied_offset().unwrap()
                );
            }
        }
    }
    // Every snapshot, restored on its own (no replay), equals the model at
    // its offset: the delta chains merge exactly.
    for (m, model) in &taken {
        let rdir = tempfile::tempdir().unwrap();
        let (store, _) = format()
            .restore(
                m,
                statesnap::format::RestoreContext {
                    repo: &repo,
                    target: rdir.path(),
                },
            )
            .await
            .unwrap();
        assert_eq!(&contents(&store), model, "snapshot {}", m.snapshot_id);
        assert_eq!(store.applied_offset().unwrap(), Some(m.changelog.offset));
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn memory_store_through_portable_matches_model(ops in proptest::collection::vec(op(), 1..150)) {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(run(ops));
    }
}
