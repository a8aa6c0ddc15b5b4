//! The RocksDB store format: snapshots restore exactly (model test),
//! incremental uploads, corruption and interrupted restores, writer
//! incarnations, staging cleanup.
#![cfg(feature = "rocksdb")]
#![allow(clippy::unwrap_used)]

use crate::common;

use bytes::Bytes;
use object_store::memory::InMemory;
use object_store::{ObjectStore, ObjectStoreExt};
use proptest::prelude::*;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use statesnap::ErrorKind;
use statesnap::changelog::file::{FileChangelog, FileChangelogOptions, FsyncPolicy};
use statesnap::changelog::{Changelog, ChangelogBinding, ChangelogId, Record};
use statesnap::clock::{Clock, ManualClock, SystemClock};
use statesnap::commit_snapshot;
use statesnap::format::rocks::{CompactionPolicy, RocksFormat};
use statesnap::format::{RestoreStats, StoreFormat};
use statesnap::repo::faulty::{FaultConfig, FaultyStore};
use statesnap::repo::{FileEntry, GcOptions, Manifest, Repository, StoreKey};
use statesnap::restore::{RestoreOptions, RestoreReport, Source, restore_store};
use statesnap::store::LoggedStore;
use statesnap::store::{RocksOptions, RocksStore};
use statesnap::store::{StateStore, StateStoreExt, ensure_follows};

use common::{
    Kv as Model, apply_to, contents, memory_repo, noise, replay_tail, restore_latest,
    restore_snapshot, rt, snapshot, write_both,
};

fn opts() -> RocksOptions {
    RocksOptions {
        write_buffer_bytes: 256 << 10,
        block_cache_bytes: 4 << 20,
        background_jobs: 2,
        ..RocksOptions::default()
    }
}

fn sk() -> StoreKey {
    StoreKey::new("app", "rocks", 0).unwrap()
}

fn id() -> ChangelogId {
    StoreKey::new("app", "rocks", 0).unwrap().changelog_id()
}

/// A changelog for tests that load stores in bulk ([`fill`]); fsynced only
/// when a snapshot asks.
fn test_log(dir: &Path) -> FileChangelog {
    FileChangelog::open(
        dir.join("bulk-log"),
        id(),
        FileChangelogOptions {
            fsync: FsyncPolicy::Never,
            ..FileChangelogOptions::default()
        },
    )
    .unwrap()
}

fn key(i: u32) -> Bytes {
    Bytes::from(format!("key-{i:06}"))
}

/// The value `fill` and `two_snapshots` write at `key(i)` for `seed`.
fn value(seed: u64, i: u32) -> Bytes {
    Bytes::from(noise(seed ^ u64::from(i), 100))
}

/// Puts `key(i) = noise(seed ^ i)` for `range`, 500 per batch, each batch
/// logged to `log` and applied at its last offset; returns the log's end.
fn fill(
    log: &FileChangelog,
    store: &mut RocksStore,
    model: &mut Model,
    range: impl Iterator<Item = u32>,
    seed: u64,
) -> u64 {
    ensure_follows(store, &ChangelogBinding::of(log).unwrap()).unwrap();
    let mut batch = Vec::new();
    let flush = |batch: &mut Vec<Record>, store: &mut RocksStore| {
        let offsets = log.append(batch).unwrap();
        store.apply(batch, *offsets.last().unwrap()).unwrap();
        batch.clear();
    };
    for i in range {
        let v = value(seed, i);
        model.insert(key(i), v.clone());
        batch.push(Record::put(key(i), v));
        if batch.len() == 500 {
            flush(&mut batch, store);
        }
    }
    if !batch.is_empty() {
        flush(&mut batch, store);
    }
    log.end_offset().unwrap()
}

/// Entries of `dir` whose name contains `needle`.
fn entries_with(dir: &Path, needle: &str) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .filter(|n| n.contains(needle))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

fn dir_listing(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}

// ---------------------------------------------------------------- model test

#[derive(Debug, Clone)]
enum Op {
    Put(u16, u16),
    Delete(u16),
    Commit,
    Flush,
    Snapshot,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        12 => (0u16..300, any::<u16>()).prop_map(|(k, v)| Op::Put(k, v)),
        4 => (0u16..300).prop_map(Op::Delete),
        4 => Just(Op::Commit),
        1 => Just(Op::Flush),
        2 => Just(Op::Snapshot),
    ]
}

fn model_key(k: u16) -> Bytes {
    Bytes::from(format!("k{k:04}"))
}

fn model_value(k: u16, v: u16) -> Bytes {
    // Long enough that a few hundred writes fill several SST files.
    let mut b = format!("v{v:05}-").into_bytes();
    b.extend(noise(u64::from(k) << 16 | u64::from(v), 200));
    Bytes::from(b)
}

fn run_model(ops: Vec<Op>) {
    let rt = rt();
    let dir = tempfile::tempdir().unwrap();
    let log = FileChangelog::open(
        dir.path().join("log"),
        id(),
        FileChangelogOptions {
            segment_bytes: 64 << 10,
            ..FileChangelogOptions::default()
        },
    )
    .unwrap();
    let store = RocksStore::open(dir.path().join("store"), &opts()).unwrap();
    let mut ls = LoggedStore::new(store, log).unwrap();
    let format = RocksFormat::new(opts());
    let (repo, _) = memory_repo();
    let mut committed = Model::new();
    let mut pending: Vec<(Bytes, Option<Bytes>)> = Vec::new();
    // (manifest, model at its offset)
    let mut snaps: Vec<(Manifest, Model)> = Vec::new();
    let commit = |ls: &mut LoggedStore<RocksStore, FileChangelog>,
                  pending: &mut Vec<(Bytes, Option<Bytes>)>,
                  committed: &mut Model| {
        ls.commit().unwrap();
        apply_to(committed, pending.drain(..));
    };
    for op in ops {
        match op {
            Op::Put(k, v) => {
                ls.put(model_key(k), model_value(k, v));
                pending.push((model_key(k), Some(model_value(k, v))));
            }
            Op::Delete(k) => {
                ls.delete(model_key(k));
                pending.push((model_key(k), None));
            }
            Op::Commit => commit(&mut ls, &mut pending, &mut committed),
            Op::Flush => ls.store().flush().unwrap(),
            Op::Snapshot => {
                commit(&mut ls, &mut pending, &mut committed);
                if ls.store().applied_offset().unwrap().is_none() {
                    continue;
                }
                let parent = snaps.last().map(|(m, _)| m.clone());
                let m = rt.block_on(snapshot(
                    &format,
                    ls.store(),
                    &repo,
                    &sk(),
                    ls.changelog(),
                    parent.as_ref(),
                ));
                assert_eq!(
                    Some(m.changelog.offset),
                    ls.store().applied_offset().unwrap()
                );
                // Inline files count as uploaded (they travel in the manifest).
                assert_eq!(
                    m.stats.bytes_uploaded + m.stats.bytes_reused,
                    m.files.iter().map(|f| f.size).sum::<u64>()
                        + m.inline_files.iter().map(|f| f.size).sum::<u64>()
                );
                snaps.push((m, committed.clone()));
            }
        }
    }
    commit(&mut ls, &mut pending, &mut committed);
    assert_eq!(contents(ls.store()), committed);
    let changelog = ls.changelog();
    for (i, (m, at_snapshot)) in snaps.iter().enumerate() {
        let target = dir.path().join(format!("restored-{i}"));
        let (mut store, stats) = rt
            .block_on(restore_snapshot(&format, m, &repo, &target))
            .unwrap();
        assert_eq!(stats.files_downloaded as usize, m.files.len());
        // Exactly the snapshot's cut ...
        assert_eq!(
            &contents(&store),
            at_snapshot,
            "snapshot {i} at offset {}",
            m.changelog.offset
        );
        assert_eq!(store.applied_offset().unwrap(), Some(m.changelog.offset));
        // ... and, with the tail replayed, exactly the changelog end.
        replay_tail(&mut store, changelog);
        assert_eq!(contents(&store), committed, "snapshot {i} + tail");
    }
    // The full restore path picks the newest snapshot and replays the tail.
    if changelog.end_offset().unwrap() > 0 {
        let target = dir.path().join("restored-latest");
        let (store, report) = rt
            .block_on(restore_latest(&format, &repo, &sk(), changelog, &target))
            .unwrap();
        assert_eq!(report.snapshot, snaps.last().map(|(m, _)| m.snapshot_id));
        assert!(report.skipped.is_empty(), "{:?}", report.skipped);
        assert_eq!(contents(&store), committed);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, ..ProptestConfig::default() })]
    #[test]
    fn restore_of_any_snapshot_plus_tail_equals_model(ops in proptest::collection::vec(op(), 1..250)) {
        run_model(ops);
    }
}

