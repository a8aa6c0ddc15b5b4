//! Bringing a store back: restore from the newest usable snapshot, then
//! replay the changelog tail; fall back to older snapshots, then to full
//! replay, and say why. Only orchestration lives here: the replay step itself
//! is [`crate::store::replay`] (re-exported), the snapshot formats are
//! [`crate::format`].

use std::path::Path;
use std::time::{Duration, Instant};

use crate::changelog::{Changelog, ChangelogBinding};
use crate::error::{Error, ErrorKind, Result};
use crate::format::{RestoreContext, RestoreStats, StoreFormat};
use crate::repo::{Repository, SnapshotId, SnapshotInfo, StoreKey, UnreadableManifest};
pub use crate::store::replay::{ReplayOptions, ReplayProgress, ReplayReport, replay};
use crate::store::{StateStore, bind_restored};

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
}

/// What a restore did.
#[derive(Debug, Clone)]
pub struct RestoreReport {
    /// The snapshot restored from, or `None` for a full replay.
    pub snapshot: Option<SnapshotId>,
    /// The snapshot's offset.
    pub snapshot_offset: Option<u64>,
    /// Newer snapshots that were not used, newest first, with reasons.
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
    /// contents are deleted. Off by default: a restore refuses (`config`)
    /// such a target rather than wipe what may be the user's files. Symlinks
    /// and mount points are refused either way.
    pub replace_unmarked: bool,
}

/// Why `snapshot` cannot be used with `changelog`, if it cannot.
fn check_usable<F: StoreFormat, C: Changelog + ?Sized>(
    format: &F,
    snapshot: &SnapshotInfo,
    changelog: &C,
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
    let id = changelog.id();
    if m.changelog.topic != id.topic || m.changelog.partition != id.partition {
        return Err(Error::config(format!(
            "snapshot follows another changelog snapshot=`{}` snapshot_changelog=`{}/{}` changelog=`{id}`",
            m.snapshot_id, m.changelog.topic, m.changelog.partition
        )));
    }
    let lineage = changelog.lineage()?;
    if m.changelog.lineage != lineage {
        return Err(Error::stale(format!(
            "snapshot belongs to an earlier incarnation of the changelog snapshot=`{}` \
             snapshot_lineage=`{}` changelog_lineage=`{lineage}`",
            m.snapshot_id, m.changelog.lineage
        )));
    }
    let end = changelog.end_offset()?;
    if m.changelog.offset >= end {
        return Err(Error::stale(format!(
            "snapshot is ahead of the changelog snapshot=`{}` offset={} end_offset={end}",
            m.snapshot_id, m.changelog.offset
        )));
    }
    if let Some((taken, now)) = m.changelog.lost_history(changelog)? {
        return Err(Error::stale(format!(
            "snapshot covers changelog records the log no longer has: the log lost records and \
             handed their offsets out again snapshot=`{}` offset={} snapshot_epoch={taken} \
             changelog_epoch={now}; an older snapshot or a replay is used instead",
            m.snapshot_id, m.changelog.offset
        )));
    }
    let horizon = changelog.horizon()?;
    if !horizon.can_resume_after(Some(m.changelog.offset)) {
        return Err(Error::stale(format!(
            "snapshot is below the changelog's horizon: replaying after it could resurrect deleted \
             keys snapshot=`{}` offset={} tombstones_before={} deleted_before={}",
            m.snapshot_id, m.changelog.offset, horizon.tombstones_before, horizon.deleted_before
        )));
    }
    Ok(())
}

/// Restores store `store_key` into `target`: the newest snapshot that is
/// usable (same format and changelog lineage, not ahead of the changelog, not
/// below its horizon, every blob verified), then a replay of the changelog
/// after it. Falls back to older snapshots, then to a full replay into an
/// empty store, recording each skip in the report. Transient errors (the
/// repository is unreachable) are returned rather than silently replaying
/// everything.
pub async fn restore_store<F: StoreFormat, C: Changelog + ?Sized>(
    format: &F,
    repo: &Repository,
    store_key: &StoreKey,
    changelog: &C,
    target: &Path,
    options: &RestoreOptions,
) -> Result<(F::Store, RestoreReport)> {
    // A symlink or a mount point is refused before anything is written
    // into it, even when the caller adopts the directory.
    if options.replace_unmarked && crate::format::staging::check_adoptable(target)? {
        // The caller adopts the directory: from now on it is a store.
        crate::store::mark_store_dir(target)?;
    }
    // Checked here for every format, custom ones included: a format's own
    // `restore`/`create_empty` may replace the target without looking.
    crate::format::staging::check_replaceable(target)?;
    let listing = if options.full_replay {
        Default::default()
    } else {
        repo.list_snapshots(store_key).await?
    };
    let mut skipped = Vec::new();
    let started = Instant::now();
    let mut restored = None;
    for snap in listing.snapshots.iter().rev() {
        let attempt = match check_usable(format, snap, changelog) {
            Ok(()) => {
                format
                    .restore(&snap.manifest, RestoreContext { repo, target })
                    .await
            }
            Err(e) => Err(e),
        };
        match attempt {
            Ok((store, stats)) => {
                restored = Some((store, stats, snap));
                break;
            }
            Err(e) if e.kind() == ErrorKind::Transient || e.kind() == ErrorKind::Cancelled => {
                return Err(e);
            }
            Err(e) => {
                tracing::warn!(snapshot = %snap.id(), offset = snap.offset(), error = %e, "skipping snapshot");
                skipped.push(SkippedSnapshot {
                    id: snap.id(),
                    offset: snap.offset(),
                    kind: e.kind(),
                    reason: e.to_string(),
                });
            }
        }
    }
    let snapshot_duration = started.elapsed();
    let (mut store, transfer, snapshot, snapshot_offset) = match restored {
        Some((store, stats, snap)) => (store, stats, Some(snap.id()), Some(snap.offset())),
        None => {
            if !listing.snapshots.is_empty() {
                tracing::warn!(store_key = %store_key, "no usable snapshot; rebuilding by full replay");
            }
            (
                format.create_empty(target)?,
                RestoreStats::default(),
                None,
                None,
            )
        }
    };
    if snapshot_offset.is_some() {
        // The format bound it from the manifest, which check_usable matched
        // against this changelog; a custom format may not have.
        bind_restored(&mut store, &ChangelogBinding::of(changelog)?)?;
    }
    if let Some(o) = snapshot_offset {
        let applied = store.applied_offset()?;
        if applied != Some(o) {
            return Err(Error::corrupt(format!(
                "restored store does not sit at its snapshot's offset store_key=`{store_key}` \
                 snapshot_offset={o} applied_offset={applied:?}"
            )));
        }
    }
    let replay = replay(&mut store, changelog, &options.replay, &mut |_| {})?;
    Ok((
        store,
        RestoreReport {
            snapshot,
            snapshot_offset,
            skipped,
            unreadable: listing.unreadable,
            transfer,
            snapshot_duration,
            replay,
        },
    ))
}
