//! Cross-store restore through the portable format: a snapshot written from
//! one store type restores into another, then replays the changelog tail.
//! Without RocksDB this uses a small custom store that snapshots through
//! `PortableCut::materialize`; with feature `rocksdb`, RocksStore ↔
//! MemoryStore both ways and a RocksStore model test.
#![allow(clippy::unwrap_used)]

use crate::common;

use bytes::Bytes;
use std::collections::BTreeMap;
use std::ops::Bound;
use std::path::Path;

use statesnap::Result;
use statesnap::changelog::file::FileChangelog;
use statesnap::changelog::{ChangelogBinding, Record};
use statesnap::format::portable::{PortableCut, PortableFormat, PortableSource};
use statesnap::repo::StoreKey;
use statesnap::store::LoggedStore;
use statesnap::store::MemoryStore;
use statesnap::store::{KvIter, SizeEstimate, StateStore, in_bounds};

/// A custom store: a `BTreeMap` and an offset. It writes no format of its
/// own — one line of `PortableSource` gives it snapshots.
#[derive(Debug, Default)]
struct TreeStore {
    map: BTreeMap<Bytes, Bytes>,
    applied: Option<u64>,
    binding: Option<ChangelogBinding>,
}

impl StateStore for TreeStore {
    fn get(&self, key: &[u8]) -> Result<Option<Bytes>> {
        Ok(self.map.get(key).cloned())
    }
    fn range<'a>(&'a self, start: Bound<&[u8]>, end: Bound<&[u8]>) -> Result<KvIter<'a>> {
        // A toy store: filter a full scan (a real one would seek), lazily,
        // with bounds of its own.
        let (start, end) = (
            start.map(Bytes::copy_from_slice),
            end.map(Bytes::copy_from_slice),
        );
        let hits = self.map.iter().filter(move |(k, _)| {
            in_bounds(
                k,
                start.as_ref().map(|s| &s[..]),
                end.as_ref().map(|e| &e[..]),
            )
        });
        Ok(Box::new(hits.map(|(k, v)| Ok((k.clone(), v.clone())))))
    }
    fn apply(&mut self, batch: &[Record], applied_offset: u64) -> Result<()> {
        let writes = batch.iter().map(|r| (r.key.clone(), r.value.clone()));
        common::apply_to(&mut self.map, writes);
        self.applied = Some(applied_offset);
        Ok(())
    }
    fn applied_offset(&self) -> Result<Option<u64>> {
        Ok(self.applied)
    }
    fn approximate_size(&self) -> Result<SizeEstimate> {
        let bytes = self.map.iter().map(|(k, v)| (k.len() + v.len()) as u64);
        Ok(SizeEstimate {
            keys: self.map.len() as u64,
            bytes: bytes.sum(),
        })
    }
    fn binding(&self) -> Result<Option<ChangelogBinding>> {
        Ok(self.binding.clone())
    }
    fn bind(&mut self, binding: &ChangelogBinding) -> Result<()> {
        if statesnap::store::check_rebind(self.binding.as_ref(), binding)? {
            self.binding = Some(binding.clone());
        }
        Ok(())
    }
}

impl PortableSource for TreeStore {
    fn portable_cut(&self) -> Result<PortableCut> {
        PortableCut::materialize(self)
    }
}

use common::contents;