// ---------------------------------------------------------------- incremental

#[test]
fn incremental_snapshot_uploads_only_new_files_and_survives_parent_gc() {
    let rt = rt();
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(SystemClock.now_ms());
    let repo = memory_repo().0.with_clock(Arc::new(clock.clone()));
    let format = RocksFormat::new(opts());
    let mut store = RocksStore::open(dir.path().join("store"), &opts()).unwrap();
    let log = test_log(dir.path());
    let mut model = Model::new();
    let n = 10_000u32;
    fill(&log, &mut store, &mut model, 0..n, 1);
    // One compacted run, so the 1 % change below does not trigger a compaction.
    store.flush().unwrap();
    store.db().compact_range::<&[u8], &[u8]>(None, None);
    let parent = rt.block_on(snapshot(&format, &store, &repo, &sk(), &log, None));
    assert!(parent.stats.bytes_uploaded > 500_000, "{:?}", parent.stats);
    assert_eq!(parent.stats.bytes_reused, 0);
    assert!(
        parent.stats.keys > 0 && parent.stats.logical_bytes > 0,
        "{:?}",
        parent.stats
    );

    // Change 1 % of the keys, flush, snapshot again.
    fill(&log, &mut store, &mut model, (0..n).step_by(100), 2);
    store.flush().unwrap();
    let child = rt.block_on(snapshot(&format, &store, &repo, &sk(), &log, Some(&parent)));
    let parent_paths: BTreeSet<&str> = parent.files.iter().map(|f| f.path.as_str()).collect();
    let parent_hashes: BTreeSet<_> = parent.files.iter().map(|f| f.blake3).collect();
    let new_sst: u64 = child
        .files
        .iter()
        .filter(|f| f.path.ends_with(".sst") && !parent_paths.contains(f.path.as_str()))
        .map(|f| f.size)
        .sum();
    let small_new: u64 = child
        .files
        .iter()
        .filter(|f| !f.path.ends_with(".sst") && !parent_hashes.contains(&f.blake3))
        .map(|f| f.size)
        .sum();
    let inline: u64 = child.inline_files.iter().map(|f| f.size).sum();
    assert!(new_sst > 0);
    assert!(inline > 0, "CURRENT, OPTIONS and MANIFEST travel inline");
    assert!(child.stats.bytes_reused > 0, "{:?}", child.stats);
    assert_eq!(
        child.stats.bytes_uploaded,
        new_sst + small_new + inline,
        "{:?}",
        child.stats
    );
    assert!(
        child.stats.bytes_uploaded < parent.stats.bytes_uploaded / 5,
        "{:?}",
        child.stats
    );
    drop(store);

    // Delete the parent and collect garbage (grace ~0, injected clock).
    let (_, deleted) = drop_and_collect(&rt, &repo, &clock, &parent);
    // Exactly the parent's blobs the child does not name (its MANIFEST
    // travelled inline, so that is the SSTs the child no longer has, if any).
    let child_hashes: BTreeSet<_> = child.files.iter().map(|f| f.blake3).collect();
    let unshared: BTreeSet<_> = parent
        .files
        .iter()
        .filter(|f| !child_hashes.contains(&f.blake3))
        .map(|f| (f.blake3, f.size))
        .collect();
    assert_eq!(
        deleted,
        unshared.iter().map(|(_, s)| s).sum::<u64>(),
        "gc deletes the parent's unshared blobs and nothing else"
    );
    let target = dir.path().join("restored");
    let (restored, _) = rt
        .block_on(restore_snapshot(&format, &child, &repo, &target))
        .unwrap();
    assert_eq!(contents(&restored), model);
}

/// Deletes snapshot `m`, then runs gc three times a minute apart (grace
/// ~0, injected clock), so what only `m` named is condemned and swept;
/// returns the blobs and bytes deleted.
fn drop_and_collect(
    rt: &tokio::runtime::Runtime,
    repo: &Repository,
    clock: &ManualClock,
    m: &Manifest,
) -> (usize, u64) {
    rt.block_on(repo.catalog().delete_snapshot(&sk(), m.snapshot_id))
        .unwrap();
    let gc_repo = repo
        .clone()
        .with_max_commit_duration(Duration::from_millis(1));
    let gc = GcOptions {
        grace: Duration::from_millis(2),
        ..GcOptions::default()
    };
    let (mut blobs, mut bytes) = (0, 0);
    for _ in 0..3 {
        clock.advance_ms(60_000);
        let r = rt
            .block_on(gc_repo.maintenance().gc_store(&sk(), &gc))
            .unwrap();
        blobs += r.blobs_deleted.len();
        bytes += r.bytes_deleted;
    }
    (blobs, bytes)
}

// ---------------------------------------------------------------- corruption

/// A changelog-backed store with two snapshots; returns the manifests.
struct TwoSnaps {
    rt: tokio::runtime::Runtime,
    dir: tempfile::TempDir,
    log: FileChangelog,
    repo: Repository,
    base: Arc<dyn ObjectStore>,
    format: RocksFormat,
    old: Manifest,
    new: Manifest,
    model: Model,
}

impl TwoSnaps {
    /// Replays the log's tail into `store` and checks it equals the model.
    fn assert_caught_up(&self, mut store: RocksStore) {
        replay_tail(&mut store, &self.log);
        assert_eq!(contents(&store), self.model);
    }

    /// Restores snapshot `m` into `target` with the fixture's format, and
    /// waits for the background sync, so the target's listing no longer
    /// changes under the test (the sync removes its mark when it ends).
    fn restore(
        &self,
        m: &Manifest,
        target: &Path,
    ) -> statesnap::Result<(RocksStore, RestoreStats)> {
        let (store, stats) =
            self.rt
                .block_on(restore_snapshot(&self.format, m, &self.repo, target))?;
        store.wait_durable()?;
        Ok((store, stats))
    }

    /// `restore_store` into `target` with `options`.
    fn restore_with(&self, target: &Path, options: &RestoreOptions) -> (RocksStore, RestoreReport) {
        let r = self
            .rt
            .block_on(restore_store(
                &self.format,
                &self.repo,
                &sk(),
                &self.log,
                target,
                options,
            ))
            .unwrap();
        r.0.wait_durable().unwrap();
        r
    }

    /// `restore_store` into `target`: the newest usable snapshot + the tail.
    fn restore_latest(&self, target: &Path) -> (RocksStore, RestoreReport) {
        self.restore_with(target, &RestoreOptions::default())
    }

