//! The whole-lifecycle simulation (invariants 1-11 of docs/architecture.md at once).
//!
//! A seeded, deterministic driver runs random sequences of: put / delete /
//! commit; snapshots (full, incremental, delta) through a fault-injecting
//! object store; retention + gc; process crashes and power losses that cut
//! the file log's unsynced tail (per fsync policy); a disk that loses synced
//! records of the log (the epoch history must then refuse every snapshot
//! of the lost stretch); losing the local store;
//! restores, of the newest state and of random points in time (exact or
//! refused); recreating the changelog (new lineage); a second writer on the
//! same log; compaction past the tombstone horizon. After every step it
//! checks the live store against a model of the changelog, and at restore
//! and verify steps that every restorable snapshot equals the model at its
//! offset. Three store/format pairs: MemoryStore + portable, RocksStore +
//! RocksDB format, RocksStore + portable.
//!
//! `STATESNAP_SIM_SEEDS` (default 1000) sets how many seeds run,
//! `STATESNAP_SIM_SEED=n` runs one seed (a failure prints the line to
//! replay it), `STATESNAP_SIM_STEPS` the steps per seed (default 60).
#![allow(clippy::unwrap_used)]

use crate::common;

use bytes::Bytes;
use object_store::ObjectStore;
use object_store::memory::InMemory;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use statesnap::ErrorKind;
use statesnap::changelog::file::{
    CompactOptions, FileChangelog, FileChangelogOptions, FsyncPolicy,
};
use statesnap::changelog::{Changelog, ChangelogId, Record};
use statesnap::clock::{Clock, ManualClock, SystemClock};
use statesnap::commit_snapshot;
use statesnap::format::portable::PortableFormat;
use statesnap::format::{RestoreContext, StoreFormat};
use statesnap::repo::faulty::{FaultConfig, FaultyStore};
use statesnap::repo::{
    GcOptions, Manifest, Repository, RetentionPolicy, SeededEntropy, SnapshotId, StoreKey,
};
use statesnap::restore::{ReplayOptions, RestoreOptions, restore_store};
use statesnap::store::LoggedStore;
use statesnap::store::MemoryStore;
use statesnap::store::StateStore;

type Log = Arc<FileChangelog>;

use common::{Kv, Rng, contents};

/// One store type with its format, as the simulation needs it.
trait Kind {
    type F: StoreFormat;
    const NAME: &'static str;
    fn format() -> Self::F;
    /// Opens the local store at `dir` after a crash (`None`: it was lost).
    fn reopen(dir: &Path) -> Option<<Self::F as StoreFormat>::Store>;
    /// Whether the format's incremental state may be reset (full snapshot).
    fn forget(_f: &Self::F) {}
}

struct MemPortable;
impl Kind for MemPortable {
    type F = PortableFormat<MemoryStore>;
    const NAME: &'static str = "memory+portable";
    fn format() -> Self::F {
        PortableFormat::memory()
    }
    fn reopen(_dir: &Path) -> Option<MemoryStore> {
        None // a process crash loses memory
    }
    fn forget(f: &Self::F) {
        f.forget_last_cut();
    }
}

#[cfg(feature = "rocksdb")]
mod rocks_kinds {
    use super::*;
    use statesnap::format::rocks::RocksFormat;
    use statesnap::store::{RocksOptions, RocksStore};

    pub fn opts() -> RocksOptions {
        RocksOptions {
            write_buffer_bytes: 64 << 10,
            block_cache_bytes: 1 << 20,
            background_jobs: 2,
            ..RocksOptions::default()
        }
    }

    pub struct RocksRocks;
    impl Kind for RocksRocks {
        type F = RocksFormat;
        const NAME: &'static str = "rocksdb+rocksdb";
        fn format() -> RocksFormat {
            RocksFormat::new(opts())
        }
        fn reopen(dir: &Path) -> Option<RocksStore> {
            dir.exists()
                .then(|| RocksStore::open(dir, &opts()).unwrap())
        }
    }

