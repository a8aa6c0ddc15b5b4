//! Incremental portable snapshots: delta size on a large store, chunk
//! sharing between full snapshots (content-defined chunking), delta chains
//! restoring exactly, the consolidation policy, and retention + gc keeping
//! every snapshot a kept delta depends on.
#![allow(clippy::unwrap_used)]

use crate::common;

use bytes::Bytes;
use std::collections::BTreeSet;
use std::time::Duration;

use statesnap::changelog::file::FileChangelog;
use statesnap::changelog::{Changelog, ChangelogBinding, Record};
use statesnap::format::portable::chunk::{ChunkParams, decode_chunk};
use statesnap::format::portable::{DeltaPolicy, LayerKind, PortableFormat, PortableMetadata};
use statesnap::repo::{BlobRef, GcOptions, Manifest, Repository, RetentionPolicy, StoreKey};
use statesnap::store::MemoryStore;
use statesnap::store::{StateStore, ensure_follows};

use common::data::{user_key as key, user_value as value};

use common::Rng;

struct Env {
    repo: Repository,
    store_key: StoreKey,
    log: FileChangelog,
    _dir: tempfile::TempDir,
}

impl Env {
    fn new() -> Env {
        let dir = tempfile::tempdir().unwrap();
        Env {
            repo: common::memory_repo().0,
            store_key: StoreKey::new("app", "store", 0).unwrap(),
            log: common::file_log(dir.path(), "app", "store"),
            _dir: dir,
        }
    }

    /// Logs `batch` and applies it at its last offset (an empty batch: a
    /// marker record, so the offset still moves).
    fn apply(&mut self, store: &mut MemoryStore, batch: &[Record]) {
        ensure_follows(store, &ChangelogBinding::of(&self.log).unwrap()).unwrap();
        let marker = [Record::delete("\u{0}marker")];
        let logged: &[Record] = if batch.is_empty() { &marker } else { batch };
        let offsets = self.log.append(logged).unwrap();
        store.apply(batch, *offsets.last().unwrap()).unwrap();
    }

    async fn snapshot(
        &self,
        fmt: &PortableFormat<MemoryStore>,
        store: &MemoryStore,
        parent: Option<&Manifest>,
    ) -> Manifest {
        common::snapshot(fmt, store, &self.repo, &self.store_key, &self.log, parent).await
    }

    async fn restore(&self, m: &Manifest) -> MemoryStore {
        let dir = tempfile::tempdir().unwrap();
        let format = PortableFormat::memory();
        let restored = common::restore_snapshot(&format, m, &self.repo, dir.path()).await;
        restored.unwrap().0
    }
}

use common::contents;

/// A new environment and a store holding users `0..n` (generation 0),
/// written through the changelog 10 000 per batch.
fn filled(n: u64) -> (Env, MemoryStore) {
    let mut env = Env::new();
    let mut store = MemoryStore::new();
    let all: Vec<Record> = (0..n).map(|i| Record::put(key(i), value(i, 0))).collect();
    for batch in all.chunks(10_000) {
        env.apply(&mut store, batch);
    }
    (env, store)
}

/// The memory store's portable format with chunks of about `target_kib`
/// KiB (a quarter of that at least, four times at most).
fn chunked(target_kib: usize) -> PortableFormat<MemoryStore> {
    PortableFormat::memory()
        .with_chunking(ChunkParams {
            min: target_kib << 8,
            target: target_kib << 10,
            max: target_kib << 12,
        })
        .unwrap()
}

/// Keys of the chunks of `m` that no snapshot in `old` holds, decoded.
async fn unshared_chunk_keys(env: &Env, m: &Manifest, old: &Manifest) -> Vec<Vec<Bytes>> {
    let old_hashes: BTreeSet<_> = old.files.iter().map(|f| f.blake3).collect();
    let mut out = Vec::new();
    for f in m.files.iter().filter(|f| !old_hashes.contains(&f.blake3)) {
        let b = env
            .repo
            .blobs()
            .get_blob_bytes(&m.store_key, &BlobRef::from(f))
            .await
            .unwrap();
        out.push(
            decode_chunk(&b)
                .unwrap()
                .records
                .into_iter()
                .map(|r| r.key)
                .collect(),
        );
    }
    out
}

