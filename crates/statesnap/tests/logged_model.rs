//! Model test: random put/delete/commit/drop-without-commit/reopen sequences
//! over `LoggedStore` on each store type, with the file changelog, checked
//! against a `BTreeMap` of committed writes after every commit and every
//! reopen + replay. Appends can be made to fail after writing part of their
//! batch, as a Kafka producer or a cut-short file write can.
#![allow(clippy::unwrap_used)]

mod common;

use bytes::Bytes;
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::ops::Bound;
use std::path::Path;
use std::sync::{Arc, Mutex};

use statesnap::changelog::file::{FileChangelog, FileChangelogOptions};
use statesnap::changelog::{Changelog, ChangelogId, ChangelogReader, Horizon, Lineage, Record};
use statesnap::restore::ReplayOptions;
use statesnap::store::StateStore;
use statesnap::store::logged::LoggedStore;
use statesnap::store::memory::MemoryStore;

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
    /// A commit whose append writes only the first `n` records of the batch,
    /// then fails.
    FailedCommit(u8),
    /// Drop the pending writes.
    Discard,
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
        2 => (0u8..6).prop_map(Op::FailedCommit),
        1 => Just(Op::Discard),
    ]
}

use common::{apply_to, contents, key};

fn small_segments() -> FileChangelogOptions {
    FileChangelogOptions {
        segment_bytes: 2048,
        ..FileChangelogOptions::default()
    }
}

fn id() -> ChangelogId {
    ChangelogId::for_store("model", "store", 0).unwrap()
}

/// A file changelog whose next append can be made to write only part of its
/// batch and then fail.
struct Flaky {
    inner: FileChangelog,
    partial_next: Arc<Mutex<Option<usize>>>,
}

impl Changelog for Flaky {
    fn id(&self) -> &ChangelogId {
        self.inner.id()
    }
    fn append(&self, batch: &[Record]) -> statesnap::Result<Vec<u64>> {
        match self.partial_next.lock().unwrap().take() {
            None => self.inner.append(batch),
            Some(n) => {
                self.inner.append(&batch[..n.min(batch.len())])?;
                Err(statesnap::Error::new(
                    statesnap::ErrorKind::Transient,
                    "injected: the append failed after part of its batch",
                ))
            }
        }
    }
    fn read_from(&self, from: u64) -> statesnap::Result<Box<dyn ChangelogReader + '_>> {
        self.inner.read_from(from)
    }
    fn start_offset(&self) -> statesnap::Result<u64> {
        self.inner.start_offset()
    }
    fn end_offset(&self) -> statesnap::Result<u64> {
        self.inner.end_offset()
    }
    fn lineage(&self) -> statesnap::Result<Lineage> {
        self.inner.lineage()
    }
    fn horizon(&self) -> statesnap::Result<Horizon> {
        self.inner.horizon()
    }
    fn flush(&self) -> statesnap::Result<()> {
        self.inner.flush()
    }
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

fn run<F: Factory>(mut f: F, ops: Vec<Op>) {
    let dir = tempfile::tempdir().unwrap();
    let log_dir = dir.path().join("log");
    let partial_next = Arc::new(Mutex::new(None));
    let open = |f: &mut F, lose: bool| {
        let log = Flaky {
            inner: FileChangelog::open(&log_dir, id(), small_segments()).unwrap(),
            partial_next: partial_next.clone(),
        };
        let mut ls = LoggedStore::new(f.open(dir.path(), lose), log).unwrap();
        ls.catch_up(&ReplayOptions { batch_size: 7 }).unwrap();
        ls
    };
    let mut committed: BTreeMap<Bytes, Bytes> = BTreeMap::new();
    let mut pending: BTreeMap<Bytes, Option<Bytes>> = BTreeMap::new();
    // After a failed append, until the next commit, reads may or may not see
    // the records it wrote.
    let mut unsure = false;
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
                apply_to(&mut committed, std::mem::take(&mut pending));
                unsure = false;
                // The store holds exactly what the changelog says, now.
                assert_eq!(contents(ls.store()), committed, "after commit");
            }
            Op::FailedCommit(n) => {
                *partial_next.lock().unwrap() = Some(usize::from(n));
                let res = ls.commit();
                if pending.is_empty() {
                    // Nothing to append: the injected failure stays armed
                    // for no one.
                    *partial_next.lock().unwrap() = None;
                    assert!(res.unwrap().is_none());
                } else {
                    assert!(res.is_err(), "the injected failure was not seen");
                    // The records that reached the changelog are committed
                    // as far as the changelog (the truth) is concerned; the
                    // writes stay pending.
                    let written: Vec<_> = pending
                        .iter()
                        .take(usize::from(n))
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect();
                    apply_to(&mut committed, written);
                    unsure = true;
                }
            }
            Op::Discard => {
                ls.discard();
                pending.clear();
            }
            Op::DropWithoutCommit | Op::LoseStore => {
                drop(ls);
                pending.clear();
                ls = open(&mut f, matches!(op, Op::LoseStore));
                unsure = false;
                assert_eq!(contents(ls.store()), committed, "after {op:?}");
            }
            Op::Reopen => {
                ls.commit().unwrap();
                apply_to(&mut committed, std::mem::take(&mut pending));
                drop(ls);
                ls = open(&mut f, false);
                unsure = false;
                assert_eq!(contents(ls.store()), committed, "after reopen");
            }
            Op::RangeCheck(..) if unsure => {}
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
    apply_to(&mut committed, pending);
    assert_eq!(contents(ls.store()), committed, "after the last commit");
    drop(ls);
    let ls = open(&mut f, true);
    assert_eq!(
        contents(ls.store()),
        committed,
        "full replay from an empty store"
    );
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
