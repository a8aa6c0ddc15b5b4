//! The restore decision, made without touching anything: which sources can
//! give a store its starting state (the local store, each snapshot, a full
//! replay), in the order a restore tries them, and why the others are out.
//! [`super::restore_store`] executes a plan; [`plan_restore`] is the same
//! decision as a dry run.

use std::path::Path;
use std::time::Duration;

use crate::changelog::{Changelog, ChangelogBinding, ChangelogId, Horizon, Lineage};
use crate::error::{Error, ErrorKind, Result};
use crate::format::{LocalStoreInfo, StoreFormat};
use crate::repo::{Manifest, Repository, SnapshotId, SnapshotInfo, StoreKey, UnreadableManifest};

/// Where a restored store gets its starting state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// The store already in the target directory (only the tail after its
    /// offset is replayed).
    Local {
        /// The last offset it applied.
        applied_offset: Option<u64>,
    },
    /// A snapshot from the repository, then the tail after its offset.
    Snapshot {
        /// The snapshot.
        id: SnapshotId,
        /// Its changelog offset.
        offset: u64,
    },
    /// An empty store, rebuilt by replaying the whole changelog.
    FullReplay,
    /// A standby that was following the changelog, promoted
    /// ([`crate::runtime::StandbyHandle::promote`]): only its lag was
    /// replayed, nothing downloaded. Restore plans never choose it.
    Standby {
        /// The last offset it had applied when the promotion began.
        applied_offset: Option<u64>,
    },
}

impl Source {
    /// The offset the store starts from (`None`: from the beginning).
    pub fn start_offset(&self) -> Option<u64> {
        match self {
            Source::Local { applied_offset } | Source::Standby { applied_offset } => {
                *applied_offset
            }
            Source::Snapshot { offset, .. } => Some(*offset),
            Source::FullReplay => None,
        }
    }
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::Local {
                applied_offset: Some(o),
            } => write!(f, "local store at offset {o}"),
            Source::Local {
                applied_offset: None,
            } => write!(f, "empty local store"),
            Source::Snapshot { id, offset } => write!(f, "snapshot {id} at offset {offset}"),
            Source::FullReplay => write!(f, "full replay"),
            Source::Standby {
                applied_offset: Some(o),
            } => write!(f, "standby at offset {o}"),
            Source::Standby {
                applied_offset: None,
            } => write!(f, "empty standby"),
        }
    }
}

/// One source a restore tries, with what it would cost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanStep {
    /// The source.
    pub source: Source,
    /// Bytes a snapshot restore downloads (its files minus those found
    /// locally with the same path and size; their hash is checked at
    /// restore time, a mismatch is downloaded).
    pub bytes_to_download: u64,
    /// Bytes of the snapshot's files already present locally.
    pub bytes_local: u64,
    /// Changelog records after the source's offset up to the end (or the
    /// point-in-time bound): an upper bound on what is replayed (a
    /// compacted log holds fewer).
    pub records_to_replay: u64,
}

/// A candidate the plan will not use, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejected {
    /// The candidate.
    pub source: Source,
    /// What kind of problem (`stale`, `config`, ...).
    pub kind: ErrorKind,
    /// The reason, as an error message.
    pub reason: String,
    /// The refusal, when the error carried one ([`crate::Reason`]): what a
    /// program acts on (the message is for people).
    pub refusal: Option<crate::Reason>,
}

/// Options of a plan (and of the restore that executes it).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PlanOptions {
    /// Consider the store already in the target directory: kept when it
    /// follows the same changelog and is at or past the newest usable
    /// snapshot. Off: the target is always replaced.
    pub local_first: bool,
    /// Ignore snapshots and the local store: rebuild by full replay.
    pub full_replay: bool,
    /// Point in time: the last changelog offset the result reflects (the
    /// newest source at or before it, then replay up to it).
    pub until: Option<u64>,
}

