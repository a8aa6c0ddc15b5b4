//! Corrupt and hostile repository contents, retention, and listing order.
#![allow(clippy::unwrap_used)]

use bytes::Bytes;
use object_store::memory::InMemory;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use std::sync::Arc;
use std::time::Duration;

use statesnap::clock::{Clock, ManualClock, SystemClock};
use statesnap::conformance::repo::draft;
use statesnap::repo::faulty::{FaultConfig, FaultyStore};
use statesnap::repo::{
    BlobRef, GcOptions, Manifest, Repository, SnapshotId, SnapshotInfo, SnapshotWriter, StoreKey,
};
use statesnap::repo::{
    DropReason, KeepReason, RetentionPolicy, plan_retention, plan_retention_for_lineage,
};
use statesnap::{ErrorKind, Reason};

fn sk() -> StoreKey {
    StoreKey::new("app", "hostile", 1).unwrap()
}

async fn repo_with_one_snapshot() -> (Repository, Manifest, ManualClock) {
    let clock = ManualClock::new(SystemClock.now_ms());
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let repo = Repository::from_store(store, "root")
        .unwrap()
        .with_clock(Arc::new(clock.clone()));
    repo.create_marker().await.unwrap();
    let mut w = SnapshotWriter::new(&repo, sk());
    w.put_bytes("data/000001.sst", Bytes::from_static(b"sst bytes"))
        .await
        .unwrap();
    let m = w.commit(draft(&sk(), 100, vec![])).await.unwrap();
    (repo, m, clock)
}

/// Writes a manifest derived from `base` at a newer offset, edited by `edit`,
/// with a correct checksum unless `reseal` is false.
async fn put_raw(
    repo: &Repository,
    base: &Manifest,
    offset: u64,
    reseal: bool,
    edit: impl FnOnce(&mut serde_json::Value),
) -> String {
    let mut m = base.clone();
    m.changelog.offset = offset;
    m.snapshot_id = SnapshotId::from_parts(offset, 1);
    m.seal().unwrap();
    let mut v: serde_json::Value = serde_json::from_slice(&m.encode().unwrap()).unwrap();
    edit(&mut v);
    if reseal {
        let body = Manifest::canonical_body(&v).unwrap();
        v["checksum"] = blake3::hash(&body).to_hex().to_string().into();
    }
    let key = m.key();
    repo.object_store()
        .put(&key, PutPayload::from(serde_json::to_vec(&v).unwrap()))
        .await
        .unwrap();
    key.to_string()
}

#[tokio::test]
async fn hostile_manifests_are_refused_with_the_right_kind_and_never_chosen() {
    let (repo, good, _clock) = repo_with_one_snapshot().await;
    let mut expected: Vec<(String, ErrorKind)> = Vec::new();
    let mut off = 1000;
    for path in [
        "../../etc/passwd",
        "/etc/passwd",
        "a\\..\\b",
        "a\u{0}b",
        "C:/Windows/x",
        "a/./b",
        "",
    ] {
        let k = put_raw(&repo, &good, off, true, |v| {
            v["files"][0]["path"] = path.into()
        })
        .await;
        expected.push((k, ErrorKind::Corrupt));
        off += 1;
    }
    let k = put_raw(&repo, &good, off, true, |v| v["format_version"] = 7.into()).await;
    expected.push((k, ErrorKind::Config));
    off += 1;
    let k = put_raw(&repo, &good, off, false, |v| {
        v["stats"]["keys"] = 999.into()
    })
    .await;
    expected.push((k, ErrorKind::Corrupt));
    off += 1;
    let k = put_raw(&repo, &good, off, true, |v| {
        v["required_features"] = serde_json::json!(["delta-v9"])
    })
    .await;
    expected.push((k, ErrorKind::Config));
    off += 1;
    let k = put_raw(&repo, &good, off, true, |v| {
        v["files"][0]["blake3"] = "zz".into()
    })
    .await;
    expected.push((k, ErrorKind::Corrupt));
    off += 1;
    // Truncated.
    let mut m = good.clone();
    m.changelog.offset = off;
    m.snapshot_id = SnapshotId::from_parts(off, 1);
    m.seal().unwrap();
    let bytes = m.encode().unwrap();
    repo.object_store()
        .put(
            &m.key(),
            PutPayload::from(bytes[..bytes.len() - 10].to_vec()),
        )
        .await
        .unwrap();
    expected.push((m.key().to_string(), ErrorKind::Corrupt));

    let listing = repo.catalog().list_snapshots(&sk()).await.unwrap();
    assert_eq!(
        listing.snapshots.len(),
        1,
        "only the good snapshot is usable"
    );
    assert_eq!(listing.latest().unwrap().id(), good.snapshot_id);
    let mut got: Vec<(String, ErrorKind)> = listing
        .unreadable
        .iter()
        .map(|u| (u.key.clone(), u.kind))
        .collect();
    got.sort_by(|a, b| a.0.cmp(&b.0));
    expected.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(got, expected);
    // The newer format version and the unknown required feature are
    // refusals a program can tell apart from damage.
    let newer = listing
        .unreadable
        .iter()
        .filter(|u| u.refusal == Some(Reason::UnsupportedVersion))
        .count();
    assert_eq!(newer, 2, "{:?}", listing.unreadable);

    // Gc refuses to run while a manifest it cannot understand exists.
    let e = repo
        .maintenance()
        .gc_store(&sk(), &GcOptions::default())
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Config, "{e}");
}

