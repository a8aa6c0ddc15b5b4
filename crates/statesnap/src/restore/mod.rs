//! Bringing a store back: restore from the newest usable snapshot, then
//! replay the changelog tail; fall back to older snapshots, then to full
//! replay, and say why. Only orchestration lives here: the replay step itself
//! is [`crate::store::replay`] (re-exported), the snapshot formats are
//! [`crate::format`].

mod plan;
mod seed;
pub use seed::{SeedReport, seed_store};

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::changelog::{Changelog, ChangelogBinding};
use crate::digest::LogicalDigest;
use crate::error::{Error, ErrorKind, Result};
pub use crate::format::staging::normalize_target;
use crate::format::{RestoreContext, RestoreStats, StoreFormat};
use crate::repo::{Manifest, Repository, SnapshotId, StoreKey, UnreadableManifest};
use crate::store::owner::DirLock;
pub use crate::store::replay::{ReplayOptions, ReplayProgress, ReplayReport, replay, replay_until};
use crate::store::{StateStore, StateStoreExt, bind_restored};
use crate::util::blocking_here;
pub use plan::{
    PlanOptions, PlanStep, Rates, Rejected, RestorePlan, Source, plan_restore, step_time,
};

/// Why a snapshot was not used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkippedSnapshot {
    /// The snapshot.
    pub id: SnapshotId,
    /// Its offset.
    pub offset: u64,
    /// What kind of problem (`stale`, `corrupt`, `config`, ...).
    pub kind: ErrorKind,
    /// The reason, as an error message.
    pub reason: String,
    /// The refusal, when the error carried one ([`crate::Reason`]): what a
    /// program acts on (the message is for people).
    pub refusal: Option<crate::Reason>,
}

/// What a restore did.
#[derive(Debug, Clone)]
pub struct RestoreReport {
    /// Where the store's starting state came from.
    pub source: Source,
    /// The decision the restore executed (every candidate with its verdict).
    pub plan: RestorePlan,
    /// The snapshot restored from, or `None` for a local store or a full
    /// replay.
    pub snapshot: Option<SnapshotId>,
    /// The snapshot's offset.
    pub snapshot_offset: Option<u64>,
    /// Snapshots newer than the source that were not used (rejected by the
    /// plan or failed to restore), newest first, with reasons.
    pub skipped: Vec<SkippedSnapshot>,
    /// Manifests that could not be read at all.
    pub unreadable: Vec<UnreadableManifest>,
    /// Transfer figures of the snapshot restore.
    pub transfer: RestoreStats,
    /// Time spent downloading, verifying and opening the snapshot.
    pub snapshot_duration: Duration,
    /// The tail (or full) replay.
    pub replay: ReplayReport,
}

/// Options for [`restore_store`].
#[derive(Debug, Clone, Default)]
pub struct RestoreOptions {
    /// Replay tuning.
    pub replay: ReplayOptions,
    /// Ignore snapshots and rebuild by full replay.
    pub full_replay: bool,
    /// Replace the target even if it is a non-empty directory that is not a
    /// statesnap store (it has no [`crate::store::STORE_MARKER`]): its
    /// contents are deleted once the new store replaces it. Nothing is
    /// written into it before: a restore that is refused, fails or is
    /// cancelled leaves it as it was. Off by default: a restore refuses
    /// (`config`) such a target rather than wipe what may be the user's
    /// files. Symlinks (also written `link/` or `link/.`, see
    /// [`normalize_target`]) and mount points are refused either way.
    pub replace_unmarked: bool,
    /// Keep the store already in the target when it follows the same
    /// changelog and is at or past the newest usable snapshot (only the
    /// tail is replayed). Off by default: `restore_store` replaces the
    /// target; the runtime ([`crate::runtime`]) turns it on.
    pub local_first: bool,
    /// Point in time: the last changelog offset the restored store
    /// reflects (the newest source at or before it, replay up to it).
    pub until: Option<u64>,
    /// After a snapshot is restored and before the tail is replayed,
    /// compare the store's logical digest with the one its manifest
    /// recorded (a full scan); a mismatch fails that snapshot (`corrupt`,
    /// the restored store is wiped) and the next candidate is tried.
    pub verify_digest: bool,
    /// Live counters for a progress bar, advanced as the restore goes
    /// (read them from another task; see [`RestoreProgress`]).
    pub progress: Option<std::sync::Arc<RestoreProgress>>,
    /// The gate [`restore_into`] enters just before it moves the restored
    /// store over its target (see [`crate::commit`]): a cancel that came
    /// first stops the restore with the target as it was; one that comes
    /// after cannot stop it. `None`: no one cancels through a gate
    /// (dropping the future before the rename still leaves the target as it
    /// was). [`restore_store`] ignores it (it commits nothing at its end).
    pub commit_gate: Option<std::sync::Arc<crate::commit::CommitGate>>,
}