/// 1 M keys × 100-byte values (~115 MB logical). One percent of the keys
/// change at random: the delta uploads at most 5 % of the full snapshot's
/// bytes. Why 5 % holds: the delta holds exactly the 10 000 changed records
/// (1 % of the logical bytes), compressed at the same level as the full run;
/// the rest is per-chunk headers (32 bytes each), so ~1 % plus noise.
///
/// Then a full snapshot after rewriting one contiguous key range shares
/// every chunk outside that range with the previous full one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_percent_delta_and_range_change_share_chunks() {
    const N: u64 = 1_000_000;
    let (mut env, mut store) = filled(N);
    let fmt = PortableFormat::memory();

    let full = env.snapshot(&fmt, &store, None).await;
    let full_meta = PortableMetadata::of(&full).unwrap();
    assert_eq!(full_meta.layers.len(), 1);
    assert_eq!(full.stats.keys, N);
    assert!(
        full.files.len() > 50,
        "expected ~1 MiB chunks, got {} files",
        full.files.len()
    );

    // 1 % of keys at random.
    let mut rng = Rng(7);
    let changed: BTreeSet<u64> = (0..N / 100).map(|_| rng.next() % N).collect();
    let batch: Vec<Record> = changed
        .iter()
        .map(|&i| Record::put(key(i), value(i, 1)))
        .collect();
    env.apply(&mut store, &batch);
    let delta = env.snapshot(&fmt, &store, Some(&full)).await;
    let meta = PortableMetadata::of(&delta).unwrap();
    assert_eq!(meta.layers.len(), 2);
    assert_eq!(meta.layers[1].kind, LayerKind::Delta);
    assert_eq!(meta.layers[1].records, changed.len() as u64);
    assert_eq!(delta.depends_on, vec![full.snapshot_id]);
    let ratio = delta.stats.bytes_uploaded as f64 / full.stats.bytes_uploaded as f64;
    println!(
        "full uploaded {} B in {} chunks; 1% delta uploaded {} B ({:.2} %)",
        full.stats.bytes_uploaded,
        full.files.len(),
        delta.stats.bytes_uploaded,
        ratio * 100.0
    );
    assert!(
        ratio <= 0.05,
        "delta uploaded {:.2} % of full",
        ratio * 100.0
    );
    assert_eq!(delta.stats.bytes_reused, full.stats.bytes_uploaded);
    assert_eq!(contents(&env.restore(&delta).await), contents(&store));

    // A full snapshot after rewriting one contiguous range [lo, hi), with
    // values of the same length: every chunk holding no key of the range is
    // byte-identical to the previous full snapshot's.
    fmt.forget_last_cut();
    let full2 = env.snapshot(&fmt, &store, None).await;
    let (lo, hi) = (400_000u64, 402_000u64);
    let batch: Vec<Record> = (lo..hi).map(|i| Record::put(key(i), value(i, 2))).collect();
    env.apply(&mut store, &batch);
    fmt.forget_last_cut();
    let full3 = env.snapshot(&fmt, &store, None).await;
    let in_range = |k: &Bytes| *k >= key(lo) && *k < key(hi);
    let unshared = unshared_chunk_keys(&env, &full3, &full2).await;
    assert!(!unshared.is_empty());
    for keys in &unshared {
        assert!(
            keys.iter().any(in_range),
            "a chunk outside the changed range was not shared"
        );
    }
    // ~230 KB of the range spans at most a few 1 MiB chunks.
    assert!(unshared.len() <= 3, "unshared chunks: {}", unshared.len());
    assert!(
        full3.stats.bytes_reused > full3.stats.bytes_uploaded * 10,
        "reused={} uploaded={}",
        full3.stats.bytes_reused,
        full3.stats.bytes_uploaded
    );

    // Inserting new keys into the range shifts sizes, so the chunk right
    // after the range may be cut differently once; all chunks before the
    // range and all but (at most) one after it are still shared.
    let batch: Vec<Record> = (lo..hi)
        .map(|i| Record::put(Bytes::from(format!("user:{i:010}-extra")), value(i, 3)))
        .collect();
    env.apply(&mut store, &batch);
    fmt.forget_last_cut();
    let full4 = env.snapshot(&fmt, &store, None).await;
    let unshared = unshared_chunk_keys(&env, &full4, &full3).await;
    let outside = unshared
        .iter()
        .filter(|ks| !ks.iter().any(in_range))
        .count();
    assert!(
        outside <= 1,
        "chunks outside the range not shared: {outside}"
    );
    assert!(unshared.len() <= 5, "unshared chunks: {}", unshared.len());
}