    pub struct RocksPortable;
    impl Kind for RocksPortable {
        type F = PortableFormat<RocksStore>;
        const NAME: &'static str = "rocksdb+portable";
        fn format() -> Self::F {
            PortableFormat::new(|p: &Path| RocksStore::open(p, &opts()))
        }
        fn reopen(dir: &Path) -> Option<RocksStore> {
            dir.exists()
                .then(|| RocksStore::open(dir, &opts()).unwrap())
        }
    }
}

/// The changelog's state after offset `o` (inclusive), from the model.
fn state_at(records: &[Record], o: Option<u64>) -> Kv {
    let mut m = Kv::new();
    let n = o.map_or(0, |o| o as usize + 1);
    for r in &records[..n.min(records.len())] {
        match &r.value {
            Some(v) => m.insert(r.key.clone(), v.clone()),
            None => m.remove(&r.key),
        };
    }
    m
}

fn sk() -> StoreKey {
    StoreKey::new("sim", "store", 0).unwrap()
}

fn id() -> ChangelogId {
    StoreKey::new("sim", "store", 0).unwrap().changelog_id()
}

struct Sim<K: Kind> {
    rng: Rng,
    seed: u64,
    dir: tempfile::TempDir,
    clock: ManualClock,
    fsync: FsyncPolicy,
    log: Option<Log>,
    ls: Option<LoggedStore<<K::F as StoreFormat>::Store, Log>>,
    format: K::F,
    /// Every record of the current incarnation, by offset.
    records: Vec<Record>,
    pending: BTreeMap<Bytes, Option<Bytes>>,
    /// Records known durable, and the last segment's size then.
    synced: (usize, Option<(PathBuf, u64)>),
    faults: Arc<FaultyStore>,
    repo: Repository,
    /// Snapshots of history the log lost (a disk lost synced records after
    /// they were taken): never restorable again.
    lost: BTreeSet<SnapshotId>,
    trace: Vec<String>,
}

