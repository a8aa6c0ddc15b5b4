//! Fault injection: a snapshot commit interrupted at every step, random
//! faults by seed, and gc run at every step of a concurrent commit. After
//! each run the repository is inspected through the *underlying* store: every
//! readable manifest's blobs must exist with the right size and hash.
#![allow(clippy::unwrap_used)]

use bytes::Bytes;
use object_store::ObjectStore;
use object_store::memory::InMemory;
use std::sync::Arc;

use statesnap::ErrorKind;
use statesnap::clock::{Clock, ManualClock, SystemClock};
use statesnap::conformance::repo::draft;
use statesnap::repo::faulty::{FaultConfig, FaultyStore};
use statesnap::repo::{
    BlobRef, FileEntry, GcOptions, Repository, SnapshotWriter, StoreKey, TransferOptions,
};

const HOUR: i64 = 3_600_000;

fn sk() -> StoreKey {
    StoreKey::new("app", "counts", 0).unwrap()
}

fn transfer() -> TransferOptions {
    // Small thresholds so the multipart/staging path runs with small data.
    TransferOptions {
        parallelism: 2,
        multipart_threshold: 64 << 10,
        part_size: 32 << 10,
        download_part_size: 16 << 10,
        ..Default::default()
    }
}

fn bytes(len: usize, seed: u8) -> Bytes {
    Bytes::from(
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect::<Vec<u8>>(),
    )
}

struct Setup {
    base: Arc<dyn ObjectStore>,
    clock: ManualClock,
    parent_files: Vec<FileEntry>,
}

/// A repository holding one parent snapshot with two files.
async fn setup() -> Setup {
    let base: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let clock = ManualClock::new(SystemClock.now_ms());
    let repo = good(&base, &clock);
    repo.create_marker().await.unwrap();
    let mut w = SnapshotWriter::new(&repo, sk());
    w.put_bytes("000001.sst", bytes(1000, 1)).await.unwrap();
    w.put_bytes("MANIFEST", bytes(200_000, 2)).await.unwrap();
    let parent = w.commit(draft(&sk(), 10, vec![])).await.unwrap();
    Setup {
        base,
        clock,
        parent_files: parent.files,
    }
}

impl Setup {
    /// A fault-injecting store over the setup's, and a repository on it.
    fn faulty(&self, cfg: FaultConfig) -> (FaultyStore, Repository) {
        let faulty = FaultyStore::new(Arc::clone(&self.base), cfg);
        let repo = good(
            &(Arc::new(faulty.clone()) as Arc<dyn ObjectStore>),
            &self.clock,
        );
        (faulty, repo)
    }

    /// How many object-store operations `write_child` makes from here on.
    async fn ops_of_clean_commit(self) -> u64 {
        let (faulty, repo) = self.faulty(FaultConfig::default());
        write_child(repo, self.parent_files).await.unwrap();
        faulty.ops()
    }
}

fn good(base: &Arc<dyn ObjectStore>, clock: &ManualClock) -> Repository {
    Repository::from_store(Arc::clone(base), "")
        .unwrap()
        .with_clock(Arc::new(clock.clone()))
        .with_transfer(transfer())
}

/// The snapshot under test: reuses the parent's first file, uploads a small
/// and a large (multipart) one, commits.
async fn write_child(repo: Repository, parent: Vec<FileEntry>) -> statesnap::Result<()> {
    let mut w = SnapshotWriter::new(&repo, sk());
    w.reuse(parent[0].clone())?;
    w.reuse(parent[1].clone())?;
    w.put_bytes("000002.sst", bytes(5000, 3)).await?;
    w.put_bytes("000003.sst", bytes(150_000, 4)).await?;
    w.commit(draft(&sk(), 20, vec![])).await.map(|_| ())
}

/// Every readable manifest names only blobs that exist and verify; returns
/// the number of valid snapshots.
async fn check_invariants(
    base: &Arc<dyn ObjectStore>,
    clock: &ManualClock,
    allow_corrupt_manifests: bool,
) -> usize {
    let repo = good(base, clock);
    let listing = repo.catalog().list_snapshots(&sk()).await.unwrap();
    for u in &listing.unreadable {
        assert!(
            allow_corrupt_manifests && u.kind == ErrorKind::Corrupt,
            "unreadable manifest {u:?}"
        );
    }
    for s in &listing.snapshots {
        for f in &s.manifest.files {
            let got = repo.blobs().get_blob_bytes(&sk(), &BlobRef::from(f)).await;
            assert!(
                got.is_ok(),
                "snapshot {} names a bad blob {}: {:?}",
                s.id(),
                f.path,
                got.err()
            );
        }
    }
    listing.snapshots.len()
}