    /// A marked store directory (restores may replace it, but only whole)
    /// holding a file `precious`.
    fn precious_target(&self) -> PathBuf {
        let target = self.dir.path().join("target");
        common::dir_with_file(&target, "precious", b"keep me");
        statesnap::store::mark_store_dir(&target).unwrap();
        target
    }

    /// `target` (from `precious_target`) holds what it held, and no
    /// restore left a staging or old directory behind.
    fn assert_untouched(&self, target: &Path, context: &str) {
        assert_eq!(
            dir_listing(target),
            BTreeSet::from([".statesnap-store".to_owned(), "precious".to_owned()]),
            "{context}"
        );
        for leftover in ["statesnap-restore", ".target.statesnap-"] {
            assert_eq!(
                entries_with(self.dir.path(), leftover),
                Vec::<String>::new(),
                "{context}"
            );
        }
    }
}

fn two_snapshots() -> TwoSnaps {
    let rt = rt();
    let dir = tempfile::tempdir().unwrap();
    let log = common::file_log(&dir.path().join("log"), "app", "rocks");
    let store = RocksStore::open(dir.path().join("store"), &opts()).unwrap();
    let mut ls = LoggedStore::new(store, log).unwrap();
    let mut model = Model::new();
    let mut write = |ls: &mut LoggedStore<RocksStore, FileChangelog>,
                     range: std::ops::Range<u32>,
                     seed: u64| {
        for i in range {
            write_both(ls, &mut model, key(i), Some(value(seed, i)));
            if i.is_multiple_of(500) {
                ls.commit().unwrap();
            }
            // Several SSTs per snapshot: the tests below pick victims among
            // a snapshot's blobs, and its small files travel inline.
            if i.is_multiple_of(1000) {
                ls.store().flush().unwrap();
            }
        }
        ls.commit().unwrap();
    };
    write(&mut ls, 0..3000, 1);
    let format = RocksFormat::new(opts());
    let (repo, base) = memory_repo();
    let old = rt.block_on(snapshot(
        &format,
        ls.store(),
        &repo,
        &sk(),
        ls.changelog(),
        None,
    ));
    write(&mut ls, 3000..6000, 2);
    let new = rt.block_on(snapshot(
        &format,
        ls.store(),
        &repo,
        &sk(),
        ls.changelog(),
        Some(&old),
    ));
    write(&mut ls, 6000..6100, 3);
    let (_store, log) = ls.into_parts();
    TwoSnaps {
        rt,
        dir,
        log,
        repo,
        base,
        format,
        old,
        new,
        model,
    }
}

impl TwoSnaps {
    /// Flips a bit of the stored blob of `path` in snapshot `m` (or flips
    /// it back).
    fn flip_byte(&self, m: &Manifest, path: &str) {
        let f = m.files.iter().find(|f| f.path == path).unwrap();
        self.rt
            .block_on(common::rot_blob(&self.base, &m.store_key, &f.blake3, 0x01));
    }

    /// The files of the newer snapshot that the older one does not hold.
    fn new_files(&self) -> impl Iterator<Item = &FileEntry> {
        let old: BTreeSet<_> = self.old.files.iter().map(|f| f.blake3).collect();
        self.new
            .files
            .iter()
            .filter(move |f| !old.contains(&f.blake3))
    }
}

/// The SST files of snapshot `m`.
fn ssts(m: &Manifest) -> impl Iterator<Item = &FileEntry> {
    m.files.iter().filter(|f| f.path.ends_with(".sst"))
}

/// The path of the largest of `files`.
fn largest<'a>(files: impl Iterator<Item = &'a FileEntry>) -> String {
    files.max_by_key(|f| f.size).unwrap().path.clone()
}

#[test]
fn corrupt_sst_fails_restore_naming_the_file_and_restore_store_falls_back() {
    let s = two_snapshots();
    let victim = largest(s.new_files().filter(|f| f.path.ends_with(".sst")));
    s.flip_byte(&s.new, &victim);

    // A target with a previous store in it stays exactly as it was.
    let target = s.precious_target();
    let err = s.restore(&s.new, &target).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Corrupt, "{err}");
    s.assert_untouched(&target, "after the failed restore");

    // restore_store skips the corrupt snapshot and uses the older one.
    let (store, report) = s.restore_latest(&target);
    assert_eq!(report.snapshot, Some(s.old.snapshot_id));
    assert_eq!(report.skipped.len(), 1, "{:?}", report.skipped);
    assert_eq!(report.skipped[0].id, s.new.snapshot_id);
    assert_eq!(report.skipped[0].kind, ErrorKind::Corrupt);
    assert_eq!(report.skipped[0].refusal, None, "{:?}", report.skipped);
    assert_eq!(contents(&store), s.model);
    drop(store);

    // Both corrupt: full replay, both skips recorded.
    let old_sst = largest(ssts(&s.old));
    s.flip_byte(&s.old, &old_sst);
    // (Into a fresh directory: the old target holds verified copies of the
    // old snapshot's files, which local-first restore would rightly reuse.)
    let (store, report) = s.restore_latest(&s.dir.path().join("fresh"));
    assert_eq!(report.snapshot, None);
    assert_eq!(report.skipped.len(), 2, "{:?}", report.skipped);
    assert!(report.skipped.iter().all(|k| k.kind == ErrorKind::Corrupt));
    assert_eq!(contents(&store), s.model);
}

/// Whichever file is corrupt, a failed restore leaves nothing behind: the
/// downloads still running when the corrupt one fails are finished before
/// the staging directory is removed (a dropped `tokio::fs` operation keeps
/// running and could re-create it). Repeated, since it is a race.
#[test]
fn a_failed_restore_never_leaves_staging_behind_whichever_file_is_corrupt() {
    let s = two_snapshots();
    let target = s.precious_target();
    let victims: Vec<String> = s
        .new_files()
        .filter(|f| f.size > 0)
        .map(|f| f.path.clone())
        .collect();
    assert!(victims.len() >= 3, "{victims:?}");
    for victim in &victims {
        s.flip_byte(&s.new, victim);
        for round in 0..8 {
            let err = s.restore(&s.new, &target).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::Corrupt, "{err}");
            s.assert_untouched(&target, &format!("victim={victim} round={round}"));
        }
        // Put the byte back for the next victim.
        s.flip_byte(&s.new, victim);
    }
    // All intact again: the restore succeeds.
    let (store, _) = s.restore(&s.new, &target).unwrap();
    assert!(store.applied_offset().unwrap() == Some(s.new.changelog.offset));
}