/// Counters a restore advances as it goes, for progress bars: pass one in
/// [`RestoreOptions::progress`] and read it from another task or thread
/// (they are relaxed atomics: each read is a recent value, not a
/// consistent snapshot of all of them).
#[derive(Debug, Default)]
pub struct RestoreProgress {
    downloaded: std::sync::Arc<AtomicU64>,
    replaying: std::sync::atomic::AtomicBool,
    replay_start: AtomicU64,
    replay_applied: AtomicU64,
    replay_end: AtomicU64,
}

impl RestoreProgress {
    /// Blob bytes read from the repository so far (every snapshot tried).
    pub fn bytes_downloaded(&self) -> u64 {
        self.downloaded.load(Ordering::Relaxed)
    }

    /// Once the changelog replay has started: records applied and records
    /// to apply in all (offsets from where it started to where it heads).
    pub fn replay(&self) -> Option<(u64, u64)> {
        if !self.replaying.load(Ordering::Relaxed) {
            return None;
        }
        let start = self.replay_start.load(Ordering::Relaxed);
        let applied = self.replay_applied.load(Ordering::Relaxed);
        let end = self.replay_end.load(Ordering::Relaxed);
        Some((applied.saturating_sub(start), end.saturating_sub(start)))
    }

    fn replay_started(&self, start: u64, end: u64) {
        self.replay_start.store(start, Ordering::Relaxed);
        self.replay_applied.store(start, Ordering::Relaxed);
        self.replay_end.store(end.max(start), Ordering::Relaxed);
        self.replaying.store(true, Ordering::Relaxed);
    }

    fn replayed(&self, p: &ReplayProgress) {
        self.replay_applied
            .store(p.applied_offset.saturating_add(1), Ordering::Relaxed);
        self.replay_end.fetch_max(p.end_offset, Ordering::Relaxed);
    }
}

/// Restores store `store_key` into `target`: the newest snapshot that is
/// usable (same format and changelog lineage, not ahead of the changelog, not
/// below its horizon, every blob verified), then a replay of the changelog
/// after it. Falls back to older snapshots, then to a full replay into an
/// empty store, recording each skip in the report. Transient errors (the
/// repository is unreachable) are returned rather than silently replaying
/// everything. With [`RestoreOptions::local_first`] a valid local store at
/// or past the newest usable snapshot is kept instead (see [`plan_restore`]
/// for the order of candidates).
///
/// The target directory is owned for the whole restore: when another
/// handle or process holds it (a live [`crate::StateHandle`], another
/// restore, a RocksDB store open elsewhere) the restore is refused
/// (`transient`) and nothing in it is read or changed.
pub async fn restore_store<F: StoreFormat, C: Changelog + ?Sized>(
    format: &F,
    repo: &Repository,
    store_key: &StoreKey,
    changelog: &C,
    target: &Path,
    options: &RestoreOptions,
) -> Result<(F::Store, RestoreReport)> {
    // Before anything is read or written: the target is ours alone for
    // the whole restore (another handle or process using it: transient).
    let target = &crate::format::staging::normalize_target(target)?;
    let owner = DirLock::acquire(target)?;
    restore_owned(format, repo, store_key, changelog, target, options, &owner).await
}

/// [`restore_store`] into `target`, whose directory the caller already owns
/// (`_owner`: the runtime's handle keeps it while open, [`restore_into`]
/// holds its target's while it builds the store in staging).
pub(crate) async fn restore_owned<F: StoreFormat, C: Changelog + ?Sized>(
    format: &F,
    repo: &Repository,
    store_key: &StoreKey,
    changelog: &C,
    target: &Path,
    options: &RestoreOptions,
    _owner: &DirLock,
) -> Result<(F::Store, RestoreReport)> {
    // A target a restore may not replace is refused whatever the source (a
    // local store is replaced when it cannot be kept). An adopted target
    // (`replace_unmarked`) is not written to: the decision travels with the
    // task (`adopting`) to the step that replaces it.
    let target = &crate::format::staging::normalize_target(target)?;
    crate::format::staging::check_adoptable(target)?;
    if !options.replace_unmarked {
        crate::format::staging::check_replaceable(target)?;
    }
    let counted;
    let repo = match &options.progress {
        Some(p) => {
            counted = repo.clone().counting_reads(p.downloaded.clone());
            &counted
        }
        None => repo,
    };
    let run = async {
        let plan = plan_restore(
            format,
            repo,
            store_key,
            changelog,
            target,
            &PlanOptions {
                local_first: options.local_first,
                full_replay: options.full_replay,
                until: options.until,
            },
        )
        .await?;
        execute(format, repo, changelog, target, plan, options).await
    };
    if options.replace_unmarked {
        crate::format::staging::adopting(target, run).await
    } else {
        run.await
    }
}

