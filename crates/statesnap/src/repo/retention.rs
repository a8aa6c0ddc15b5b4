//! Retention: which snapshots to keep. A pure function over a listing, with
//! the time passed in (from the injected clock), so it is trivially testable.
//!
//! Retention decides **per lineage** (changelog incarnation). Offsets of
//! different incarnations are not comparable: after a changelog is deleted
//! and recreated, the dead incarnation's snapshots sit at higher offsets than
//! the live one's, yet no restore can use them. The live lineage is the one
//! the caller names ([`plan_for_lineage`], or [`plan_for_changelog`], which
//! also rules out snapshots of history the log lost) or, in [`plan`], the lineage of
//! the most recently *created* snapshot (a dead incarnation has no writer
//! left to snapshot it). Rules, in order:
//!
//! 1. the newest snapshot of the live lineage (by `(offset, id)`) is always
//!    kept;
//! 2. `keep_last = n` keeps the `n` newest of the live lineage;
//! 3. `keep_newer_than = d` keeps every snapshot, of any lineage, with
//!    `created_at >= now - d` (a dead lineage's snapshots expire by age
//!    alone, so a mistaken recreation can still be investigated for a while);
//! 4. every snapshot a kept one `depends_on`, transitively, is kept.
//!
//! A policy with neither limit keeps everything. `parent` alone is not a
//! dependency: a snapshot that needs its parent's data must list it in
//! `depends_on` (a RocksDB incremental snapshot names every file it needs,
//! reused or not, so dropping its parent loses nothing).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use super::catalog::SnapshotInfo;
use super::paths::SnapshotId;
use crate::changelog::{Changelog, Lineage};
use crate::error::Result;

/// What to keep.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RetentionPolicy {
    /// Keep the newest `n` snapshots.
    pub keep_last: Option<usize>,
    /// Keep snapshots younger than this.
    pub keep_newer_than: Option<Duration>,
}

/// Why a snapshot is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeepReason {
    /// The newest valid snapshot.
    Newest,
    /// Among the `keep_last` newest.
    KeepLast,
    /// Younger than `keep_newer_than`.
    NewerThan,
    /// A kept snapshot depends on it.
    DependencyOf(SnapshotId),
    /// The policy sets no limit.
    NoPolicy,
}

/// Why a snapshot is dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DropReason {
    /// Outside `keep_last` and older than `keep_newer_than`, and no kept
    /// snapshot depends on it.
    Expired,
    /// Of a changelog incarnation that is not the live one, older than
    /// `keep_newer_than`, and no kept snapshot depends on it.
    DeadLineage,
    /// Of the live lineage, but its offset lies in history the changelog
    /// lost (see [`plan_for_changelog`]); older than `keep_newer_than`, and
    /// no kept snapshot depends on it.
    LostHistory,
}

/// The decision for one listing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RetentionPlan {
    /// Kept snapshots (newest first) with the first reason that kept each.
    pub keep: Vec<(SnapshotId, KeepReason)>,
    /// Dropped snapshots (newest first).
    pub drop: Vec<(SnapshotId, DropReason)>,
    /// Dependencies named by kept snapshots that are not in the listing
    /// (those snapshots cannot be restored).
    pub missing_dependencies: Vec<(SnapshotId, SnapshotId)>,
}

impl RetentionPlan {
    /// Whether `id` is dropped.
    pub fn drops(&self, id: SnapshotId) -> bool {
        self.drop.iter().any(|(d, _)| *d == id)
    }
}

/// Decides what to keep among `snapshots` (any order) at time `now_ms`,
/// taking the lineage of the most recently created snapshot as the live one.
pub fn plan(snapshots: &[SnapshotInfo], policy: &RetentionPolicy, now_ms: i64) -> RetentionPlan {
    let live = snapshots
        .iter()
        .max_by_key(|s| (s.manifest.created_at, s.manifest.name()))
        .map(|s| s.manifest.changelog.lineage.clone());
    plan_for_lineage(snapshots, policy, now_ms, live.as_ref())
}