#[tokio::test]
async fn corrupt_blobs_fail_restore_downloads_and_leave_nothing() {
    let (repo, m, _clock) = repo_with_one_snapshot().await;
    let f = &m.files[0];
    let key = statesnap::repo::paths::blob(&sk(), &f.blake3);
    repo.object_store()
        .put(&key, PutPayload::from(b"sst bytez".to_vec()))
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let dest = Manifest::file_path_within(dir.path(), &f.path).unwrap();
    let e = repo
        .blobs()
        .get_blobs_to_files(&sk(), &[(BlobRef::from(f), dest.clone())])
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Corrupt, "{e}");
    assert!(!dest.exists());
    let leftovers: Vec<_> = std::fs::read_dir(dest.parent().unwrap()).unwrap().collect();
    assert!(leftovers.is_empty(), "partial files left: {leftovers:?}");
}

#[tokio::test]
async fn catalog_ignores_listing_order() {
    let base: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let clock = ManualClock::new(SystemClock.now_ms());
    let repo = Repository::from_store(Arc::clone(&base), "")
        .unwrap()
        .with_clock(Arc::new(clock.clone()));
    let f = repo
        .blobs()
        .put_blob_bytes(&sk(), Bytes::from_static(b"x"))
        .await
        .unwrap();
    let file = statesnap::repo::FileEntry {
        path: "x".into(),
        size: f.blob.size,
        blake3: f.blob.hash,
    };
    // Offsets deliberately not in id order.
    let offsets = [5u64, 3, 9, 1, 7, 7, 0, 12, 2, 11];
    for (i, off) in offsets.iter().enumerate() {
        let m = Manifest::from_draft(
            draft(&sk(), *off, vec![file.clone()]),
            SnapshotId::from_parts(100 - i as u64, 0),
            0,
        )
        .unwrap();
        repo.commit_manifest(&m).await.unwrap();
    }
    for seed in 1..=20 {
        let shuffled = FaultyStore::new(
            Arc::clone(&base),
            FaultConfig {
                seed,
                shuffle_listings: true,
                ..Default::default()
            },
        );
        let r = Repository::from_store(Arc::new(shuffled), "").unwrap();
        let l = r.catalog().list_snapshots(&sk()).await.unwrap();
        let names: Vec<_> = l.snapshots.iter().map(|s| s.manifest.name()).collect();
        let mut sorted = names.clone();
        sorted.sort();
        assert_eq!(names, sorted, "seed {seed}");
        assert_eq!(l.latest().unwrap().offset(), 12);
        assert_eq!(l.at_or_before(8).unwrap().offset(), 7);
        // Two snapshots at offset 7: the one with the larger id wins.
        assert_eq!(
            l.at_or_before(8).unwrap().id(),
            SnapshotId::from_parts(100 - 4, 0)
        );
        assert_eq!(r.catalog().list_stores().await.unwrap(), vec![sk()]);
    }
}

fn info(offset: u64, id_ms: u64, created_at: i64, depends_on: Vec<SnapshotId>) -> SnapshotInfo {
    let mut d = draft(&sk(), offset, vec![]);
    d.depends_on = depends_on;
    let manifest = Manifest::from_draft(d, SnapshotId::from_parts(id_ms, 0), created_at).unwrap();
    SnapshotInfo {
        key: manifest.key().to_string(),
        manifest,
    }
}