/// Measured rates a plan's time estimate uses.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rates {
    /// Repository download bandwidth, bytes per second.
    pub download_bytes_per_sec: f64,
    /// Changelog replay rate, records per second.
    pub replay_records_per_sec: f64,
}

impl Default for Rates {
    /// Conservative figures for when nothing was measured yet (a loopback
    /// object store and the file log on this project's test machine do
    /// several times better).
    fn default() -> Self {
        Rates {
            download_bytes_per_sec: 50e6,
            replay_records_per_sec: 200e3,
        }
    }
}

/// The restore decision for one store partition.
#[derive(Debug, Clone)]
pub struct RestorePlan {
    /// The store partition.
    pub store_key: StoreKey,
    /// Its changelog.
    pub changelog: ChangelogId,
    /// The changelog's end offset when the plan was made.
    pub end_offset: u64,
    /// The point-in-time bound, if any.
    pub until: Option<u64>,
    /// The sources a restore tries, in order; the first that works is
    /// used. Never empty. For the newest state it always ends with
    /// [`Source::FullReplay`]; for a point in time it holds only the
    /// sources that give exactly the state at that offset (a plan with
    /// none is refused, `stale`, naming the offsets that are exact).
    pub steps: Vec<PlanStep>,
    /// Candidates not tried, with reasons (newest first).
    pub rejected: Vec<Rejected>,
    /// Manifests that could not be read at all.
    pub unreadable: Vec<UnreadableManifest>,
    /// The manifests of the snapshot steps, for the restore that runs the
    /// plan.
    pub(crate) manifests: Vec<SnapshotInfo>,
}

impl RestorePlan {
    /// The source a restore uses if nothing fails.
    pub fn chosen(&self) -> Option<&PlanStep> {
        self.steps.first()
    }

    /// Estimated time to a ready store along the chosen step.
    pub fn estimated_time(&self, rates: &Rates) -> Duration {
        self.chosen()
            .map_or(Duration::ZERO, |s| step_time(s, rates))
    }

    pub(crate) fn manifest(&self, id: SnapshotId) -> Option<&Manifest> {
        self.manifests
            .iter()
            .find(|m| m.id() == id)
            .map(|m| &m.manifest)
    }
}

/// Estimated time of one step: download at the measured bandwidth, replay
/// at the measured rate.
pub fn step_time(step: &PlanStep, rates: &Rates) -> Duration {
    let secs = step.bytes_to_download as f64 / rates.download_bytes_per_sec.max(1.0)
        + step.records_to_replay as f64 / rates.replay_records_per_sec.max(1.0);
    Duration::try_from_secs_f64(secs).unwrap_or(Duration::MAX)
}

/// The changelog's state, read once per plan.
pub(crate) struct LogFacts {
    pub(crate) binding: ChangelogBinding,
    pub(crate) end: u64,
    /// Read when a candidate has a tail to replay (only then can the
    /// horizon refuse it). For Kafka it costs a config lookup, an
    /// offset-by-time lookup and a one-record read — 0.7 s on a 1 M-record
    /// tansu log — which a handoff snapshot at the log's end does not need.
    horizon: std::sync::OnceLock<Horizon>,
}

impl LogFacts {
    pub(crate) fn read<C: Changelog + ?Sized>(changelog: &C) -> Result<LogFacts> {
        Ok(LogFacts {
            binding: ChangelogBinding::of(changelog)?,
            end: changelog.end_offset()?,
            horizon: std::sync::OnceLock::new(),
        })
    }

    /// The changelog's horizon, read once.
    fn horizon<C: Changelog + ?Sized>(&self, changelog: &C) -> Result<&Horizon> {
        Ok(match self.horizon.get() {
            Some(h) => h,
            None => {
                let h = changelog.horizon()?;
                self.horizon.get_or_init(|| h)
            }
        })
    }