/// A chain of deltas with puts, overwrites and deletes restores each link
/// exactly; the chain is consolidated by length and by size.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delta_chain_restores_and_consolidates() {
    let (mut env, mut store) = filled(20_000);
    let fmt = chunked(16).with_delta_policy(DeltaPolicy {
        enabled: true,
        max_chain_len: 3,
        max_delta_percent: 50,
    });
    let mut rng = Rng(11);
    let mut parent: Option<Manifest> = None;
    let mut kinds = Vec::new();
    for round in 0..9u64 {
        let mut batch = Vec::new();
        for _ in 0..300 {
            let i = rng.next() % 25_000;
            if rng.next().is_multiple_of(3) {
                batch.push(Record::delete(key(i)));
            } else {
                batch.push(Record::put(key(i), value(i, round + 10)));
            }
        }
        // Deleting a key that does not exist is still a valid tombstone.
        batch.push(Record::delete(key(999_999)));
        env.apply(&mut store, &batch);
        let m = env.snapshot(&fmt, &store, parent.as_ref()).await;
        let meta = PortableMetadata::of(&m).unwrap();
        kinds.push(meta.layers.len());
        assert_eq!(m.depends_on.len(), meta.layers.len() - 1);
        assert_eq!(
            contents(&env.restore(&m).await),
            contents(&store),
            "round {round}"
        );
        parent = Some(m);
    }
    // First snapshot full, then deltas up to the chain bound, then full again.
    assert_eq!(kinds, vec![1, 2, 3, 4, 1, 2, 3, 4, 1]);

    // Size bound: a delta larger than 50 % of the base forces a full snapshot.
    let batch: Vec<Record> = (0..15_000u64)
        .map(|i| Record::put(key(i), value(i, 99)))
        .collect();
    env.apply(&mut store, &batch);
    let m = env.snapshot(&fmt, &store, parent.as_ref()).await;
    assert_eq!(PortableMetadata::of(&m).unwrap().layers.len(), 1);
    assert!(m.depends_on.is_empty());
}

/// Retention with `keep_last = 1` keeps the newest delta *and* its base and
/// earlier deltas; gc then deletes only what no kept snapshot needs, and the
/// kept delta still restores.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gc_keeps_every_snapshot_a_kept_delta_needs() {
    let (mut env, mut store) = filled(5_000);
    let fmt = chunked(8);
    let change = |env: &mut Env, store: &mut MemoryStore, g: u64| {
        let b: Vec<Record> = (g * 10..g * 10 + 50)
            .map(|i| Record::put(key(i), value(i, g)))
            .collect();
        env.apply(store, &b);
    };
    // f1 <- d1 ; f2 (full) <- d2 <- d3
    let f1 = env.snapshot(&fmt, &store, None).await;
    change(&mut env, &mut store, 1);
    let d1 = env.snapshot(&fmt, &store, Some(&f1)).await;
    change(&mut env, &mut store, 2);
    fmt.forget_last_cut();
    let f2 = env.snapshot(&fmt, &store, Some(&d1)).await;
    change(&mut env, &mut store, 3);
    let d2 = env.snapshot(&fmt, &store, Some(&f2)).await;
    change(&mut env, &mut store, 4);
    let d3 = env.snapshot(&fmt, &store, Some(&d2)).await;
    assert_eq!(d1.depends_on, vec![f1.snapshot_id]);
    assert!(f2.depends_on.is_empty());
    assert_eq!(d3.depends_on, vec![f2.snapshot_id, d2.snapshot_id]);
    let want = contents(&store);

    let opts = GcOptions {
        grace: Duration::from_millis(50),
        retention: Some(RetentionPolicy {
            keep_last: Some(1),
            keep_newer_than: None,
        }),
        dry_run: false,
    };
    // Blobs must be older than the grace period to be condemned, and a
    // condemnation must be one grace period old to be swept.
    tokio::time::sleep(Duration::from_millis(120)).await;
    // A short commit budget only on the gc handle, so the grace can be short.
    let gc_repo = env
        .repo
        .clone()
        .with_max_commit_duration(Duration::from_millis(20));
    let r1 = gc_repo
        .maintenance()
        .gc_store(&env.store_key, &opts)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(120)).await;
    let r2 = gc_repo
        .maintenance()
        .gc_store(&env.store_key, &opts)
        .await
        .unwrap();

    let mut dropped: Vec<_> = r1.manifests_deleted.iter().map(|(id, _)| *id).collect();
    dropped.sort();
    let mut want_dropped = vec![f1.snapshot_id, d1.snapshot_id];
    want_dropped.sort();
    assert_eq!(dropped, want_dropped, "only the old chain is dropped");
    assert!(r2.bytes_deleted > 0, "the old chain's own blobs are swept");
    let listing = env
        .repo
        .catalog()
        .list_snapshots(&env.store_key)
        .await
        .unwrap();
    let kept: BTreeSet<_> = listing.snapshots.iter().map(|s| s.id()).collect();
    assert_eq!(
        kept,
        [f2.snapshot_id, d2.snapshot_id, d3.snapshot_id]
            .into_iter()
            .collect()
    );
    assert_eq!(contents(&env.restore(&d3).await), want);
    assert_eq!(
        contents(&env.restore(&d2).await).len(),
        contents(&env.restore(&f2).await).len()
    );
}
