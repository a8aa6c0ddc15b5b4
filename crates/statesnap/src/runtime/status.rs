//! One store's snapshot bookkeeping ([`Shared`]: state, metrics, the
//! in-flight flag) and the status it reports ([`StoreStatus`]).

use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::lock;
use super::policy::{self, SnapshotPolicy, Trigger};
use crate::changelog::Changelog;
use crate::error::{ErrorKind, Result};
use crate::repo::{Manifest, SnapshotId, StoreKey};
use crate::restore::Rates;

/// One store's snapshot bookkeeping, shared by its handle, its background
/// task and the manager's status listing.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(super) key: StoreKey,
    /// The store's changelog, for maintenance (weak: the handle and its
    /// snapshot task hold it; a closed store's log is released at once).
    pub(super) changelog: std::sync::Weak<dyn Changelog>,
    pub(super) state: Mutex<SnapState>,
    /// Whether a snapshot is in flight (watchable: `close` waits on it).
    pub(super) in_flight: tokio::sync::watch::Sender<bool>,
    /// Cancels this store's snapshot in flight (abandon, drop; a child of
    /// the manager's shutdown token).
    pub(super) cancel: tokio_util::sync::CancellationToken,
    pub(super) metrics: StoreMetrics,
}

/// This store's handles in the `metrics` facade (label `store`); see
/// `docs/runtime.md` for the names. Registered once per open, so a commit
/// only stores into them.
pub(super) struct StoreMetrics {
    pub(super) records_since: metrics::Gauge,
    pub(super) estimated_tail_replay: metrics::Gauge,
    pub(super) in_flight: metrics::Gauge,
    pub(super) last_offset: metrics::Gauge,
    pub(super) taken: metrics::Counter,
    pub(super) failed: metrics::Counter,
    pub(super) coalesced: metrics::Counter,
    pub(super) bytes_uploaded: metrics::Counter,
    pub(super) bytes_reused: metrics::Counter,
    pub(super) capture_seconds: metrics::Histogram,
    pub(super) snapshot_seconds: metrics::Histogram,
}

impl StoreMetrics {
    pub(super) fn new(key: &StoreKey) -> StoreMetrics {
        let store = key.to_string();
        StoreMetrics {
            records_since: metrics::gauge!("statesnap_records_since_snapshot", "store" => store.clone()),
            estimated_tail_replay: metrics::gauge!("statesnap_estimated_tail_replay_seconds", "store" => store.clone()),
            in_flight: metrics::gauge!("statesnap_snapshot_in_flight", "store" => store.clone()),
            last_offset: metrics::gauge!("statesnap_last_snapshot_offset", "store" => store.clone()),
            taken: metrics::counter!("statesnap_snapshots_total", "store" => store.clone()),
            failed: metrics::counter!("statesnap_snapshot_failures_total", "store" => store.clone()),
            coalesced: metrics::counter!("statesnap_snapshot_triggers_coalesced_total", "store" => store.clone()),
            bytes_uploaded: metrics::counter!("statesnap_snapshot_bytes_uploaded_total", "store" => store.clone()),
            bytes_reused: metrics::counter!("statesnap_snapshot_bytes_reused_total", "store" => store.clone()),
            capture_seconds: metrics::histogram!("statesnap_capture_seconds", "store" => store.clone()),
            snapshot_seconds: metrics::histogram!("statesnap_snapshot_seconds", "store" => store),
        }
    }
}

impl std::fmt::Debug for StoreMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreMetrics").finish_non_exhaustive()
    }
}

#[derive(Debug, Default)]
pub(super) struct SnapState {
    pub(super) applied_offset: Option<u64>,
    pub(super) opened_at_ms: i64,
    /// The last committed snapshot (the next one's parent).
    pub(super) parent: Option<Manifest>,
    pub(super) last_attempt_ms: Option<i64>,
    pub(super) retry_at_ms: Option<i64>,
    pub(super) consecutive_failures: u32,
    pub(super) last_error: Option<String>,
    pub(super) last_error_kind: Option<ErrorKind>,
    pub(super) last_trigger: Option<Trigger>,
    pub(super) last_duration: Option<Duration>,
    pub(super) taken: u64,
    pub(super) failed: u64,
    pub(super) coalesced: u64,
    pub(super) bytes_uploaded: u64,
    pub(super) bytes_reused: u64,
}

impl Shared {
    pub(super) fn new(
        key: StoreKey,
        changelog: std::sync::Weak<dyn Changelog>,
        now_ms: i64,
        cancel: tokio_util::sync::CancellationToken,
    ) -> Shared {
        Shared {
            changelog,
            metrics: StoreMetrics::new(&key),
            key,
            cancel,
            state: Mutex::new(SnapState {
                opened_at_ms: now_ms,
                ..SnapState::default()
            }),
            in_flight: tokio::sync::watch::Sender::new(false),
        }
    }

    pub(super) fn records_since(st: &SnapState) -> u64 {
        let from = st
            .parent
            .as_ref()
            .map_or(0, |p| p.changelog.offset.saturating_add(1));
        st.applied_offset
            .map_or(0, |a| a.saturating_add(1).saturating_sub(from))
    }

