//! Resharding N store partitions into M: exact placement, exact contents,
//! ready-to-run targets, refusals that change nothing, and resumable runs.
#![cfg(feature = "rocksdb")]
#![allow(clippy::unwrap_used)]

use crate::common;

use bytes::Bytes;
use proptest::prelude::*;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use statesnap::changelog::file::{FileChangelog, FileChangelogOptions, FsyncPolicy};
use statesnap::changelog::{Changelog, Record};
use statesnap::format::StoreFormat;
use statesnap::repo::{Repository, StoreKey};
use statesnap::reshard::{
    FnPartitioner, Murmur2, PARTITION_LOCAL_PREFIX, Partitioner, ReshardOptions, ReshardReport,
    SourcePartition, TargetPartition, reshard,
};
use statesnap::restore::{RestoreOptions, Source, restore_store};
use statesnap::store::LoggedStore;
use statesnap::{ErrorKind, LogicalDigest, PortableFormat, Reason, RocksFormat};

use common::Kv;

/// Which format a side of the reshard uses.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Memory,
    Rocks,
}

fn log_options() -> FileChangelogOptions {
    FileChangelogOptions {
        fsync: FsyncPolicy::Never,
        segment_bytes: 64 << 10,
        ..FileChangelogOptions::default()
    }
}

fn open_log(dir: &Path, key: &StoreKey) -> FileChangelog {
    FileChangelog::open(dir, key.changelog_id(), log_options()).unwrap()
}

/// Source partitions `shop/carts/0..n`, each with a changelog, a snapshot
/// and a tail after it, written as a keyed producer would place them.
struct Sources {
    root: tempfile::TempDir,
    repo: Repository,
    keys: Vec<StoreKey>,
    logs: Vec<FileChangelog>,
    /// The state of each source at its log's end.
    models: Vec<Kv>,
}

impl Sources {
    /// `n` partitions in `kind`, `writes` writes spread over `key_space`
    /// keys (a tenth of them deletes), a snapshot after three quarters.
    async fn new(kind: Kind, n: u32, writes: u32, key_space: u32, seed: u64) -> Sources {
        let root = tempfile::tempdir().unwrap();
        let repo = Repository::init(
            &format!("file://{}", root.path().join("repo").display()),
            Default::default(),
        )
        .await
        .unwrap();
        let keys: Vec<StoreKey> = (0..n)
            .map(|p| StoreKey::new("shop", "carts", p).unwrap())
            .collect();
        let mut s = Sources {
            logs: keys
                .iter()
                .map(|k| open_log(&root.path().join(format!("log-{k}")), k))
                .collect(),
            root,
            repo,
            keys,
            models: vec![Kv::new(); n as usize],
        };
        let workload = Workload {
            writes,
            key_space,
            seed,
        };
        match kind {
            Kind::Memory => s.fill(&PortableFormat::memory(), workload).await,
            Kind::Rocks => s.fill(&RocksFormat::default(), workload).await,
        }
        s
    }

    async fn fill<F: StoreFormat>(&mut self, format: &F, load: Workload) {
        let Workload {
            writes,
            key_space,
            seed,
        } = load;
        let Sources {
            root,
            repo,
            keys,
            logs,
            models,
        } = self;
        let mut rng = common::xorshift(seed | 1);
        let n = keys.len() as u32;
        let mut stores = Vec::new();
        for (k, log) in keys.iter().zip(logs.iter()) {
            let store = format
                .create_empty(&root.path().join(format!("writer-{k}")))
                .unwrap();
            stores.push(LoggedStore::new(store, log).unwrap());
        }
        for w in 0..writes {
            let key = Bytes::from(format!("user-{:06}", rng() % u64::from(key_space)));
            let p = Murmur2.partition(&key, n) as usize;
            if rng().is_multiple_of(10) {
                stores[p].delete(key.clone());
                models[p].remove(&key);
            } else {
                let value = Bytes::from(format!("v{w}-{}", rng() % 1000));
                stores[p].put(key.clone(), value.clone());
                models[p].insert(key, value);
            }
            if w % 500 == 499 {
                stores.iter_mut().for_each(|s| {
                    s.commit().unwrap();
                });
            }
            if w == writes * 3 / 4 {
                for (s, k) in stores.iter_mut().zip(keys.iter()) {
                    s.commit().unwrap();
                    let cut = format.capture(s.store()).unwrap();
                    statesnap::commit_snapshot(format, cut, repo, k, s.changelog(), None)
                        .await
                        .unwrap();
                }
            }
        }
        for s in &mut stores {
            s.commit().unwrap();
        }
    }

