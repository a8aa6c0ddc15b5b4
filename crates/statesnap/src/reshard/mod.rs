//! Resharding: the state of `N` store partitions, moved exactly into `M`.
//!
//! When an input topic's partition count changes, every key's partition
//! changes with it, and so does the store partition that must hold its
//! state. [`reshard`] restores each source partition at a known changelog
//! offset (its newest usable snapshot plus its changelog tail), merges the
//! sources in key order, and sends every entry to the target partition the
//! [`Partitioner`] names. Each target's entries go, in key order, to its
//! own new changelog (one put per live key) and into a fresh store, which
//! is then committed as the target's first snapshot at that log's end: the
//! resharded application's first `open` replays nothing.
//!
//! Why it is exact: the sources are exact states of their logs (restore
//! invariant); a key lives in one source (the merge refuses a key held by
//! two); each target holds exactly the keys placed in it, with the values
//! the sources hold; its changelog holds one put per key, so replaying that
//! log gives the same state as its snapshot. Each target's logical digest
//! is computed as its store is loaded and checked again against the digest its
//! snapshot's format computes from the committed cut; the report carries
//! their union, the digest of the whole moved state. `docs/reshard.md` has
//! the whole argument and what the operator does with the input topic.
//!
//! A rerun after a crash is safe. Without [`ReshardOptions::resume`] a
//! target that already holds records or snapshots is refused
//! (`already exists`); with it, the records already in a target's
//! changelog are compared one by one with what this reshard writes there
//! (the output is a pure function of the source states and the
//! partitioner), the rest is appended, and a target snapshot already
//! committed is kept only if it is exactly the one this reshard would
//! commit. Any difference is refused: one target never gets two states.

mod merge;
mod partitioner;
mod target;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

pub use partitioner::{
    FnPartitioner, Murmur2, PARTITIONERS, Partitioner, SharedPartitioner, by_name, murmur2,
};

use crate::changelog::{Changelog, ChangelogBinding, ChangelogId};
use crate::digest::LogicalDigest;
use crate::error::{Error, ErrorKind, Reason, Result};
use crate::format::StoreFormat;
use crate::repo::{Repository, SnapshotId, StoreKey};
use crate::restore::{
    RestoreOptions, RestoreReport, ScratchDir, Source as RestoreSource, restore_store,
};
use crate::store::{StateStore, StateStoreExt, ensure_follows};
use crate::util::blocking_here;
use target::TargetWriter;

/// Records appended to a target changelog per batch.
pub(crate) const APPEND_BATCH: usize = 10_000;

/// The key prefix of statesnap's own per-partition bookkeeping in a store
/// (the consumer-group glue's input position, `\x00statesnap/input-position`).
/// Such keys describe one partition of the old layout (an offset in one
/// input partition), so they are left behind by default
/// ([`ReshardOptions::leave_behind`]).
pub const PARTITION_LOCAL_PREFIX: &[u8] = b"\x00statesnap/";

/// One source partition: its store, the changelog it follows, and
/// optionally the offset to reshard its state as of.
#[derive(Clone, Copy)]
pub struct SourcePartition<'a> {
    /// The source store partition.
    pub store_key: &'a StoreKey,
    /// Its changelog.
    pub changelog: &'a dyn Changelog,
    /// Reshard the state as of this offset instead of the log's end.
    pub until: Option<u64>,
}

/// One target partition: its store and its new, empty changelog.
#[derive(Clone, Copy)]
pub struct TargetPartition<'a> {
    /// The target store partition.
    pub store_key: &'a StoreKey,
    /// Its changelog: empty, or (with [`ReshardOptions::resume`]) holding
    /// what an interrupted run of this same reshard wrote.
    pub changelog: &'a dyn Changelog,
}

impl<'a> SourcePartition<'a> {
    /// Partition `keys[i]` following `logs[i]`, each as of its log's end.
    pub fn zip<C: Changelog>(keys: &'a [StoreKey], logs: &'a [C]) -> Vec<Self> {
        keys.iter()
            .zip(logs)
            .map(|(store_key, changelog)| SourcePartition {
                store_key,
                changelog,
                until: None,
            })
            .collect()
    }
}

