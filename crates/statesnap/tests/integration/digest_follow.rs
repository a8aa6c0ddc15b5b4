//! The RocksDB format's digest that follows the changes: over random
//! histories (puts, overwrites, deletes, flushes, compactions of the live
//! store and of the checkpoint, reopens, restores, bulk loads, writes around
//! `apply`), every snapshot's digest and exact counts equal those of the
//! contents it holds, and a snapshot is derived from its predecessor
//! exactly when nothing since could have hidden a write.
#![cfg(feature = "rocksdb")]
#![allow(clippy::unwrap_used)]

use crate::common;

use bytes::Bytes;
use proptest::prelude::*;
use std::path::Path;

use statesnap::LogicalDigest;
use statesnap::changelog::{Changelog, ChangelogBinding, Record};
use statesnap::format::rocks::{CompactionPolicy, RocksFormat};
use statesnap::repo::{Manifest, StoreKey};
use statesnap::store::{RocksOptions, RocksStore, StateStore, StateStoreExt, ensure_follows};

use common::{Kv, memory_repo, restore_snapshot, rt, snapshot};

#[derive(Debug, Clone)]
enum Op {
    /// A batch of puts and deletes (`None`), applied at the next offset.
    Batch(Vec<(u8, Option<u8>)>),
    Flush,
    /// A full compaction of the live store (drops overwritten versions and
    /// tombstones: files change, contents do not).
    CompactLive,
    /// A snapshot; `true`: its checkpoint is compacted before upload.
    Snapshot(bool),
    Reopen,
    /// The store replaced by a restore of the newest snapshot.
    Restore,
    /// Sorted puts through the bulk loader (ingested files).
    BulkLoad(Vec<u8>),
    /// A put through `RocksStore::db()`, around `apply`.
    AroundApply(u8, u8),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => proptest::collection::vec((0u8..48, proptest::option::weighted(0.8, any::<u8>())), 1..12)
            .prop_map(Op::Batch),
        1 => Just(Op::Flush),
        1 => Just(Op::CompactLive),
        4 => any::<bool>().prop_map(Op::Snapshot),
        1 => Just(Op::Reopen),
        1 => Just(Op::Restore),
        1 => proptest::collection::vec(48u8..64, 1..6).prop_map(Op::BulkLoad),
        1 => (0u8..64, any::<u8>()).prop_map(|(k, v)| Op::AroundApply(k, v)),
    ]
}

fn key(k: u8) -> Bytes {
    Bytes::from(format!("key-{k:03}"))
}

fn value(k: u8, v: u8) -> Bytes {
    // Sizes vary with the value, so byte counts are checked too.
    Bytes::from(format!("{k}:{v}:{}", "x".repeat(usize::from(v % 29))))
}

fn opts() -> RocksOptions {
    RocksOptions {
        write_buffer_bytes: 64 << 10,
        block_cache_bytes: 1 << 20,
        background_jobs: 1,
        ..RocksOptions::default()
    }
}

fn digest_of(model: &Kv) -> LogicalDigest {
    LogicalDigest::of_pairs(model.iter().map(|(k, v)| (k.as_ref(), v.as_ref())))
}

fn how(m: &Manifest) -> String {
    m.format_metadata["digest"]
        .as_str()
        .unwrap_or("?")
        .to_owned()
}

