//! Cross-store restore through the portable format: a snapshot written from
//! one store type restores into another, then replays the changelog tail.
//! Without RocksDB this uses a small custom store that snapshots through
//! `PortableCut::materialize`; with feature `rocksdb`, RocksStore ↔
//! MemoryStore both ways and a RocksStore model test.
#![allow(clippy::unwrap_used)]

mod common;

use bytes::Bytes;
use object_store::memory::InMemory;
use std::collections::BTreeMap;
use std::ops::Bound;
use std::path::Path;
use std::sync::Arc;

use statesnap::Result;
use statesnap::changelog::file::{FileChangelog, FileChangelogOptions};
use statesnap::changelog::{ChangelogBinding, ChangelogId, Record};
use statesnap::format::StoreFormat;
use statesnap::format::portable::{PortableCut, PortableFormat, PortableSource};
use statesnap::repo::{Repository, StoreKey};
use statesnap::restore::{RestoreOptions, restore_store};
use statesnap::snapshot::commit_snapshot;
use statesnap::store::logged::LoggedStore;
use statesnap::store::memory::MemoryStore;
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
        // A toy store: filter a full scan (a real one would seek).
        let hits: Vec<_> = self
            .map
            .iter()
            .filter(|(k, _)| in_bounds(k, start, end))
            .map(|(k, v)| Ok((k.clone(), v.clone())))
            .collect();
        Ok(Box::new(hits.into_iter()))
    }
    fn apply(&mut self, batch: &[Record], applied_offset: u64) -> Result<()> {
        for r in batch {
            match &r.value {
                Some(v) => self.map.insert(r.key.clone(), v.clone()),
                None => self.map.remove(&r.key),
            };
        }
        self.applied = Some(applied_offset);
        Ok(())
    }
    fn applied_offset(&self) -> Result<Option<u64>> {
        Ok(self.applied)
    }
    fn approximate_size(&self) -> Result<SizeEstimate> {
        Ok(SizeEstimate {
            keys: self.map.len() as u64,
            bytes: self
                .map
                .iter()
                .map(|(k, v)| (k.len() + v.len()) as u64)
                .sum(),
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

/// Writes through a `LoggedStore<A>`, snapshots it with `fa`, writes a
/// tail, then restores with `fb` (store type B) and checks B == A.
async fn cross<A, B>(store_a: A, fa: &PortableFormat<A>, fb: &PortableFormat<B>, dir: &Path)
where
    A: PortableSource + 'static,
    B: PortableSource + 'static,
{
    let id = ChangelogId::for_store("x", "s", 0).unwrap();
    let log =
        FileChangelog::open(dir.join("log"), id.clone(), FileChangelogOptions::default()).unwrap();
    let mut ls = LoggedStore::new(store_a, log).unwrap();
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
    let repo = Repository::from_store(Arc::new(InMemory::new()), "").unwrap();
    let sk = StoreKey::new("x", "s", 0).unwrap();
    let m = commit_snapshot(
        fa,
        fa.capture(ls.store()).unwrap(),
        &repo,
        &sk,
        ls.changelog(),
        None,
    )
    .await
    .unwrap();
    // The tail: replayed after the snapshot.
    ls.put("k00001", "tail");
    ls.delete("k00010");
    ls.put("zzz", "new");
    ls.commit().unwrap();
    let (b, report) = restore_store(
        fb,
        &repo,
        &sk,
        ls.changelog(),
        &dir.join("restored"),
        &RestoreOptions::default(),
    )
    .await
    .unwrap();
    assert_eq!(report.snapshot, Some(m.snapshot_id));
    assert_eq!(report.replay.records, 3);
    assert_eq!(contents(&b), contents(ls.store()));
    assert_eq!(
        b.applied_offset().unwrap(),
        ls.store().applied_offset().unwrap()
    );
}

fn tree_format() -> PortableFormat<TreeStore> {
    PortableFormat::new(|_: &Path| Ok(TreeStore::default()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn custom_store_snapshot_restores_into_memory_store() {
    let dir = tempfile::tempdir().unwrap();
    cross(
        TreeStore::default(),
        &tree_format(),
        &PortableFormat::memory(),
        dir.path(),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_store_snapshot_restores_into_custom_store() {
    let dir = tempfile::tempdir().unwrap();
    cross(
        MemoryStore::new(),
        &PortableFormat::memory(),
        &tree_format(),
        dir.path(),
    )
    .await;
}

#[cfg(feature = "rocksdb")]
mod rocks {
    use super::*;
    use proptest::prelude::*;
    use statesnap::store::rocks::RocksStore;

    fn rocks_format() -> PortableFormat<RocksStore> {
        PortableFormat::new(|p: &Path| RocksStore::open(p, &Default::default()))
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn rocks_snapshot_restores_into_memory_store() {
        let dir = tempfile::tempdir().unwrap();
        let rocks = RocksStore::open(dir.path().join("src"), &Default::default()).unwrap();
        cross(
            rocks,
            &rocks_format(),
            &PortableFormat::memory(),
            dir.path(),
        )
        .await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn memory_snapshot_restores_into_rocks_store() {
        let dir = tempfile::tempdir().unwrap();
        cross(
            MemoryStore::new(),
            &PortableFormat::memory(),
            &rocks_format(),
            dir.path(),
        )
        .await;
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
            let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
            rt.block_on(async {
                let dir = tempfile::tempdir().unwrap();
                let id = ChangelogId::for_store("m", "s", 0).unwrap();
                let log = FileChangelog::open(dir.path().join("log"), id.clone(), FileChangelogOptions::default()).unwrap();
                let rocks = RocksStore::open(dir.path().join("src"), &Default::default()).unwrap();
                let mut ls = LoggedStore::new(rocks, log).unwrap();
                let mut model = BTreeMap::new();
                let mut write = |ls: &mut LoggedStore<RocksStore, FileChangelog>, ops: &[(u8, Option<u16>)]| {
                    for (k, v) in ops {
                        let k = Bytes::from(format!("key-{k:03}"));
                        match v {
                            Some(v) => { let v = Bytes::from(v.to_le_bytes().to_vec()); ls.put(k.clone(), v.clone()); model.insert(k, v); }
                            None => { ls.delete(k.clone()); model.remove(&k); }
                        }
                    }
                    ls.commit().unwrap();
                };
                write(&mut ls, &before);
                let repo = Repository::from_store(Arc::new(InMemory::new()), "").unwrap();
                let sk = StoreKey::new("m", "s", 0).unwrap();
                let f = rocks_format();
                commit_snapshot(&f, f.capture(ls.store()).unwrap(), &repo, &sk, ls.changelog(), None).await.unwrap();
                write(&mut ls, &after);
                let (restored, _) = restore_store(&f, &repo, &sk, ls.changelog(), &dir.path().join("dst"), &RestoreOptions::default()).await.unwrap();
                assert_eq!(contents(&restored), model);
            });
        }
    }
}
