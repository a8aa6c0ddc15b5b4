//! Model test for the portable format: random put/delete/commit sequences
//! over a `LoggedStore<MemoryStore>` with the file changelog, snapshots
//! (full and delta) at random points, and restores (snapshot + tail replay)
//! checked against a `BTreeMap` of committed writes.
#![allow(clippy::unwrap_used)]

use crate::common;

use bytes::Bytes;
use proptest::prelude::*;
use std::collections::BTreeMap;

use statesnap::format::portable::chunk::ChunkParams;
use statesnap::format::portable::{DeltaPolicy, LayerKind, PortableFormat, PortableMetadata};
use statesnap::repo::{Manifest, StoreKey};
use statesnap::store::LoggedStore;
use statesnap::store::MemoryStore;
use statesnap::store::StateStore;

#[derive(Debug, Clone)]
enum Op {
    Write(Write),
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
        20 => writes_and_commits(60, [12, 4, 4], Op::Write, Op::Commit),
        3 => Just(Op::Snapshot),
        2 => Just(Op::Restore),
        1 => Just(Op::FullSnapshot),
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

use common::{
    Model, Write, contents, file_log, memory_repo, restore_latest, restore_snapshot, rt, snapshot,
    writes_and_commits,
};

async fn run(ops: Vec<Op>) {
    let dir = tempfile::tempdir().unwrap();
    let log = file_log(&dir.path().join("log"), "model", "store");
    let mut ls = LoggedStore::new(MemoryStore::new(), log).unwrap();
    let (repo, _) = memory_repo();
    let sk = StoreKey::new("model", "store", 0).unwrap();
    let fmt = format();
    let mut model = Model::default();
    let mut latest: Option<Manifest> = None;
    // (manifest, model at its offset)
    let mut taken: Vec<(Manifest, BTreeMap<Bytes, Bytes>)> = Vec::new();
    for op in ops {
        match op {
            Op::Write(w) => model.write(&mut ls, &w),
            Op::Commit => model.commit(&mut ls),
            Op::Snapshot | Op::FullSnapshot => {
                model.commit(&mut ls);
                if ls.store().applied_offset().unwrap().is_none() {
                    continue;
                }
                if matches!(op, Op::FullSnapshot) {
                    fmt.forget_last_cut();
                }
                let m = snapshot(
                    &fmt,
                    ls.store(),
                    &repo,
                    &sk,
                    ls.changelog(),
                    latest.as_ref(),
                )
                .await;
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
                assert_eq!(m.stats.keys, model.committed.len() as u64);
                taken.push((m.clone(), model.committed.clone()));
                latest = Some(m);
            }
            Op::Restore => {
                model.commit(&mut ls);
                let rdir = tempfile::tempdir().unwrap();
                let target = rdir.path().join("store");
                let (store, report) =
                    restore_latest(&format(), &repo, &sk, ls.changelog(), &target)
                        .await
                        .unwrap();
                assert!(report.skipped.is_empty(), "{:?}", report.skipped);
                // Two snapshots may share an offset; either is the newest.
                assert_eq!(
                    report.snapshot_offset,
                    latest.as_ref().map(|m| m.changelog.offset),
                    "restores from the newest snapshot"
                );
                assert_eq!(contents(&store), model.committed, "restore + tail replay");
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
        let (store, _) = restore_snapshot(&format(), m, &repo, rdir.path())
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
        rt().block_on(run(ops));
    }
}