    fn partitions(&self) -> Vec<SourcePartition<'_>> {
        SourcePartition::zip(&self.keys, &self.logs)
    }

    fn union(&self) -> Kv {
        self.models
            .iter()
            .flatten()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }
}

/// What the sources' writers do.
#[derive(Debug, Clone, Copy)]
struct Workload {
    writes: u32,
    key_space: u32,
    seed: u64,
}

/// Target partitions `shop2/carts/0..m` with new, empty changelogs.
struct Targets<C = FileChangelog> {
    keys: Vec<StoreKey>,
    logs: Vec<C>,
    dir: PathBuf,
}

impl Targets {
    fn new(root: &Path, app: &str, m: u32) -> Targets {
        let dir = root.join(format!("targets-{app}"));
        let keys: Vec<StoreKey> = (0..m)
            .map(|p| StoreKey::new(app, "carts", p).unwrap())
            .collect();
        let logs = keys
            .iter()
            .map(|k| open_log(&dir.join(format!("log-{k}")), k))
            .collect();
        Targets { keys, logs, dir }
    }
}

impl<C: Changelog> Targets<C> {
    fn partitions(&self) -> Vec<TargetPartition<'_>> {
        TargetPartition::zip(&self.keys, &self.logs)
    }

    fn end_offsets(&self) -> Vec<u64> {
        self.logs.iter().map(|l| l.end_offset().unwrap()).collect()
    }
}

async fn run<C: Changelog>(
    s: &Sources,
    source: Kind,
    t: &Targets<C>,
    target: Kind,
    options: &ReshardOptions,
) -> statesnap::Result<ReshardReport> {
    let scratch = s.root.path().join(format!("scratch-{}", ulid::Ulid::new()));
    let (sources, targets) = (s.partitions(), t.partitions());
    let r = match (source, target) {
        (Kind::Memory, Kind::Memory) => {
            let (f, g) = (PortableFormat::memory(), PortableFormat::memory());
            reshard(&s.repo, &f, &sources, &g, &targets, &scratch, options).await
        }
        (Kind::Memory, Kind::Rocks) => {
            let (f, g) = (PortableFormat::memory(), RocksFormat::default());
            reshard(&s.repo, &f, &sources, &g, &targets, &scratch, options).await
        }
        (Kind::Rocks, Kind::Memory) => {
            let (f, g) = (RocksFormat::default(), PortableFormat::memory());
            reshard(&s.repo, &f, &sources, &g, &targets, &scratch, options).await
        }
        (Kind::Rocks, Kind::Rocks) => {
            let (f, g) = (RocksFormat::default(), RocksFormat::default());
            reshard(&s.repo, &f, &sources, &g, &targets, &scratch, options).await
        }
    };
    assert!(!scratch.exists(), "the scratch directory is removed");
    r
}

/// What target `j` holds when opened the way the new application opens
/// it, and how many records that open replayed.
async fn open_target<C: Changelog>(
    s: &Sources,
    t: &Targets<C>,
    kind: Kind,
    j: usize,
) -> (Kv, u64, Source) {
    let dir = t.dir.join(format!("open-{j}-{}", ulid::Ulid::new()));
    let o = RestoreOptions::default();
    let (k, l) = (&t.keys[j], &t.logs[j]);
    let (kv, report) = match kind {
        Kind::Memory => {
            let (store, r) = restore_store(&PortableFormat::memory(), &s.repo, k, l, &dir, &o)
                .await
                .unwrap();
            (common::contents(&store), r)
        }
        Kind::Rocks => {
            let (store, r) = restore_store(&RocksFormat::default(), &s.repo, k, l, &dir, &o)
                .await
                .unwrap();
            (common::contents(&store), r)
        }
    };
    (kv, report.replay.records, report.source)
}