#[test]
fn interrupted_restore_leaves_target_untouched_and_next_restore_succeeds() {
    let s = two_snapshots();
    // The target holds a store restored from the older snapshot.
    let target = s.dir.path().join("target");
    let (old_store, _) = s.restore(&s.old, &target).unwrap();
    let before_contents = contents(&old_store);
    drop(old_store);

    // Count the object-store operations of a clean restore elsewhere.
    // (Into a copy of the target, so local-first reuse is the same.)
    let probe_dir = s.dir.path().join("probe");
    std::fs::create_dir_all(&probe_dir).unwrap();
    for e in std::fs::read_dir(&target).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), probe_dir.join(e.file_name())).unwrap();
    }
    let probe = Arc::new(FaultyStore::new(
        Arc::clone(&s.base),
        FaultConfig::default(),
    ));
    let probe_repo =
        Repository::from_store(Arc::clone(&probe) as Arc<dyn ObjectStore>, "").unwrap();
    s.rt.block_on(restore_snapshot(&s.format, &s.new, &probe_repo, &probe_dir))
        .unwrap();
    let ops = probe.ops();
    assert!(ops > 3, "{ops}");

    for n in [0, 1, ops / 2, ops - 1] {
        let before = dir_listing(&target);
        let faulty = Arc::new(FaultyStore::new(
            Arc::clone(&s.base),
            FaultConfig {
                crash_after: Some(n),
                ..FaultConfig::default()
            },
        ));
        let frepo = Repository::from_store(faulty as Arc<dyn ObjectStore>, "").unwrap();
        let err =
            s.rt.block_on(restore_snapshot(&s.format, &s.new, &frepo, &target))
                .unwrap_err();
        assert!(
            matches!(err.kind(), ErrorKind::Transient),
            "crash after {n}: {err}"
        );
        assert_eq!(dir_listing(&target), before, "crash after {n}");
        assert!(
            entries_with(s.dir.path(), "statesnap-restore").is_empty(),
            "crash after {n}"
        );
        let reopened = RocksStore::open(&target, &opts()).unwrap();
        assert_eq!(contents(&reopened), before_contents);
        assert_eq!(
            reopened.applied_offset().unwrap(),
            Some(s.old.changelog.offset)
        );
        drop(reopened);
    }
    let before = dir_listing(&target);
    let (store, stats) = s.restore(&s.new, &target).unwrap();
    assert_eq!(
        store.applied_offset().unwrap(),
        Some(s.new.changelog.offset)
    );
    // Local-first: SSTs shared with the old snapshot (as a blob or inline)
    // came from the old target.
    let in_old = |f: &FileEntry| {
        s.old.files.contains(f)
            || s.old
                .inline_files
                .iter()
                .any(|i| i.path == f.path && i.blake3 == f.blake3)
    };
    let shared = ssts(&s.new)
        .filter(|f| before.contains(&f.path) && in_old(f))
        .count();
    assert!(shared > 0);
    assert_eq!(stats.files_reused_locally as usize, shared, "{stats:?}");
    assert_eq!(
        stats.files_reused_locally + stats.files_downloaded,
        s.new.files.len() as u64
    );
    s.assert_caught_up(store);
}

#[test]
fn local_file_with_same_name_and_size_but_other_bytes_is_not_reused() {
    let s = two_snapshots();
    let target = s.dir.path().join("target");
    let (st, _) = s.restore(&s.old, &target).unwrap();
    drop(st);
    // Tamper with a local SST the snapshot also names: same name, same size.
    let f = ssts(&s.old).next().unwrap();
    let p = target.join(&f.path);
    let mut b = std::fs::read(&p).unwrap();
    b[10] ^= 0xff;
    std::fs::remove_file(&p).unwrap();
    std::fs::write(&p, &b).unwrap();
    let (store, stats) = s.restore(&s.old, &target).unwrap();
    assert_eq!(
        stats.files_reused_locally as usize,
        ssts(&s.old).count() - 1,
        "{stats:?}"
    );
    assert_eq!(std::fs::read(&p).unwrap().len() as u64, f.size);
    assert_eq!(
        blake3::hash(&std::fs::read(&p).unwrap()).as_bytes(),
        &f.blake3.0
    );
    drop(store);
}

// ---------------------------------------------------------------- incarnations

#[test]
fn two_incarnations_restored_from_one_snapshot_keep_their_own_files() {
    let rt = rt();
    let dir = tempfile::tempdir().unwrap();
    let (repo, _) = memory_repo();
    let format = RocksFormat::new(opts());
    let mut a = RocksStore::open(dir.path().join("a"), &opts()).unwrap();
    let log = test_log(dir.path());
    let mut base_model = Model::new();
    fill(&log, &mut a, &mut base_model, 0..2000, 7);
    let s0 = rt.block_on(snapshot(&format, &a, &repo, &sk(), &log, None));
    drop(a);

    let mut results = Vec::new();
    for (name, seed) in [("b", 100u64), ("c", 200u64)] {
        let target = dir.path().join(name);
        let (mut st, _) = rt
            .block_on(restore_snapshot(&format, &s0, &repo, &target))
            .unwrap();
        let mut model = base_model.clone();
        // Same keys, same value sizes, different bytes: same-named SSTs of
        // the same size, with different contents.
        fill(&log, &mut st, &mut model, 0..500, seed);
        st.flush().unwrap();
        let m = rt.block_on(snapshot(&format, &st, &repo, &sk(), &log, Some(&s0)));
        results.push((m, model));
    }
    let (mb, _) = &results[0];
    let (mc, _) = &results[1];
    let collide = mb.files.iter().any(|fb| {
        fb.path.ends_with(".sst")
            && mc
                .files
                .iter()
                .any(|fc| fc.path == fb.path && fc.blake3 != fb.blake3)
    });
    assert!(
        collide,
        "test setup: expected a same-named SST with different bytes\n{mb:?}\n{mc:?}"
    );
    for (i, (m, model)) in results.iter().enumerate() {
        let target = dir.path().join(format!("check-{i}"));
        let (st, _) = rt
            .block_on(restore_snapshot(&format, m, &repo, &target))
            .unwrap();
        assert_eq!(&contents(&st), model, "incarnation {i}");
    }
}

// ---------------------------------------------------------------- staging

