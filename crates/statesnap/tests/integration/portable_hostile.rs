//! Defect 6: the portable restore collected every compressed blob of every
//! layer before decoding, and decoded the first chunk of every layer at
//! once, so a hostile manifest (many layers sharing one highly compressible
//! chunk) could take gigabytes. Now the restore streams with bounded memory
//! and such a manifest fails `corrupt`.
#![allow(clippy::unwrap_used)]

use bytes::Bytes;
use object_store::memory::InMemory;
use std::sync::Arc;

use statesnap::ErrorKind;
use statesnap::changelog::Lineage;
use statesnap::format::portable::chunk::ChunkBuilder;
use statesnap::format::portable::{MAX_LAYERS, PortableFormat, chunk_path};
use statesnap::format::{RestoreContext, StoreFormat};
use statesnap::repo::{
    ChangelogPosition, Manifest, ManifestDraft, Repository, SnapshotWriter, StoreKey,
};

fn sk() -> StoreKey {
    StoreKey::new("app", "hostile", 0).unwrap()
}

/// One chunk of `records` puts with `value_len`-byte zero values: tiny
/// compressed, large decoded.
fn compressible_chunk(records: usize, value_len: usize) -> Bytes {
    let mut b = ChunkBuilder::new();
    for i in 0..records {
        b.push(
            &Bytes::from(format!("k{i:08}")),
            Some(&vec![0u8; value_len]),
        )
        .unwrap();
    }
    b.seal().unwrap()
}

/// Commits a portable manifest of `layers` layers, every layer one chunk
/// with the same bytes.
async fn hostile(repo: &Repository, layers: usize, chunk: Bytes, records: u64) -> Manifest {
    let mut w = SnapshotWriter::new(repo, sk());
    let mut metas = Vec::new();
    for l in 0..layers {
        w.put_bytes(&chunk_path(l, 0), chunk.clone()).await.unwrap();
        metas.push(serde_json::json!({
            "kind": if l == 0 { "full" } else { "delta" },
            "offset": 10,
            "records": records,
            "logical_bytes": 1,
            "chunks": 1,
        }));
    }
    let draft = ManifestDraft {
        store_key: sk(),
        changelog: ChangelogPosition {
            topic: "app-hostile-changelog".into(),
            partition: 0,
            offset: 10,
            lineage: Lineage("l".into()),
            epoch: None,
        },
        store_format: PortableFormat::memory().id(),
        parent: None,
        depends_on: vec![],
        files: vec![],
        stats: Default::default(),
        format_metadata: serde_json::json!({ "chunk_version": 1, "layers": metas }),
        required_features: vec![],
    };
    w.commit(draft).await.unwrap()
}

async fn restore(
    fmt: &PortableFormat<statesnap::store::MemoryStore>,
    repo: &Repository,
    m: &Manifest,
) -> statesnap::Result<()> {
    let dir = tempfile::tempdir().unwrap();
    fmt.restore(
        m,
        RestoreContext {
            repo,
            target: &dir.path().join("s"),
        },
    )
    .await
    .map(|_| ())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn too_many_layers_is_corrupt() {
    let repo = Repository::from_store(Arc::new(InMemory::new()), "").unwrap();
    let m = hostile(&repo, MAX_LAYERS + 1, compressible_chunk(4, 16), 4).await;
    let err = restore(&PortableFormat::memory(), &repo, &m)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Corrupt, "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn layers_decoding_past_the_budget_are_corrupt() {
    let repo = Repository::from_store(Arc::new(InMemory::new()), "").unwrap();
    // ~4 MiB decoded per chunk, a few KiB compressed.
    let chunk = compressible_chunk(64, 64 << 10);
    assert!(chunk.len() < 64 << 10, "compressed {} bytes", chunk.len());
    let m = hostile(&repo, MAX_LAYERS, chunk, 64).await;
    let fmt = PortableFormat::memory().with_restore_memory_budget(16 << 20);
    let err = restore(&fmt, &repo, &m).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Corrupt, "{err}");
    // Within the budget, the same layers restore (later layers win).
    let small = hostile(&repo, 3, compressible_chunk(64, 64 << 10), 64).await;
    restore(&fmt, &repo, &small).await.unwrap();
}

/// Peak-memory measurement of a 1 M-key portable restore (run by hand, for
/// the figures in docs/performance.md): `STATESNAP_RSS_DIR=/tmp/x cargo test
/// --release --all-features --test integration -- --ignored portable_hostile::
/// rss_write_1m`, then the same with `rss_restore_1m` under
/// `/usr/bin/time -v` (its peak RSS is the restore's alone).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "measurement, run by hand"]
async fn rss_write_1m() {
    use statesnap::changelog::file::{FileChangelog, FileChangelogOptions, FsyncPolicy};
    use statesnap::commit_snapshot;
    use statesnap::store::LoggedStore;
    let dir = std::path::PathBuf::from(std::env::var("STATESNAP_RSS_DIR").unwrap());
    let log = FileChangelog::open(
        dir.join("log"),
        StoreKey::new("app", "hostile", 0).unwrap().changelog_id(),
        FileChangelogOptions {
            fsync: FsyncPolicy::Never,
            ..FileChangelogOptions::default()
        },
    )
    .unwrap();
    let mut s = LoggedStore::new(statesnap::store::MemoryStore::new(), log).unwrap();
    for i in 0..1_000_000u32 {
        s.put(format!("user:{i:010}"), vec![(i % 251) as u8; 100]);
        if i % 10_000 == 9_999 {
            s.commit().unwrap();
        }
    }
    let repo = Repository::init(
        &format!("file://{}", dir.join("repo").display()),
        Default::default(),
    )
    .await
    .unwrap();
    let f = PortableFormat::memory();
    let cut = f.capture(s.store()).unwrap();
    commit_snapshot(&f, cut, &repo, &sk(), s.changelog(), None)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "measurement, run by hand"]
async fn rss_restore_1m() {
    let dir = std::path::PathBuf::from(std::env::var("STATESNAP_RSS_DIR").unwrap());
    let repo = Repository::open(
        &format!("file://{}", dir.join("repo").display()),
        Default::default(),
    )
    .await
    .unwrap();
    let m = repo
        .catalog()
        .latest(&sk())
        .await
        .unwrap()
        .unwrap()
        .manifest;
    let f = PortableFormat::new(|p: &std::path::Path| {
        statesnap::store::RocksStore::open(p, &statesnap::store::RocksOptions::default())
    });
    let t = std::time::Instant::now();
    let (s, _) = f
        .restore(
            &m,
            RestoreContext {
                repo: &repo,
                target: &dir.join(format!("restored-{}", std::process::id())),
            },
        )
        .await
        .unwrap();
    eprintln!(
        "restored {} keys into RocksDB in {:?}",
        statesnap::store::StateStore::approximate_size(&s)
            .unwrap()
            .keys,
        t.elapsed()
    );
}