/// Everything the reshard promises, checked against the model.
async fn check_exact<C: Changelog>(
    s: &Sources,
    t: &Targets<C>,
    target: Kind,
    r: &ReshardReport,
    p: &dyn Partitioner,
) {
    let want = s.union();
    let m = t.keys.len() as u32;
    assert_eq!(r.keys, want.len() as u64);
    let digest = LogicalDigest::of_pairs(want.iter().map(|(k, v)| (&k[..], &v[..])));
    assert_eq!(r.digest, digest, "the sources' union");
    let mut placed = LogicalDigest::new();
    let mut seen = Kv::new();
    for (j, tr) in r.targets.iter().enumerate() {
        placed.merge(&tr.digest);
        let (kv, replayed, source) = open_target(s, t, target, j).await;
        let expected: Kv = want
            .iter()
            .filter(|(k, _)| p.partition(k, m) as usize == j)
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        assert_eq!(
            kv, expected,
            "target {j} holds exactly the keys placed in it"
        );
        assert_eq!(tr.keys, kv.len() as u64);
        // Ready to run: the snapshot stands at the log's end.
        assert_eq!(replayed, 0, "target {j}'s first open replays nothing");
        if kv.is_empty() {
            assert!(tr.snapshot.is_none());
            assert!(matches!(source, Source::FullReplay));
        } else {
            assert!(matches!(source, Source::Snapshot { id, .. } if Some(id) == tr.snapshot));
        }
        // The seeded log alone rebuilds the same state.
        let (from_log, last) = common::replayed(&t.logs[j]);
        assert_eq!(
            from_log, kv,
            "target {j}'s changelog replays to its snapshot"
        );
        assert_eq!(last, tr.last_offset);
        seen.extend(kv);
    }
    assert_eq!(placed, digest, "the targets' union");
    assert_eq!(seen, want);
}

fn kind() -> impl Strategy<Value = Kind> {
    prop_oneof![Just(Kind::Memory), Just(Kind::Rocks)]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 10, ..ProptestConfig::default() })]

    /// Split and merge, any format to any format: every key lands where
    /// Kafka's partitioner sends it, with its value, and nothing else does.
    #[test]
    fn a_reshard_is_exact_for_any_counts_and_formats(
        n in 1u32..=5,
        m in 1u32..=9,
        source in kind(),
        target in kind(),
        writes in 0u32..3_000,
        seed in any::<u64>(),
    ) {
        common::rt().block_on(async {
            let s = Sources::new(source, n, writes, 800, seed).await;
            let t = Targets::new(s.root.path(), "shop2", m);
            let options = ReshardOptions { verify_replay: true, ..Default::default() };
            let r = run(&s, source, &t, target, &options).await.unwrap();
            assert!(r.targets.iter().all(|t| t.replay_verified || t.keys == 0));
            check_exact(&s, &t, target, &r, &Murmur2).await;
            for (i, sr) in r.sources.iter().enumerate() {
                assert_eq!(sr.keys, s.models[i].len() as u64);
            }
        });
    }
}

/// Where a run is stopped: refused for its input, or dropped.
#[derive(Debug, Clone)]
enum Stop {
    /// A key held by two sources, at this point of the key space.
    Duplicate(u32),
    /// A finished run's snapshots lost, then a resume whose partitioner
    /// sends this key (of the key space) elsewhere.
    OtherResume(u32),
    /// The reshard's future dropped after this many milliseconds.
    Drop(u64),
}

fn stop() -> impl Strategy<Value = Stop> {
    prop_oneof![
        (0u32..800).prop_map(Stop::Duplicate),
        (0u32..800).prop_map(Stop::OtherResume),
        (0u64..200).prop_map(Stop::Drop),
    ]
}

/// What a run must leave as it was when refused: the targets' logs, byte
/// for byte, and the repository's target snapshots.
type Untouched = (
    Vec<u64>,
    usize,
    std::collections::BTreeMap<PathBuf, common::Node>,
);