/// [`restore_store`] for a store another process will open (the CLI's
/// `restore`): the whole restore — the snapshot *and* the changelog tail —
/// is built in a hidden staging directory next to `target`, the store is
/// closed and synced, and only then moved over `target`. An error, or the
/// future being dropped (Ctrl-C), at any point leaves `target` as it was,
/// and the staging directory is removed (by its guard, once the blocking
/// steps the restore started have finished; a killed process's leftovers
/// by the next restore of `target`). Nothing is written into `target`
/// before the final rename (only the staging directory beside it), and a
/// target that changed meanwhile (it became a symbolic link, or a
/// non-empty unmarked directory without `replace_unmarked`) is checked
/// again just before the rename and refused. `target` is read as
/// [`normalize_target`] says. The store already in `target` is never
/// reused (`local_first` is ignored). Fails `config` for a format whose
/// stores live in memory (nothing to put in a directory).
pub async fn restore_into<F: StoreFormat, C: Changelog + ?Sized>(
    format: &F,
    repo: &Repository,
    store_key: &StoreKey,
    changelog: &C,
    target: &Path,
    options: &RestoreOptions,
) -> Result<RestoreReport> {
    use crate::format::staging;
    // Nothing is read or written before the target is ours: a live handle
    // (or another restore) using it refuses this one (transient). Nothing
    // is written to `target` before the final rename: an adopted target
    // (`replace_unmarked`) is only checked here, and again just before it
    // is replaced.
    let target = &staging::normalize_target(target)?;
    let owner = DirLock::acquire(target)?;
    let check_target = || -> Result<()> {
        staging::check_adoptable(target)?;
        if !options.replace_unmarked {
            staging::check_replaceable(target)?;
        }
        Ok(())
    };
    check_target()?;
    let (stage, guard) = staging::new_restore_staging(target)?;
    let inner = RestoreOptions {
        local_first: false,
        replace_unmarked: false,
        ..options.clone()
    };
    let (store, report) =
        restore_owned(format, repo, store_key, changelog, &stage, &inner, &owner).await?;
    drop(store);
    // The replay above runs without an await: give a cancellation that
    // came meanwhile (Ctrl-C) its chance before anything is moved.
    tokio::task::yield_now().await;
    if std::fs::symlink_metadata(&stage).is_err() {
        return Err(Error::config(format!(
            "this format keeps its stores in memory: there is nothing to restore into a \
             directory store_key=`{store_key}` format=`{}`; restore with a format whose \
             stores live on disk",
            format.id().name
        )));
    }
    // A directory restore returns a durable store: the files a format left
    // to sync in the background are synced here, and its marks removed.
    let marks = crate::store::unsynced::check(&stage)?;
    crate::store::unsynced::sync_and_clear(&stage, &marks)?;
    // The target may have changed while the store was built (a link put in
    // its place, files put in a directory that was empty).
    check_target()?;
    // The commit point: from here a cancel no longer stops the restore.
    if let Some(gate) = &options.commit_gate {
        gate.enter()?;
    }
    staging::swap_into_place(&stage, target, |_| Ok(()))?;
    guard.disarm();
    Ok(report)
}

/// Compares a restored store's logical digest with its manifest's (no
/// digest recorded: nothing to compare).
fn check_digest<S: StateStore>(store: &S, m: &Manifest) -> Result<()> {
    let Some(expected) = m.logical_digest else {
        return Ok(());
    };
    let actual = store.logical_digest()?;
    if actual != expected {
        return Err(Error::corrupt(format!(
            "restored store's contents differ from its snapshot's logical digest snapshot=`{}` \
             expected=`{expected}` actual=`{actual}`; the snapshot is not used",
            m.snapshot_id
        ))
        .with_reason(crate::Reason::DigestMismatch));
    }
    Ok(())
}