    /// Whether replay can resume after `offset` (the horizon, read once).
    fn can_resume_after<C: Changelog + ?Sized>(
        &self,
        changelog: &C,
        offset: u64,
    ) -> Result<std::result::Result<(), Horizon>> {
        if offset.saturating_add(1) >= self.end {
            // Nothing to replay: no horizon can refuse it.
            return Ok(Ok(()));
        }
        let horizon = self.horizon(changelog)?;
        Ok(if horizon.can_resume_after(Some(offset)) {
            Ok(())
        } else {
            Err(*horizon)
        })
    }

    /// Whether a source at `start` replayed up to `until` gives exactly the
    /// state the log had at `until` ([`Horizon::exact_as_of`]). Up to the
    /// log's last record, it is an ordinary restore.
    fn exact_as_of<C: Changelog + ?Sized>(
        &self,
        changelog: &C,
        start: Option<u64>,
        until: u64,
    ) -> Result<std::result::Result<(), Horizon>> {
        if start == Some(until) {
            return Ok(Ok(()));
        }
        let horizon = self.horizon(changelog)?;
        let exact = if until.saturating_add(1) >= self.end {
            horizon.can_resume_after(start)
        } else {
            horizon.exact_as_of(start, until)
        };
        Ok(if exact { Ok(()) } else { Err(*horizon) })
    }

    fn id(&self) -> &ChangelogId {
        &self.binding.changelog
    }

    fn lineage(&self) -> &Lineage {
        &self.binding.lineage
    }

    /// Records after `start` up to the end or `until`.
    fn records_after(&self, start: Option<u64>, until: Option<u64>) -> u64 {
        let stop = until.map_or(self.end, |u| self.end.min(u.saturating_add(1)));
        stop.saturating_sub(start.map_or(0, |o| o.saturating_add(1)))
    }
}

/// Checks that `snapshot` can seed a store that then follows `changelog`:
/// same format (not newer), same changelog and lineage, not ahead of the
/// log, in history the log still has, not below its horizon.
pub(crate) fn check_usable<F: StoreFormat, C: Changelog + ?Sized>(
    format: &F,
    snapshot: &SnapshotInfo,
    changelog: &C,
    facts: &LogFacts,
) -> Result<()> {
    let m = &snapshot.manifest;
    let fid = format.id();
    if m.store_format.name != fid.name || m.store_format.version > fid.version {
        return Err(Error::config(format!(
            "snapshot was written by another store format snapshot=`{}` format=`{}` version={} \
             this_format=`{}` this_version={}",
            m.snapshot_id, m.store_format.name, m.store_format.version, fid.name, fid.version
        )));
    }
    let id = facts.id();
    if m.changelog.topic != id.topic || m.changelog.partition != id.partition {
        return Err(Error::config(format!(
            "snapshot follows another changelog snapshot=`{}` snapshot_changelog=`{}/{}` changelog=`{id}`",
            m.snapshot_id, m.changelog.topic, m.changelog.partition
        )).with_reason(crate::Reason::OtherChangelog));
    }
    let lineage = facts.lineage();
    if &m.changelog.lineage != lineage {
        return Err(Error::stale(format!(
            "snapshot belongs to another incarnation of the changelog (lineage {}; the log \
             has {lineage}: it was recreated, or this is another log of the same name) \
             snapshot=`{}` snapshot_lineage=`{}` changelog_lineage=`{lineage}`",
            m.changelog.lineage, m.snapshot_id, m.changelog.lineage
        ))
        .with_reason(crate::Reason::LineageChanged));
    }
    let end = facts.end;
    if m.changelog.offset >= end {
        return Err(Error::stale(format!(
            "snapshot is ahead of the changelog snapshot=`{}` offset={} end_offset={end}",
            m.snapshot_id, m.changelog.offset
        ))
        .with_reason(crate::Reason::AheadOfLog));
    }
    // Offsets the log lost and handed out again (invariant 11, epochs).
    if let Some((taken, now)) = m.changelog.lost_history(changelog)? {
        return Err(Error::stale(format!(
            "snapshot covers changelog records the log no longer has: the log lost records and \
             handed their offsets out again snapshot=`{}` offset={} snapshot_epoch={taken} \
             changelog_epoch={now}; an older snapshot or a replay is used instead",
            m.snapshot_id, m.changelog.offset
        ))
        .with_reason(crate::Reason::HistoryLost));
    }
    if let Err(horizon) = facts.can_resume_after(changelog, m.changelog.offset)? {
        return Err(Error::stale(format!(
            "snapshot is below the changelog's horizon: replaying after it could resurrect deleted \
             keys snapshot=`{}` offset={} tombstones_before={} deleted_before={}",
            m.snapshot_id, m.changelog.offset, horizon.tombstones_before, horizon.deleted_before
        ))
        .with_reason(crate::Reason::BelowHorizon));
    }
    Ok(())
}