#[tokio::test]
async fn crash_after_every_operation_of_a_commit_leaves_a_complete_snapshot_or_none() {
    let total = setup().await.ops_of_clean_commit().await;
    assert!(
        total >= 10,
        "commit too short to be interesting: {total} ops"
    );
    for n in 0..=total {
        let s = setup().await;
        let (_, repo) = s.faulty(FaultConfig {
            crash_after: Some(n),
            ..Default::default()
        });
        let res = write_child(repo, s.parent_files.clone()).await;
        let snapshots = check_invariants(&s.base, &s.clock, false).await;
        if n == total {
            assert!(res.is_ok(), "all ops allowed but commit failed: {res:?}");
            assert_eq!(snapshots, 2);
        } else {
            let err = res.expect_err(&format!("crash after {n} ops but commit reported success"));
            assert_eq!(err.kind(), ErrorKind::Transient, "crash after {n}: {err}");
            assert_eq!(
                snapshots, 1,
                "crash after {n}: a snapshot appeared without a successful commit"
            );
        }
        // The crashed writer's leftovers never confuse a retry on a healthy store.
        write_child(good(&s.base, &s.clock), s.parent_files.clone())
            .await
            .unwrap();
        assert_eq!(
            check_invariants(&s.base, &s.clock, false).await,
            if n == total { 3 } else { 2 }
        );
    }
    println!("crash points exercised: {}", total + 1);
}

#[tokio::test]
async fn random_faults_by_seed_never_leave_a_manifest_with_a_bad_blob() {
    const SEEDS: u64 = 300;
    let mut committed = 0;
    for seed in 1..=SEEDS {
        let s = setup().await;
        let cfg = FaultConfig {
            seed,
            error_probability: 0.08,
            lost_ack_probability: 0.08,
            truncate_probability: 0.08,
            shuffle_listings: true,
            ..Default::default()
        };
        let (_, repo) = s.faulty(cfg);
        // A snapshotter retries a failed snapshot a few times.
        for _ in 0..4 {
            if write_child(repo.clone(), s.parent_files.clone())
                .await
                .is_ok()
            {
                committed += 1;
                break;
            }
        }
        // Truncated manifest writes (a non-atomic store) show up as corrupt,
        // never as a usable snapshot with bad blobs.
        check_invariants(&s.base, &s.clock, true).await;
    }
    assert!(
        committed > 0,
        "no seed ever committed: faults too dense to test anything"
    );
    println!("seeds: {SEEDS}, committed under faults: {committed}");
}

