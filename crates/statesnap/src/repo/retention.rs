//! Retention: which snapshots to keep. A pure function over a listing, with
//! the time passed in (from the injected clock), so it is trivially testable.
//!
//! Rules, in order:
//! 1. the newest valid snapshot (by `(offset, id)`) is always kept;
//! 2. `keep_last = n` keeps the `n` newest;
//! 3. `keep_newer_than = d` keeps every snapshot with `created_at >= now - d`;
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

/// Decides what to keep among `snapshots` (any order) at time `now_ms`.
pub fn plan(snapshots: &[SnapshotInfo], policy: &RetentionPolicy, now_ms: i64) -> RetentionPlan {
    let mut sorted: Vec<&SnapshotInfo> = snapshots.iter().collect();
    sorted.sort_by_key(|s| std::cmp::Reverse(s.manifest.name()));
    let by_id: BTreeMap<SnapshotId, &SnapshotInfo> = sorted.iter().map(|s| (s.id(), *s)).collect();
    let mut kept: BTreeMap<SnapshotId, KeepReason> = BTreeMap::new();
    let no_policy = policy.keep_last.is_none() && policy.keep_newer_than.is_none();
    let cutoff = policy
        .keep_newer_than
        .map(|d| now_ms.saturating_sub(i64::try_from(d.as_millis()).unwrap_or(i64::MAX)));
    for (i, s) in sorted.iter().enumerate() {
        let reason = if i == 0 {
            Some(KeepReason::Newest)
        } else if no_policy {
            Some(KeepReason::NoPolicy)
        } else if policy.keep_last.is_some_and(|n| i < n) {
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
            None => out.drop.push((s.id(), DropReason::Expired)),
        }
    }
    out.missing_dependencies = missing.into_iter().collect();
    out
}
