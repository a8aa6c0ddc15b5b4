//! Retention and gc of the stores a manager has open, on a schedule.

use std::sync::{Arc, Weak};
use std::time::Duration;

use super::{Inner, StateManager, lock};
use crate::error::Result;
use crate::repo::gc::{GcOptions, GcReport};
use crate::repo::retention::{DropReason, RetentionPolicy, plan_for_changelog};
use crate::repo::{SnapshotId, StoreKey};

/// Retention and gc the manager runs over the stores it has open (each
/// process maintains its own partitions; the CLI's `retain` and `gc` cover
/// a whole repository).
#[derive(Debug, Clone, PartialEq)]
pub struct Maintenance {
    /// Which snapshots to keep. Retention is judged against each store's
    /// changelog: snapshots of a dead lineage or of history the log lost
    /// count for nothing (see [`plan_for_changelog`]).
    pub retention: RetentionPolicy,
    /// gc grace period (see `docs/gc.md`): at least twice the repository's
    /// commit budget. Default 1 h.
    pub grace: Duration,
    /// How often a pass runs. Default 10 minutes.
    pub every: Duration,
}

impl Default for Maintenance {
    fn default() -> Self {
        Maintenance {
            retention: RetentionPolicy {
                keep_last: Some(3),
                keep_newer_than: Some(Duration::from_secs(24 * 3600)),
            },
            grace: Duration::from_secs(3600),
            every: Duration::from_secs(600),
        }
    }
}

/// What one maintenance pass did to one store.
#[derive(Debug, Clone, PartialEq)]
pub struct MaintenanceReport {
    /// The store partition.
    pub store_key: StoreKey,
    /// Snapshots retention dropped (their manifests were deleted).
    pub dropped: Vec<(SnapshotId, DropReason)>,
    /// The gc pass after it (condemned and swept blobs, bytes freed).
    pub gc: GcReport,
}

impl StateManager {
    /// Runs one retention + gc pass over every store open in this manager,
    /// whether or not [`super::StateManagerBuilder::maintenance`] scheduled
    /// passes. Stops at the first error (the next pass starts over; every
    /// step is safe to repeat).
    pub async fn maintain_now(&self, m: &Maintenance) -> Result<Vec<MaintenanceReport>> {
        let open: Vec<_> = lock(&self.inner.open).values().cloned().collect();
        let repo = &self.inner.repo;
        let mut out = Vec::new();
        for shared in open {
            // A store closed meanwhile is its next owner's to maintain.
            let Some(changelog) = shared.changelog.upgrade() else {
                continue;
            };
            let key = &shared.key;
            let listing = repo.catalog().list_snapshots(key).await?;
            let plan = plan_for_changelog(
                &listing.snapshots,
                &m.retention,
                self.inner.clock.now_ms(),
                &*changelog,
            )?;
            drop(changelog);
            for (id, _) in &plan.drop {
                repo.catalog().delete_snapshot(key, *id).await?;
            }
            let gc = repo
                .maintenance()
                .gc_store(
                    key,
                    &GcOptions {
                        grace: m.grace,
                        retention: None,
                        dry_run: false,
                    },
                )
                .await?;
            tracing::info!(
                store_key = %key,
                dropped = plan.drop.len(),
                bytes_condemned = gc.bytes_condemned,
                bytes_deleted = gc.bytes_deleted,
                "maintenance pass"
            );
            out.push(MaintenanceReport {
                store_key: key.clone(),
                dropped: plan.drop,
                gc,
            });
        }
        Ok(out)
    }
}

/// The scheduled passes: every `m.every` until shutdown, or until the
/// manager is dropped (the loop holds it weakly).
pub(super) async fn run(inner: Weak<Inner>, m: Maintenance) {
    let Some(cancel) = inner.upgrade().map(|i| i.cancel.clone()) else {
        return;
    };
    loop {
        tokio::select! {
            () = tokio::time::sleep(m.every) => {}
            () = cancel.cancelled() => return,
        }
        let Some(inner) = inner.upgrade() else {
            return;
        };
        let manager = StateManager {
            inner: Arc::clone(&inner),
        };
        tokio::select! {
            r = manager.maintain_now(&m) => {
                if let Err(e) = r {
                    tracing::warn!(error = %e, "maintenance pass failed; the next one retries");
                }
            }
            () = cancel.cancelled() => return,
        }
    }
}