#[test]
fn staging_leftovers_are_cleaned_up_and_cuts_remove_their_checkpoint() {
    let rt = rt();
    let dir = tempfile::tempdir().unwrap();
    let store_path = dir.path().join("store");
    let mut store = RocksStore::open(&store_path, &opts()).unwrap();
    let log = test_log(dir.path());
    let mut model = Model::new();
    fill(&log, &mut store, &mut model, 0..100, 1);
    let format = RocksFormat::new(opts());
    let root = format.staging_root_for(&store_path);
    // A checkpoint left by a crashed process.
    std::fs::create_dir_all(root.join("checkpoint-dead")).unwrap();
    std::fs::write(root.join("checkpoint-dead/000001.sst"), b"x").unwrap();
    let cut = format.capture(&store).unwrap();
    assert_eq!(
        entries_with(&root, "checkpoint-"),
        vec![
            cut.dir()
                .file_name()
                .unwrap()
                .to_string_lossy()
                .into_owned()
        ]
    );
    // A second capture does not remove the first, live, cut.
    let cut2 = format.capture(&store).unwrap();
    assert!(cut.dir().is_dir());
    assert_eq!(entries_with(&root, "checkpoint-").len(), 2);
    let cut_dir: PathBuf = cut.dir().to_path_buf();
    drop(cut);
    assert!(root.is_dir(), "the second cut still lives in it");
    drop(cut2);
    assert!(!cut_dir.exists());
    assert!(entries_with(&root, "checkpoint-").is_empty());
    // The default staging directory goes with its last checkpoint: no
    // empty `<store>.statesnap-staging` is left beside the store.
    assert!(!root.exists());

    // A snapshot (success) keeps its checkpoint as the next one's base
    // (its digest is derived from it), and only that one: the next
    // snapshot's replaces it.
    let (repo, _) = memory_repo();
    let first = rt.block_on(snapshot(&format, &store, &repo, &sk(), &log, None));
    assert_eq!(first.format_metadata["digest"], "scanned");
    let bases = entries_with(&root, "checkpoint-");
    assert_eq!(bases.len(), 1);
    fill(&log, &mut store, &mut model, 0..10, 2);
    let m = rt.block_on(snapshot(&format, &store, &repo, &sk(), &log, Some(&first)));
    assert_eq!(m.format_metadata["digest"], "derived");
    assert_eq!(m.format_metadata["digest_keys_read"], 10);
    let next = entries_with(&root, "checkpoint-");
    assert_eq!(next.len(), 1);
    assert_ne!(next, bases);
    // The store closed, the base goes, and the staging directory with it
    // (once the base's open in the background, if still running, ends).
    drop(store);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while root.exists() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(entries_with(&root, "checkpoint-").is_empty());
    assert!(!root.exists());
    assert!(entries_with(dir.path(), ".statesnap-staging").is_empty());
    let store = RocksStore::open(&store_path, &opts()).unwrap();
    // A failed snapshot (below) leaves the base's checkpoint only.
    let m = rt.block_on(snapshot(&format, &store, &repo, &sk(), &log, Some(&m)));
    assert_eq!(
        m.format_metadata["digest"], "scanned",
        "a reopened store has no base"
    );
    let base = entries_with(&root, "checkpoint-");
    // A staging root the caller chose is theirs: kept.
    let chosen = dir.path().join("chosen-staging");
    let custom = RocksFormat::new(opts()).with_staging_root(&chosen);
    drop(custom.capture(&store).unwrap());
    assert!(chosen.is_dir());
    assert!(entries_with(&chosen, "checkpoint-").is_empty());
    // A failed write (unreachable repository) leaves none either.
    let broken = Repository::from_store(
        Arc::new(FaultyStore::new(
            Arc::new(InMemory::new()),
            FaultConfig {
                crash_after: Some(0),
                ..FaultConfig::default()
            },
        )),
        "",
    )
    .unwrap();
    let cut = format.capture(&store).unwrap();
    let err = rt
        .block_on(commit_snapshot(&format, cut, &broken, &sk(), &log, None))
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Transient, "{err}");
    assert_eq!(entries_with(&root, "checkpoint-"), base);
    drop(store);

    // Restore leftovers next to the target are removed by the next restore.
    let target = dir.path().join("restored");
    std::fs::create_dir_all(dir.path().join(".restored.statesnap-restore-dead")).unwrap();
    std::fs::create_dir_all(dir.path().join(".restored.statesnap-old-dead")).unwrap();
    std::fs::create_dir_all(dir.path().join(".other.statesnap-restore-keep")).unwrap();
    let (st, _) = rt
        .block_on(restore_snapshot(&format, &m, &repo, &target))
        .unwrap();
    assert_eq!(contents(&st), model);
    assert!(
        entries_with(dir.path(), ".restored.statesnap").is_empty(),
        "{:?}",
        dir_listing(dir.path())
    );
    assert_eq!(entries_with(dir.path(), ".other.statesnap").len(), 1);
    drop(st);

    // create_empty removes whatever was there.
    let empty = format.create_empty(&target).unwrap();
    assert!(contents(&empty).is_empty());
    assert_eq!(empty.applied_offset().unwrap(), None);
    let _ = SystemClock.now_ms();
}

#[test]
fn capture_offset_is_that_of_the_checkpoint_contents_even_without_wal() {
    let rt = rt();
    let dir = tempfile::tempdir().unwrap();
    let o = RocksOptions {
        wal: false,
        ..opts()
    };
    let mut store = RocksStore::open(dir.path().join("store"), &o).unwrap();
    let log = test_log(dir.path());
    let mut model = Model::new();
    let next = fill(&log, &mut store, &mut model, 0..1000, 5);
    let format = RocksFormat::new(o.clone());
    let cut = format.capture(&store).unwrap();
    assert_eq!(format.cut_offset(&cut), Some(next - 1));
    assert!(cut.files().iter().any(|(n, _)| n.ends_with(".sst")));
    assert!(
        !cut.files()
            .iter()
            .any(|(n, _)| n.starts_with("LOG") || n == "LOCK")
    );
    let (repo, _) = memory_repo();
    let m = rt
        .block_on(commit_snapshot(&format, cut, &repo, &sk(), &log, None))
        .unwrap();
    assert_eq!(m.changelog.offset, next - 1);
    drop(store);
    let (st, _) = rt
        .block_on(restore_snapshot(&format, &m, &repo, &dir.path().join("r")))
        .unwrap();
    assert_eq!(contents(&st), model);
}

/// A restore's progress counters end where its report does: every blob
/// byte read (the corrupt newer snapshot tried first included) and every
/// tail record replayed.
#[test]
fn restore_progress_counts_every_byte_read_and_every_record_replayed() {
    let s = two_snapshots();
    let victim = largest(s.new_files().filter(|f| f.path.ends_with(".sst")));
    s.flip_byte(&s.new, &victim);
    let progress = std::sync::Arc::new(statesnap::restore::RestoreProgress::default());
    assert_eq!(progress.replay(), None, "no replay before the restore");
    let target = s.dir.path().join("progress-target");
    let (store, report) = s.restore_with(
        &target,
        &RestoreOptions {
            progress: Some(progress.clone()),
            ..RestoreOptions::default()
        },
    );
    assert_eq!(report.snapshot, Some(s.old.snapshot_id));
    assert_eq!(contents(&store), s.model);
    let old_bytes: u64 = s.old.files.iter().map(|f| f.size).sum();
    assert_eq!(report.transfer.bytes_downloaded, old_bytes);
    // The refused snapshot's bytes were read too (up to the bad file).
    assert!(
        progress.bytes_downloaded() > old_bytes,
        "read {} bytes, the used snapshot holds {old_bytes}",
        progress.bytes_downloaded()
    );
    let (done, total) = progress.replay().expect("the tail was replayed");
    assert_eq!(done, report.replay.records, "{report:?}");
    assert_eq!(total, report.replay.records, "{report:?}");
    assert!(done > 0);
}

/// A store left with one compacted run of its keys and three newer runs of
/// the same keys in level 0 (auto compactions off) snapshots at ~4x its
/// live data unless the checkpoint is
/// compacted first. With the policy on, the snapshot is within the bound,
/// restores exactly, the live store is untouched, and the next snapshot —
/// inside the policy's interval, so not compacted — is incremental over the
/// compacted parent and restores exactly too. Without the policy, the
/// snapshot carries the amplification.
#[test]
fn a_space_amplified_checkpoint_is_compacted_before_upload_and_restores_exactly() {
    let rt = rt();
    for compact in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let (repo, _) = memory_repo();
        let policy = CompactionPolicy {
            max_space_amplification: 1.3,
            min_bytes: 0,
            min_interval: Duration::from_secs(3600),
        };
        let format = RocksFormat::new(opts()).with_compaction(compact.then_some(policy));
        let mut store = store_without_auto_compactions(dir.path());
        let log = test_log(dir.path());
        let mut model = Model::new();
        for seed in 1..=4 {
            fill(&log, &mut store, &mut model, 0..5000, seed);
            store.flush().unwrap();
            if seed == 1 {
                store.db().compact_range::<&[u8], &[u8]>(None, None);
            }
        }
        let cut = format.capture(&store).unwrap();
        let amplification = cut.space_amplification();
        assert!(amplification > 2.5, "{amplification}");
        let live_before: BTreeSet<String> = store
            .db()
            .live_files()
            .unwrap()
            .into_iter()
            // The metadata family still compacts on its own.
            .filter(|f| f.column_family_name == "default")
            .map(|f| f.name)
            .collect();
        let m = rt
            .block_on(commit_snapshot(&format, cut, &repo, &sk(), &log, None))
            .unwrap();
        let snap_bytes: u64 = ssts(&m).map(|f| f.size).sum();
        let ratio = snap_bytes as f64 / m.stats.logical_bytes as f64;
        assert_eq!(
            m.format_metadata["compacted"].is_object(),
            compact,
            "{}",
            m.format_metadata
        );
        if compact {
            assert!(
                ratio <= 1.3,
                "compacted snapshot at {ratio:.2}x its live data"
            );
            let before = m.format_metadata["compacted"]["sst_bytes_before"]
                .as_u64()
                .unwrap();
            assert!(before > 2 * snap_bytes, "{before} vs {snap_bytes}");
        } else {
            assert!(ratio > 2.5, "{ratio}");
        }
        // The live store kept its own files and contents.
        for name in &live_before {
            assert!(
                store.path().join(name.trim_start_matches('/')).exists(),
                "{name}"
            );
        }
        assert_eq!(contents(&store), model);
        let (st, _) = rt
            .block_on(restore_snapshot(&format, &m, &repo, &dir.path().join("r1")))
            .unwrap();
        assert_eq!(contents(&st), model);
        assert_eq!(st.applied_offset().unwrap(), Some(m.changelog.offset));
        drop(st);

        // Inside the interval: not compacted again, incremental, exact.
        fill(&log, &mut store, &mut model, (0..5000).step_by(10), 9);
        let m2 = rt.block_on(snapshot(&format, &store, &repo, &sk(), &log, Some(&m)));
        assert!(m2.format_metadata.get("compacted").is_none());
        assert_eq!(m2.parent, Some(m.snapshot_id));
        let (st, _) = rt
            .block_on(restore_snapshot(
                &format,
                &m2,
                &repo,
                &dir.path().join("r2"),
            ))
            .unwrap();
        assert_eq!(contents(&st), model);
    }
}