/// Checks that `source` replayed up to the point in time `until` (if any)
/// gives exactly the state the log had there (`stale` if compaction may
/// have removed a record that replay would need).
fn check_point_in_time<C: Changelog + ?Sized>(
    changelog: &C,
    facts: &LogFacts,
    source: &Source,
    until: Option<u64>,
) -> Result<()> {
    let Some(u) = until else {
        return Ok(());
    };
    match facts.exact_as_of(changelog, source.start_offset(), u)? {
        Ok(()) => Ok(()),
        Err(h) => Err(Error::stale(format!(
            "{source} cannot give the state at the point in time exactly: compaction may have \
             removed records after it that a later write replaced until={u} \
             superseded_before={} tombstones_before={} deleted_before={}",
            h.superseded_before, h.tombstones_before, h.deleted_before
        ))
        .with_reason(crate::Reason::BelowHorizon)),
    }
}

/// Every exact point in time, for people: the offsets of usable snapshots
/// (each exact at its own offset) in ascending order, then the stretch at
/// the log's end that replay reaches exactly, if any ("offsets 412, 905
/// and 1398, and any offset from 2473 to 2480").
fn exact_points_text(points: &[u64], tail: Option<(u64, u64)>) -> String {
    let mut points: Vec<u64> = points.to_vec();
    points.sort_unstable();
    points.dedup();
    // The stretch covers the snapshots inside it.
    if let Some((from, _)) = tail {
        points.retain(|&o| o < from);
    }
    let listed = match points.as_slice() {
        [] => None,
        [one] => Some(format!("offset {one}")),
        [init @ .., last] => {
            let init: Vec<String> = init.iter().map(u64::to_string).collect();
            Some(format!("offsets {} and {last}", init.join(", ")))
        }
    };
    let stretch = tail.map(|(from, to)| {
        if from == to {
            format!("offset {from} (the log's last)")
        } else {
            format!("any offset from {from} to {to} (the log's end)")
        }
    });
    match (listed, stretch) {
        (Some(l), Some(s)) => format!("{l}, and {s}"),
        (Some(l), None) => l,
        (None, Some(s)) => s,
        (None, None) => "none: restore the newest state instead".to_owned(),
    }
}

/// The refusal of a point in time that no source gives exactly, naming
/// the points in time that are exact.
fn no_exact_source<C: Changelog + ?Sized>(
    store_key: &StoreKey,
    facts: &LogFacts,
    changelog: &C,
    until: Option<u64>,
    exact_points: &[u64],
) -> Error {
    let Some(u) = until else {
        return Error::internal(format!(
            "restore plan has no source store_key=`{store_key}`"
        ));
    };
    let horizon = facts.horizon(changelog).ok().copied().unwrap_or_default();
    let from = horizon.superseded_before.saturating_sub(1);
    let tail = (from < facts.end).then(|| (from, facts.end.saturating_sub(1)));
    Error::stale(format!(
        "the state at this point in time cannot be rebuilt exactly: compaction may have removed \
         records at or before it that a later write replaced, and no snapshot sits exactly there \
         store_key=`{store_key}` changelog=`{}` until={u} superseded_before={}; the exact points \
         in time are {}",
        facts.id(),
        horizon.superseded_before,
        exact_points_text(exact_points, tail)
    ))
    .with_reason(crate::Reason::BelowHorizon)
}

