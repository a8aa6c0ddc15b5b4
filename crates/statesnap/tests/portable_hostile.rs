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
    fmt: &PortableFormat<statesnap::store::memory::MemoryStore>,
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
    assert!(err.message().contains("layer count out of range"), "{err}");
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
    assert!(
        err.message()
            .contains("more memory to restore than allowed"),
        "{err}"
    );
    // Within the budget, the same layers restore (later layers win).
    let small = hostile(&repo, 3, compressible_chunk(64, 64 << 10), 64).await;
    restore(&fmt, &repo, &small).await.unwrap();
}