/// The amplification measure does not mistake a small rewrite, or a store
/// growing in key order, for amplification: after 1 % of a compacted
/// store's keys are rewritten, the
/// new level-0 file spans every key range (RocksDB's live-data estimate
/// then fell to ~1 % of the store, which made every such snapshot a full
/// compaction and a full upload), yet the cut measures ~1.0 and is not
/// compacted.
#[test]
fn a_small_rewrite_is_not_taken_for_space_amplification() {
    let rt = rt();
    let dir = tempfile::tempdir().unwrap();
    let (repo, _) = memory_repo();
    let policy = CompactionPolicy {
        min_bytes: 0,
        min_interval: Duration::ZERO,
        ..CompactionPolicy::default()
    };
    let format = RocksFormat::new(opts()).with_compaction(Some(policy));
    let mut store = RocksStore::open(dir.path().join("store"), &opts()).unwrap();
    let log = test_log(dir.path());
    let mut model = Model::new();
    fill(&log, &mut store, &mut model, 0..20_000, 1);
    store.flush().unwrap();
    store.db().compact_range::<&[u8], &[u8]>(None, None);
    fill(&log, &mut store, &mut model, (0..20_000).step_by(100), 2);
    let cut = format.capture(&store).unwrap();
    let amplification = cut.space_amplification();
    assert!(amplification < 1.1, "{amplification}");
    let m = rt
        .block_on(commit_snapshot(&format, cut, &repo, &sk(), &log, None))
        .unwrap();
    assert!(
        m.format_metadata.get("compacted").is_none(),
        "{}",
        m.format_metadata
    );
    let (st, _) = rt
        .block_on(restore_snapshot(&format, &m, &repo, &dir.path().join("r")))
        .unwrap();
    assert_eq!(contents(&st), model);

    // Growing in key order: as many new keys again, all past the bottom
    // level's range, double the bytes without a single second version.
    fill(&log, &mut store, &mut model, 20_000..40_000, 3);
    store.flush().unwrap();
    let cut = format.capture(&store).unwrap();
    let amplification = cut.space_amplification();
    assert!(amplification < 1.1, "{amplification}");
}

/// With nothing compacted below level 0 yet (auto compactions off), three
/// runs of the same keys measure ~3x and three runs of disjoint keys ~1x:
/// the largest non-overlapping level-0 files are the reference (each run is
/// several files here: small write buffers). (Taking every level-0-only
/// store as unamplified left a 100 k-key store written ten times at 2.8x:
/// 31.9 MB shipped for 11.5 MB of data.)
#[test]
fn level_zero_only_stores_are_measured_against_their_largest_file() {
    for overlapping in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let format = RocksFormat::new(opts());
        let mut store = store_without_auto_compactions(dir.path());
        let log = test_log(dir.path());
        let mut model = Model::new();
        for round in 0..3u32 {
            let keys = if overlapping {
                0..5000
            } else {
                round * 5000..(round + 1) * 5000
            };
            fill(&log, &mut store, &mut model, keys, u64::from(round));
            store.flush().unwrap();
        }
        let files: Vec<_> = store
            .db()
            .live_files()
            .unwrap()
            .into_iter()
            .filter(|f| f.column_family_name == "default")
            .collect();
        assert!(
            files.iter().all(|f| f.level == 0),
            "everything in level 0: {:?}",
            files.iter().map(|f| f.level).collect::<Vec<_>>()
        );
        let amplification = format.capture(&store).unwrap().space_amplification();
        if overlapping {
            assert!(amplification > 2.5, "{amplification}");
        } else {
            assert!(amplification < 1.1, "{amplification}");
        }
    }
}

/// A store at `dir/store` whose data column family never compacts on its
/// own (the metadata family still does).
fn store_without_auto_compactions(dir: &Path) -> RocksStore {
    let store = RocksStore::open(dir.join("store"), &opts()).unwrap();
    store
        .db()
        .set_options(&[("disable_auto_compactions", "true")])
        .unwrap();
    store
}

// ------------------------------------------- restores synced in the background

/// The marks a restore that syncs in the background leaves in `dir`.
fn unsynced_marks(dir: &Path) -> Vec<String> {
    entries_with(dir, ".statesnap-unsynced-")
}

/// A restore returns before its files are on disk (the default,
/// `RestoreSync::Background`); the mark it leaves is removed once they are.
/// If the machine restarts before that, the store's files may be anything:
/// simulated here by a mark from another boot and an SST that never
/// reached the disk (zeroed). Opening the store is refused, saying why, and
/// a local-first restore (what the runtime runs) sets the store aside and
/// restores it exactly, downloading what the local copy no longer matches.
#[test]
fn a_store_left_unsynced_by_a_machine_restart_is_refused_and_restored_again() {
    let s = two_snapshots();
    let target = s.dir.path().join("target");
    let (store, _) = s.restore(&s.new, &target).unwrap();
    store.wait_durable().unwrap();
    assert_eq!(unsynced_marks(&target), Vec::<String>::new());
    drop(store);

    std::fs::write(
        target.join(".statesnap-unsynced-0123"),
        "a-boot-before-the-crash\n",
    )
    .unwrap();
    let victim = largest(ssts(&s.new));
    let len = std::fs::metadata(target.join(&victim)).unwrap().len();
    std::fs::write(
        target.join(&victim),
        vec![0u8; usize::try_from(len).unwrap()],
    )
    .unwrap();

    let e = RocksStore::open(&target, &opts()).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Corrupt, "{e}");

    let (store, report) = s.restore_with(
        &target,
        &RestoreOptions {
            local_first: true,
            ..RestoreOptions::default()
        },
    );
    assert!(
        report
            .plan
            .rejected
            .iter()
            .any(|r| r.kind == ErrorKind::Corrupt && matches!(r.source, Source::Local { .. })),
        "{:?}",
        report.plan.rejected
    );
    assert_eq!(report.snapshot, Some(s.new.snapshot_id));
    assert!(report.transfer.files_downloaded >= 1, "{report:?}");
    assert_eq!(contents(&store), s.model);
    store.wait_durable().unwrap();
    assert_eq!(unsynced_marks(&target), Vec::<String>::new());
}