fn id(ms: u64) -> SnapshotId {
    SnapshotId::from_parts(ms, 0)
}

fn info_in(lineage: &str, offset: u64, id_ms: u64, created_at: i64) -> SnapshotInfo {
    let mut d = draft(&sk(), offset, vec![]);
    d.changelog.lineage = statesnap::changelog::Lineage(lineage.to_string());
    let manifest = Manifest::from_draft(d, SnapshotId::from_parts(id_ms, 0), created_at).unwrap();
    SnapshotInfo {
        key: manifest.key().to_string(),
        manifest,
    }
}

/// Defect 3: after the changelog was recreated, the dead incarnation's
/// snapshots sit at higher offsets; retention used to keep them as "newest"
/// and delete the live lineage's only usable snapshot.
#[test]
fn retention_decides_per_lineage() {
    let now = 100_000_000;
    let min = 60_000;
    let snaps = vec![
        info_in("old", 900, 1, now - 60 * min),
        info_in("old", 1000, 2, now - 50 * min),
        info_in("new", 5, 3, now - 20 * min),
        info_in("new", 10, 4, now - 10 * min),
    ];
    let keep_one = RetentionPolicy {
        keep_last: Some(1),
        keep_newer_than: None,
    };
    for p in [
        plan_retention(&snaps, &keep_one, now),
        plan_retention_for_lineage(
            &snaps,
            &keep_one,
            now,
            Some(&statesnap::changelog::Lineage("new".into())),
        ),
    ] {
        assert_eq!(p.keep, vec![(id(4), KeepReason::Newest)]);
        assert_eq!(
            p.drop,
            vec![
                (id(2), DropReason::DeadLineage),
                (id(1), DropReason::DeadLineage),
                (id(3), DropReason::Expired),
            ]
        );
    }
    // A dead lineage's snapshots expire by age alone.
    let p = plan_retention(
        &snaps,
        &RetentionPolicy {
            keep_last: Some(1),
            keep_newer_than: Some(Duration::from_secs(55 * 60)),
        },
        now,
    );
    assert!(p.keep.contains(&(id(2), KeepReason::NewerThan)), "{p:?}");
    assert!(p.keep.contains(&(id(3), KeepReason::NewerThan)), "{p:?}");
    assert_eq!(p.drop, vec![(id(1), DropReason::DeadLineage)]);
}

#[test]
fn retention_keep_last_newer_than_newest_and_dependencies() {
    let clock = ManualClock::new(10_000_000);
    let now = clock.now_ms();
    let min = 60_000;
    // offset order: a(1) < b(2) < c(3) < d(4) < e(5); e is a delta on c, c a delta on a.
    let snaps = vec![
        info(3, 3, now - 30 * min, vec![id(1)]),
        info(1, 1, now - 50 * min, vec![]),
        info(5, 5, now - 120 * min, vec![id(3)]),
        info(2, 2, now - 40 * min, vec![]),
        info(4, 4, now - 10 * min, vec![]),
    ];
    // keep_last = 1: newest (e) plus its chain c -> a.
    let p = plan_retention(
        &snaps,
        &RetentionPolicy {
            keep_last: Some(1),
            keep_newer_than: None,
        },
        now,
    );
    assert_eq!(
        p.keep,
        vec![
            (id(5), KeepReason::Newest),
            (id(3), KeepReason::DependencyOf(id(5))),
            (id(1), KeepReason::DependencyOf(id(3)))
        ]
    );
    assert!(p.drops(id(4)) && p.drops(id(2)));
    // keep_last = 2: e, d (+ c, a as dependencies); b dropped.
    let p = plan_retention(
        &snaps,
        &RetentionPolicy {
            keep_last: Some(2),
            keep_newer_than: None,
        },
        now,
    );
    assert_eq!(p.drop.iter().map(|d| d.0).collect::<Vec<_>>(), vec![id(2)]);
    // keep_newer_than 35 min: d (10 min), c (30 min) + newest e (old!) + a (dependency of c and e's chain).
    let p = plan_retention(
        &snaps,
        &RetentionPolicy {
            keep_last: None,
            keep_newer_than: Some(Duration::from_secs(35 * 60)),
        },
        now,
    );
    let kept: Vec<_> = p.keep.iter().map(|k| k.0).collect();
    assert_eq!(kept, vec![id(5), id(4), id(3), id(1)]);
    assert_eq!(
        p.keep[0].1,
        KeepReason::Newest,
        "newest is kept even when old"
    );
    assert!(p.drops(id(2)));
    // Time moves: everything ages out but the newest and its chain.
    clock.advance_ms(1000 * min);
    let p = plan_retention(
        &snaps,
        &RetentionPolicy {
            keep_last: None,
            keep_newer_than: Some(Duration::from_secs(35 * 60)),
        },
        clock.now_ms(),
    );
    assert_eq!(
        p.keep.iter().map(|k| k.0).collect::<Vec<_>>(),
        vec![id(5), id(3), id(1)]
    );
    // No policy keeps everything; an empty listing keeps nothing.
    assert!(
        plan_retention(&snaps, &RetentionPolicy::default(), now)
            .drop
            .is_empty()
    );
    assert!(
        plan_retention(
            &[],
            &RetentionPolicy {
                keep_last: Some(0),
                keep_newer_than: None
            },
            now
        )
        .keep
        .is_empty()
    );
    // keep_last = 0 still keeps the newest.
    let p = plan_retention(
        &snaps,
        &RetentionPolicy {
            keep_last: Some(0),
            keep_newer_than: None,
        },
        now,
    );
    assert_eq!(p.keep[0], (id(5), KeepReason::Newest));
    // A dependency that is not in the listing is reported.
    let orphan = vec![info(9, 9, now, vec![id(42)])];
    let p = plan_retention(
        &orphan,
        &RetentionPolicy {
            keep_last: Some(1),
            keep_newer_than: None,
        },
        now,
    );
    assert_eq!(p.missing_dependencies, vec![(id(9), id(42))]);
}

