//! When to take a snapshot: [`SnapshotPolicy`] and the pure decision the
//! handle asks on every commit.

use std::time::Duration;

/// When a [`super::StateHandle`] takes background snapshots, and how its
/// handoff snapshot is bounded.
///
/// A snapshot is due on a commit when any trigger fires — time since the
/// last snapshot, records since it, or the estimated restore time exceeding
/// half the objective — and none of the brakes hold: one snapshot in
/// flight per store (a trigger meanwhile coalesces into the next check), at
/// least `min_interval` between attempts, and after a failure an
/// exponential backoff from `retry_backoff_min` to `retry_backoff_max`.
#[derive(Debug, Clone, PartialEq)]
pub struct SnapshotPolicy {
    /// Snapshot when this long has passed since the last one (or since the
    /// store was opened). Default 5 minutes; `None` turns it off.
    pub every: Option<Duration>,
    /// Snapshot when this many changelog offsets were applied since the
    /// last one. Default off.
    pub every_records: Option<u64>,
    /// Restore-time objective: snapshot when the tail replay a restore
    /// would need (records since the last snapshot ÷ the measured replay
    /// rate) exceeds half of this, leaving the other half for the snapshot
    /// download and for the records that arrive while the snapshot is
    /// written. Default off.
    pub max_restore_time: Option<Duration>,
    /// At least this long between two snapshot attempts of one store.
    /// Default 1 s.
    pub min_interval: Duration,
    /// First wait after a failed snapshot; doubled per consecutive failure.
    /// Default 1 s.
    pub retry_backoff_min: Duration,
    /// Longest wait after failures. Default 60 s.
    pub retry_backoff_max: Duration,
    /// How long [`super::StateHandle::close`] may take: waiting for a
    /// snapshot in flight plus the handoff snapshot. Default 60 s.
    pub close_deadline: Duration,
    /// Record each snapshot's logical digest (a scan of the cut, in the
    /// background): `None` = the format's default (the portable and
    /// RocksDB formats: yes; a custom format: as it says). A RocksDB
    /// snapshot without one records RocksDB's estimates of its keys and
    /// bytes instead of counts.
    pub logical_digest: Option<bool>,
}

impl Default for SnapshotPolicy {
    fn default() -> Self {
        SnapshotPolicy {
            every: Some(Duration::from_secs(300)),
            every_records: None,
            max_restore_time: None,
            min_interval: Duration::from_secs(1),
            retry_backoff_min: Duration::from_secs(1),
            retry_backoff_max: Duration::from_secs(60),
            close_deadline: Duration::from_secs(60),
            logical_digest: None,
        }
    }
}

impl SnapshotPolicy {
    /// No background snapshots (only the handoff snapshot on close and
    /// explicit [`super::StateHandle::snapshot_now`] requests).
    pub fn manual() -> Self {
        SnapshotPolicy {
            every: None,
            ..SnapshotPolicy::default()
        }
    }

    /// Sets [`SnapshotPolicy::every`].
    pub fn every(mut self, d: Duration) -> Self {
        self.every = Some(d);
        self
    }

    /// Sets [`SnapshotPolicy::every_records`].
    pub fn every_records(mut self, n: u64) -> Self {
        self.every_records = Some(n);
        self
    }

    /// Sets [`SnapshotPolicy::max_restore_time`].
    pub fn max_restore_time(mut self, d: Duration) -> Self {
        self.max_restore_time = Some(d);
        self
    }

    /// Sets [`SnapshotPolicy::min_interval`].
    pub fn min_interval(mut self, d: Duration) -> Self {
        self.min_interval = d;
        self
    }

    /// Sets [`SnapshotPolicy::logical_digest`].
    pub fn logical_digest(mut self, on: bool) -> Self {
        self.logical_digest = Some(on);
        self
    }

    /// Sets [`SnapshotPolicy::close_deadline`].
    pub fn close_deadline(mut self, d: Duration) -> Self {
        self.close_deadline = d;
        self
    }

    /// The wait before the next attempt after `failures` consecutive
    /// failures.
    pub fn backoff(&self, failures: u32) -> Duration {
        let doublings = failures.saturating_sub(1).min(30);
        self.retry_backoff_min
            .saturating_mul(1u32 << doublings)
            .min(self.retry_backoff_max)
    }
}

/// Why a snapshot was taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    /// [`SnapshotPolicy::every`] elapsed.
    Time,
    /// [`SnapshotPolicy::every_records`] reached.
    Records,
    /// The estimated restore time passed half of
    /// [`SnapshotPolicy::max_restore_time`].
    RestoreTime,
    /// [`super::StateHandle::snapshot_now`].
    Requested,
    /// The handoff snapshot of [`super::StateHandle::close`].
    Handoff,
}

impl std::fmt::Display for Trigger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Trigger::Time => "time",
            Trigger::Records => "records",
            Trigger::RestoreTime => "restore-time",
            Trigger::Requested => "requested",
            Trigger::Handoff => "handoff",
        })
    }
}