impl<K: Kind> Sim<K>
where
    <K::F as StoreFormat>::Store: 'static,
{
    fn new(seed: u64) -> Self {
        let mut rng = Rng(seed);
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::new(SystemClock.now_ms());
        let fsync = match rng.below(3) {
            0 => FsyncPolicy::EveryBatch,
            1 => FsyncPolicy::Never,
            _ => FsyncPolicy::Interval(Duration::from_secs(5)),
        };
        let faults = Arc::new(FaultyStore::new(
            Arc::new(InMemory::new()),
            FaultConfig {
                seed,
                ..FaultConfig::default()
            },
        ));
        let repo = Repository::from_store(Arc::clone(&faults) as Arc<dyn ObjectStore>, "")
            .unwrap()
            .with_clock(Arc::new(clock.clone()))
            .with_entropy(Arc::new(SeededEntropy::new(seed)));
        let mut sim = Sim {
            rng,
            seed,
            dir,
            clock,
            fsync,
            log: None,
            ls: None,
            format: K::format(),
            records: Vec::new(),
            pending: BTreeMap::new(),
            synced: (0, None),
            faults,
            repo,
            lost: BTreeSet::new(),
            trace: Vec::new(),
        };
        sim.open_log();
        sim
    }

    fn log_dir(&self) -> PathBuf {
        self.dir.path().join("log")
    }

    fn store_dir(&self) -> PathBuf {
        self.dir.path().join("store")
    }

    fn open_log(&mut self) {
        let log = FileChangelog::open(
            self.log_dir(),
            id(),
            FileChangelogOptions {
                segment_bytes: 4 << 10,
                fsync: self.fsync,
                clock: Arc::new(self.clock.clone()),
                ..FileChangelogOptions::default()
            },
        )
        .unwrap();
        self.log = Some(Arc::new(log));
    }

    fn log(&self) -> &Log {
        self.log.as_ref().unwrap()
    }

    fn faults_on(&mut self) {
        let p = if self.rng.chance(40) { 0.05 } else { 0.0 };
        self.faults.set_config(FaultConfig {
            seed: self.rng.next(),
            error_probability: p,
            lost_ack_probability: p / 2.0,
            truncate_probability: p / 2.0,
            ..FaultConfig::default()
        });
    }

    fn faults_off(&mut self) {
        self.faults.set_config(FaultConfig::default());
    }

    /// Records what the model expects to be durable now (after a flush,
    /// or every commit under `EveryBatch`); power losses never cut below
    /// what the log itself reports synced.
    fn mark_synced(&mut self) {
        let tail = self.log().durable_tail().unwrap();
        self.synced = (self.records.len(), Some(tail));
    }

    /// A `LoggedStore` over the local store, reopened or restored as needed.
    fn ensure_open(&mut self, rt: &tokio::runtime::Runtime) {
        if self.ls.is_some() {
            return;
        }
        if let Some(store) = K::reopen(&self.store_dir()) {
            match LoggedStore::new(store, Arc::clone(self.log())) {
                Ok(mut ls) => match ls.catch_up(&ReplayOptions { batch_size: 7 }) {
                    Ok(_) => {
                        self.trace.push("reopened local store".into());
                        self.ls = Some(ls);
                        return;
                    }
                    Err(e) => {
                        assert_eq!(e.kind(), ErrorKind::Stale, "{e}");
                        self.trace
                            .push(format!("local store refused on catch-up: {e}"));
                    }
                },
                Err(e) => {
                    assert_eq!(e.kind(), ErrorKind::Stale, "{e}");
                    self.trace.push(format!("local store refused: {e}"));
                }
            }
        }
        self.restore(rt);
    }

    fn restore(&mut self, rt: &tokio::runtime::Runtime) {
        self.ls = None;
        self.faults_off();
        let log = Arc::clone(self.log());
        let (store, report) = rt
            .block_on(restore_store(
                &self.format,
                &self.repo,
                &sk(),
                &*log,
                &self.store_dir(),
                &RestoreOptions::default(),
            ))
            .unwrap();
        self.trace.push(format!(
            "restored from {:?} at {:?} + {} records; skipped {}",
            report.snapshot,
            report.snapshot_offset,
            report.replay.records,
            report.skipped.len()
        ));
        // Nothing usable is skipped for a reason other than the log's
        // horizon or lineage.
        for s in &report.skipped {
            assert_eq!(s.kind, ErrorKind::Stale, "skipped {s:?}");
        }
        assert!(
            report.snapshot.is_none_or(|id| !self.lost.contains(&id)),
            "restored from {:?}, a snapshot of history the log lost",
            report.snapshot
        );
        let end = self.records.len() as u64;
        assert_eq!(store.applied_offset().unwrap(), end.checked_sub(1));
        assert_eq!(
            contents(&store),
            state_at(&self.records, end.checked_sub(1))
        );
        self.ls = Some(LoggedStore::new(store, log).unwrap());
    }

    fn check_live(&self) {
        if let Some(ls) = &self.ls {
            let a = ls.store().applied_offset().unwrap();
            assert!(
                a.is_none_or(|a| (a as usize) < self.records.len()),
                "store at {a:?} beyond the log's {} records",
                self.records.len()
            );
            assert_eq!(
                contents(ls.store()),
                state_at(&self.records, a),
                "live store at {a:?}"
            );
        }
    }

    /// Restores every current-lineage snapshot (up to 3 at random) on its
    /// own and compares it with the model at its offset.
    fn verify_snapshots(&mut self, rt: &tokio::runtime::Runtime) {
        self.faults_off();
        let lineage = self.log().lineage().unwrap();
        let listing = rt
            .block_on(self.repo.catalog().list_snapshots(&sk()))
            .unwrap();
        // The fault-injecting store can leave a truncated manifest behind
        // a failed conditional put (real stores do not): it must read as
        // corrupt, and is then never used.
        assert!(
            listing
                .unreadable
                .iter()
                .all(|u| u.kind == ErrorKind::Corrupt),
            "{:?}",
            listing.unreadable
        );
        let ours: Vec<&Manifest> = listing
            .snapshots
            .iter()
            .map(|s| &s.manifest)
            .filter(|m| m.changelog.lineage == lineage && !self.lost.contains(&m.snapshot_id))
            .collect();
        for m in &ours {
            // Invariant 11: no snapshot beyond what the log holds.
            assert!(
                (m.changelog.offset as usize) < self.records.len(),
                "snapshot {} at {} beyond the log's {} records",
                m.snapshot_id,
                m.changelog.offset,
                self.records.len()
            );
        }
        for _ in 0..ours.len().min(3) {
            let m = ours[self.rng.below(ours.len() as u64) as usize];
            if m.store_format.name != self.format.id().name {
                continue;
            }
            let scratch = self.dir.path().join(format!("verify-{}", self.rng.next()));
            let (store, _) = rt
                .block_on(self.format.restore(
                    m,
                    RestoreContext {
                        repo: &self.repo,
                        target: &scratch,
                    },
                ))
                .unwrap_or_else(|e| {
                    panic!("committed snapshot {} does not restore: {e}", m.snapshot_id)
                });
            assert_eq!(
                contents(&store),
                state_at(&self.records, Some(m.changelog.offset)),
                "snapshot {} at {}",
                m.snapshot_id,
                m.changelog.offset
            );
            drop(store);
            let _ = std::fs::remove_dir_all(&scratch);
        }
    }

    /// Restores the state at a random offset (sometimes past the log's
    /// end) into a scratch directory: it equals the model at that offset,
    /// or is refused — `config` past the end, `stale` where compaction may
    /// have removed what the replay up to it needs.
    fn point_in_time(&mut self, rt: &tokio::runtime::Runtime) {
        self.faults_off();
        let end = self.records.len() as u64;
        let until = if end == 0 || self.rng.chance(10) {
            end + self.rng.below(3)
        } else {
            self.rng.below(end)
        };
        let scratch = self.dir.path().join(format!("pit-{}", self.rng.next()));
        let log = Arc::clone(self.log());
        let options = RestoreOptions {
            until: Some(until),
            ..RestoreOptions::default()
        };
        let result = rt.block_on(restore_store(
            &self.format,
            &self.repo,
            &sk(),
            &*log,
            &scratch,
            &options,
        ));
        match result {
            Ok((store, report)) => {
                assert!(
                    until < end,
                    "point in time {until} past the end {end} answered"
                );
                assert_eq!(
                    contents(&store),
                    state_at(&self.records, Some(until)),
                    "point in time {until} from {:?}",
                    report.source
                );
                self.trace.push(format!(
                    "point in time {until}: from {} + {} records",
                    report.source, report.replay.records
                ));
            }
            Err(e) if until >= end => {
                assert_eq!(e.kind(), ErrorKind::Config, "{e}");
                self.trace
                    .push(format!("point in time {until}: past the end"));
            }
            Err(e) => {
                assert_eq!(e.kind(), ErrorKind::Stale, "point in time {until}: {e}");
                let h = log.horizon().unwrap();
                assert!(
                    until + 1 < h.superseded_before || !h.can_resume_after(None),
                    "point in time {until} refused on a log compaction did not overtake: {h:?} {e}"
                );
                self.trace.push(format!("point in time {until}: refused"));
            }
        }
        let _ = std::fs::remove_dir_all(&scratch);
    }

    fn step(&mut self, rt: &tokio::runtime::Runtime) {
        let op = self.rng.below(100);
        match op {
            0..=34 => {
                self.ensure_open(rt);
                let k = Bytes::from(format!("k{:02}", self.rng.below(40)));
                let put = self.rng.chance(75);
                let v = Bytes::from(
                    format!("v{}", self.rng.next() % 1000).repeat(1 + self.rng.below(20) as usize),
                );
                let ls = self.ls.as_mut().unwrap();
                if put {
                    ls.put(k.clone(), v.clone());
                    self.pending.insert(k, Some(v));
                } else {
                    ls.delete(k.clone());
                    self.pending.insert(k, None);
                }
            }
            35..=54 => self.commit(rt),
            55..=66 => self.snapshot(rt),
            67..=70 => self.gc(rt),
            71..=74 => self.crash(rt, false),
            75 => self.crash(rt, true),
            76..=77 => {
                self.trace.push("lose the local store".into());
                self.ls = None;
                self.pending.clear();
                let _ = std::fs::remove_dir_all(self.store_dir());
                self.restore(rt);
            }
            78..=82 => {
                self.pending.clear();
                self.restore(rt);
            }
            83..=85 => self.verify_snapshots(rt),
            86..=87 => self.point_in_time(rt),
            88 => self.recreate_log(rt),
            89..=93 => self.second_writer(rt),
            _ => self.compact(),
        }
        self.check_live();
    }

    fn commit(&mut self, rt: &tokio::runtime::Runtime) {
        self.ensure_open(rt);
        let r = self.ls.as_mut().unwrap().commit();
        match r {
            Ok(Some(info)) => {
                assert_eq!(
                    info.first_offset as usize,
                    self.records.len(),
                    "batch offset"
                );
                for (k, v) in std::mem::take(&mut self.pending) {
                    self.records.push(Record { key: k, value: v });
                }
                assert_eq!(info.last_offset as usize + 1, self.records.len());
                if self.fsync == FsyncPolicy::EveryBatch {
                    self.mark_synced();
                }
            }
            Ok(None) => assert!(self.pending.is_empty()),
            Err(e) => {
                // The store was behind (another writer appended) and the
                // records it missed are below the horizon now: the batch is
                // in the log, the store must be restored.
                assert_eq!(e.kind(), ErrorKind::Stale, "{e}");
                let end = self.log().end_offset().unwrap() as usize;
                assert_eq!(end, self.records.len() + self.pending.len(), "{e}");
                for (k, v) in std::mem::take(&mut self.pending) {
                    self.records.push(Record { key: k, value: v });
                }
                self.trace
                    .push(format!("commit on a store below the horizon: {e}"));
                self.restore(rt);
            }
        }
    }

    fn snapshot(&mut self, rt: &tokio::runtime::Runtime) {
        self.ensure_open(rt);
        if self
            .ls
            .as_ref()
            .unwrap()
            .store()
            .applied_offset()
            .unwrap()
            .is_none()
        {
            return;
        }
        if self.rng.chance(20) {
            K::forget(&self.format);
        }
        let lineage = self.log().lineage().unwrap();
        self.faults_off();
        let listing = rt
            .block_on(self.repo.catalog().list_snapshots(&sk()))
            .unwrap();
        let parent = listing
            .snapshots
            .iter()
            .rev()
            .map(|s| s.manifest.clone())
            .find(|m| m.changelog.lineage == lineage);
        let cut = self
            .format
            .capture(self.ls.as_ref().unwrap().store())
            .unwrap();
        self.faults_on();
        let log = Arc::clone(self.log());
        let r = rt.block_on(commit_snapshot(
            &self.format,
            cut,
            &self.repo,
            &sk(),
            &*log,
            parent.as_ref(),
        ));
        self.faults_off();
        match r {
            Ok(m) => {
                self.trace.push(format!(
                    "snapshot {} at {}",
                    m.snapshot_id, m.changelog.offset
                ));
                assert_eq!(
                    Some(m.changelog.offset),
                    self.ls.as_ref().unwrap().store().applied_offset().unwrap()
                );
                self.mark_synced();
            }
            Err(e) => {
                self.trace.push(format!("snapshot failed: {e}"));
                // A lost acknowledgement: the manifest may be committed all
                // the same — and then the log was flushed before it.
                let now = rt
                    .block_on(self.repo.catalog().list_snapshots(&sk()))
                    .unwrap();
                if now.snapshots.len() > listing.snapshots.len()
                    || now
                        .snapshots
                        .iter()
                        .any(|s| !listing.snapshots.iter().any(|o| o.id() == s.id()))
                {
                    self.trace.push("... but its manifest was committed".into());
                    self.mark_synced();
                }
                assert!(
                    matches!(
                        e.kind(),
                        ErrorKind::Transient
                            | ErrorKind::Stale
                            | ErrorKind::Corrupt
                            | ErrorKind::AlreadyExists
                            | ErrorKind::NotFound
                    ),
                    "unexpected snapshot error: {e}"
                );
            }
        }
    }

    fn gc(&mut self, rt: &tokio::runtime::Runtime) {
        self.faults_off();
        let keep_last = 1 + self.rng.below(3) as usize;
        self.clock.advance_ms(2 * 3_600_000);
        let r = rt
            .block_on(self.repo.maintenance().gc_store(
                &sk(),
                &GcOptions {
                    retention: Some(RetentionPolicy {
                        keep_last: Some(keep_last),
                        keep_newer_than: None,
                    }),
                    ..GcOptions::default()
                },
            ))
            .unwrap();
        self.trace.push(format!(
            "gc keep_last={keep_last}: {} manifests deleted",
            r.manifests_deleted.len()
        ));
    }

    /// A process crash, or (when the log does not sync every batch) a
    /// power loss that cuts the log's unsynced tail at a random byte, or
    /// (`disk_loss`) a disk that loses synced bytes of the last segment too.
    fn crash(&mut self, rt: &tokio::runtime::Runtime, disk_loss: bool) {
        self.ls = None;
        self.pending.clear();
        self.format = K::format();
        let power_loss = disk_loss || (self.fsync == FsyncPolicy::Never && self.rng.chance(50));
        let last = self.log().segment_paths().unwrap().pop();
        // What the log itself has synced, not what the model expects: a
        // snapshot over records the log never synced must show up here.
        let (durable_path, synced_len) = self.log().durable_tail().unwrap();
        self.log = None;
        if power_loss
            && let Some(last) = last
            && (disk_loss || last == durable_path)
        {
            let len = std::fs::metadata(&last).unwrap().len();
            // A segment header is 32 bytes; a disk loss cuts anywhere after it.
            let floor = if disk_loss { 32.min(len) } else { synced_len };
            let cut = floor + self.rng.below(len - floor + 1);
            let f = std::fs::OpenOptions::new().write(true).open(&last).unwrap();
            f.set_len(cut).unwrap();
            self.trace.push(format!(
                "{}: {} cut to {cut} of {len} bytes",
                if disk_loss { "disk loss" } else { "power loss" },
                last.display()
            ));
        } else {
            self.trace.push("process crash".into());
        }
        self.open_log();
        let end = self.log().end_offset().unwrap() as usize;
        // Invariant 11: no committed snapshot of this incarnation names an
        // offset the log no longer holds.
        self.faults_off();
        let lineage = self.log().lineage().unwrap();
        let listing = rt
            .block_on(self.repo.catalog().list_snapshots(&sk()))
            .unwrap();
        for s in &listing.snapshots {
            if disk_loss && s.manifest.changelog.lineage == lineage && s.offset() as usize >= end {
                // What the disk took, the log hands out again: these
                // snapshots must never be restored or used as a base.
                self.lost.insert(s.id());
            }
            if s.manifest.changelog.lineage == lineage && !self.lost.contains(&s.id()) {
                assert!(
                    (s.offset() as usize) < end,
                    "snapshot {} at {} covers records the power loss took (log end {end})",
                    s.id(),
                    s.offset()
                );
            }
        }
        if self.fsync == FsyncPolicy::EveryBatch && !disk_loss {
            assert!(
                end >= self.synced.0,
                "the log lost synced records: end {end} < {}",
                self.synced.0
            );
        }
        assert!(end <= self.records.len());
        if !power_loss {
            assert_eq!(end, self.records.len(), "a process crash loses nothing");
        }
        self.records.truncate(end);
        if disk_loss {
            self.synced = (self.synced.0.min(end), None);
        }
        self.ensure_open(rt);
    }

    fn recreate_log(&mut self, rt: &tokio::runtime::Runtime) {
        self.trace.push("recreate the changelog".into());
        let had_records = !self.records.is_empty();
        self.ls = None;
        self.pending.clear();
        self.log = None;
        std::fs::remove_dir_all(self.log_dir()).unwrap();
        self.open_log();
        self.records.clear();
        self.synced = (0, None);
        if had_records && let Some(store) = K::reopen(&self.store_dir()) {
            let applied = store.applied_offset().unwrap();
            let Err(err) = LoggedStore::new(store, Arc::clone(self.log())) else {
                panic!("a store of the old incarnation (at {applied:?}) was accepted");
            };
            assert_eq!(err.kind(), ErrorKind::Stale, "{err} (store at {applied:?})");
        }
        self.restore(rt);
    }

    fn second_writer(&mut self, rt: &tokio::runtime::Runtime) {
        self.ensure_open(rt);
        let mut other = LoggedStore::new(MemoryStore::new(), Arc::clone(self.log())).unwrap();
        let n = 1 + self.rng.below(3);
        let mut batch = BTreeMap::new();
        for _ in 0..n {
            let k = Bytes::from(format!("k{:02}", self.rng.below(40)));
            let v = Bytes::from(format!("other-{}", self.rng.next() % 100));
            other.put(k.clone(), v.clone());
            batch.insert(k, Some(v));
        }
        let info = other.commit().unwrap().unwrap();
        assert_eq!(info.first_offset as usize, self.records.len());
        for (k, v) in batch {
            self.records.push(Record { key: k, value: v });
        }
        assert_eq!(
            contents(other.store()),
            state_at(&self.records, Some(info.last_offset))
        );
        if self.fsync == FsyncPolicy::EveryBatch {
            self.mark_synced();
        }
        self.trace
            .push(format!("second writer wrote {n} at {}", info.first_offset));
    }

    fn compact(&mut self) {
        self.clock.advance_ms(3_600_000);
        let r = self
            .log()
            .compact(&CompactOptions {
                delete_retention: Duration::from_secs(600),
            })
            .unwrap();
        let h = self.log().horizon().unwrap();
        self.trace.push(format!(
            "compact: {} segments, horizon {:?}",
            r.segments_rewritten, h
        ));
    }

    fn finish(&mut self, rt: &tokio::runtime::Runtime) {
        self.pending.clear();
        self.verify_snapshots(rt);
        let _ = std::fs::remove_dir_all(self.store_dir());
        self.restore(rt);
    }
}