/// A process that dies before its restore's files are synced loses
/// nothing the kernel had (same boot): the store opens, and opening it
/// finishes the sync and removes the mark.
#[cfg(target_os = "linux")]
#[test]
fn a_mark_of_this_boot_is_synced_by_the_next_open() {
    let s = two_snapshots();
    let target = s.dir.path().join("target");
    let (store, _) = s.restore(&s.new, &target).unwrap();
    store.wait_durable().unwrap();
    drop(store);
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    std::fs::write(target.join(".statesnap-unsynced-0456"), boot).unwrap();
    let store = RocksStore::open(&target, &opts()).unwrap();
    store.wait_durable().unwrap();
    assert_eq!(unsynced_marks(&target), Vec::<String>::new());
    s.assert_caught_up(store);
}

/// `RestoreSync::Immediate`: every file is fsynced before the store is
/// published, so it carries no mark at all.
#[test]
fn an_immediate_restore_leaves_no_mark() {
    let s = two_snapshots();
    let repo = s
        .repo
        .clone()
        .with_transfer(statesnap::repo::TransferOptions {
            restore_sync: statesnap::repo::RestoreSync::Immediate,
            ..*s.repo.transfer()
        });
    let target = s.dir.path().join("target");
    let (store, _) =
        s.rt.block_on(restore_snapshot(&s.format, &s.new, &repo, &target))
            .unwrap();
    assert_eq!(unsynced_marks(&target), Vec::<String>::new());
    s.assert_caught_up(store);
}

/// Small files ride in the manifest (`CURRENT`, `OPTIONS-*`, ...): no blob
/// of their own, restored byte for byte from the manifest. A manifest whose
/// inline bytes were altered and resealed (a bug or a hand edit) is refused
/// naming the file, the target stays as it was, and `restore_store` falls
/// back to the older snapshot.
#[test]
fn inline_files_restore_and_damaged_ones_are_refused() {
    let s = two_snapshots();
    for m in [&s.old, &s.new] {
        let inline: BTreeSet<&str> = m.inline_files.iter().map(|f| f.path.as_str()).collect();
        assert!(inline.contains("CURRENT"), "{inline:?}");
        assert!(
            inline.iter().any(|p| p.starts_with("OPTIONS-")),
            "{inline:?}"
        );
        // The metadata column family's SST (the flushed offset) too; the
        // data's SSTs are blobs.
        assert!(inline.iter().any(|p| p.ends_with(".sst")), "{inline:?}");
        assert!(m.files.iter().any(|f| f.path.ends_with(".sst")));
        assert!(m.files.iter().all(|f| !inline.contains(f.path.as_str())));
        assert!(m.required_features.iter().any(|f| f == "inline-files"));
        // (A metadata SST may also be a blob: one a compaction removed
        // from the live store before a capture could tell its column
        // family travels as a blob that once.)
        for f in m.inline_files.iter().filter(|f| !f.path.ends_with(".sst")) {
            let stored =
                s.rt.block_on(s.repo.blobs().head_blob(&sk(), &f.blake3))
                    .unwrap();
            assert_eq!(stored, None, "no blob for inline file {}", f.path);
        }
    }
    // (Opening the restored store rewrites CURRENT, MANIFEST and OPTIONS,
    // so what shows the inline bytes were right is that it opens at the
    // snapshot's offset and catches up to the model.)
    let target = s.dir.path().join("plain");
    let (store, _) = s.restore(&s.new, &target).unwrap();
    s.assert_caught_up(store);

    // CURRENT's bytes replaced in the stored manifest, checksum recomputed.
    let mut v: serde_json::Value = serde_json::from_slice(&s.new.encode().unwrap()).unwrap();
    let i = s
        .new
        .inline_files
        .iter()
        .position(|f| f.path == "CURRENT")
        .unwrap();
    let other = statesnap::repo::InlineFile::new("CURRENT", b"MANIFEST-999999\n").unwrap();
    v["inline_files"][i]["zstd_base64"] = other.zstd_base64.into();
    let body = Manifest::canonical_body(&v).unwrap();
    v["checksum"] = blake3::hash(&body).to_hex().to_string().into();
    let bytes = serde_json::to_vec(&v).unwrap();
    let key = s.new.key();
    let damaged = Manifest::decode(key.as_ref(), &bytes).unwrap();
    s.rt.block_on(s.base.put(&key, bytes.into())).unwrap();

    let target = s.precious_target();
    let err = s.restore(&damaged, &target).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Corrupt, "{err}");
    s.assert_untouched(&target, "after the refused restore");
    let (store, report) = s.restore_latest(&target);
    assert_eq!(report.snapshot, Some(s.old.snapshot_id));
    assert_eq!(report.skipped.len(), 1, "{:?}", report.skipped);
    assert!(
        report.skipped[0].kind == ErrorKind::Corrupt && report.skipped[0].id == s.new.snapshot_id,
        "{:?}",
        report.skipped
    );
    s.assert_caught_up(store);

    // Verify finds it too, without restoring: that snapshot, that file.
    let verified =
        s.rt.block_on(s.repo.maintenance().verify_store(
            &sk(),
            &Default::default(),
            &|_: &statesnap::repo::VerifyProgress| {},
        ))
        .unwrap();
    assert!(!verified.is_ok());
    assert!(verified.bad.is_empty(), "{:?}", verified.bad);
    assert_eq!(verified.bad_inline.len(), 1, "{:?}", verified.bad_inline);
    let bad = &verified.bad_inline[0];
    assert_eq!(
        (bad.snapshot, bad.path.as_str()),
        (s.new.snapshot_id, "CURRENT")
    );
    assert_eq!(
        verified.broken_snapshots().get(&sk()),
        Some(&vec![s.new.snapshot_id])
    );
}

/// With `link_immutable_files` in a local repository, the snapshot's SSTs
/// are the store's own files (hard links), every other file is not, and
/// the blobs outlive the store's names for them: after a compaction
/// deleted every SST the first snapshot had, both snapshots restore
/// exactly, and gc of the first leaves the second whole.
#[test]
fn linked_ssts_are_the_store_s_files_and_outlive_them() {
    use std::os::unix::fs::MetadataExt;
    let rt = rt();
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(SystemClock.now_ms());
    let url = format!("file://{}", dir.path().join("repo").display());
    let repo = rt
        .block_on(Repository::init(&url, Default::default()))
        .unwrap()
        .with_clock(Arc::new(clock.clone()))
        .with_transfer(statesnap::repo::TransferOptions {
            link_immutable_files: true,
            ..Default::default()
        });
    let blob_file = |f: &FileEntry| {
        dir.path()
            .join("repo")
            .join(statesnap::repo::paths::blob(&sk(), &f.blake3).as_ref())
    };
    let format = RocksFormat::new(opts());
    let store_dir = dir.path().join("store");
    let mut store = RocksStore::open(&store_dir, &opts()).unwrap();
    let log = test_log(dir.path());
    let mut model = Model::new();
    fill(&log, &mut store, &mut model, 0..5_000, 1);
    store.flush().unwrap();
    let first = rt.block_on(snapshot(&format, &store, &repo, &sk(), &log, None));
    let first_model = model.clone();
    let mut linked = 0;
    for f in &first.files {
        let blob = std::fs::metadata(blob_file(f)).unwrap();
        match std::fs::metadata(store_dir.join(&f.path)) {
            Ok(live) if f.path.ends_with(".sst") => {
                assert_eq!(live.ino(), blob.ino(), "{} is linked", f.path);
                linked += 1;
            }
            // Mutable files are copies (or inline); an SST compacted away
            // since the checkpoint has no live name to compare.
            Ok(live) => assert_ne!(live.ino(), blob.ino(), "{} is a copy", f.path),
            Err(_) => {}
        }
    }
    assert!(linked > 1, "{linked} SSTs linked");

    // Every key rewritten, then one compacted run: the store deletes the
    // first snapshot's SSTs.
    fill(&log, &mut store, &mut model, 0..5_000, 2);
    store.flush().unwrap();
    store.db().compact_range::<&[u8], &[u8]>(None, None);
    for f in ssts(&first) {
        assert!(
            !store_dir.join(&f.path).exists(),
            "{} compacted away",
            f.path
        );
    }
    let second = rt.block_on(snapshot(&format, &store, &repo, &sk(), &log, Some(&first)));
    drop(store);
    for (m, want, name) in [(&first, &first_model, "a"), (&second, &model, "b")] {
        let (restored, _) = rt
            .block_on(restore_snapshot(&format, m, &repo, &dir.path().join(name)))
            .unwrap();
        assert_eq!(&contents(&restored), want, "snapshot {}", m.snapshot_id);
    }

    let (deleted, _) = drop_and_collect(&rt, &repo, &clock, &first);
    assert!(deleted > 0, "the first snapshot's SSTs are swept");
    let (restored, _) = rt
        .block_on(restore_snapshot(
            &format,
            &second,
            &repo,
            &dir.path().join("c"),
        ))
        .unwrap();
    assert_eq!(contents(&restored), model);
}