/// What [`verify_deep`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeepVerifyReport {
    /// The snapshot.
    pub snapshot: SnapshotId,
    /// The digest its manifest recorded (`None`: its writer recorded none;
    /// only the blobs were verified, by the restore).
    pub expected: Option<LogicalDigest>,
    /// The digest of the restored store.
    pub actual: LogicalDigest,
    /// Bytes downloaded.
    pub bytes_downloaded: u64,
}

/// Whether [`verify_deep`] compared the restored contents with a digest,
/// and what it found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum DigestCheck {
    /// The manifest records a digest and the restored contents match it.
    Matched,
    /// The manifest records a digest and the restored contents differ: the
    /// snapshot does not hold what its writer saw (a failure).
    Mismatch,
    /// The manifest records no digest (an older manifest, a writer that
    /// turned it off, or a format that computes none): nothing was
    /// compared; only the blobs were verified, by the restore.
    NotRecorded,
}

impl DigestCheck {
    /// The name `verify --deep --json` prints: `matched`, `mismatch`,
    /// `no_digest_recorded`.
    pub fn as_str(&self) -> &'static str {
        match self {
            DigestCheck::Matched => "matched",
            DigestCheck::Mismatch => "mismatch",
            DigestCheck::NotRecorded => "no_digest_recorded",
        }
    }
}

impl DeepVerifyReport {
    /// Whether a recorded digest was compared, and matched.
    pub fn digest_check(&self) -> DigestCheck {
        match self.expected {
            None => DigestCheck::NotRecorded,
            Some(e) if e == self.actual => DigestCheck::Matched,
            Some(_) => DigestCheck::Mismatch,
        }
    }

    /// Whether the restored contents were compared with a recorded digest
    /// and match it. `false` both for a mismatch and when no digest was
    /// recorded ([`DeepVerifyReport::digest_check`] tells which): a check
    /// that was not made is not reported as passed.
    pub fn is_ok(&self) -> bool {
        self.digest_check() == DigestCheck::Matched
    }

    /// Whether the check found something wrong: the restored contents
    /// differ from the recorded digest. (A snapshot with no digest
    /// recorded has nothing found wrong, and nothing compared.)
    pub fn found_mismatch(&self) -> bool {
        self.digest_check() == DigestCheck::Mismatch
    }
}

/// Restores snapshot `manifest` alone — no changelog, no replay — into
/// `dir` (which must not exist), every blob verified by the format, and
/// checks the store sits at the snapshot's offset: the snapshot's contents,
/// to read offline (the CLI's `get`, `scan` and `diff`). The caller owns
/// `dir` afterwards; on failure it is removed.
pub async fn open_snapshot<F: StoreFormat>(
    format: &F,
    repo: &Repository,
    manifest: &Manifest,
    dir: &Path,
) -> Result<(F::Store, RestoreStats)> {
    // Never remove what the caller had there: the directory is ours only
    // if we create it.
    if std::fs::symlink_metadata(dir).is_ok() {
        return Err(Error::config(format!(
            "the directory to open a snapshot in already exists path=`{}`; give a path that \
             does not exist (it is created)",
            dir.display()
        ))
        .with_reason(crate::Reason::AlreadyExists));
    }
    let result = async {
        let (store, stats) = format
            .restore(manifest, RestoreContext { repo, target: dir })
            .await?;
        let applied = store.applied_offset()?;
        if applied != Some(manifest.changelog.offset) {
            return Err(Error::corrupt(format!(
                "restored snapshot does not sit at its offset snapshot=`{}` offset={} \
                 applied_offset={applied:?}",
                manifest.snapshot_id, manifest.changelog.offset
            )));
        }
        Ok((store, stats))
    }
    .await;
    if result.is_err() {
        remove_scratch(dir)?;
    }
    result
}

/// A scratch directory this library created (it refuses one that exists:
/// what the caller had there is never removed). [`ScratchDir::remove`]
/// removes it and reports a failure; dropped otherwise (an early return, a
/// cancelled future), it is removed once every blocking step still working
/// inside it has ended (its guard is held by them: a source restore still
/// running on the blocking pool when a reshard is dropped would otherwise
/// write into it again after it was removed), a failure only logged.
#[derive(Debug)]
pub(crate) struct ScratchDir {
    path: std::path::PathBuf,
    guard: Option<crate::format::staging::PathGuard>,
}