/// The dangerous case for gc: the writer reuses old blobs that no manifest
/// references any more (its parent was just dropped by retention). Gc runs
/// while the writer is paused before each of its operations.
#[tokio::test]
async fn gc_at_every_step_of_a_commit_never_deletes_a_referenced_blob() {
    // Count the writer's ops in the scenario (parent manifest deleted, blobs old).
    let total = parent_dropped_two_hours_ago()
        .await
        .ops_of_clean_commit()
        .await;
    let gc = GcOptions::default();
    let grace = i64::try_from(gc.grace.as_millis()).unwrap();
    let mut runs = 0;
    for k in 0..total {
        for sweep_while_paused in [false, true] {
            let s = parent_dropped_two_hours_ago().await;
            let (faulty, repo) = s.faulty(FaultConfig::default());
            let mut pause = faulty.pause_before(k);
            let writer = tokio::spawn(write_child(repo, s.parent_files.clone()));
            assert!(pause.reached().await, "op {k} not reached");
            let paused_op = faulty.op_log().last().cloned().unwrap_or_default();
            let collector = good(&s.base, &s.clock);
            // Mark while the writer is paused.
            let r = collector.maintenance().gc_store(&sk(), &gc).await.unwrap();
            assert!(r.blobs_deleted.is_empty());
            if sweep_while_paused {
                // The writer stalls. Before its checks this must make it fail;
                // at its final manifest put the stall is bounded by assumption
                // A1 of docs/gc.md (put completes within G - D), so only
                // advance that far there.
                let is_commit_put =
                    paused_op.contains(" put ") && paused_op.contains("/manifests/");
                let stall = if is_commit_put {
                    grace - 600_000 - 1
                } else {
                    grace + 1
                };
                s.clock.advance_ms(stall);
                collector.maintenance().gc_store(&sk(), &gc).await.unwrap();
            }
            pause.resume();
            let res = writer.await.unwrap();
            if let Err(e) = &res {
                // Stale: a blob vanished or was condemned too long ago, or
                // the commit ran over budget. Transient: gc removed a staging
                // object that looked older than the grace period (the test's
                // clock runs 2 h ahead of the store's, so everything the
                // writer uploads looks old to gc: harsher than A3).
                assert!(
                    matches!(e.kind(), ErrorKind::Stale | ErrorKind::Transient),
                    "op {k} ({paused_op}): {e}"
                );
            }
            // Later gc passes, well past the grace period.
            for _ in 0..3 {
                s.clock.advance_ms(grace + 1);
                collector.maintenance().gc_store(&sk(), &gc).await.unwrap();
                check_invariants(&s.base, &s.clock, false).await;
            }
            let n = check_invariants(&s.base, &s.clock, false).await;
            assert_eq!(n, usize::from(res.is_ok()), "op {k} ({paused_op}): {res:?}");
            runs += 1;
        }
    }
    println!("gc interleavings exercised: {runs} (writer ops: {total})");
}

/// The setup with its parent snapshot deleted and its clock two hours on:
/// the parent's blobs are old and no manifest references them.
async fn parent_dropped_two_hours_ago() -> Setup {
    let s = setup().await;
    let repo = good(&s.base, &s.clock);
    let latest = repo.catalog().latest(&sk()).await.unwrap().unwrap();
    repo.catalog()
        .delete_snapshot(&sk(), latest.id())
        .await
        .unwrap();
    s.clock.advance_ms(2 * HOUR);
    s
}