/// Writes through a `LoggedStore<A>` (store A from `make_a`, given the test's
/// directory), snapshots it with `fa`, writes a tail, then restores with `fb`
/// (store type B) into `restored` and checks B == A. Returns the directory.
async fn cross<A, B>(
    make_a: impl FnOnce(&Path) -> A,
    fa: &PortableFormat<A>,
    fb: &PortableFormat<B>,
) -> tempfile::TempDir
where
    A: PortableSource + 'static,
    B: PortableSource + 'static,
{
    let dir = tempfile::tempdir().unwrap();
    let log = common::file_log(&dir.path().join("log"), "x", "s");
    let mut ls = LoggedStore::new(make_a(dir.path()), log).unwrap();
    for i in 0..3000u32 {
        ls.put(format!("k{i:05}"), format!("v{i}"));
        if i % 7 == 0 {
            ls.delete(format!("k{:05}", i / 2));
        }
        if i % 500 == 499 {
            ls.commit().unwrap();
        }
    }
    ls.commit().unwrap();
    let (repo, _) = common::memory_repo();
    let sk = StoreKey::new("x", "s", 0).unwrap();
    let m = common::snapshot(fa, ls.store(), &repo, &sk, ls.changelog(), None).await;
    // The tail: replayed after the snapshot.
    ls.put("k00001", "tail");
    ls.delete("k00010");
    ls.put("zzz", "new");
    ls.commit().unwrap();
    let target = dir.path().join("restored");
    let (b, report) = common::restore_latest(fb, &repo, &sk, ls.changelog(), &target)
        .await
        .unwrap();
    assert_eq!(report.snapshot, Some(m.snapshot_id));
    assert_eq!(report.replay.records, 3);
    assert_eq!(contents(&b), contents(ls.store()));
    assert_eq!(
        b.applied_offset().unwrap(),
        ls.store().applied_offset().unwrap()
    );
    dir
}

fn tree_format() -> PortableFormat<TreeStore> {
    PortableFormat::new(|_: &Path| Ok(TreeStore::default()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn custom_store_snapshot_restores_into_memory_store() {
    let memory = PortableFormat::memory();
    cross(|_| TreeStore::default(), &tree_format(), &memory).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_store_snapshot_restores_into_custom_store() {
    let memory = PortableFormat::memory();
    cross(|_| MemoryStore::new(), &memory, &tree_format()).await;
}

#[cfg(feature = "rocksdb")]
mod rocks {
    use super::*;
    use proptest::prelude::*;
    use statesnap::store::RocksStore;

    fn rocks_format() -> PortableFormat<RocksStore> {
        PortableFormat::new(|p: &Path| RocksStore::open(p, &Default::default()))
    }

    fn rocks_at(dir: &Path) -> RocksStore {
        RocksStore::open(dir.join("src"), &Default::default()).unwrap()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn rocks_snapshot_restores_into_memory_store() {
        cross(rocks_at, &rocks_format(), &PortableFormat::memory()).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn memory_snapshot_restores_into_rocks_store() {
        let memory = PortableFormat::memory();
        let dir = cross(|_| MemoryStore::new(), &memory, &rocks_format()).await;
        // The restored RocksStore is a real, reopenable database at its offset.
        let reopened = RocksStore::open(dir.path().join("restored"), &Default::default()).unwrap();
        assert!(reopened.applied_offset().unwrap().is_some());
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]

        /// RocksStore through the portable format: random writes, snapshot
        /// at a random point, more writes, restore + replay == model.
        #[test]
        fn rocks_through_portable_matches_model(
            before in proptest::collection::vec((0u8..50, proptest::option::of(any::<u16>())), 1..80),
            after in proptest::collection::vec((0u8..50, proptest::option::of(any::<u16>())), 0..40),
        ) {
            common::rt().block_on(async {
                let dir = tempfile::tempdir().unwrap();
                let log = common::file_log(&dir.path().join("log"), "m", "s");
                let mut ls = LoggedStore::new(rocks_at(dir.path()), log).unwrap();
                let mut model = common::Kv::new();
                let mut write = |ls: &mut LoggedStore<RocksStore, FileChangelog>, ops: &[(u8, Option<u16>)]| {
                    for &(k, v) in ops {
                        let v = v.map(|v| Bytes::from(v.to_le_bytes().to_vec()));
                        common::write_both(ls, &mut model, common::key(k), v);
                    }
                    ls.commit().unwrap();
                };
                write(&mut ls, &before);
                let (repo, _) = common::memory_repo();
                let sk = StoreKey::new("m", "s", 0).unwrap();
                let f = rocks_format();
                common::snapshot(&f, ls.store(), &repo, &sk, ls.changelog(), None).await;
                write(&mut ls, &after);
                let target = dir.path().join("dst");
                let (restored, _) = common::restore_latest(&f, &repo, &sk, ls.changelog(), &target).await.unwrap();
                assert_eq!(contents(&restored), model);
            });
        }
    }
}