impl ScratchDir {
    /// Creates `path`, which must not exist (`config`, reason
    /// `already_exists`, if it does).
    pub(crate) fn create(path: &Path) -> Result<Self> {
        if std::fs::symlink_metadata(path).is_ok() {
            return Err(Error::config(format!(
                "the scratch directory already exists path=`{}`; give a path that does not exist",
                path.display()
            ))
            .with_reason(crate::Reason::AlreadyExists));
        }
        std::fs::create_dir_all(path).map_err(|e| {
            Error::io(
                format!("cannot create scratch directory path=`{}`", path.display()),
                e,
            )
        })?;
        Ok(ScratchDir {
            path: path.to_owned(),
            guard: Some(crate::format::staging::PathGuard::new(path.to_owned())),
        })
    }

    /// Its path.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Removes it, reporting a failure. Every step that worked in it has
    /// ended (they were awaited).
    pub(crate) fn remove(mut self) -> Result<()> {
        if let Some(g) = self.guard.take() {
            g.disarm();
        }
        remove_scratch(&self.path)
    }
}

fn remove_scratch(dir: &Path) -> Result<()> {
    if std::fs::symlink_metadata(dir).is_ok() {
        std::fs::remove_dir_all(dir).map_err(|e| {
            Error::io(
                format!("cannot remove scratch directory path=`{}`", dir.display()),
                e,
            )
        })?;
    }
    Ok(())
}

/// Restores snapshot `manifest` into the scratch directory `scratch` (which
/// must not exist: it is created and removed afterwards) with
/// [`open_snapshot`], computes the store's logical digest and compares it
/// with the manifest's. A failed restore is returned as its error
/// (`corrupt` for a bad blob); a digest mismatch, or a manifest that
/// records no digest to compare, is in the report
/// ([`DeepVerifyReport::digest_check`]).
pub async fn verify_deep<F: StoreFormat>(
    format: &F,
    repo: &Repository,
    manifest: &Manifest,
    scratch: &Path,
) -> Result<DeepVerifyReport> {
    let (store, stats) = open_snapshot(format, repo, manifest, scratch).await?;
    let result = store.logical_digest().map(|actual| DeepVerifyReport {
        snapshot: manifest.snapshot_id,
        expected: manifest.logical_digest,
        actual,
        bytes_downloaded: stats.bytes_downloaded,
    });
    drop(store);
    remove_scratch(scratch)?;
    result
}

/// Runs `plan`: tries its steps in order, replays the tail after the one
/// that worked.
async fn execute<F: StoreFormat, C: Changelog + ?Sized>(
    format: &F,
    repo: &Repository,
    changelog: &C,
    target: &Path,
    plan: RestorePlan,
    options: &RestoreOptions,
) -> Result<(F::Store, RestoreReport)> {
    let started = Instant::now();
    let ((mut store, transfer, source), failed) =
        first_usable_source(format, repo, target, &plan, options).await?;
    let snapshot_duration = started.elapsed();
    let (snapshot, snapshot_offset) = match source {
        Source::Snapshot { id, offset } => (Some(id), Some(offset)),
        _ => (None, None),
    };
    if source == Source::FullReplay && !plan.manifests.is_empty() {
        tracing::warn!(store_key = %plan.store_key, "no usable snapshot; rebuilding by full replay");
    }
    let replay = replay_tail(&mut store, changelog, &plan, snapshot_offset, options)?;
    let skipped = skipped_snapshots(&plan, &source, failed);
    let unreadable = plan.unreadable.clone();
    Ok((
        store,
        RestoreReport {
            source,
            plan,
            snapshot,
            snapshot_offset,
            skipped,
            unreadable,
            transfer,
            snapshot_duration,
            replay,
        },
    ))
}