#[tokio::test]
async fn gc_with_faults_never_deletes_a_referenced_blob() {
    // Gc itself crashing at every step leaves the repository valid and
    // converges once it can run cleanly.
    let s = setup().await;
    let repo = good(&s.base, &s.clock);
    repo.blobs()
        .put_blob_bytes(&sk(), bytes(10, 9))
        .await
        .unwrap();
    repo.blobs()
        .put_blob_bytes(&sk(), bytes(20, 8))
        .await
        .unwrap();
    s.clock.advance_ms(2 * HOUR);
    let gc = GcOptions::default();
    let mut n = 0;
    loop {
        let (_, frepo) = s.faulty(FaultConfig {
            crash_after: Some(n),
            ..Default::default()
        });
        let res = frepo.maintenance().gc_store(&sk(), &gc).await;
        check_invariants(&s.base, &s.clock, false).await;
        s.clock.advance_ms(HOUR + 1);
        n += 1;
        if res.is_ok() && n > 40 {
            break;
        }
    }
    // Eventually the two orphans are gone and the snapshot's blobs remain.
    for _ in 0..3 {
        repo.maintenance().gc_store(&sk(), &gc).await.unwrap();
        s.clock.advance_ms(HOUR + 1);
    }
    assert!(
        repo.blobs()
            .head_blob(&sk(), &statesnap::repo::BlobHash::of(&bytes(10, 9)))
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(check_invariants(&s.base, &s.clock, false).await, 1);
}

/// A file is stored with its own hash whichever way it goes: read whole
/// below the multipart threshold, streamed at and above it (the threshold
/// here is 64 KiB).
#[tokio::test]
async fn put_blob_file_stores_every_size_around_the_threshold() {
    let base: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let repo = good(&base, &ManualClock::new(SystemClock.now_ms()));
    let dir = tempfile::tempdir().unwrap();
    let t = 64 << 10;
    for (i, len) in [0, 1, t - 1, t, t + 1, 3 * t + 17].into_iter().enumerate() {
        let data = bytes(len, i as u8);
        let path = dir.path().join(format!("f{i}"));
        std::fs::write(&path, &data).unwrap();
        let out = repo.blobs().put_blob_file(&sk(), &path).await.unwrap();
        assert_eq!(out.blob.size, len as u64, "len={len}");
        assert_eq!(
            out.blob.hash,
            statesnap::repo::BlobHash::of(&data),
            "len={len}"
        );
        assert!(out.uploaded, "len={len}");
        let back = repo.blobs().get_blob_bytes(&sk(), &out.blob).await.unwrap();
        assert_eq!(back, data, "len={len}");
        // A second put of the same bytes finds the blob.
        let again = repo.blobs().put_blob_file(&sk(), &path).await.unwrap();
        assert!(!again.uploaded);
    }
    let missing = repo
        .blobs()
        .put_blob_file(&sk(), &dir.path().join("missing"))
        .await
        .unwrap_err();
    assert_eq!(missing.kind(), ErrorKind::NotFound, "{missing}");
}

/// `put_immutable_file` in a `file://` repository with
/// `link_immutable_files`: the blob is the file itself (one inode, two
/// names), found again on a second put, and still there after the source
/// name is gone. Without the option, in another store, across
/// filesystems, or over a wrong-size blob of that hash, it is a copy.
#[tokio::test]
async fn put_immutable_file_links_on_one_filesystem_and_copies_otherwise() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}", dir.path().join("repo").display());
    let linking = TransferOptions {
        link_immutable_files: true,
        ..TransferOptions::default()
    };
    let plain = Repository::init(&url, Default::default()).await.unwrap();
    let repo = plain.clone().with_transfer(linking);
    let blob_path = |b: &BlobRef| {
        dir.path()
            .join("repo")
            .join(statesnap::repo::paths::blob(&sk(), &b.hash).as_ref())
    };
    let src = dir.path().join("000042.sst");
    let data = bytes(100_000, 7);
    std::fs::write(&src, &data).unwrap();
    // Written two days ago: the blob must still look new to gc.
    let two_days_ago = std::time::UNIX_EPOCH
        + std::time::Duration::from_millis((SystemClock.now_ms() - 2 * 86_400_000) as u64);
    std::fs::File::options()
        .write(true)
        .open(&src)
        .unwrap()
        .set_modified(two_days_ago)
        .unwrap();

    let out = repo.blobs().put_immutable_file(&sk(), &src).await.unwrap();
    assert!(out.uploaded);
    let age = SystemClock.now_ms()
        - repo
            .blobs()
            .head_blob(&sk(), &out.blob.hash)
            .await
            .unwrap()
            .unwrap()
            .last_modified_ms;
    assert!(
        (0..60_000).contains(&age),
        "the link's mtime is {age} ms old"
    );
    assert_eq!(out.blob.hash, statesnap::repo::BlobHash::of(&data));
    let (s, b) = (
        std::fs::metadata(&src).unwrap(),
        std::fs::metadata(blob_path(&out.blob)).unwrap(),
    );
    assert_eq!((s.dev(), s.ino()), (b.dev(), b.ino()), "a link, not a copy");
    assert_eq!(s.nlink(), 2);
    let again = repo.blobs().put_immutable_file(&sk(), &src).await.unwrap();
    assert!(
        !again.uploaded,
        "the same bytes are found, not stored again"
    );
    std::fs::remove_file(&src).unwrap();
    assert_eq!(
        repo.blobs().get_blob_bytes(&sk(), &out.blob).await.unwrap(),
        data
    );

    // Without the option: a copy.
    let other = dir.path().join("000043.sst");
    std::fs::write(&other, bytes(5_000, 8)).unwrap();
    let out = plain
        .blobs()
        .put_immutable_file(&sk(), &other)
        .await
        .unwrap();
    assert!(out.uploaded);
    let b = std::fs::metadata(blob_path(&out.blob)).unwrap();
    assert_ne!(b.ino(), std::fs::metadata(&other).unwrap().ino());

    // A blob of that hash with another size (damage): replaced by a copy.
    let third = dir.path().join("000044.sst");
    let third_data = bytes(7_000, 9);
    std::fs::write(&third, &third_data).unwrap();
    let hash = statesnap::repo::BlobHash::of(&third_data);
    let wrong = blob_path(&BlobRef { hash, size: 0 });
    std::fs::create_dir_all(wrong.parent().unwrap()).unwrap();
    std::fs::write(&wrong, b"short").unwrap();
    let out = repo
        .blobs()
        .put_immutable_file(&sk(), &third)
        .await
        .unwrap();
    assert!(out.uploaded);
    assert_eq!(
        repo.blobs().get_blob_bytes(&sk(), &out.blob).await.unwrap(),
        third_data
    );

    // Another store (here in memory): an upload.
    let mem: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let mem_repo = good(&mem, &ManualClock::new(SystemClock.now_ms())).with_transfer(linking);
    let out = mem_repo
        .blobs()
        .put_immutable_file(&sk(), &third)
        .await
        .unwrap();
    assert_eq!(
        mem_repo
            .blobs()
            .get_blob_bytes(&sk(), &out.blob)
            .await
            .unwrap(),
        third_data
    );

    // Missing source: an error naming it.
    let err = repo
        .blobs()
        .put_immutable_file(&sk(), &dir.path().join("gone.sst"))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound, "{err}");

    // Across filesystems (link fails with EXDEV): a copy. /dev/shm is a
    // tmpfs on Linux; where it is missing or on the same device, this part
    // has nothing to cross.
    let shm = std::path::Path::new("/dev/shm");
    let crosses = shm.is_dir()
        && std::fs::metadata(shm).unwrap().dev() != std::fs::metadata(dir.path()).unwrap().dev();
    if crosses {
        let far = tempfile::tempdir_in(shm).unwrap();
        let src = far.path().join("000045.sst");
        let data = bytes(20_000, 10);
        std::fs::write(&src, &data).unwrap();
        let out = repo.blobs().put_immutable_file(&sk(), &src).await.unwrap();
        assert!(out.uploaded);
        assert_eq!(std::fs::metadata(&src).unwrap().nlink(), 1, "copied");
        assert_eq!(
            repo.blobs().get_blob_bytes(&sk(), &out.blob).await.unwrap(),
            data
        );
    } else {
        eprintln!("no second filesystem at /dev/shm: the cross-filesystem copy is not exercised");
    }
}