fn run_seed<K: Kind>(seed: u64, steps: usize, rt: &tokio::runtime::Runtime)
where
    <K::F as StoreFormat>::Store: 'static,
{
    let mut sim = Sim::<K>::new(seed);
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        for _ in 0..steps {
            sim.step(rt);
        }
        sim.finish(rt);
    }));
    if let Err(p) = result {
        eprintln!(
            "simulation failed: kind={} seed={seed} fsync={:?}; replay with \
             STATESNAP_SIM_SEED={seed} cargo test --release --all-features --test integration simulation::\n\
             last steps:\n  {}",
            K::NAME,
            sim.fsync,
            sim.trace
                .iter()
                .rev()
                .take(15)
                .rev()
                .cloned()
                .collect::<Vec<_>>()
                .join("\n  ")
        );
        std::panic::resume_unwind(p);
    }
    let _ = sim.seed;
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[test]
fn whole_lifecycle_simulation() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let steps = env_u64("STATESNAP_SIM_STEPS", 60) as usize;
    let seeds: Vec<u64> = match std::env::var("STATESNAP_SIM_SEED") {
        Ok(s) => vec![s.parse().unwrap()],
        Err(_) => (0..env_u64("STATESNAP_SIM_SEEDS", 1000)).collect(),
    };
    for seed in seeds {
        // Every tenth seed on RocksDB (either format), the rest on memory:
        // RocksDB opens dominate the time.
        match seed % 10 {
            #[cfg(feature = "rocksdb")]
            3 => run_seed::<rocks_kinds::RocksRocks>(seed, steps, &rt),
            #[cfg(feature = "rocksdb")]
            7 => run_seed::<rocks_kinds::RocksPortable>(seed, steps, &rt),
            _ => run_seed::<MemPortable>(seed, steps, &rt),
        }
    }
}
