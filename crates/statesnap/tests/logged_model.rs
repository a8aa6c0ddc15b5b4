//! Model test: random put/delete/commit/drop-without-commit/reopen sequences
//! over `LoggedStore` on each store type, with the file changelog, checked
//! against a `BTreeMap` of committed writes after every reopen + replay.
#![allow(clippy::unwrap_used)]

use bytes::Bytes;
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::ops::Bound;
use std::path::Path;

use statesnap::changelog::ChangelogId;
use statesnap::changelog::file::{FileChangelog, FileChangelogOptions};
use statesnap::restore::ReplayOptions;
use statesnap::store::logged::LoggedStore;
use statesnap::store::memory::MemoryStore;
use statesnap::store::{StateStore, StateStoreExt};

#[derive(Debug, Clone)]
enum Op {
    Put(u8, u16),
    Delete(u8),
    Commit,
    /// Drop the store with uncommitted writes, reopen both, replay.
    DropWithoutCommit,
    /// Commit, drop, reopen, replay.
    Reopen,
    /// Lose the store entirely (a new machine), keep the changelog.
    LoseStore,
    RangeCheck(u8, u8),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        10 => (0u8..40, any::<u16>()).prop_map(|(k, v)| Op::Put(k, v)),
        4 => (0u8..40).prop_map(Op::Delete),
        4 => Just(Op::Commit),
        1 => Just(Op::DropWithoutCommit),
        1 => Just(Op::Reopen),
        1 => Just(Op::LoseStore),
        2 => (0u8..40, 0u8..40).prop_map(|(a, b)| Op::RangeCheck(a.min(b), a.max(b))),
    ]
}

fn key(k: u8) -> Bytes {
    Bytes::from(format!("key-{k:03}"))
}

fn small_segments() -> FileChangelogOptions {
    FileChangelogOptions { segment_bytes: 2048, ..FileChangelogOptions::default() }
}

fn id() -> ChangelogId {
    ChangelogId::for_store("model", "store", 0).unwrap()
}

trait Factory {
    type S: StateStore;
    fn open(&mut self, dir: &Path, lose: bool) -> Self::S;
}

struct Mem;
impl Factory for Mem {
    type S = MemoryStore;
    fn open(&mut self, _dir: &Path, _lose: bool) -> MemoryStore {
        // Memory does not survive a restart: every reopen starts empty.
        MemoryStore::new()
    }
}

#[cfg(feature = "rocksdb")]
struct Rocks;
#[cfg(feature = "rocksdb")]
impl Factory for Rocks {
    type S = statesnap::store::rocks::RocksStore;
    fn open(&mut self, dir: &Path, lose: bool) -> Self::S {
        let p = dir.join("rocks");
        if lose && p.exists() {
            std::fs::remove_dir_all(&p).unwrap();
        }
        statesnap::store::rocks::RocksStore::open(&p, &Default::default()).unwrap()
    }
}

fn contents<S: StateStore>(s: &S) -> BTreeMap<Bytes, Bytes> {
    s.iter().unwrap().map(|kv| kv.unwrap()).collect()
}

fn run<F: Factory>(mut f: F, ops: Vec<Op>) {
    let dir = tempfile::tempdir().unwrap();
    let log_dir = dir.path().join("log");
    let open = |f: &mut F, lose: bool| {
        let log = FileChangelog::open(&log_dir, id(), small_segments()).unwrap();
        let mut ls = LoggedStore::new(f.open(dir.path(), lose), log).unwrap();
        ls.catch_up(&ReplayOptions { batch_size: 7 }).unwrap();
        ls
    };
    let mut committed: BTreeMap<Bytes, Bytes> = BTreeMap::new();
    let mut pending: BTreeMap<Bytes, Option<Bytes>> = BTreeMap::new();
    let mut ls = open(&mut f, false);
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
            Op::Commit => {
                ls.commit().unwrap();
                for (k, v) in std::mem::take(&mut pending) {
                    match v {
                        Some(v) => committed.insert(k, v),
                        None => committed.remove(&k),
                    };
                }
            }
            Op::DropWithoutCommit | Op::LoseStore => {
                drop(ls);
                pending.clear();
                ls = open(&mut f, matches!(op, Op::LoseStore));
                assert_eq!(contents(ls.store()), committed, "after {op:?}");
            }
            Op::Reopen => {
                ls.commit().unwrap();
                for (k, v) in std::mem::take(&mut pending) {
                    match v {
                        Some(v) => committed.insert(k, v),
                        None => committed.remove(&k),
                    };
                }
                drop(ls);
                ls = open(&mut f, false);
                assert_eq!(contents(ls.store()), committed, "after reopen");
            }
            Op::RangeCheck(a, b) => {
                // Reads see pending writes over committed state.
                let mut view = committed.clone();
                for (k, v) in &pending {
                    match v {
                        Some(v) => view.insert(k.clone(), v.clone()),
                        None => view.remove(k),
                    };
                }
                let (lo, hi) = (key(a), key(b));
                let want: Vec<_> = view
                    .range::<Bytes, _>((Bound::Included(&lo), Bound::Included(&hi)))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                let got: Vec<_> = ls
                    .range(Bound::Included(&lo[..]), Bound::Included(&hi[..]))
                    .unwrap()
                    .map(|kv| kv.unwrap())
                    .collect();
                assert_eq!(got, want, "range {a}..={b}");
                assert_eq!(ls.get(&lo).unwrap(), view.get(&lo).cloned());
            }
        }
    }
    ls.commit().unwrap();
    for (k, v) in pending {
        match v {
            Some(v) => committed.insert(k, v),
            None => committed.remove(&k),
        };
    }
    drop(ls);
    let ls = open(&mut f, true);
    assert_eq!(contents(ls.store()), committed, "full replay from an empty store");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn memory_store_matches_model(ops in proptest::collection::vec(op(), 1..120)) {
        run(Mem, ops);
    }

    #[cfg(feature = "rocksdb")]
    #[test]
    fn rocks_store_matches_model(ops in proptest::collection::vec(op(), 1..120)) {
        run(Rocks, ops);
    }
}