/// A `file://` repository copies files at or above the multipart threshold
/// itself (read, hash, write through one buffer, fsync, rename): every
/// size stores under its own hash, a second put finds it, a wrong-size
/// blob in the way is replaced, and no staging file is left behind.
#[tokio::test]
async fn a_local_repository_copies_large_files_without_staging_leftovers() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("repo");
    let url = format!("file://{}", root.display());
    let repo = Repository::init(&url, Default::default())
        .await
        .unwrap()
        .with_transfer(transfer());
    let t = 64 << 10;
    for (i, len) in [t, t + 1, 3 * t + 17, (1 << 20) * 2 + 5]
        .into_iter()
        .enumerate()
    {
        let data = bytes(len, 40 + i as u8);
        let path = dir.path().join(format!("big{i}"));
        std::fs::write(&path, &data).unwrap();
        let out = repo.blobs().put_blob_file(&sk(), &path).await.unwrap();
        assert!(out.uploaded, "len={len}");
        assert_eq!(
            out.blob.hash,
            statesnap::repo::BlobHash::of(&data),
            "len={len}"
        );
        assert_eq!(
            repo.blobs().get_blob_bytes(&sk(), &out.blob).await.unwrap(),
            data
        );
        assert!(
            !repo
                .blobs()
                .put_blob_file(&sk(), &path)
                .await
                .unwrap()
                .uploaded
        );
    }
    // A damaged (short) blob under the hash of a new file: replaced.
    let data = bytes(2 * t, 99);
    let hash = statesnap::repo::BlobHash::of(&data);
    let key = statesnap::repo::paths::blob(&sk(), &hash);
    let stored = root.join(key.as_ref());
    std::fs::create_dir_all(stored.parent().unwrap()).unwrap();
    std::fs::write(&stored, b"short").unwrap();
    let path = dir.path().join("replaced");
    std::fs::write(&path, &data).unwrap();
    let out = repo.blobs().put_blob_file(&sk(), &path).await.unwrap();
    assert!(out.uploaded);
    assert_eq!(std::fs::read(&stored).unwrap(), data);

    let staging = root.join(format!("stores/{}/tmp", sk()));
    let left: Vec<_> = std::fs::read_dir(&staging)
        .map(|d| d.map(|e| e.unwrap().file_name()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "staging leftovers: {left:?}");
}