// ------------------------------------------------ contents: digest and counts

/// A store whose RocksDB estimate of its keys is wrong: 3000 keys, 1500 of
/// them overwritten and 200 deleted, in files that never compact (the
/// older versions and the tombstones stay). Returns the store, its log and
/// model, and RocksDB's estimate.
fn overwritten_store(dir: &Path) -> (RocksStore, FileChangelog, Model, u64) {
    let log = test_log(dir);
    let mut store = store_without_auto_compactions(dir);
    let mut model = Model::new();
    fill(&log, &mut store, &mut model, 0..3000, 1);
    store.db().flush().unwrap();
    fill(&log, &mut store, &mut model, 0..1500, 2);
    let deletes: Vec<Record> = (1500..1700).map(|i| Record::delete(key(i))).collect();
    let offsets = log.append(&deletes).unwrap();
    store.apply(&deletes, *offsets.last().unwrap()).unwrap();
    for i in 1500..1700 {
        model.remove(&key(i));
    }
    store.db().flush().unwrap();
    let estimate = store
        .db()
        .property_int_value("rocksdb.estimate-num-keys")
        .unwrap()
        .unwrap();
    (store, log, model, estimate)
}

/// By default a RocksDB snapshot records its contents' logical digest and
/// the exact key and byte counts, read from its checkpoint in the
/// background; RocksDB's own estimate (which the manifest held before)
/// differs from the truth here.
#[test]
fn a_snapshot_records_its_digest_and_exact_counts_not_rocksdbs_estimate() {
    let rt = rt();
    let dir = tempfile::tempdir().unwrap();
    let (store, log, model, estimate) = overwritten_store(dir.path());
    assert_eq!(model.len(), 2800);
    assert_ne!(estimate, model.len() as u64, "the estimate is no count");
    let (repo, _) = memory_repo();
    let format = RocksFormat::new(opts());
    let m = rt.block_on(snapshot(&format, &store, &repo, &sk(), &log, None));
    let expected = statesnap::LogicalDigest::of_pairs(model.iter().map(|(k, v)| (&k[..], &v[..])));
    assert_eq!(m.logical_digest, Some(expected));
    assert_eq!(m.logical_digest, Some(store.logical_digest().unwrap()));
    assert!(m.stats.counts_exact);
    assert_eq!(m.stats.keys, 2800);
    assert_eq!(m.exact_keys(), Some(2800));
    let logical: u64 = model.iter().map(|(k, v)| (k.len() + v.len()) as u64).sum();
    assert_eq!(m.stats.logical_bytes, logical);
    assert_eq!(m.exact_logical_bytes(), Some(logical));
    // What it records survives the repository: the committed manifest.
    let listed = rt.block_on(repo.catalog().list_snapshots(&sk())).unwrap();
    assert_eq!(listed.snapshots[0].manifest, m);

    // Turned off, the manifest holds RocksDB's estimates and says so.
    let cut = format.capture(&store).unwrap();
    let off = rt
        .block_on(statesnap::commit_snapshot_with(
            &format,
            cut,
            &repo,
            &sk(),
            &log,
            Some(&m),
            &statesnap::SnapshotOptions {
                logical_digest: Some(false),
                ..Default::default()
            },
        ))
        .unwrap();
    assert_eq!(off.logical_digest, None);
    assert!(!off.stats.counts_exact);
    assert_eq!(off.exact_keys(), None);
    assert_eq!(off.exact_logical_bytes(), None);
}

/// A manifest whose recorded digest was altered and resealed: every blob
/// and the manifest's own checksum check out, the snapshot restores — and
/// only the digest comparison of `verify_deep` catches that its contents
/// are not what the manifest says. (Before snapshots recorded a digest by
/// default, a RocksDB snapshot had nothing to compare.)
#[test]
fn a_digest_that_disagrees_with_intact_blobs_is_caught_by_verify_deep_only() {
    use statesnap::repo::VerifyOptions;
    use statesnap::restore::{DigestCheck, verify_deep};
    let rt = rt();
    let dir = tempfile::tempdir().unwrap();
    let (store, log, _model, _) = overwritten_store(dir.path());
    let (repo, base) = memory_repo();
    let format = RocksFormat::new(opts());
    let m = rt.block_on(snapshot(&format, &store, &repo, &sk(), &log, None));
    let scratch = dir.path().join("scratch");
    let deep = rt
        .block_on(verify_deep(&format, &repo, &m, &scratch))
        .unwrap();
    assert_eq!(deep.digest_check(), DigestCheck::Matched);
    assert!(deep.is_ok());

    // Alter one hex digit of the digest's sum (the key count stays), and
    // recompute the manifest's checksum, as a buggy writer would have.
    let recorded = m.logical_digest.unwrap().to_string();
    let last = recorded.chars().last().unwrap();
    let altered = format!(
        "{}{}",
        &recorded[..recorded.len() - 1],
        if last == '0' { '1' } else { '0' }
    );
    let mut v: serde_json::Value = serde_json::from_slice(&m.encode().unwrap()).unwrap();
    v["logical_digest"] = altered.clone().into();
    let body = Manifest::canonical_body(&v).unwrap();
    v["checksum"] = blake3::hash(&body).to_hex().to_string().into();
    rt.block_on(base.put(&m.key(), serde_json::to_vec(&v).unwrap().into()))
        .unwrap();

    let lying = rt
        .block_on(repo.catalog().list_snapshots(&sk()))
        .unwrap()
        .snapshots
        .pop()
        .unwrap()
        .manifest;
    assert_eq!(lying.logical_digest.unwrap().to_string(), altered);
    let blobs = rt
        .block_on(
            repo.maintenance()
                .verify(&VerifyOptions::default(), &|_| {}),
        )
        .unwrap();
    assert!(blobs.is_ok(), "every blob is intact: {blobs:?}");
    let deep = rt
        .block_on(verify_deep(&format, &repo, &lying, &scratch))
        .unwrap();
    assert_eq!(deep.digest_check(), DigestCheck::Mismatch);
    assert!(deep.found_mismatch());
    assert!(!deep.is_ok());
    assert_eq!(Some(deep.actual), m.logical_digest);
}