impl<'a> TargetPartition<'a> {
    /// Partition `keys[i]` with its new changelog `logs[i]`.
    pub fn zip<C: Changelog>(keys: &'a [StoreKey], logs: &'a [C]) -> Vec<Self> {
        keys.iter()
            .zip(logs)
            .map(|(store_key, changelog)| TargetPartition {
                store_key,
                changelog,
            })
            .collect()
    }
}

impl std::fmt::Debug for SourcePartition<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SourcePartition")
            .field("store_key", self.store_key)
            .field("changelog", self.changelog.id())
            .field("until", &self.until)
            .finish()
    }
}

impl std::fmt::Debug for TargetPartition<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TargetPartition")
            .field("store_key", self.store_key)
            .field("changelog", self.changelog.id())
            .finish()
    }
}

/// How [`reshard`] runs.
#[derive(Clone)]
pub struct ReshardOptions {
    /// Where each key goes (default: [`Murmur2`], Kafka's).
    pub partitioner: SharedPartitioner,
    /// Continue an interrupted reshard: targets that already hold records
    /// or snapshots are checked against this reshard's output instead of
    /// refused (`--force` in the CLI).
    pub resume: bool,
    /// After writing, rebuild every target by a full replay of its new
    /// changelog and check it holds the target's digest (one more pass
    /// over the data; the proof the tests run).
    pub verify_replay: bool,
    /// Key prefixes that are not moved: per-partition bookkeeping that means
    /// nothing in the new layout (default: [`PARTITION_LOCAL_PREFIX`], the
    /// input positions the consumer-group glue records; every source holds
    /// one, so moving them would be a key held by two sources). Each
    /// source's report counts the keys left behind.
    pub leave_behind: Vec<Vec<u8>>,
    /// Counters to read from another task (progress bars).
    pub progress: Option<Arc<ReshardProgress>>,
}

impl Default for ReshardOptions {
    fn default() -> Self {
        ReshardOptions {
            partitioner: Arc::new(Murmur2),
            resume: false,
            verify_replay: false,
            leave_behind: vec![PARTITION_LOCAL_PREFIX.to_vec()],
            progress: None,
        }
    }
}