    pub(crate) fn status(&self, now_ms: i64, rates: &Rates) -> StoreStatus {
        let st = lock(&self.state);
        let records_since = Shared::records_since(&st);
        StoreStatus {
            store_key: self.key.clone(),
            applied_offset: st.applied_offset,
            last_snapshot: st.parent.as_ref().map(|p| p.snapshot_id),
            last_snapshot_offset: st.parent.as_ref().map(|p| p.changelog.offset),
            last_snapshot_age: st.parent.as_ref().map(|p| {
                Duration::from_millis(
                    u64::try_from(now_ms.saturating_sub(p.created_at)).unwrap_or(0),
                )
            }),
            records_since_snapshot: records_since,
            estimated_tail_replay: policy::replay_time(records_since, rates.replay_records_per_sec),
            in_flight: *self.in_flight.borrow(),
            snapshots_taken: st.taken,
            snapshots_failed: st.failed,
            consecutive_failures: st.consecutive_failures,
            coalesced_triggers: st.coalesced,
            bytes_uploaded: st.bytes_uploaded,
            bytes_reused: st.bytes_reused,
            last_trigger: st.last_trigger,
            last_snapshot_duration: st.last_duration,
            last_error: st.last_error.clone(),
            last_error_kind: st.last_error_kind,
        }
    }

    /// Records the end of a snapshot attempt.
    pub(super) fn finish(
        &self,
        result: &Result<Manifest>,
        started: Instant,
        now_ms: i64,
        policy: &SnapshotPolicy,
    ) {
        let mut st = lock(&self.state);
        st.last_duration = Some(started.elapsed());
        self.metrics
            .snapshot_seconds
            .record(started.elapsed().as_secs_f64());
        match result {
            Ok(m) => {
                self.metrics.taken.increment(1);
                self.metrics
                    .bytes_uploaded
                    .increment(m.stats.bytes_uploaded);
                self.metrics.bytes_reused.increment(m.stats.bytes_reused);
                st.taken += 1;
                st.bytes_uploaded += m.stats.bytes_uploaded;
                st.bytes_reused += m.stats.bytes_reused;
                st.consecutive_failures = 0;
                st.retry_at_ms = None;
                st.last_error = None;
                st.last_error_kind = None;
                // A snapshot finishing after a newer one (a handoff raced a
                // background one) does not move the parent back.
                if st
                    .parent
                    .as_ref()
                    .is_none_or(|p| p.changelog.offset <= m.changelog.offset)
                {
                    st.parent = Some(m.clone());
                    self.metrics.last_offset.set(m.changelog.offset as f64);
                }
            }
            Err(e) => {
                self.metrics.failed.increment(1);
                st.failed += 1;
                st.consecutive_failures = st.consecutive_failures.saturating_add(1);
                let wait = policy.backoff(st.consecutive_failures);
                st.retry_at_ms = Some(
                    now_ms.saturating_add(i64::try_from(wait.as_millis()).unwrap_or(i64::MAX)),
                );
                st.last_error = Some(e.to_string());
                st.last_error_kind = Some(e.kind());
                tracing::warn!(
                    store_key = %self.key,
                    error = %e,
                    failures = st.consecutive_failures,
                    retry_in_ms = wait.as_millis() as u64,
                    "snapshot failed; the next commit after the backoff takes a new one"
                );
            }
        }
        drop(st);
        self.metrics.in_flight.set(0.0);
        self.in_flight.send_replace(false);
    }

    /// Marks a snapshot in flight.
    pub(super) fn start(&self) {
        self.metrics.in_flight.set(1.0);
        self.in_flight.send_replace(true);
    }
}

/// A store's snapshot status, as [`StateHandle::status`] and
/// [`StateManager::status`] report it.
#[derive(Debug, Clone, PartialEq)]
pub struct StoreStatus {
    /// The store partition.
    pub store_key: StoreKey,
    /// The last changelog offset the store applied.
    pub applied_offset: Option<u64>,
    /// The newest snapshot this handle knows of (taken or restored from).
    pub last_snapshot: Option<SnapshotId>,
    /// Its offset.
    pub last_snapshot_offset: Option<u64>,
    /// How long ago it was taken.
    pub last_snapshot_age: Option<Duration>,
    /// Changelog offsets applied since it (what a restore would replay).
    pub records_since_snapshot: u64,
    /// Those records at the measured replay rate.
    pub estimated_tail_replay: Duration,
    /// A snapshot is being written.
    pub in_flight: bool,
    /// Snapshots this handle committed.
    pub snapshots_taken: u64,
    /// Snapshot attempts that failed.
    pub snapshots_failed: u64,
    /// Failures since the last success (the backoff grows with them).
    pub consecutive_failures: u32,
    /// Triggers that fired while a snapshot was in flight (folded into a
    /// later snapshot).
    pub coalesced_triggers: u64,
    /// Bytes uploaded by this handle's snapshots.
    pub bytes_uploaded: u64,
    /// Bytes its snapshots reused from earlier ones.
    pub bytes_reused: u64,
    /// Why the last snapshot was taken.
    pub last_trigger: Option<Trigger>,
    /// How long the last attempt took (write and commit).
    pub last_snapshot_duration: Option<Duration>,
    /// The last failure, until a snapshot succeeds.
    pub last_error: Option<String>,
    /// Its kind (what to do about it), until a snapshot succeeds.
    pub last_error_kind: Option<ErrorKind>,
}
