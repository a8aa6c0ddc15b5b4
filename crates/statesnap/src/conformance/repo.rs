//! The repository suite: run against every object-store backend (memory,
//! local directory, a real S3-protocol server).
//!
//! ```no_run
//! # async fn f() {
//! statesnap::conformance::repo::run_all("memory://conformance-doc", Default::default()).await;
//! # }
//! ```

use bytes::Bytes;
use object_store::path::Path;
use object_store::{ObjectStoreExt, PutPayload};
use std::sync::Arc;

use crate::ErrorKind;
use crate::changelog::Lineage;
use crate::clock::{Clock, ManualClock, SystemClock};
use crate::repo::manifest::{
    ChangelogPosition, FileEntry, Manifest, ManifestDraft, SnapshotStats, StoreFormatId,
};
use crate::repo::paths::{self, BlobHash, SnapshotId, StoreKey};
use crate::repo::{BlobRef, GcOptions, Repository, RepositoryOptions};

const HOUR_MS: i64 = 3_600_000;

/// A draft for store `sk` at `offset` naming `files`.
pub fn draft(sk: &StoreKey, offset: u64, files: Vec<FileEntry>) -> ManifestDraft {
    ManifestDraft {
        store_key: sk.clone(),
        changelog: ChangelogPosition {
            topic: format!("{}-{}-changelog", sk.application(), sk.store()),
            partition: sk.partition(),
            offset,
            lineage: Lineage("conformance".into()),
            epoch: None,
        },
        store_format: StoreFormatId {
            name: "conformance".into(),
            version: 1,
        },
        parent: None,
        depends_on: vec![],
        files,
        stats: SnapshotStats::default(),
        format_metadata: serde_json::json!({}),
        required_features: vec![],
    }
}

fn sk(store: &str, partition: u32) -> StoreKey {
    StoreKey::new("conf", store, partition).expect("valid store key")
}

async fn put_file(repo: &Repository, sk: &StoreKey, path: &str, bytes: &[u8]) -> FileEntry {
    let out = repo
        .blobs()
        .put_blob_bytes(sk, Bytes::copy_from_slice(bytes))
        .await
        .expect("put blob");
    FileEntry {
        path: path.into(),
        size: out.blob.size,
        blake3: out.blob.hash,
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    let mut x = u32::from(seed) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            (x >> 8) as u8
        })
        .collect()
}

/// Runs every check against the empty location `url`, in order. Each
/// check uses its own store keys, so one location serves them all.
pub async fn run_all(url: &str, opts: RepositoryOptions) {
    let clock = ManualClock::new(SystemClock.now_ms());
    let opts = RepositoryOptions {
        clock: Arc::new(clock.clone()),
        ..opts
    };
    let repo = init_and_open(url, opts).await;
    conditional_create(&repo).await;
    blob_round_trip_and_dedupe(&repo).await;
    large_blob_uses_multipart(&repo).await;
    corrupt_blob_is_detected(&repo).await;
    listing_is_per_store(&repo).await;
    deletes(&repo).await;
    catalog_sorts_adversarial_names(&repo).await;
    commit_with_missing_reused_blob_fails(&repo).await;
    gc_keeps_referenced_and_sweeps_old_unreferenced(&repo, &clock).await;
}