/// Checks that the local store `info` can be kept: it follows this
/// changelog incarnation, is behind its end, at or before `until`, and the
/// log still holds everything after it.
///
/// What this cannot see: a local store whose log lost records *and* had
/// them re-filled by another writer up to past the store's offset (the
/// snapshot check above compares epochs; a store records none). The file
/// log keeps the store and the log on one disk, where a loss of the log's
/// synced records takes the store's with it.
fn check_local<C: Changelog + ?Sized>(
    info: &LocalStoreInfo,
    changelog: &C,
    facts: &LogFacts,
    until: Option<u64>,
) -> Result<()> {
    let expected = &facts.binding;
    match (&info.binding, info.applied_offset) {
        (Some(b), _) if b == expected => {}
        (Some(b), _) => {
            return Err(Error::stale(format!(
                "local store follows another changelog store_follows=`{b}` changelog=`{expected}`; \
                 it is replaced"
            ))
            .with_reason(crate::Reason::OtherChangelog));
        }
        (None, None) => {
            return Err(Error::config(
                "local store is empty: nothing to keep".to_owned(),
            ));
        }
        (None, Some(o)) => {
            return Err(Error::stale(format!(
                "local store has applied records but records no changelog binding \
                 applied_offset={o}; its offset cannot be trusted: it is replaced"
            ))
            .with_reason(crate::Reason::Unbound));
        }
    }
    let Some(a) = info.applied_offset else {
        return Err(Error::config(
            "local store has applied nothing: nothing to keep".to_owned(),
        ));
    };
    if a >= facts.end {
        return Err(Error::stale(format!(
            "local store is ahead of its changelog applied_offset={a} end_offset={}; the log \
             lost records the store applied: it is replaced",
            facts.end
        ))
        .with_reason(crate::Reason::AheadOfLog));
    }
    if let Some(u) = until
        && a > u
    {
        return Err(Error::stale(format!(
            "local store is past the point in time applied_offset={a} until={u}; a store cannot \
             go back: it is replaced"
        ))
        .with_reason(crate::Reason::PastPoint));
    }
    if let Err(horizon) = facts.can_resume_after(changelog, a)? {
        return Err(Error::stale(format!(
            "local store is below the changelog's horizon applied_offset={a} \
             tombstones_before={} deleted_before={}; it is replaced",
            horizon.tombstones_before, horizon.deleted_before
        ))
        .with_reason(crate::Reason::BelowHorizon));
    }
    Ok(())
}

/// Bytes of `manifest`'s files the format would reuse from under `target`
/// (same path and size; the restore checks their hash).
fn local_bytes<F: StoreFormat>(format: &F, manifest: &Manifest, target: &Path) -> u64 {
    manifest
        .files
        .iter()
        .filter(|f| {
            format.reuses_local_file(&f.path)
                && Manifest::file_path_within(target, &f.path)
                    .ok()
                    .and_then(|p| std::fs::symlink_metadata(p).ok())
                    .is_some_and(|m| m.is_file() && m.len() == f.size)
        })
        .map(|f| f.size)
        .sum()
}

/// A step that downloads nothing: the local store or a full replay.
fn replay_step(source: Source, facts: &LogFacts, until: Option<u64>) -> PlanStep {
    PlanStep {
        records_to_replay: facts.records_after(source.start_offset(), until),
        source,
        bytes_to_download: 0,
        bytes_local: 0,
    }
}

