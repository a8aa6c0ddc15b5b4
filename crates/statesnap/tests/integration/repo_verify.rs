//! Defect 8: one bit-rotted blob poisoned every later snapshot, because
//! dedup only checks that a blob of that name and size exists.
//! `Maintenance::verify` finds it and quarantines it; the next snapshot
//! uploads the bytes again.
#![allow(clippy::unwrap_used)]

use crate::common;

use std::sync::Mutex;

use statesnap::ErrorKind;
use statesnap::changelog::file::FileChangelog;
use statesnap::commit_snapshot;
use statesnap::format::StoreFormat;
use statesnap::format::portable::PortableFormat;
use statesnap::repo::paths::{self, ParsedKey};
use statesnap::repo::{StoreKey, VerifyOptions};
use statesnap::store::LoggedStore;
use statesnap::store::MemoryStore;

fn sk() -> StoreKey {
    StoreKey::new("app", "verify", 0).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_finds_quarantines_and_the_next_snapshot_heals() {
    let dir = tempfile::tempdir().unwrap();
    let (repo, base) = common::memory_repo();
    let log = common::file_log(&dir.path().join("log"), "app", "verify");
    let mut s = LoggedStore::new(MemoryStore::new(), log).unwrap();
    for i in 0..20_000u32 {
        s.put(format!("key-{i:06}"), format!("value-{i}-{}", i * 7));
    }
    s.commit().unwrap();
    let format = PortableFormat::memory();
    // Full snapshots only: each one dedups every chunk it shares.
    let full_cut = |s: &LoggedStore<MemoryStore, FileChangelog>| {
        format.forget_last_cut();
        format.capture(s.store()).unwrap()
    };
    let cut = full_cut(&s);
    let first = commit_snapshot(&format, cut, &repo, &sk(), s.changelog(), None)
        .await
        .unwrap();
    let clean = repo
        .maintenance()
        .verify(&VerifyOptions::default(), &|_| {})
        .await
        .unwrap();
    assert!(clean.is_ok(), "{clean:?}");
    assert_eq!(clean.blobs_checked, first.files.len() as u64);

    // Rot one blob: same size, one byte flipped.
    let victim = first.files[first.files.len() / 2].clone();
    common::rot_blob(&base, &sk(), &victim.blake3, 0x40).await;

    // A second full snapshot of the same contents dedups onto the bad blob.
    let cut = full_cut(&s);
    let second = commit_snapshot(&format, cut, &repo, &sk(), s.changelog(), None)
        .await
        .unwrap();
    assert!(second.files.iter().any(|f| f.blake3 == victim.blake3));
    assert_eq!(second.stats.bytes_uploaded, 0, "everything was deduped");

    // Verify finds it, names both snapshots, quarantines it.
    let seen = Mutex::new(0u64);
    let report = repo
        .maintenance()
        .verify(&VerifyOptions { quarantine: true }, &|p| {
            *seen.lock().unwrap() = p.blobs_checked;
            assert!(p.blobs_checked <= p.blobs_total);
        })
        .await
        .unwrap();
    assert!(!report.is_ok());
    assert_eq!(report.bad.len(), 1, "{report:?}");
    let bad = &report.bad[0];
    assert_eq!(bad.hash, victim.blake3);
    assert_eq!(bad.kind, ErrorKind::Corrupt);
    let mut both = vec![first.snapshot_id, second.snapshot_id];
    both.sort();
    assert_eq!(bad.referenced_by, both);
    assert_eq!(*seen.lock().unwrap(), report.blobs_checked);
    let q = object_store::path::Path::from(bad.quarantined_to.clone().unwrap());
    assert!(matches!(
        paths::parse(&q),
        Some(ParsedKey::Quarantined(_, h, _)) if h == victim.blake3
    ));
    assert!(
        repo.blobs()
            .head_blob(&sk(), &victim.blake3)
            .await
            .unwrap()
            .is_none()
    );

    // The next snapshot of the same contents uploads the good bytes again.
    let cut = full_cut(&s);
    let third = commit_snapshot(&format, cut, &repo, &sk(), s.changelog(), None)
        .await
        .unwrap();
    assert!(third.stats.bytes_uploaded > 0);
    let want = common::contents(s.store());
    let (_, log) = s.into_parts();
    let target = dir.path().join("restored");
    let (restored, r) = common::restore_latest(&format, &repo, &sk(), &log, &target)
        .await
        .unwrap();
    assert_eq!(r.snapshot, Some(third.snapshot_id));
    assert_eq!(common::contents(&restored), want);
    // Content addressing: the re-uploaded bytes are exactly what the older
    // two snapshots named, so they are whole again too.
    let after = repo
        .maintenance()
        .verify(&VerifyOptions::default(), &|_| {})
        .await
        .unwrap();
    assert!(after.is_ok(), "{after:?}");
    assert!(after.broken_snapshots().is_empty());
}