/// [`plan`] with the live lineage given (the changelog's current one):
/// snapshots of any other lineage count for nothing but their age.
pub fn plan_for_lineage(
    snapshots: &[SnapshotInfo],
    policy: &RetentionPolicy,
    now_ms: i64,
    live: Option<&Lineage>,
) -> RetentionPlan {
    plan_classified(snapshots, policy, now_ms, |s| match live {
        Some(l) if s.manifest.changelog.lineage != *l => Some(DropReason::DeadLineage),
        _ => None,
    })
}

/// [`plan`] against the changelog the store follows: only snapshots a
/// restore could use count toward `keep_last` and "newest". Besides another
/// lineage, that rules out a snapshot whose offset lies in history the log
/// lost ([`crate::changelog::Changelog::epoch_at`] differs from the epoch
/// the snapshot recorded); such snapshots expire like a dead lineage's.
pub fn plan_for_changelog<C: Changelog + ?Sized>(
    snapshots: &[SnapshotInfo],
    policy: &RetentionPolicy,
    now_ms: i64,
    changelog: &C,
) -> Result<RetentionPlan> {
    let lineage = changelog.lineage()?;
    let mut lost = BTreeSet::new();
    for s in snapshots {
        let c = &s.manifest.changelog;
        if c.lineage == lineage && c.lost_history(changelog)?.is_some() {
            lost.insert(s.id());
        }
    }
    Ok(plan_classified(snapshots, policy, now_ms, |s| {
        if s.manifest.changelog.lineage != lineage {
            Some(DropReason::DeadLineage)
        } else if lost.contains(&s.id()) {
            Some(DropReason::LostHistory)
        } else {
            None
        }
    }))
}

/// The rules above, with `dead` saying why a snapshot cannot count as live
/// (`None`: it is live).
fn plan_classified(
    snapshots: &[SnapshotInfo],
    policy: &RetentionPolicy,
    now_ms: i64,
    dead: impl Fn(&SnapshotInfo) -> Option<DropReason>,
) -> RetentionPlan {
    let mut sorted: Vec<&SnapshotInfo> = snapshots.iter().collect();
    sorted.sort_by_key(|s| std::cmp::Reverse(s.manifest.name()));
    let by_id: BTreeMap<SnapshotId, &SnapshotInfo> = sorted.iter().map(|s| (s.id(), *s)).collect();
    let mut kept: BTreeMap<SnapshotId, KeepReason> = BTreeMap::new();
    let no_policy = policy.keep_last.is_none() && policy.keep_newer_than.is_none();
    let cutoff = policy
        .keep_newer_than
        .map(|d| now_ms.saturating_sub(i64::try_from(d.as_millis()).unwrap_or(i64::MAX)));
    // Rank within the live lineage, newest first.
    let mut live_rank = 0usize;
    for s in &sorted {
        let is_live = dead(s).is_none();
        let rank = if is_live {
            live_rank += 1;
            Some(live_rank - 1)
        } else {
            None
        };
        let reason = if rank == Some(0) {
            Some(KeepReason::Newest)
        } else if no_policy {
            Some(KeepReason::NoPolicy)
        } else if rank.is_some_and(|i| policy.keep_last.is_some_and(|n| i < n)) {
            Some(KeepReason::KeepLast)
        } else if cutoff.is_some_and(|c| s.manifest.created_at >= c) {
            Some(KeepReason::NewerThan)
        } else {
            None
        };
        if let Some(r) = reason {
            kept.insert(s.id(), r);
        }
    }
    // Transitive closure over depends_on.
    let mut missing = BTreeSet::new();
    let mut queue: Vec<SnapshotId> = kept.keys().copied().collect();
    while let Some(id) = queue.pop() {
        let Some(s) = by_id.get(&id) else { continue };
        for dep in &s.manifest.depends_on {
            if !by_id.contains_key(dep) {
                missing.insert((id, *dep));
            } else if !kept.contains_key(dep) {
                kept.insert(*dep, KeepReason::DependencyOf(id));
                queue.push(*dep);
            }
        }
    }
    let mut out = RetentionPlan::default();
    for s in &sorted {
        match kept.get(&s.id()) {
            Some(r) => out.keep.push((s.id(), *r)),
            None => out
                .drop
                .push((s.id(), dead(s).unwrap_or(DropReason::Expired))),
        }
    }
    out.missing_dependencies = missing.into_iter().collect();
    out
}