/// Tries the plan's steps in order until one gives a store: the local
/// store, a snapshot (digest-checked when asked), or an empty store for a
/// full replay. A transient or cancelled step ends the restore; any other
/// failure is recorded and the next step tried.
#[allow(clippy::type_complexity)]
async fn first_usable_source<F: StoreFormat>(
    format: &F,
    repo: &Repository,
    target: &Path,
    plan: &RestorePlan,
    options: &RestoreOptions,
) -> Result<((F::Store, RestoreStats, Source), Vec<SkippedSnapshot>)> {
    let mut failed: Vec<SkippedSnapshot> = Vec::new();
    let mut restored = None;
    // A snapshot restored over the local store and then refused (digest)
    // was wiped: the local store is gone.
    let mut local_gone = false;
    for step in &plan.steps {
        let attempt =
            match &step.source {
                Source::Local { .. } if local_gone => continue,
                Source::Local { .. } => blocking_here(|| format.open_local(target))
                    .map(|s| (s, RestoreStats::default())),
                Source::Snapshot { id, .. } => match plan.manifest(*id) {
                    Some(m) => match format.restore(m, RestoreContext { repo, target }).await {
                        Ok((store, stats)) if options.verify_digest => {
                            match blocking_here(|| check_digest(&store, m)) {
                                Ok(()) => Ok((store, stats)),
                                Err(e) => {
                                    drop(store);
                                    local_gone = true;
                                    drop(blocking_here(|| format.create_empty(target))?);
                                    Err(e)
                                }
                            }
                        }
                        other => other,
                    },
                    None => Err(Error::internal(format!(
                        "restore plan names a snapshot it holds no manifest for snapshot=`{id}`"
                    ))),
                },
                Source::FullReplay => blocking_here(|| format.create_empty(target))
                    .map(|s| (s, RestoreStats::default())),
                Source::Standby { .. } => Err(Error::internal(
                    "a restore plan names a standby as a source; plans never do",
                )),
            };
        match attempt {
            Ok((store, stats)) => {
                restored = Some((store, stats, step.source.clone()));
                break;
            }
            Err(e) if e.kind() == ErrorKind::Transient || e.kind() == ErrorKind::Cancelled => {
                return Err(e);
            }
            // An empty store that cannot be created: nothing left to try.
            Err(e) if step.source == Source::FullReplay => return Err(e),
            Err(e) => {
                tracing::warn!(source = %step.source, error = %e, "restore source failed; trying the next");
                if let Source::Snapshot { id, offset } = step.source {
                    failed.push(SkippedSnapshot {
                        id,
                        offset,
                        kind: e.kind(),
                        reason: e.to_string(),
                        refusal: e.reason(),
                    });
                }
            }
        }
    }
    let Some(restored) = restored else {
        return Err(Error::internal(format!(
            "restore plan has no step left store_key=`{}`",
            plan.store_key
        )));
    };
    Ok((restored, failed))
}

/// Binds a restored snapshot's store to `changelog`, checks that it sits at
/// the snapshot's offset, and replays the tail (up to `options.until`).
fn replay_tail<S: StateStore, C: Changelog + ?Sized>(
    store: &mut S,
    changelog: &C,
    plan: &RestorePlan,
    snapshot_offset: Option<u64>,
    options: &RestoreOptions,
) -> Result<ReplayReport> {
    if snapshot_offset.is_some() {
        // A restored store follows the changelog its snapshot was taken
        // from (invariant 10); bind it before replaying the tail.
        bind_restored(store, &ChangelogBinding::of(changelog)?)?;
    }
    if let Some(o) = snapshot_offset {
        let applied = store.applied_offset()?;
        if applied != Some(o) {
            return Err(Error::corrupt(format!(
                "restored store does not sit at its snapshot's offset store_key=`{}` \
                 snapshot_offset={o} applied_offset={applied:?}",
                plan.store_key
            )));
        }
    }
    if let Some(p) = &options.progress {
        let from = store.applied_offset()?.map_or(0, |o| o + 1);
        let end = changelog.end_offset()?;
        let to = options.until.map_or(end, |u| u.saturating_add(1).min(end));
        p.replay_started(from, to);
    }
    blocking_here(|| {
        replay_until(store, changelog, &options.replay, options.until, &mut |r| {
            if let Some(p) = &options.progress {
                p.replayed(r);
            }
        })
    })
}

/// Skipped: snapshots newer than the source, rejected by the plan or
/// failed, newest first.
fn skipped_snapshots(
    plan: &RestorePlan,
    source: &Source,
    failed: Vec<SkippedSnapshot>,
) -> Vec<SkippedSnapshot> {
    let start = source.start_offset();
    let mut skipped: Vec<SkippedSnapshot> = plan
        .rejected
        .iter()
        .filter_map(|r| match r.source {
            Source::Snapshot { id, offset } if start.is_none_or(|s| offset > s) => {
                Some(SkippedSnapshot {
                    id,
                    offset,
                    kind: r.kind,
                    reason: r.reason.clone(),
                    refusal: r.refusal,
                })
            }
            _ => None,
        })
        .chain(failed)
        .collect();
    skipped.sort_by_key(|s| std::cmp::Reverse((s.offset, s.id)));
    skipped
}