/// Marker: open before init fails clearly, init is a conditional create,
/// a newer format version is refused naming both versions.
pub async fn init_and_open(url: &str, opts: RepositoryOptions) -> Repository {
    let e = Repository::open(url, opts.clone())
        .await
        .expect_err("open before init");
    assert!(
        matches!(e.kind(), ErrorKind::NotFound | ErrorKind::Config),
        "{e}"
    );
    assert_eq!(e.reason(), Some(crate::Reason::NoRepository), "{e}");
    let repo = Repository::init(url, opts.clone()).await.expect("init");
    let e = Repository::init(url, opts.clone())
        .await
        .expect_err("second init");
    assert_eq!(e.kind(), ErrorKind::AlreadyExists, "{e}");
    let opened = Repository::open(url, opts.clone())
        .await
        .expect("open after init");
    let m = opened.read_marker().await.expect("marker");
    assert_eq!(m.format_version, 1);

    let sub = Repository::from_store(repo.object_store(), "conformance-v2").expect("sub repo");
    sub.object_store()
        .put(
            &paths::marker(),
            PutPayload::from(r#"{"format_version":2,"repository_id":"x","created_at":0}"#),
        )
        .await
        .expect("raw put");
    let e = sub.read_marker().await.expect_err("v2 marker");
    assert_eq!(e.kind(), ErrorKind::Config, "{e}");
    assert_eq!(e.reason(), Some(crate::Reason::UnsupportedVersion), "{e}");
    opened
}

/// A manifest is created at most once.
pub async fn conditional_create(repo: &Repository) {
    let sk = sk("create", 0);
    let f = put_file(repo, &sk, "a", b"hello").await;
    let m = Manifest::from_draft(draft(&sk, 5, vec![f]), SnapshotId::from_parts(1, 1), 1)
        .expect("manifest");
    repo.commit_manifest(&m).await.expect("first create");
    let e = repo.commit_manifest(&m).await.expect_err("second create");
    assert_eq!(e.kind(), ErrorKind::AlreadyExists, "{e}");
    let got = repo
        .catalog()
        .get_snapshot(&sk, m.snapshot_id)
        .await
        .expect("get");
    assert_eq!(got.manifest, m);
}

/// Small blobs round-trip, and a second put of the same bytes uploads
/// nothing.
pub async fn blob_round_trip_and_dedupe(repo: &Repository) {
    let sk = sk("blobs", 0);
    for len in [0usize, 1, 1000, 300_000] {
        let data = Bytes::from(pattern(len, len as u8));
        let first = repo
            .blobs()
            .put_blob_bytes(&sk, data.clone())
            .await
            .expect("put");
        assert!(first.uploaded, "len={len}");
        assert_eq!(
            first.blob,
            BlobRef {
                hash: BlobHash::of(&data),
                size: len as u64
            }
        );
        let again = repo
            .blobs()
            .put_blob_bytes(&sk, data.clone())
            .await
            .expect("put again");
        assert!(!again.uploaded, "dedupe len={len}");
        assert_eq!(
            repo.blobs()
                .get_blob_bytes(&sk, &first.blob)
                .await
                .expect("get"),
            data
        );
    }
    let missing = BlobRef {
        hash: BlobHash::of(b"never stored"),
        size: 12,
    };
    let e = repo
        .blobs()
        .get_blob_bytes(&sk, &missing)
        .await
        .expect_err("missing");
    assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
}

/// A blob above the multipart threshold (>= 20 MiB) goes through the
/// staging path, round-trips to a file, dedupes, and leaves no staging.
pub async fn large_blob_uses_multipart(repo: &Repository) {
    let sk = sk("large", 0);
    let data = pattern(21 << 20, 7);
    let hash = BlobHash::of(&data);
    let out = repo
        .blobs()
        .put_blob_reader(&sk, &data[..])
        .await
        .expect("put large");
    assert!(out.uploaded);
    assert_eq!(
        out.blob,
        BlobRef {
            hash,
            size: data.len() as u64
        }
    );
    let again = repo
        .blobs()
        .put_blob_reader(&sk, &data[..])
        .await
        .expect("put large again");
    assert!(!again.uploaded);
    let dir = tempfile::tempdir().expect("tempdir");
    let dest = dir.path().join("sub").join("big.sst");
    repo.blobs()
        .get_blob_to_file(&sk, &out.blob, &dest)
        .await
        .expect("get to file");
    let back = std::fs::read(&dest).expect("read back");
    assert_eq!(BlobHash::of(&back), hash);
    let staging: Vec<_> = futures::TryStreamExt::try_collect::<Vec<_>>(
        repo.object_store().list(Some(&paths::staging_prefix(&sk))),
    )
    .await
    .expect("list staging");
    assert!(staging.is_empty(), "staging left behind: {staging:?}");
}

/// A flipped byte, a truncation or extra bytes are a corrupt error for
/// the blob, whole or downloaded in ranges (16 KiB: seven ranges);
/// nothing is left at the destination. Intact, the ranged download
/// round-trips.
pub async fn corrupt_blob_is_detected(repo: &Repository) {
    let sk = sk("corrupt", 0);
    let data = pattern(100_000, 3);
    let out = repo
        .blobs()
        .put_blob_bytes(&sk, Bytes::from(data.clone()))
        .await
        .expect("put");
    let key = paths::blob(&sk, &out.blob.hash);
    let ranged = repo.clone().with_transfer(crate::repo::TransferOptions {
        parallelism: 4,
        download_part_size: 16 << 10,
        ..*repo.transfer()
    });
    let dir = tempfile::tempdir().expect("tempdir");
    let dest = dir.path().join("x.sst");
    ranged
        .blobs()
        .get_blob_to_file(&sk, &out.blob, &dest)
        .await
        .expect("ranged download");
    assert_eq!(std::fs::read(&dest).expect("read back"), data);
    std::fs::remove_file(&dest).expect("remove");
    let mut flipped = data.clone();
    flipped[50_000] ^= 0x01;
    let mut longer = data.clone();
    longer.extend_from_slice(b"trailing");
    for (damage, stored) in [
        ("flipped", flipped.clone()),
        ("truncated", data[..99_000].to_vec()),
        ("longer", longer),
    ] {
        repo.object_store()
            .put(&key, PutPayload::from(stored))
            .await
            .expect("raw overwrite");
        let e = repo
            .blobs()
            .get_blob_bytes(&sk, &out.blob)
            .await
            .expect_err(damage);
        assert_eq!(e.kind(), ErrorKind::Corrupt, "{damage}: {e}");
        let e = repo
            .blobs()
            .get_blob_to_file(&sk, &out.blob, &dest)
            .await
            .expect_err(damage);
        assert_eq!(e.kind(), ErrorKind::Corrupt, "{damage}, to a file: {e}");
        assert_eq!(
            std::fs::read_dir(dir.path()).expect("readdir").count(),
            0,
            "{damage}: partial file left"
        );
        let e = ranged
            .blobs()
            .get_blob_to_file(&sk, &out.blob, &dest)
            .await
            .expect_err(damage);
        assert_eq!(e.kind(), ErrorKind::Corrupt, "{damage}, in ranges: {e}");
        assert_eq!(
            std::fs::read_dir(dir.path()).expect("readdir").count(),
            0,
            "{damage}, in ranges: partial file left"
        );
    }
}

/// Listing is per store even when store keys are prefixes of each other.
pub async fn listing_is_per_store(repo: &Repository) {
    let keys = [
        sk("list", 1),
        sk("list", 10),
        sk("list", 100),
        sk("list2", 1),
        sk("lis", 1),
    ];
    for (i, k) in keys.iter().enumerate() {
        for j in 0..=i {
            let f = put_file(repo, k, "f", format!("{k}-{j}").as_bytes()).await;
            repo.commit(draft(k, j as u64, vec![f]))
                .await
                .expect("commit");
        }
    }
    for (i, k) in keys.iter().enumerate() {
        let l = repo.catalog().list_snapshots(k).await.expect("list");
        assert_eq!(l.snapshots.len(), i + 1, "{k}");
        assert!(l.unreadable.is_empty(), "{k}: {:?}", l.unreadable);
        assert!(l.snapshots.iter().all(|s| &s.manifest.store_key == k));
    }
    let stores = repo.catalog().list_stores().await.expect("stores");
    for k in &keys {
        assert!(stores.contains(k), "{k} missing from {stores:?}");
    }
}

/// Deleting a snapshot removes it; deleting again is not-found.
pub async fn deletes(repo: &Repository) {
    let sk = sk("delete", 0);
    let f = put_file(repo, &sk, "f", b"d").await;
    let a = repo
        .commit(draft(&sk, 1, vec![f.clone()]))
        .await
        .expect("a");
    let b = repo.commit(draft(&sk, 2, vec![f])).await.expect("b");
    repo.catalog()
        .delete_snapshot(&sk, b.snapshot_id)
        .await
        .expect("delete");
    let l = repo.catalog().list_snapshots(&sk).await.expect("list");
    assert_eq!(
        l.snapshots.iter().map(|s| s.id()).collect::<Vec<_>>(),
        vec![a.snapshot_id]
    );
    let e = repo
        .catalog()
        .delete_snapshot(&sk, b.snapshot_id)
        .await
        .expect_err("again");
    assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
    let e = repo
        .catalog()
        .get_snapshot(&sk, b.snapshot_id)
        .await
        .expect_err("get deleted");
    assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
}

/// Sorted by (offset, id) whatever the ids; unreadable manifests are
/// reported, not fatal, and never chosen.
pub async fn catalog_sorts_adversarial_names(repo: &Repository) {
    let sk = sk("sort", 0);
    let f = put_file(repo, &sk, "f", b"s").await;
    // ids deliberately ordered against offsets.
    let cases = [
        (10u64, 5u64),
        (2, 9),
        (u64::MAX, 1),
        (0, 7),
        (10, 2),
        (1_000_000_000_000, 3),
    ];
    for (off, idms) in cases {
        let m = Manifest::from_draft(
            draft(&sk, off, vec![f.clone()]),
            SnapshotId::from_parts(idms, 0),
            0,
        )
        .expect("manifest");
        repo.commit_manifest(&m).await.expect("commit");
    }
    let store = repo.object_store();
    store
        .put(
            &Path::from(format!("{}/garbage.txt", paths::manifests_prefix(&sk))),
            PutPayload::from("x"),
        )
        .await
        .expect("garbage");
    let bad = Manifest::from_draft(
        draft(&sk, u64::MAX - 1, vec![f.clone()]),
        SnapshotId::from_parts(9, 9),
        0,
    )
    .expect("bad");
    store
        .put(
            &bad.key(),
            PutPayload::from(b"{\"format_version\":1, \"trunc".to_vec()),
        )
        .await
        .expect("put");
    let l = repo.catalog().list_snapshots(&sk).await.expect("list");
    let got: Vec<(u64, u64)> = l
        .snapshots
        .iter()
        .map(|s| (s.offset(), s.id().0.timestamp_ms()))
        .collect();
    let mut want = cases.to_vec();
    want.sort();
    assert_eq!(got, want);
    assert_eq!(l.unreadable.len(), 2, "{:?}", l.unreadable);
    assert!(l.unreadable.iter().all(|u| u.kind == ErrorKind::Corrupt));
    let latest = newest(repo, &sk).await;
    assert_eq!(latest.offset(), u64::MAX);
    let at_or_before = |offset| {
        let sk = &sk;
        async move {
            repo.catalog()
                .at_or_before(sk, offset)
                .await
                .expect("at_or_before")
        }
    };
    assert_eq!(at_or_before(9).await.map(|s| s.offset()), Some(2));
    // Two snapshots at offset 10: the one with the greater id.
    let at_10 = at_or_before(10).await;
    assert_eq!(at_10.map(|s| s.id().0.timestamp_ms()), Some(5));
    assert_eq!(at_or_before(1).await.map(|s| s.offset()), Some(0));
    let empty = self::sk("sort-empty", 0);
    assert!(
        repo.catalog()
            .latest(&empty)
            .await
            .expect("latest")
            .is_none()
    );
}

/// A commit naming a blob that is gone fails (stale) and writes nothing.
pub async fn commit_with_missing_reused_blob_fails(repo: &Repository) {
    let sk = sk("reuse", 0);
    let f = put_file(repo, &sk, "kept", b"kept").await;
    let gone = put_file(repo, &sk, "gone", b"gone").await;
    repo.object_store()
        .delete(&paths::blob(&sk, &gone.blake3))
        .await
        .expect("raw delete");
    let e = repo
        .commit(draft(&sk, 1, vec![f, gone]))
        .await
        .expect_err("commit");
    assert_eq!(e.kind(), ErrorKind::Stale, "{e}");
    assert_eq!(e.reason(), Some(crate::Reason::GcRace), "{e}");
    assert!(
        repo.catalog()
            .list_snapshots(&sk)
            .await
            .expect("list")
            .snapshots
            .is_empty()
    );
}

/// Gc: dry run changes nothing; referenced blobs survive; old
/// unreferenced blobs are condemned, then swept a grace period later.
pub async fn gc_keeps_referenced_and_sweeps_old_unreferenced(
    repo: &Repository,
    clock: &ManualClock,
) {
    let sk = sk("gc", 0);
    let kept = put_file(repo, &sk, "kept", b"referenced").await;
    let orphan = put_file(repo, &sk, "orphan", b"unreferenced").await;
    repo.commit(draft(&sk, 1, vec![kept.clone()]))
        .await
        .expect("commit");
    let opts = GcOptions::default();
    // Young: nothing condemned.
    let r = repo
        .maintenance()
        .gc_store(&sk, &opts)
        .await
        .expect("gc young");
    assert!(
        r.blobs_condemned.is_empty() && r.blobs_deleted.is_empty(),
        "{r:?}"
    );
    clock.advance_ms(2 * HOUR_MS);
    let dry = GcOptions {
        dry_run: true,
        ..opts.clone()
    };
    let r = repo.maintenance().gc_store(&sk, &dry).await.expect("dry");
    assert_eq!(
        r.blobs_condemned
            .iter()
            .map(|b| b.blake3)
            .collect::<Vec<_>>(),
        vec![orphan.blake3]
    );
    let r = repo.maintenance().gc_store(&sk, &opts).await.expect("mark");
    assert_eq!(r.blobs_condemned.len(), 1, "{r:?}");
    assert!(r.blobs_deleted.is_empty());
    let exists = |f: &FileEntry| {
        let (sk, hash) = (&sk, f.blake3);
        async move {
            repo.blobs()
                .head_blob(sk, &hash)
                .await
                .expect("head")
                .is_some()
        }
    };
    assert!(exists(&orphan).await, "mark must not delete");
    clock.advance_ms(HOUR_MS + 1);
    let r = repo
        .maintenance()
        .gc_store(&sk, &dry)
        .await
        .expect("dry sweep");
    assert_eq!(r.blobs_deleted.len(), 1, "{r:?}");
    assert!(exists(&orphan).await, "dry run deleted");
    let r = repo
        .maintenance()
        .gc_store(&sk, &opts)
        .await
        .expect("sweep");
    assert_eq!(
        r.blobs_deleted.iter().map(|b| b.blake3).collect::<Vec<_>>(),
        vec![orphan.blake3]
    );
    assert_eq!(r.bytes_deleted, orphan.size);
    assert!(!exists(&orphan).await, "swept");
    assert!(exists(&kept).await, "referenced");
    let latest = newest(repo, &sk).await;
    for f in &latest.manifest.files {
        repo.blobs()
            .get_blob_bytes(&sk, &BlobRef::from(f))
            .await
            .expect("referenced blob intact");
    }
    // Nothing left to do.
    clock.advance_ms(2 * HOUR_MS);
    let r = repo.maintenance().gc_store(&sk, &opts).await.expect("idle");
    assert!(
        r.blobs_condemned.is_empty() && r.blobs_deleted.is_empty(),
        "{r:?}"
    );
}

/// The newest snapshot of `sk`, which the caller has committed.
async fn newest(repo: &Repository, sk: &StoreKey) -> crate::repo::SnapshotInfo {
    let latest = repo.catalog().latest(sk).await.expect("latest");
    latest.expect("a committed snapshot")
}