#[tokio::test]
async fn gc_applies_retention_deletes_manifests_then_collects_their_blobs() {
    let clock = ManualClock::new(SystemClock.now_ms());
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let repo = Repository::from_store(store, "")
        .unwrap()
        .with_clock(Arc::new(clock.clone()));
    let mut ids = Vec::new();
    for i in 0..4u8 {
        let mut w = SnapshotWriter::new(&repo, sk());
        w.put_bytes("shared", Bytes::from_static(b"shared"))
            .await
            .unwrap();
        w.put_bytes("own", Bytes::from(vec![i; 10])).await.unwrap();
        ids.push(
            w.commit(draft(&sk(), u64::from(i) * 10, vec![]))
                .await
                .unwrap(),
        );
        clock.advance_ms(1000);
    }
    clock.advance_ms(2 * 3_600_000);
    let opts = GcOptions {
        retention: Some(RetentionPolicy {
            keep_last: Some(2),
            keep_newer_than: None,
        }),
        ..Default::default()
    };
    let dry = repo
        .maintenance()
        .gc_store(
            &sk(),
            &GcOptions {
                dry_run: true,
                ..opts.clone()
            },
        )
        .await
        .unwrap();
    assert_eq!(dry.manifests_deleted.len(), 2);
    assert_eq!(
        repo.catalog()
            .list_snapshots(&sk())
            .await
            .unwrap()
            .snapshots
            .len(),
        4,
        "dry run deleted"
    );
    let r = repo.maintenance().gc_store(&sk(), &opts).await.unwrap();
    assert_eq!(
        r.manifests_deleted.iter().map(|m| m.0).collect::<Vec<_>>(),
        vec![ids[0].snapshot_id, ids[1].snapshot_id]
    );
    assert_eq!(
        r.blobs_condemned.len(),
        2,
        "the two dropped snapshots' own blobs: {r:?}"
    );
    clock.advance_ms(3_600_001);
    let r = repo.maintenance().gc_store(&sk(), &opts).await.unwrap();
    assert_eq!(r.blobs_deleted.len(), 2);
    for s in repo
        .catalog()
        .list_snapshots(&sk())
        .await
        .unwrap()
        .snapshots
    {
        for f in &s.manifest.files {
            repo.blobs()
                .get_blob_bytes(&sk(), &BlobRef::from(f))
                .await
                .unwrap();
        }
    }
}