impl std::fmt::Debug for ReshardOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReshardOptions")
            .field("partitioner", &self.partitioner.name())
            .field("resume", &self.resume)
            .field("verify_replay", &self.verify_replay)
            .field(
                "leave_behind",
                &self
                    .leave_behind
                    .iter()
                    .map(|p| String::from_utf8_lossy(p))
                    .collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

/// Progress of a running [`reshard`] (relaxed counters).
#[derive(Debug, Default)]
pub struct ReshardProgress {
    sources_restored: AtomicU64,
    keys: AtomicU64,
    bytes: AtomicU64,
    per_target: std::sync::Mutex<Vec<u64>>,
}

impl ReshardProgress {
    /// Source partitions restored so far.
    pub fn sources_restored(&self) -> u64 {
        self.sources_restored.load(Ordering::Relaxed)
    }
    /// Keys placed so far, over all targets.
    pub fn keys(&self) -> u64 {
        self.keys.load(Ordering::Relaxed)
    }
    /// Key and value bytes placed so far.
    pub fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }
    /// Keys placed so far in each target (as of the last batch).
    pub fn keys_per_target(&self) -> Vec<u64> {
        match self.per_target.lock() {
            Ok(g) => g.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }
}

/// What one source contributed.
#[derive(Debug, Clone)]
pub struct SourceReport {
    /// The source partition.
    pub store_key: StoreKey,
    /// Its changelog.
    pub changelog: ChangelogId,
    /// The snapshot its state came from (`None`: a full replay of its log).
    pub snapshot: Option<SnapshotId>,
    /// The offset its state reflects (`None`: an empty log).
    pub offset: Option<u64>,
    /// Changelog records replayed after the snapshot.
    pub replayed: u64,
    /// Its live keys that were moved.
    pub keys: u64,
    /// Its keys under a [`ReshardOptions::leave_behind`] prefix, not moved.
    pub left_behind: u64,
}

/// What one target received.
#[derive(Debug, Clone)]
pub struct TargetReport {
    /// The target partition.
    pub store_key: StoreKey,
    /// Its changelog.
    pub changelog: ChangelogId,
    /// Its live keys (= records in its changelog).
    pub keys: u64,
    /// Key and value bytes.
    pub bytes: u64,
    /// Records this run appended to its changelog.
    pub appended: u64,
    /// Records an earlier, interrupted run had appended, checked equal.
    pub resumed: u64,
    /// The offset of its last record: where its snapshot stands.
    pub last_offset: Option<u64>,
    /// Its logical digest.
    pub digest: LogicalDigest,
    /// Its snapshot (`None` when no key went to it: its empty log is its
    /// state).
    pub snapshot: Option<SnapshotId>,
    /// The snapshot was committed by an earlier run (checked equal).
    pub snapshot_reused: bool,
    /// A full replay of its changelog gave its digest
    /// ([`ReshardOptions::verify_replay`]).
    pub replay_verified: bool,
}

/// What [`reshard`] did.
#[derive(Debug, Clone)]
pub struct ReshardReport {
    /// The partitioner's name.
    pub partitioner: String,
    /// Per source partition.
    pub sources: Vec<SourceReport>,
    /// Per target partition.
    pub targets: Vec<TargetReport>,
    /// Keys moved.
    pub keys: u64,
    /// Key and value bytes moved.
    pub bytes: u64,
    /// The digest of every key moved: the union of the targets' digests
    /// (equal to the union of the sources' states).
    pub digest: LogicalDigest,
    /// Restoring the sources.
    pub restore_time: Duration,
    /// Merging, placing and writing the targets (their logs and stores).
    pub write_time: Duration,
    /// Committing the targets' snapshots (and verifying, when asked).
    pub commit_time: Duration,
}

/// Reshards `sources` (partitions `0..N` of one store, each in
/// `source_format`) into `targets` (partitions `0..M` of another store, in
/// `target_format`), placing each key with `options.partitioner`. `scratch`
/// must not exist: the sources are restored and the targets built there,
/// and it is removed at the end, whatever the outcome.
///
/// Refuses before writing anything: sources or targets that are not
/// partitions `0..N` of one store each (`config`, naming what is missing or
/// repeated), targets naming the source store (`config`), a source whose
/// snapshots are all unusable (`stale`, naming the partition and why), and
/// without `resume` a target that holds records or snapshots (`already
/// exists`). While writing: a key held by two sources or a partitioner
/// answer out of range (`config`), and with `resume` a target whose
/// records differ from this reshard's output (`already exists`). A target
/// snapshot is committed only once its changelog holds every record and
/// is flushed, so an interrupted reshard leaves no snapshot that claims a
/// state it does not hold.
#[allow(clippy::too_many_arguments)]
pub async fn reshard<SF: StoreFormat, TF: StoreFormat>(
    repo: &Repository,
    source_format: &SF,
    sources: &[SourcePartition<'_>],
    target_format: &TF,
    targets: &[TargetPartition<'_>],
    scratch: &Path,
    options: &ReshardOptions,
) -> Result<ReshardReport> {
    check_partitions(sources, targets)?;
    check_targets(repo, targets, options.resume).await?;
    let scratch = ScratchDir::create(scratch)?;
    let run = Run {
        repo,
        source_format,
        sources,
        target_format,
        targets,
        scratch: scratch.path(),
        options,
    };
    run.execute().await
}

/// Checks that sources and targets are partitions `0..N` and `0..M` of two
/// different stores.
fn check_partitions(
    sources: &[SourcePartition<'_>],
    targets: &[TargetPartition<'_>],
) -> Result<()> {
    let source = one_store("source", sources.iter().map(|s| s.store_key))?;
    let target = one_store("target", targets.iter().map(|t| t.store_key))?;
    if source == target {
        return Err(Error::config(format!(
            "the reshard target is the source store store=`{}/{}`; write the new layout to \
             another application or store name",
            source.0, source.1
        )));
    }
    Ok(())
}

/// The `(application, store)` every key names, checking the partitions
/// are exactly `0..n`.
fn one_store<'a>(what: &str, keys: impl Iterator<Item = &'a StoreKey>) -> Result<(String, String)> {
    let keys: Vec<&StoreKey> = keys.collect();
    let Some(first) = keys.first() else {
        return Err(Error::config(format!(
            "a reshard needs at least one {what} partition"
        )));
    };
    let mut seen = vec![false; keys.len()];
    for k in &keys {
        if (k.application(), k.store()) != (first.application(), first.store()) {
            return Err(Error::config(format!(
                "{what} partitions belong to different stores first=`{first}` other=`{k}`; a \
                 reshard moves one store"
            )));
        }
        match seen.get_mut(k.partition() as usize) {
            Some(s) if !*s => *s = true,
            Some(_) => {
                return Err(Error::config(format!(
                    "{what} partition given twice store_key=`{k}`"
                )));
            }
            None => {
                return Err(Error::config(format!(
                    "{what} partition out of range store_key=`{k}` partitions={}; give \
                     partitions 0..{} exactly",
                    keys.len(),
                    keys.len()
                )));
            }
        }
    }
    Ok((first.application().to_owned(), first.store().to_owned()))
}

/// Without `resume`, a target holding records or snapshots is refused.
async fn check_targets(
    repo: &Repository,
    targets: &[TargetPartition<'_>],
    resume: bool,
) -> Result<()> {
    if resume {
        return Ok(());
    }
    for t in targets {
        check_new_target(repo, t.store_key, Some(t.changelog)).await?;
    }
    Ok(())
}

/// Refuses (`already exists`) a reshard target that is not new: its
/// changelog holds (or once held) records other than a backend's own
/// markers, or the repository holds snapshots of it. `changelog: None`: the
/// log does not exist yet (a caller that checks before creating anything,
/// as the CLI does, so that a refused reshard creates no target log).
pub async fn check_new_target(
    repo: &Repository,
    store_key: &StoreKey,
    changelog: Option<&dyn Changelog>,
) -> Result<()> {
    let newest = repo.catalog().latest(store_key).await?;
    let (end, holds) = match changelog {
        Some(log) => {
            let end = log.end_offset()?;
            (end, holds_records(log, end)?)
        }
        None => (0, false),
    };
    if !holds && newest.is_none() {
        return Ok(());
    }
    let what = match &newest {
        Some(s) => format!("snapshot=`{}`", s.id()),
        None => "snapshot=none".to_owned(),
    };
    let log = changelog.map_or_else(|| "none".to_owned(), |l| l.id().to_string());
    Err(Error::new(
        ErrorKind::AlreadyExists,
        format!(
            "the reshard target is not empty store_key=`{store_key}` changelog=`{log}` \
             end_offset={end} {what}; use new targets, or resume an interrupted reshard of the \
             same sources (resume / --force: what is there is checked against this reshard's \
             output)"
        ),
    )
    .with_reason(Reason::AlreadyExists))
}

/// Whether `log` holds, or once held, any record. Marker records a backend
/// writes for itself (a Kafka lineage marker) do not count: a log that
/// holds nothing else is new. A log whose first offsets were truncated
/// held records. `end`: its end offset.
fn holds_records(log: &dyn Changelog, end: u64) -> Result<bool> {
    if end == 0 {
        return Ok(false);
    }
    let start = log.start_offset()?;
    if start > 0 {
        return Ok(true);
    }
    let mut reader = log.read_from(start)?;
    while let Some(batch) = reader.next_batch(64)? {
        if !batch.is_empty() {
            return Ok(true);
        }
    }
    Ok(false)
}

struct Run<'r, 'a, SF, TF> {
    repo: &'r Repository,
    source_format: &'r SF,
    sources: &'r [SourcePartition<'a>],
    target_format: &'r TF,
    targets: &'r [TargetPartition<'a>],
    scratch: &'r Path,
    options: &'r ReshardOptions,
}

impl<SF: StoreFormat, TF: StoreFormat> Run<'_, '_, SF, TF> {
    async fn execute(&self) -> Result<ReshardReport> {
        let started = Instant::now();
        let mut restored = Vec::with_capacity(self.sources.len());
        for (i, s) in self.sources.iter().enumerate() {
            restored.push(self.restore_source(i, s).await?);
        }
        let restore_time = started.elapsed();

        let started = Instant::now();
        // Nothing reaches a target log, store or the repository until the
        // input can no longer be refused: a first pass over the merged
        // sources finds a key held by two sources, a partitioner answer out
        // of range and (resuming) any target whose records differ from this
        // reshard's output, before any target appends anything.
        blocking_here(|| self.check_input(&restored))?;
        let (source_reports, mut target_reports, mut stores) =
            blocking_here(|| self.write_targets(&restored))?;
        drop(restored);
        let write_time = started.elapsed();

        // Every key read from a source went to exactly one target.
        let read: u64 = source_reports.iter().map(|s| s.keys).sum();
        let mut digest = LogicalDigest::new();
        target_reports.iter().for_each(|t| digest.merge(&t.digest));
        if digest.keys() != read {
            return Err(Error::internal(format!(
                "the targets hold {} keys, the sources {read}; nothing was committed",
                digest.keys()
            )));
        }

        let started = Instant::now();
        for (j, (t, store)) in self.targets.iter().zip(stores.drain(..)).enumerate() {
            self.commit_target(j, t, store, &mut target_reports[j])
                .await?;
        }
        Ok(ReshardReport {
            partitioner: self.options.partitioner.name().to_owned(),
            keys: target_reports.iter().map(|t| t.keys).sum(),
            bytes: target_reports.iter().map(|t| t.bytes).sum(),
            sources: source_reports,
            targets: target_reports,
            digest,
            restore_time,
            write_time,
            commit_time: started.elapsed(),
        })
    }

    /// Restores source `i`: its newest usable snapshot and the tail, or a
    /// full replay of a log that has no snapshots. A store whose snapshots
    /// exist but are all unusable is refused: the reshard says why rather
    /// than silently replaying the whole history.
    async fn restore_source(
        &self,
        i: usize,
        s: &SourcePartition<'_>,
    ) -> Result<(SF::Store, RestoreReport)> {
        let options = RestoreOptions {
            until: s.until,
            ..RestoreOptions::default()
        };
        let dir = self.scratch.join(format!("source-{i}"));
        let (store, report) = restore_store(
            self.source_format,
            self.repo,
            s.store_key,
            s.changelog,
            &dir,
            &options,
        )
        .await?;
        if matches!(report.source, RestoreSource::FullReplay)
            && (!report.skipped.is_empty() || !report.unreadable.is_empty())
        {
            let why: Vec<String> = report
                .skipped
                .iter()
                .map(|k| format!("{}: {}", k.id, k.reason))
                .chain(
                    report
                        .unreadable
                        .iter()
                        .map(|u| format!("{}: {}", u.key, u.reason)),
                )
                .collect();
            return Err(Error::stale(format!(
                "no usable snapshot of source partition store_key=`{}` changelog=`{}`: {}; \
                 snapshot it again (or restore its changelog) before resharding",
                s.store_key,
                s.changelog.id(),
                why.join("; ")
            )));
        }
        if let Some(p) = &self.options.progress {
            p.sources_restored.fetch_add(1, Ordering::Relaxed);
        }
        Ok((store, report))
    }

    /// Merges the sources and writes every target's changelog (on this
    /// thread) and store (on a loader thread, fed in key order).
    #[allow(clippy::type_complexity)]
    fn write_targets(
        &self,
        restored: &[(SF::Store, RestoreReport)],
    ) -> Result<(Vec<SourceReport>, Vec<TargetReport>, Vec<TF::Store>)> {
        let mut stores = Vec::with_capacity(self.targets.len());
        for (j, t) in self.targets.iter().enumerate() {
            let mut store = self
                .target_format
                .create_empty(&self.scratch.join(format!("target-{j}")))?;
            ensure_follows(&mut store, &ChangelogBinding::of(t.changelog)?)?;
            stores.push(store);
        }
        let (channel, loader_end) = target::channel();
        let (placed, loaded) = std::thread::scope(|scope| {
            let loaders = match stores
                .iter_mut()
                .map(|s| s.bulk_loader())
                .collect::<Result<Vec<_>>>()
            {
                Ok(l) => l,
                Err(e) => return (Err(e), Ok(Vec::new())),
            };
            let loader = scope.spawn(move || target::load(loaders, loader_end));
            let placed = self.place(restored, channel);
            let loaded = loader
                .join()
                .unwrap_or_else(|_| Err(Error::internal("the store loader panicked")));
            (placed, loaded)
        });
        // The loader's error first: placing fails with "loader stopped"
        // because of it.
        let digests = loaded?;
        let (sources, mut targets) = placed?;
        for (t, d) in targets.iter_mut().zip(digests) {
            t.digest = d;
        }
        Ok((sources, targets, stores))
    }

    /// The checking pass: everything [`Run::place`] would refuse for its
    /// input, found without writing (the merge, the partitioner, and the
    /// comparison of each target's existing records with this output).
    fn check_input(&self, restored: &[(SF::Store, RestoreReport)]) -> Result<()> {
        let mut writers = Vec::with_capacity(self.targets.len());
        for t in self.targets {
            writers.push(TargetWriter::new(t, None, self.options.resume)?);
        }
        self.merge(restored, &mut writers, |_, _| {})?;
        for w in writers {
            w.finish()?;
        }
        Ok(())
    }

    /// Merges the sources in key order and hands each entry to its
    /// target's writer; returns the keys each source gave and left behind.
    fn merge(
        &self,
        restored: &[(SF::Store, RestoreReport)],
        writers: &mut [TargetWriter<'_>],
        mut placed: impl FnMut(&[TargetWriter<'_>], usize),
    ) -> Result<Vec<(u64, u64)>> {
        let names: Vec<String> = self
            .sources
            .iter()
            .map(|s| s.store_key.to_string())
            .collect();
        // Keys left behind are dropped from each source before the merge:
        // every source may hold one of them (its own input position).
        let left_behind: Vec<AtomicU64> = self.sources.iter().map(|_| AtomicU64::new(0)).collect();
        let leave_behind = &self.options.leave_behind;
        let iters = restored
            .iter()
            .zip(&left_behind)
            .map(|((store, _), count)| {
                let kept = store.iter()?.filter(move |kv| match kv {
                    Ok((key, _)) if leave_behind.iter().any(|p| key.starts_with(p)) => {
                        count.fetch_add(1, Ordering::Relaxed);
                        false
                    }
                    _ => true,
                });
                Ok(Box::new(kept) as crate::store::KvIter<'_>)
            })
            .collect::<Result<Vec<_>>>()?;
        let mut merge = merge::Merge::new(iters, names)?;
        let mut per_source = vec![0u64; self.sources.len()];
        let m = u32::try_from(self.targets.len()).unwrap_or(u32::MAX);
        let partitioner = &*self.options.partitioner;
        while let Some((i, (key, value))) = merge.next_entry()? {
            per_source[i] += 1;
            let j = partitioner.partition(&key, m);
            let Some(w) = writers.get_mut(j as usize) else {
                return Err(Error::config(format!(
                    "the partitioner placed a key outside the targets partitioner=`{}` \
                     partition={j} partitions={m}",
                    partitioner.name()
                )));
            };
            w.put(key, value)?;
            placed(&*writers, j as usize);
        }
        drop(merge);
        let left_behind = left_behind.iter().map(|c| c.load(Ordering::Relaxed));
        Ok(per_source.into_iter().zip(left_behind).collect())
    }

    /// The placing half: merges the sources in key order, appends each
    /// key to its target's changelog and sends it to the loader thread.
    fn place(
        &self,
        restored: &[(SF::Store, RestoreReport)],
        channel: target::Channel,
    ) -> Result<(Vec<SourceReport>, Vec<TargetReport>)> {
        let mut writers = Vec::with_capacity(self.targets.len());
        for (j, t) in self.targets.iter().enumerate() {
            let sink = target::LoadSink::new(j, &channel);
            writers.push(TargetWriter::new(t, Some(sink), self.options.resume)?);
        }
        let counts = self.merge(restored, &mut writers, |writers, j| {
            if let Some(p) = &self.options.progress {
                let w = &writers[j];
                p.keys.fetch_add(1, Ordering::Relaxed);
                p.bytes.fetch_add(w.last_bytes, Ordering::Relaxed);
                if w.keys % 4096 == 0 {
                    self.publish(writers, p);
                }
            }
        })?;
        let mut target_reports = Vec::with_capacity(writers.len());
        for w in writers {
            target_reports.push(w.finish()?);
        }
        channel
            .tx
            .send(target::Load::Finish)
            .map_err(|_| Error::internal("the store loader stopped"))?;
        if let Some(p) = &self.options.progress {
            let mut g = p.per_target.lock().unwrap_or_else(|e| e.into_inner());
            *g = target_reports.iter().map(|t| t.keys).collect();
        }
        let mut source_reports = Vec::with_capacity(self.sources.len());
        for ((s, (store, r)), (keys, left_behind)) in self.sources.iter().zip(restored).zip(counts)
        {
            source_reports.push(SourceReport {
                store_key: s.store_key.clone(),
                changelog: s.changelog.id().clone(),
                snapshot: r.snapshot,
                offset: store.applied_offset()?,
                replayed: r.replay.records,
                keys,
                left_behind,
            });
        }
        Ok((source_reports, target_reports))
    }

    fn publish(&self, writers: &[TargetWriter<'_>], p: &ReshardProgress) {
        let mut g = p.per_target.lock().unwrap_or_else(|e| e.into_inner());
        *g = writers.iter().map(|w| w.keys).collect();
    }

    /// Verifies (when asked) and commits target `j`'s snapshot, or keeps the
    /// one an earlier run committed when it is exactly this one.
    async fn commit_target(
        &self,
        j: usize,
        t: &TargetPartition<'_>,
        store: TF::Store,
        report: &mut TargetReport,
    ) -> Result<()> {
        let Some(last) = report.last_offset else {
            return Ok(());
        };
        if self.options.verify_replay {
            self.verify_replay(j, t, report).await?;
        }
        // A snapshot of this log's incarnation that an earlier run committed
        // is kept only if it is exactly this one; any other one of this
        // incarnation is a second state for the target. Snapshots of an
        // earlier incarnation (a recreated log) are never restored onto it.
        let lineage = t.changelog.lineage()?;
        let listing = self.repo.catalog().list_snapshots(t.store_key).await?;
        for existing in listing.snapshots.iter().rev() {
            let m = &existing.manifest;
            if m.changelog.lineage != lineage {
                continue;
            }
            if m.changelog.offset == last && m.logical_digest.as_ref() == Some(&report.digest) {
                report.snapshot = Some(existing.id());
                report.snapshot_reused = true;
                return Ok(());
            }
            return Err(Error::new(
                ErrorKind::AlreadyExists,
                format!(
                    "the reshard target already has a snapshot this reshard did not write \
                     store_key=`{}` snapshot=`{}` offset={}; use new targets",
                    t.store_key,
                    existing.id(),
                    m.changelog.offset
                ),
            )
            .with_reason(Reason::AlreadyExists));
        }
        // The manifest records the digest (a resumed run recognises its own
        // snapshot by it), computed by the format from the cut: a second,
        // independent count of what the target holds.
        let cut = self.target_format.capture(&store)?;
        let options = crate::snapshot::SnapshotOptions {
            logical_digest: Some(true),
            ..Default::default()
        };
        let manifest = crate::snapshot::commit_snapshot_with(
            self.target_format,
            cut,
            self.repo,
            t.store_key,
            t.changelog,
            None,
            &options,
        )
        .await?;
        if manifest.logical_digest.as_ref() != Some(&report.digest) {
            return Err(Error::internal(format!(
                "the target's committed snapshot does not hold what was placed in it \
                 store_key=`{}` snapshot=`{}` placed={}; delete that snapshot and report a bug",
                t.store_key, manifest.snapshot_id, report.digest
            )));
        }
        report.snapshot = Some(manifest.snapshot_id);
        Ok(())
    }

    /// Rebuilds target `j` from its changelog alone and compares digests.
    async fn verify_replay(
        &self,
        j: usize,
        t: &TargetPartition<'_>,
        report: &mut TargetReport,
    ) -> Result<()> {
        let dir = self.scratch.join(format!("verify-{j}"));
        let options = RestoreOptions {
            full_replay: true,
            ..RestoreOptions::default()
        };
        let (rebuilt, _) = restore_store(
            self.target_format,
            self.repo,
            t.store_key,
            t.changelog,
            &dir,
            &options,
        )
        .await?;
        let actual = blocking_here(|| rebuilt.logical_digest())?;
        drop(rebuilt);
        crate::format::staging::remove_path(&dir)
            .map_err(|e| Error::io(format!("cannot remove path=`{}`", dir.display()), e))?;
        if actual != report.digest {
            return Err(Error::corrupt(format!(
                "the target rebuilt from its new changelog differs from the reshard's output \
                 store_key=`{}` expected={} actual={actual}; nothing was committed for it",
                t.store_key, report.digest
            ))
            .with_reason(Reason::DigestMismatch));
        }
        report.replay_verified = true;
        Ok(())
    }
}