/// Runs `ops` against a RocksDB store and a model; checks every snapshot.
/// Returns how many snapshots were derived.
async fn run(dir: &Path, ops: Vec<Op>) -> usize {
    let sk = StoreKey::new("app", "follow", 0).unwrap();
    let (repo, _) = memory_repo();
    let log = common::file_log(&dir.join("log"), "app", "follow");
    let plain = RocksFormat::new(opts()).with_compaction(None);
    let compacting = RocksFormat::new(opts()).with_compaction(Some(CompactionPolicy {
        max_space_amplification: 1.0,
        min_bytes: 0,
        min_interval: std::time::Duration::ZERO,
    }));
    let mut path = dir.join("store-0");
    let mut store = RocksStore::open(&path, &opts()).unwrap();
    ensure_follows(&mut store, &ChangelogBinding::of(&log).unwrap()).unwrap();
    let mut model = Kv::new();
    let mut parent: Option<Manifest> = None;
    // Whether the next snapshot must be derived: a snapshot of this open
    // came before, and nothing since went around the recorded writes.
    let mut base = false;
    let mut derived = 0;
    for (step, op) in ops.into_iter().enumerate() {
        match op {
            Op::Batch(writes) => {
                let batch: Vec<Record> = writes
                    .iter()
                    .map(|&(k, v)| match v {
                        Some(v) => Record::put(key(k), value(k, v)),
                        None => Record::delete(key(k)),
                    })
                    .collect();
                for r in &batch {
                    match &r.value {
                        Some(v) => model.insert(r.key.clone(), v.clone()),
                        None => model.remove(&r.key),
                    };
                }
                let offsets = log.append(&batch).unwrap();
                store.apply(&batch, *offsets.last().unwrap()).unwrap();
            }
            Op::Flush => store.flush().unwrap(),
            Op::CompactLive => store.db().compact_range::<&[u8], &[u8]>(None, None),
            // A store that applied nothing has nothing to snapshot.
            Op::Snapshot(_) if store.applied_offset().unwrap().is_none() => {}
            Op::Snapshot(compact) => {
                let format = if compact { &compacting } else { &plain };
                let m = snapshot(format, &store, &repo, &sk, &log, parent.as_ref()).await;
                let want = digest_of(&model);
                assert_eq!(
                    m.logical_digest,
                    Some(want),
                    "step {step}: snapshot digest ({}) differs from its contents'",
                    how(&m)
                );
                assert!(m.stats.counts_exact, "step {step}");
                assert_eq!(m.stats.keys, model.len() as u64, "step {step}: keys");
                let bytes: u64 = model.iter().map(|(k, v)| (k.len() + v.len()) as u64).sum();
                assert_eq!(m.stats.logical_bytes, bytes, "step {step}: logical bytes");
                let expected = if base { "derived" } else { "scanned" };
                assert_eq!(how(&m), expected, "step {step}");
                derived += usize::from(base);
                base = true;
                parent = Some(m);
            }
            Op::Reopen => {
                drop(store);
                store = RocksStore::open(&path, &opts()).unwrap();
                base = false;
            }
            Op::Restore => {
                let Some(m) = &parent else { continue };
                // The snapshot, not the changes since: the model goes back.
                model = Kv::new();
                let target = dir.join(format!("store-{}", step + 1));
                let (restored, _) = restore_snapshot(&plain, m, &repo, &target).await.unwrap();
                drop(store);
                store = restored;
                path = target;
                for (k, v) in store.iter().unwrap().map(Result::unwrap) {
                    model.insert(k, v);
                }
                assert_eq!(digest_of(&model), m.logical_digest.unwrap());
                base = false;
            }
            Op::BulkLoad(mut keys) => {
                keys.sort_unstable();
                keys.dedup();
                let batch: Vec<Record> = keys
                    .iter()
                    .map(|&k| Record::put(key(k), value(k, k.wrapping_mul(7))))
                    .collect();
                let offsets = log.append(&batch).unwrap();
                let mut loader = store.bulk_loader().unwrap();
                for (r, offset) in batch.iter().zip(offsets) {
                    let v = r.value.clone().unwrap();
                    loader.put(&r.key, &v, offset).unwrap();
                    model.insert(r.key.clone(), v);
                }
                loader.finish().unwrap();
                base = false;
            }
            Op::AroundApply(k, v) => {
                store.db().put(key(k), value(k, v)).unwrap();
                model.insert(key(k), value(k, v));
                base = false;
            }
        }
    }
    // A last one, so every history ends on a checked snapshot.
    if store.applied_offset().unwrap().is_none() {
        return derived;
    }
    let m = snapshot(&plain, &store, &repo, &sk, &log, parent.as_ref()).await;
    assert_eq!(
        m.logical_digest,
        Some(digest_of(&model)),
        "final snapshot ({})",
        how(&m)
    );
    derived + usize::from(base)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn every_derived_digest_equals_a_scan_of_the_same_contents(
        ops in proptest::collection::vec(op(), 1..40),
    ) {
        let dir = tempfile::tempdir().unwrap();
        rt().block_on(run(dir.path(), ops));
    }
}

/// The plain case, spelled out: snapshots with writes between them are
/// derived, and the derivation examines only the keys written.
#[test]
fn consecutive_snapshots_are_derived_and_read_only_the_written_keys() {
    let dir = tempfile::tempdir().unwrap();
    let mut ops = vec![
        Op::Batch((0..48).map(|k| (k, Some(k))).collect()),
        Op::Snapshot(false),
    ];
    for round in 0..4u8 {
        ops.push(Op::Batch(vec![(round, Some(200)), (round + 10, None)]));
        ops.push(Op::Flush);
        ops.push(Op::Snapshot(round % 2 == 1));
    }
    let derived = rt().block_on(run(dir.path(), ops));
    assert_eq!(derived, 5, "four snapshots after the first, and the last");
}