fn rejection(source: Source, e: &Error) -> Rejected {
    Rejected {
        source,
        kind: e.kind(),
        reason: e.to_string(),
        refusal: e.reason(),
    }
}

/// Transient and cancelled errors abort a plan (the answer would be wrong,
/// not just different); every other error rejects one candidate.
fn aborts(e: &Error) -> bool {
    matches!(e.kind(), ErrorKind::Transient | ErrorKind::Cancelled)
}

/// Decides how to restore `store_key` into `target` from `repo` and
/// `changelog`, without changing anything: lists the snapshots, checks each
/// against the changelog (format, lineage, epoch, horizon, not ahead), reads
/// the local store's offset (read-only), and orders the usable sources —
/// snapshots newer than the local store (newest first), then the local
/// store, then older snapshots, then a full replay. Blob contents are
/// verified only by the restore itself.
///
/// With a point in time ([`PlanOptions::until`]) the answer is exact or
/// refused: an offset at or past the changelog's end is refused (`config`,
/// naming the end), snapshots after it are not candidates, and a source is
/// kept only if replaying from it up to the offset gives exactly the state
/// the log had there ([`Horizon::exact_as_of`]: compaction may have dropped
/// a record whose key was written again later). When no source is exact
/// the plan is refused (`stale`), naming the offsets that are.
pub async fn plan_restore<F: StoreFormat, C: Changelog + ?Sized>(
    format: &F,
    repo: &Repository,
    store_key: &StoreKey,
    changelog: &C,
    target: &Path,
    options: &PlanOptions,
) -> Result<RestorePlan> {
    let facts = LogFacts::read(changelog)?;
    let listing = if options.full_replay {
        Default::default()
    } else {
        repo.catalog().list_snapshots(store_key).await?
    };
    plan_with(
        format, listing, store_key, changelog, target, options, &facts,
    )
}

pub(crate) fn plan_with<F: StoreFormat, C: Changelog + ?Sized>(
    format: &F,
    listing: crate::repo::Listing,
    store_key: &StoreKey,
    changelog: &C,
    target: &Path,
    options: &PlanOptions,
    facts: &LogFacts,
) -> Result<RestorePlan> {
    let until = options.until;
    check_until(store_key, facts, until)?;
    let mut rejected = Vec::new();
    let local = local_candidate(format, changelog, target, options, facts, &mut rejected)?;
    let mut steps = Vec::new();
    let mut manifests = Vec::new();
    let mut local_placed = false;
    // Usable snapshots that are not sources only because the point in
    // time lies before or past them: each is exact at its own offset.
    // Those past it are checked only if the plan is refused (`later`).
    let mut exact_points = Vec::new();
    let mut later = Vec::new();
    for snap in listing.snapshots.iter().rev() {
        let source = Source::Snapshot {
            id: snap.id(),
            offset: snap.offset(),
        };
        // A snapshot after the point in time is no candidate, and nothing
        // is wrong with it: it is not listed as rejected. Usable, it is an
        // exact point in time a refusal can name.
        if until.is_some_and(|u| snap.offset() > u) {
            later.push(snap);
            continue;
        }
        if let Err(e) = check_usable(format, snap, changelog, facts) {
            if aborts(&e) {
                return Err(e);
            }
            rejected.push(rejection(source, &e));
            continue;
        }
        if let Err(e) = check_point_in_time(changelog, facts, &source, until) {
            if aborts(&e) {
                return Err(e);
            }
            exact_points.push(snap.offset());
            rejected.push(rejection(source, &e));
            continue;
        }
        if let Some(a) = local
            && !local_placed
            && a >= snap.offset()
        {
            steps.push(replay_step(
                Source::Local {
                    applied_offset: Some(a),
                },
                facts,
                until,
            ));
            local_placed = true;
        }
        steps.push(snapshot_step(format, snap, source, target, facts, until));
        manifests.push(snap.clone());
    }
    if let Some(a) = local
        && !local_placed
    {
        steps.push(replay_step(
            Source::Local {
                applied_offset: Some(a),
            },
            facts,
            until,
        ));
    }
    // Last resort, always listed for the newest state: a log that no
    // longer starts at offset 0 makes the replay itself fail (stale) and
    // say so. For a point in time, only if it is exact.
    match check_point_in_time(changelog, facts, &Source::FullReplay, until) {
        Ok(()) => steps.push(replay_step(Source::FullReplay, facts, until)),
        Err(e) if aborts(&e) => return Err(e),
        Err(e) => rejected.push(rejection(Source::FullReplay, &e)),
    }
    if steps.is_empty() {
        exact_points.extend(
            later
                .into_iter()
                .filter(|s| check_usable(format, s, changelog, facts).is_ok())
                .map(|s| s.offset()),
        );
        return Err(no_exact_source(
            store_key,
            facts,
            changelog,
            until,
            &exact_points,
        ));
    }
    Ok(RestorePlan {
        store_key: store_key.clone(),
        changelog: facts.id().clone(),
        end_offset: facts.end,
        until,
        steps,
        rejected,
        unreadable: listing.unreadable,
        manifests,
    })
}