#[tokio::test]
async fn open_and_init_errors_are_clear() {
    let dir = tempfile::tempdir().unwrap();
    let url = url::Url::from_directory_path(dir.path().join("nothing-here"))
        .unwrap()
        .to_string();
    let e = Repository::open(&url, Default::default())
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
    assert_eq!(e.reason(), Some(Reason::NoRepository), "{e}");
    for bad in ["ftp://x/y", "not a url", "s3://bucket/p?x"] {
        let mut o = statesnap::repo::RepositoryOptions::default();
        o.store_options.insert("no_such_option".into(), "1".into());
        if let Err(e) = Repository::open(bad, o).await {
            assert!(
                matches!(e.kind(), ErrorKind::Config | ErrorKind::NotFound),
                "{bad}: {e}"
            );
        }
    }
    // Explicit options override env; an unknown one is a config error.
    let mut o = statesnap::repo::RepositoryOptions::default();
    o.store_options.insert("bogus".into(), "1".into());
    let e = Repository::open("s3://bucket/prefix", o).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Config, "{e}");
}

/// Defect 6 (manifests): a manifest far larger than any statesnap writes is
/// refused as corrupt before it is read into memory, and never chosen.
#[tokio::test]
async fn an_oversized_manifest_is_refused_unread() {
    let (repo, good, _clock) = repo_with_one_snapshot().await;
    let mut m = good.clone();
    m.changelog.offset = 5000;
    m.snapshot_id = SnapshotId::from_parts(5000, 1);
    let key = m.key();
    let huge = vec![b' '; (statesnap::repo::MAX_MANIFEST_BYTES + 1) as usize];
    repo.object_store()
        .put(&key, PutPayload::from(huge))
        .await
        .unwrap();
    let err = repo.catalog().read_manifest(&key).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Corrupt, "{err}");
    let listing = repo.catalog().list_snapshots(&sk()).await.unwrap();
    assert_eq!(listing.latest().unwrap().id(), good.snapshot_id);
    assert!(listing.unreadable.iter().any(|u| u.key == key.to_string()));
}

/// A gc record larger than gc ever writes is dropped unread: even a valid
/// one, padded past the cap, condemns nothing. The same record at its
/// normal size does sweep (the control: the test would see a read).
#[tokio::test]
async fn an_oversized_gc_record_is_dropped_unread() {
    use statesnap::repo::paths::{self, BlobHash};
    use statesnap::repo::{CondemnationRecord, CondemnedBlob, GC_RECORD_FORMAT_VERSION};
    let (repo, _good, clock) = repo_with_one_snapshot().await;
    let orphan = Bytes::from_static(b"bytes no manifest names");
    let hash = BlobHash::of(&orphan);
    let blob_key = paths::blob(&sk(), &hash);
    repo.object_store()
        .put(&blob_key, PutPayload::from(orphan.clone()))
        .await
        .unwrap();
    // Sealed long ago: ripe for sweeping if anyone reads it.
    let record = CondemnationRecord {
        format_version: GC_RECORD_FORMAT_VERSION,
        condemned_at: 0,
        sealed_at: Some(0),
        blobs: vec![CondemnedBlob {
            blake3: hash,
            size: orphan.len() as u64,
        }],
    };
    let body = serde_json::to_vec(&record).unwrap();
    let mut padded = body.clone();
    padded.resize(body.len() + (64 << 20), b' ');
    let huge_key = paths::gc_record(&sk(), ulid::Ulid::from_parts(1, 1));
    repo.object_store()
        .put(&huge_key, PutPayload::from(padded))
        .await
        .unwrap();
    clock.advance_ms(3 * 3_600_000);
    let report = repo
        .maintenance()
        .gc_store(&sk(), &GcOptions::default())
        .await
        .unwrap();
    assert_eq!(report.records_dropped, 1, "{report:?}");
    assert!(report.blobs_deleted.is_empty(), "{report:?}");
    repo.object_store().head(&blob_key).await.unwrap();
    assert!(matches!(
        repo.object_store().head(&huge_key).await,
        Err(object_store::Error::NotFound { .. })
    ));

    // Control: the record at its real size is read and sweeps the orphan.
    let key = paths::gc_record(&sk(), ulid::Ulid::from_parts(2, 1));
    repo.object_store()
        .put(&key, PutPayload::from(body))
        .await
        .unwrap();
    let report = repo
        .maintenance()
        .gc_store(&sk(), &GcOptions::default())
        .await
        .unwrap();
    assert_eq!(report.records_dropped, 0, "{report:?}");
    assert!(
        report.blobs_deleted.iter().any(|b| b.blake3 == hash),
        "{report:?}"
    );
}