async fn targets_before(s: &Sources, t: &Targets) -> Untouched {
    let mut snapshots = 0;
    for k in &t.keys {
        snapshots += s
            .repo
            .catalog()
            .list_snapshots(k)
            .await
            .unwrap()
            .snapshots
            .len();
    }
    (t.end_offsets(), snapshots, common::tree(&t.dir))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]

    /// Refused at a random point of the input (a key held by two sources, a
    /// resume with another partitioner) the targets' logs and the
    /// repository are byte for byte as before, and once the cause is gone
    /// the run finishes exactly; dropped at a random moment, nothing of its
    /// scratch space remains once the work it started has ended.
    #[test]
    fn refusals_and_drops_leave_targets_and_directories_as_they_were(
        n in 2u32..=4,
        m in 1u32..=5,
        source in kind(),
        target in kind(),
        writes in 200u32..3_000,
        seed in any::<u64>(),
        how in stop(),
    ) {
        let mut s = common::rt().block_on(Sources::new(source, n, writes, 800, seed));
        let t = Targets::new(s.root.path(), "shop2", m);
        match how {
            Stop::Duplicate(at) => common::rt().block_on(async {
                // Put in the source Kafka's partitioner places it in, and in
                // the next one.
                let key = Bytes::from(format!("user-{at:06}"));
                let home = Murmur2.partition(&key, n) as usize;
                let other = (home + 1) % n as usize;
                for i in [home, other] {
                    s.logs[i].append(&[Record::put(key.clone(), "dup")]).unwrap();
                    s.models[i].insert(key.clone(), Bytes::from("dup"));
                }
                let before = targets_before(&s, &t).await;
                let e = run(&s, source, &t, target, &Default::default()).await.unwrap_err();
                assert_eq!(e.kind(), ErrorKind::Config, "{e}");
                assert_eq!(targets_before(&s, &t).await, before, "refused: {e}");
                // The duplicate gone from the other source: a plain run
                // finds the targets new and is exact.
                s.logs[other].append(&[Record::delete(key.clone())]).unwrap();
                s.models[other].remove(&key);
                let r = run(&s, source, &t, target, &Default::default()).await.unwrap();
                check_exact(&s, &t, target, &r, &Murmur2).await;
            }),
            Stop::OtherResume(at) => common::rt().block_on(async {
                let r = run(&s, source, &t, target, &Default::default()).await.unwrap();
                for (k, tr) in t.keys.iter().zip(&r.targets) {
                    if let Some(id) = tr.snapshot {
                        s.repo.catalog().delete_snapshot(k, id).await.unwrap();
                    }
                }
                let moved = Bytes::from(format!("user-{at:06}"));
                let held = s.union().contains_key(&moved);
                let before = targets_before(&s, &t).await;
                let other = ReshardOptions {
                    partitioner: Arc::new(FnPartitioner::new("murmur2", move |k: &[u8], n| {
                        let p = Murmur2.partition(k, n);
                        if k == &moved[..] { (p + 1) % n } else { p }
                    })),
                    resume: true,
                    ..Default::default()
                };
                match run(&s, source, &t, target, &other).await {
                    Err(e) => {
                        assert_eq!(e.kind(), ErrorKind::AlreadyExists, "{e}");
                        assert_eq!(targets_before(&s, &t).await, before, "refused: {e}");
                    }
                    // Nothing to differ on: one target, or a key no source
                    // holds.
                    Ok(_) => assert!(m == 1 || !held, "a different layout was accepted"),
                }
                let resume = ReshardOptions { resume: true, ..Default::default() };
                let r = run(&s, source, &t, target, &resume).await.unwrap();
                check_exact(&s, &t, target, &r, &Murmur2).await;
            }),
            Stop::Drop(delay_ms) => {
                let rt = common::rt();
                rt.block_on(async {
                    let o = ReshardOptions::default();
                    let work = run(&s, source, &t, target, &o);
                    let _ = tokio::time::timeout(std::time::Duration::from_millis(delay_ms), work)
                        .await;
                });
                drop(rt);
                let left: Vec<_> = std::fs::read_dir(s.root.path())
                    .unwrap()
                    .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                    .filter(|n| n.starts_with("scratch-"))
                    .collect();
                assert!(left.is_empty(), "dropped after {delay_ms} ms: {left:?} left");
            }
        }
    }
}

#[test]
fn a_users_partitioner_places_every_key() {
    common::rt().block_on(async {
        let s = Sources::new(Kind::Memory, 3, 2_000, 500, 7).await;
        let t = Targets::new(s.root.path(), "byte", 4);
        let p = FnPartitioner::new("last-byte", |k: &[u8], n| {
            u32::from(*k.last().unwrap_or(&0)) % n
        });
        let options = ReshardOptions {
            partitioner: Arc::new(p),
            ..Default::default()
        };
        let r = run(&s, Kind::Memory, &t, Kind::Rocks, &options)
            .await
            .unwrap();
        assert_eq!(r.partitioner, "last-byte");
        let p = FnPartitioner::new("last-byte", |k: &[u8], n| {
            u32::from(*k.last().unwrap_or(&0)) % n
        });
        check_exact(&s, &t, Kind::Rocks, &r, &p).await;
    });
}

#[test]
fn a_reshard_as_of_given_offsets_moves_that_state() {
    common::rt().block_on(async {
        let s = Sources::new(Kind::Rocks, 2, 2_000, 400, 11).await;
        let ends: Vec<u64> = s.logs.iter().map(|l| l.end_offset().unwrap()).collect();
        // Move on: the reshard must move the state at `ends`, not the new one.
        let late = Record::put("user-late", "x");
        s.logs[0].append(std::slice::from_ref(&late)).unwrap();
        let mut sources = s.partitions();
        for (src, end) in sources.iter_mut().zip(&ends) {
            src.until = Some(end - 1);
        }
        let t = Targets::new(s.root.path(), "asof", 3);
        let scratch = s.root.path().join("scratch-asof");
        let f = RocksFormat::default();
        let r = reshard(
            &s.repo,
            &f,
            &sources,
            &f,
            &t.partitions(),
            &scratch,
            &Default::default(),
        )
        .await
        .unwrap();
        for (sr, end) in r.sources.iter().zip(&ends) {
            assert_eq!(sr.offset, Some(end - 1));
        }
        drop(sources);
        check_exact(&s, &t, Kind::Rocks, &r, &Murmur2).await;
    });
}