/// Refuses (`config`) a point in time at or past the log's end, naming the
/// last offset the log holds.
fn check_until(store_key: &StoreKey, facts: &LogFacts, until: Option<u64>) -> Result<()> {
    if let Some(u) = until
        && u >= facts.end
    {
        let holds = match facts.end {
            0 => "it holds no record".to_owned(),
            e => format!("its last record is at offset {}", e - 1),
        };
        return Err(Error::config(format!(
            "point in time is past the changelog's end store_key=`{store_key}` changelog=`{}` \
             until={u} end_offset={}: {holds}; give an offset below the end, or none for the \
             newest state",
            facts.id(),
            facts.end
        ))
        .with_reason(crate::Reason::PastEnd));
    }
    Ok(())
}

/// The local store's applied offset when it may be kept (`local_first`):
/// valid, following this log, not below its horizon, exact for the point
/// in time. A local store that may not is listed in `rejected`.
fn local_candidate<F: StoreFormat, C: Changelog + ?Sized>(
    format: &F,
    changelog: &C,
    target: &Path,
    options: &PlanOptions,
    facts: &LogFacts,
    rejected: &mut Vec<Rejected>,
) -> Result<Option<u64>> {
    let until = options.until;
    if !options.local_first || options.full_replay {
        return Ok(None);
    }
    {
        match crate::util::blocking_here(|| format.inspect_local(target)) {
            Ok(None) => {}
            Ok(Some(info)) => {
                let source = Source::Local {
                    applied_offset: info.applied_offset,
                };
                match check_local(&info, changelog, facts, until)
                    .and_then(|()| check_point_in_time(changelog, facts, &source, until))
                {
                    Ok(()) => return Ok(info.applied_offset),
                    Err(e) if aborts(&e) => return Err(e),
                    Err(e) => rejected.push(rejection(source, &e)),
                }
            }
            Err(e) if aborts(&e) => return Err(e),
            Err(e) => rejected.push(rejection(
                Source::Local {
                    applied_offset: None,
                },
                &e,
            )),
        }
    }
    Ok(None)
}

/// A snapshot's step: what it downloads (less what the local store already
/// holds) and what it replays after.
fn snapshot_step<F: StoreFormat>(
    format: &F,
    snap: &SnapshotInfo,
    source: Source,
    target: &Path,
    facts: &LogFacts,
    until: Option<u64>,
) -> PlanStep {
    let size: u64 = snap.manifest.files.iter().map(|f| f.size).sum();
    let here = local_bytes(format, &snap.manifest, target);
    PlanStep {
        source,
        bytes_to_download: size.saturating_sub(here),
        bytes_local: here,
        records_to_replay: facts.records_after(Some(snap.offset()), until),
    }
}