/// What the decision looks at, all read by the caller under one lock.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PolicyInput {
    pub(crate) now_ms: i64,
    /// Offsets applied since the last snapshot.
    pub(crate) records_since: u64,
    /// When the last snapshot was taken (or the store opened).
    pub(crate) since_ms: i64,
    /// When the last attempt started, if any.
    pub(crate) last_attempt_ms: Option<i64>,
    /// No attempt before this (backoff after a failure).
    pub(crate) retry_at_ms: Option<i64>,
    pub(crate) in_flight: bool,
    pub(crate) replay_records_per_sec: f64,
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// The estimated tail replay time for `records` at `rate` records/s.
pub(crate) fn replay_time(records: u64, rate: f64) -> Duration {
    Duration::try_from_secs_f64(records as f64 / rate.max(1.0)).unwrap_or(Duration::MAX)
}

/// Whether a snapshot is due, and why. `Err(())`: a trigger fired but a
/// snapshot is in flight (it coalesces).
pub(crate) fn due(policy: &SnapshotPolicy, i: &PolicyInput) -> Result<Option<Trigger>, ()> {
    if i.records_since == 0 {
        return Ok(None);
    }
    if i.retry_at_ms.is_some_and(|r| i.now_ms < r) {
        return Ok(None);
    }
    if i.last_attempt_ms
        .is_some_and(|a| i.now_ms.saturating_sub(a) < ms(policy.min_interval))
    {
        return Ok(None);
    }
    let trigger = if policy
        .every
        .is_some_and(|e| i.now_ms.saturating_sub(i.since_ms) >= ms(e))
    {
        Some(Trigger::Time)
    } else if policy.every_records.is_some_and(|n| i.records_since >= n) {
        Some(Trigger::Records)
    } else if policy
        .max_restore_time
        .is_some_and(|t| replay_time(i.records_since, i.replay_records_per_sec) >= t / 2)
    {
        Some(Trigger::RestoreTime)
    } else {
        None
    };
    match trigger {
        Some(_) if i.in_flight => Err(()),
        t => Ok(t),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input() -> PolicyInput {
        PolicyInput {
            now_ms: 10_000,
            records_since: 1,
            since_ms: 10_000,
            last_attempt_ms: None,
            retry_at_ms: None,
            in_flight: false,
            replay_records_per_sec: 1000.0,
        }
    }

    #[test]
    fn each_trigger_fires_at_its_threshold_and_not_before() {
        let p = SnapshotPolicy::manual()
            .every(Duration::from_secs(10))
            .every_records(100)
            .max_restore_time(Duration::from_secs(4));
        assert_eq!(due(&p, &input()), Ok(None));
        let t = PolicyInput {
            now_ms: 19_999,
            ..input()
        };
        assert_eq!(due(&p, &t), Ok(None));
        let t = PolicyInput {
            now_ms: 20_000,
            ..input()
        };
        assert_eq!(due(&p, &t), Ok(Some(Trigger::Time)));
        let r = PolicyInput {
            records_since: 99,
            ..input()
        };
        assert_eq!(due(&p, &r), Ok(None));
        let r = PolicyInput {
            records_since: 100,
            ..input()
        };
        assert_eq!(due(&p, &r), Ok(Some(Trigger::Records)));
        // 4 s objective, 1000 rec/s: due at 2 s of tail = 2000 records
        // (records trigger off here).
        let p2 = SnapshotPolicy::manual().max_restore_time(Duration::from_secs(4));
        let o = PolicyInput {
            records_since: 1999,
            ..input()
        };
        assert_eq!(due(&p2, &o), Ok(None));
        let o = PolicyInput {
            records_since: 2000,
            ..input()
        };
        assert_eq!(due(&p2, &o), Ok(Some(Trigger::RestoreTime)));
    }

    #[test]
    fn brakes_hold_triggers_back() {
        let p = SnapshotPolicy::manual().every_records(1);
        let fired = input();
        assert_eq!(due(&p, &fired), Ok(Some(Trigger::Records)));
        let nothing_new = PolicyInput {
            records_since: 0,
            ..fired
        };
        assert_eq!(due(&p, &nothing_new), Ok(None));
        let in_flight = PolicyInput {
            in_flight: true,
            ..fired
        };
        assert_eq!(due(&p, &in_flight), Err(()), "coalesced");
        let too_soon = PolicyInput {
            last_attempt_ms: Some(9_500),
            ..fired
        };
        assert_eq!(due(&p, &too_soon), Ok(None));
        let spaced = PolicyInput {
            last_attempt_ms: Some(9_000),
            ..fired
        };
        assert_eq!(due(&p, &spaced), Ok(Some(Trigger::Records)));
        let backing_off = PolicyInput {
            retry_at_ms: Some(10_001),
            ..fired
        };
        assert_eq!(due(&p, &backing_off), Ok(None));
        let retry = PolicyInput {
            retry_at_ms: Some(10_000),
            ..fired
        };
        assert_eq!(due(&p, &retry), Ok(Some(Trigger::Records)));
    }

    #[test]
    fn backoff_doubles_up_to_its_cap() {
        let p = SnapshotPolicy::default();
        let secs: Vec<u64> = (1..=9).map(|f| p.backoff(f).as_secs()).collect();
        assert_eq!(secs, vec![1, 2, 4, 8, 16, 32, 60, 60, 60]);
        assert_eq!(p.backoff(u32::MAX), Duration::from_secs(60));
    }
}