/// Asserts `e` is a refusal of `kind` that left every target untouched.
fn refused<C: Changelog>(e: statesnap::Error, kind: ErrorKind, t: &Targets<C>, ends: &[u64]) {
    assert_eq!(e.kind(), kind, "{e}");
    assert_eq!(t.end_offsets(), ends, "a refusal writes nothing: {e}");
}

#[test]
fn bad_sources_and_targets_are_refused_before_anything_is_written() {
    common::rt().block_on(async {
        let s = Sources::new(Kind::Memory, 3, 1_000, 300, 3).await;
        let t = Targets::new(s.root.path(), "bad", 2);
        let zero = vec![0u64; 2];
        let scratch = s.root.path().join("scratch-bad");
        let o = ReshardOptions::default();
        let attempt = async |sources: &[SourcePartition<'_>],
                             targets: &[TargetPartition<'_>],
                             o: &ReshardOptions| {
            let f = PortableFormat::memory();
            let e = reshard(&s.repo, &f, sources, &f, targets, &scratch, o).await;
            refused(e.unwrap_err(), ErrorKind::Config, &t, &zero);
        };

        // A missing source partition (1 of 0..3).
        let mut sources = s.partitions();
        sources.remove(1);
        attempt(&sources, &t.partitions(), &o).await;
        // A partition given twice.
        let mut sources = s.partitions();
        sources[2] = sources[0];
        attempt(&sources, &t.partitions(), &o).await;
        // The target is the source store.
        let same = Targets::new(s.root.path(), "shop", 2);
        attempt(&s.partitions(), &same.partitions(), &o).await;
        // No target partitions at all.
        attempt(&s.partitions(), &[], &o).await;
        // A partitioner that answers out of range.
        let wild = ReshardOptions {
            partitioner: Arc::new(FnPartitioner::new("wild", |_: &[u8], n| n)),
            ..Default::default()
        };
        attempt(&s.partitions(), &t.partitions(), &wild).await;
        assert!(!scratch.exists());
        // A scratch directory that exists is not used.
        std::fs::create_dir_all(&scratch).unwrap();
        attempt(&s.partitions(), &t.partitions(), &o).await;
        assert!(scratch.exists(), "the caller's directory is left alone");
    });
}

#[test]
fn a_key_held_by_two_sources_is_refused() {
    common::rt().block_on(async {
        let s = Sources::new(Kind::Memory, 2, 500, 300, 5).await;
        // A producer that did not partition by key wrote the same key to both.
        for l in &s.logs {
            l.append(&[Record::put("user-dup", "x")]).unwrap();
        }
        let t = Targets::new(s.root.path(), "dup", 3);
        let e = run(&s, Kind::Memory, &t, Kind::Memory, &Default::default()).await;
        refused(e.unwrap_err(), ErrorKind::Config, &t, &[0, 0, 0]);
    });
}

/// Defect: a key held by two sources, met after whole batches had been
/// appended, was refused after writing them. The duplicate sorts last of
/// all keys: the refusal still comes before any target log, store or
/// snapshot is written, and once the duplicate is gone a plain run (not a
/// resume) finds the targets new.
#[test]
fn a_key_held_by_two_sources_found_last_is_refused_before_any_write() {
    common::rt().block_on(async {
        let s = Sources::new(Kind::Memory, 2, 60_000, 40_000, 17).await;
        let dup = "zz-last-key-of-all";
        for l in &s.logs {
            l.append(&[Record::put(dup, "x")]).unwrap();
        }
        let t = Targets::new(s.root.path(), "late", 3);
        let e = run(&s, Kind::Memory, &t, Kind::Memory, &Default::default())
            .await
            .unwrap_err();
        assert!(e.to_string().contains(dup), "{e}");
        refused(e, ErrorKind::Config, &t, &[0, 0, 0]);
        for k in &t.keys {
            assert!(s.repo.catalog().latest(k).await.unwrap().is_none());
        }
        // The duplicate removed from one source: the targets are new.
        s.logs[1].append(&[Record::delete(dup)]).unwrap();
        let r = run(&s, Kind::Memory, &t, Kind::Memory, &Default::default())
            .await
            .unwrap();
        assert!(r.targets.iter().all(|t| t.resumed == 0));
    });
}

/// Defect: a resume whose partitioner differed from the first run's only
/// on the greatest key was refused, but only after the targets before the
/// differing one had appended their pending records, so that even the
/// correct resume then failed. A resume checks every target before any
/// appends: the refusal changes nothing, and the correct resume finishes.
#[test]
fn a_refused_resume_changes_no_target() {
    common::rt().block_on(async {
        let mut s = Sources::new(Kind::Memory, 2, 40_000, 30_000, 19).await;
        // The greatest key of all, placed by Kafka's partitioner in a target
        // other than 0: a partitioner that sends it to target 0 instead
        // adds a record at the end of target 0 (which finishes first) and
        // leaves one too many in its own target.
        let greatest = (0..)
            .map(|i| Bytes::from(format!("zz-greatest-{i}")))
            .find(|k| Murmur2.partition(k, 4) != 0)
            .unwrap();
        let p = Murmur2.partition(&greatest, 2) as usize;
        s.logs[p]
            .append(&[Record::put(greatest.clone(), "last")])
            .unwrap();
        s.models[p].insert(greatest.clone(), Bytes::from("last"));
        let t = Targets::new(s.root.path(), "resume-late", 4);
        // Interrupted after every record was written, before the commits:
        // a finished run whose snapshots are gone.
        let r = run(&s, Kind::Memory, &t, Kind::Memory, &Default::default())
            .await
            .unwrap();
        for (k, tr) in t.keys.iter().zip(&r.targets) {
            if let Some(id) = tr.snapshot {
                s.repo.catalog().delete_snapshot(k, id).await.unwrap();
            }
        }
        let partial = t.end_offsets();
        // A partitioner that differs only on the greatest key.
        assert_eq!(s.union().keys().next_back(), Some(&greatest));
        let other = ReshardOptions {
            partitioner: Arc::new(FnPartitioner::new("murmur2", move |k: &[u8], n| {
                if k == &greatest[..] {
                    0
                } else {
                    Murmur2.partition(k, n)
                }
            })),
            resume: true,
            ..Default::default()
        };
        let e = run(&s, Kind::Memory, &t, Kind::Memory, &other)
            .await
            .unwrap_err();
        refused(e, ErrorKind::AlreadyExists, &t, &partial);
        // The correct resume still finishes, exactly.
        let resume = ReshardOptions {
            resume: true,
            ..Default::default()
        };
        let r = run(&s, Kind::Memory, &t, Kind::Memory, &resume)
            .await
            .unwrap();
        check_exact(&s, &t, Kind::Memory, &r, &Murmur2).await;
    });
}

/// Defect: a reshard dropped while a source restore ran on the blocking
/// pool left its scratch directory behind (the guard removed it once, and
/// the restore wrote into it again). Dropped at many points, from the
/// sources' restore to the commits, nothing of the scratch space remains
/// once the work it started has ended (the runtime, dropped, waits for
/// it).
#[test]
fn a_dropped_reshard_leaves_no_scratch_behind() {
    let s = common::rt().block_on(Sources::new(Kind::Rocks, 3, 30_000, 20_000, 23));
    for (i, delay_ms) in [0u64, 1, 3, 8, 20, 50, 120, 300].into_iter().enumerate() {
        let t = Targets::new(s.root.path(), &format!("drop{i}"), 2);
        let scratch = s.root.path().join(format!("scratch-drop-{i}"));
        let rt = common::rt();
        let finished = rt.block_on(async {
            let (f, g) = (RocksFormat::default(), RocksFormat::default());
            let (sources, targets) = (s.partitions(), t.partitions());
            let o = ReshardOptions::default();
            let work = reshard(&s.repo, &f, &sources, &g, &targets, &scratch, &o);
            tokio::time::timeout(std::time::Duration::from_millis(delay_ms), work)
                .await
                .is_ok()
        });
        drop(rt);
        assert!(
            !scratch.exists(),
            "dropped after {delay_ms} ms (finished: {finished}): scratch left: {:?}",
            std::fs::read_dir(&scratch).map(|d| d.count())
        );
    }
}

#[test]
fn per_partition_bookkeeping_is_left_behind_and_counted() {
    common::rt().block_on(async {
        let s = Sources::new(Kind::Rocks, 3, 900, 300, 13).await;
        // Every source records its input position, as the consumer-group
        // glue does: one key, in every partition, with its own value.
        let position = [PARTITION_LOCAL_PREFIX, b"input-position"].concat();
        for (i, l) in s.logs.iter().enumerate() {
            l.append(&[Record::put(position.clone(), vec![0, 0, 0, i as u8])])
                .unwrap();
        }
        // Moved, it would be a key held by two sources.
        let t = Targets::new(s.root.path(), "keep", 2);
        let keep_all = ReshardOptions {
            leave_behind: Vec::new(),
            ..Default::default()
        };
        let e = run(&s, Kind::Rocks, &t, Kind::Rocks, &keep_all).await;
        refused(e.unwrap_err(), ErrorKind::Config, &t, &[0, 0]);

        // By default it stays behind: the targets hold the users' keys
        // only, and each source's report counts what it left.
        let t = Targets::new(s.root.path(), "left", 2);
        let r = run(&s, Kind::Rocks, &t, Kind::Rocks, &Default::default())
            .await
            .unwrap();
        assert!(r.sources.iter().all(|s| s.left_behind == 1), "{r:?}");
        check_exact(&s, &t, Kind::Rocks, &r, &Murmur2).await;
    });
}

/// Targets on Kafka (librdkafka's mock cluster) that keep their lineage in
/// marker records: a target whose only record is such a marker (someone
/// opened the new changelog first) is new, not "already holding records";
/// the markers and writer claims the backend writes are not records of the
/// target; and the targets open ready to run, exactly.
#[cfg(feature = "kafka")]
#[test]
fn targets_on_kafka_with_marker_lineage_are_new_and_ready_to_run() {
    use statesnap::changelog::kafka::{
        KafkaChangelog, KafkaOptions, LineageSource, NonCompactedPolicy,
    };
    common::rt().block_on(async {
        let s = Sources::new(Kind::Rocks, 2, 1_500, 400, 17).await;
        let mock = rdkafka::mocking::MockCluster::new(1).unwrap();
        let options = KafkaOptions::new(mock.bootstrap_servers())
            .request_timeout(std::time::Duration::from_secs(5))
            .non_compacted_policy(NonCompactedPolicy::Warn)
            .lineage_source(LineageSource::Marker);
        let keys: Vec<StoreKey> = (0..3)
            .map(|p| StoreKey::new("kshop", "carts", p).unwrap())
            .collect();
        mock.create_topic(&keys[0].changelog_id().topic, 3, 1)
            .unwrap();
        let logs: Vec<KafkaChangelog> = keys
            .iter()
            .map(|k| KafkaChangelog::open(k.changelog_id(), options.clone()).unwrap())
            .collect();
        let lineage = logs[0].lineage().unwrap();
        assert!(lineage.0.starts_with("marker:"), "{lineage}");
        assert_eq!(logs[0].end_offset().unwrap(), 1, "the marker took offset 0");
        let t = Targets {
            keys,
            logs,
            dir: s.root.path().join("targets-kafka"),
        };
        let r = run(&s, Kind::Rocks, &t, Kind::Rocks, &Default::default())
            .await
            .unwrap();
        check_exact(&s, &t, Kind::Rocks, &r, &Murmur2).await;
        assert_eq!(t.logs[0].lineage().unwrap(), lineage, "the marker stands");
        // A second run into the same targets is refused: they hold records.
        let e = run(&s, Kind::Rocks, &t, Kind::Rocks, &Default::default()).await;
        assert_eq!(e.unwrap_err().kind(), ErrorKind::AlreadyExists);
    });
}

#[test]
fn a_source_whose_snapshots_are_all_unusable_is_refused_as_stale() {
    common::rt().block_on(async {
        let mut s = Sources::new(Kind::Rocks, 2, 1_000, 300, 9).await;
        // Partition 1's log is recreated: its snapshot is of another lineage.
        let dir = s.root.path().join(format!("log-{}", s.keys[1]));
        std::fs::remove_dir_all(&dir).unwrap();
        s.logs[1] = open_log(&dir, &s.keys[1]);
        s.logs[1].append(&[Record::put("user-new", "x")]).unwrap();
        let t = Targets::new(s.root.path(), "stale", 2);
        let e = run(&s, Kind::Rocks, &t, Kind::Rocks, &Default::default()).await;
        refused(e.unwrap_err(), ErrorKind::Stale, &t, &[0, 0]);
    });
}

/// A partitioner that fails (answers out of range) after `ok` placements:
/// an interruption in the middle of writing the targets.
fn failing_after(ok: u64) -> ReshardOptions {
    let count = AtomicU64::new(0);
    ReshardOptions {
        partitioner: Arc::new(FnPartitioner::new("murmur2", move |k: &[u8], n| {
            if count.fetch_add(1, Ordering::Relaxed) >= ok {
                n
            } else {
                Murmur2.partition(k, n)
            }
        })),
        ..Default::default()
    }
}

#[test]
fn an_interrupted_reshard_is_refused_then_resumed_to_the_same_state() {
    common::rt().block_on(async {
        // Enough keys that the first appends happen before the interruption.
        let s = Sources::new(Kind::Memory, 2, 80_000, 60_000, 13).await;
        let t = Targets::new(s.root.path(), "resume", 2);
        // The checking pass places every key once without writing; the
        // writing pass then fails 30 000 keys in.
        let keys = s.union().len() as u64;
        let e = run(
            &s,
            Kind::Memory,
            &t,
            Kind::Rocks,
            &failing_after(keys + 30_000),
        )
        .await;
        assert_eq!(e.unwrap_err().kind(), ErrorKind::Config);
        let partial = t.end_offsets();
        assert!(
            partial.iter().any(|&e| e > 0),
            "the run wrote part of the targets: {partial:?}"
        );
        for k in &t.keys {
            assert!(
                s.repo.catalog().latest(k).await.unwrap().is_none(),
                "no snapshot claims a part"
            );
        }

        // A plain rerun refuses: the targets are not empty.
        let e = run(&s, Kind::Memory, &t, Kind::Rocks, &Default::default())
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::AlreadyExists, "{e}");
        assert_eq!(e.reason(), Some(Reason::AlreadyExists));
        assert_eq!(t.end_offsets(), partial);

        // Resuming with another partitioner would mix two layouts: refused.
        let other = ReshardOptions {
            partitioner: Arc::new(FnPartitioner::new("other", |k: &[u8], n| {
                (Murmur2.partition(k, n) + 1) % n
            })),
            resume: true,
            ..Default::default()
        };
        let e = run(&s, Kind::Memory, &t, Kind::Rocks, &other)
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::AlreadyExists, "{e}");
        assert_eq!(
            t.end_offsets(),
            partial,
            "nothing appended after a mismatch"
        );

        // Resuming the same reshard finishes it.
        let resume = ReshardOptions {
            resume: true,
            verify_replay: true,
            ..Default::default()
        };
        let r = run(&s, Kind::Memory, &t, Kind::Rocks, &resume)
            .await
            .unwrap();
        let resumed: u64 = r.targets.iter().map(|t| t.resumed).sum();
        assert_eq!(resumed, partial.iter().sum::<u64>());
        check_exact(&s, &t, Kind::Rocks, &r, &Murmur2).await;

        // And running it again changes nothing: the snapshots are its own.
        let again = run(&s, Kind::Memory, &t, Kind::Rocks, &resume)
            .await
            .unwrap();
        assert!(
            again
                .targets
                .iter()
                .all(|t| t.appended == 0 && (t.snapshot_reused || t.keys == 0))
        );
        assert_eq!(
            again.targets.iter().map(|t| t.snapshot).collect::<Vec<_>>(),
            r.targets.iter().map(|t| t.snapshot).collect::<Vec<_>>()
        );
        check_exact(&s, &t, Kind::Rocks, &again, &Murmur2).await;

        // Interrupted between two targets' commits: target 1's snapshot is
        // missing. A rerun keeps target 0's and commits target 1's.
        let lost = r.targets[1].snapshot.unwrap();
        s.repo
            .catalog()
            .delete_snapshot(&t.keys[1], lost)
            .await
            .unwrap();
        let last = run(&s, Kind::Memory, &t, Kind::Rocks, &resume)
            .await
            .unwrap();
        assert!(last.targets[0].snapshot_reused);
        assert!(!last.targets[1].snapshot_reused);
        assert_ne!(last.targets[1].snapshot, Some(lost));
        check_exact(&s, &t, Kind::Rocks, &last, &Murmur2).await;
    });
}

#[test]
fn an_empty_source_set_moves_nothing_and_commits_nothing() {
    common::rt().block_on(async {
        let s = Sources::new(Kind::Memory, 2, 0, 10, 1).await;
        let t = Targets::new(s.root.path(), "empty", 3);
        let r = run(&s, Kind::Memory, &t, Kind::Memory, &Default::default())
            .await
            .unwrap();
        assert_eq!(r.keys, 0);
        assert!(
            r.targets
                .iter()
                .all(|t| t.snapshot.is_none() && t.last_offset.is_none())
        );
        assert_eq!(t.end_offsets(), vec![0, 0, 0]);
    });
}
