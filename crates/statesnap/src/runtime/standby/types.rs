//! A standby's options, state and status, as callers see them.

use std::time::Duration;

use crate::error::{Error, ErrorKind, Reason};
use crate::repo::StoreKey;
use crate::restore::{ReplayOptions, Source};

/// How standbys follow their changelog.
#[derive(Debug, Clone)]
pub struct StandbyOptions {
    /// How often the changelog's end is polled when the standby is caught
    /// up (default 50 ms). Each poll that finds new records replays all of
    /// them before the next.
    pub poll_interval: Duration,
    /// The first retry's delay after a failed poll or bootstrap (broker or
    /// repository unreachable); each retry doubles it, up to
    /// `max_backoff` (defaults 200 ms and 5 s).
    pub retry_backoff: Duration,
    /// The longest delay between retries.
    pub max_backoff: Duration,
    /// How often the lineage and horizon are checked on an idle log, where
    /// no replay runs to check them (default 5 s).
    pub idle_check_interval: Duration,
    /// Replay tuning for each poll.
    pub replay: ReplayOptions,
}

impl Default for StandbyOptions {
    fn default() -> Self {
        StandbyOptions {
            poll_interval: Duration::from_millis(50),
            retry_backoff: Duration::from_millis(200),
            max_backoff: Duration::from_secs(5),
            idle_check_interval: Duration::from_secs(5),
            replay: ReplayOptions::default(),
        }
    }
}

/// What a standby is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StandbyState {
    /// Restoring its store (the first time, or after a
    /// [`RebootstrapCause`]); reads fail `transient` until it is ready.
    Bootstrapping,
    /// Following the changelog.
    Following,
    /// The last poll or bootstrap failed (the changelog or the repository
    /// is unreachable, or refused): retried with a backoff, the lag grows.
    /// [`StandbyStatus::last_error`] says what failed.
    Retrying,
    /// Stopped: promoted, or the manager shut down.
    Stopped,
}

/// Why a standby threw its store away and bootstrapped again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RebootstrapCause {
    /// The changelog's horizon passed the standby's offset (compaction or
    /// retention removed what its replay needs).
    BelowHorizon,
    /// The changelog was recreated (new lineage), or the store follows
    /// another log.
    LineageChanged,
    /// The changelog lost records the standby had applied (it is ahead of
    /// the log, or offsets were handed out again).
    HistoryLost,
    /// The standby's directory disappeared under it.
    DirectoryLost,
    /// A promotion failed after it had taken the store (the changelog
    /// could not be reached when the handle was made).
    PromotionFailed,
}

impl RebootstrapCause {
    /// The name used in logs, metrics and reports.
    pub fn as_str(&self) -> &'static str {
        match self {
            RebootstrapCause::BelowHorizon => "below_horizon",
            RebootstrapCause::LineageChanged => "lineage_changed",
            RebootstrapCause::HistoryLost => "history_lost",
            RebootstrapCause::DirectoryLost => "directory_lost",
            RebootstrapCause::PromotionFailed => "promotion_failed",
        }
    }

    /// The cause an error from a poll's replay names, if it is one a
    /// rebootstrap answers.
    pub(super) fn of(e: &Error) -> Option<RebootstrapCause> {
        match e.reason()? {
            Reason::BelowHorizon => Some(RebootstrapCause::BelowHorizon),
            Reason::LineageChanged | Reason::OtherChangelog | Reason::Unbound => {
                Some(RebootstrapCause::LineageChanged)
            }
            Reason::AheadOfLog | Reason::HistoryLost => Some(RebootstrapCause::HistoryLost),
            _ => None,
        }
    }
}

impl std::fmt::Display for RebootstrapCause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One (re)bootstrap of a standby.
#[derive(Debug, Clone, PartialEq)]
pub struct Bootstrap {
    /// Why it ran (`None`: the first one).
    pub cause: Option<RebootstrapCause>,
    /// Where the store came from.
    pub source: Source,
    /// Bytes downloaded from the repository.
    pub bytes_downloaded: u64,
    /// Changelog records replayed on top.
    pub records_replayed: u64,
    /// How long it took.
    pub duration: Duration,
    /// When it ended, by the manager's clock (ms since the epoch).
    pub at_ms: i64,
}

/// How far a standby is behind its changelog.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Lag {
    /// Records between the standby's offset and the log's end as of the
    /// last poll (a poll that succeeds replays them all).
    pub records: u64,
    /// How long ago the standby last held everything the log held (the
    /// start of its last poll that reached the end); grows while the log
    /// cannot be reached.
    pub time: Duration,
}

/// A standby's status.
#[derive(Debug, Clone, PartialEq)]
pub struct StandbyStatus {
    /// The store partition.
    pub store_key: StoreKey,
    /// What it is doing.
    pub state: StandbyState,
    /// The last offset its store applied (`None`: nothing, or not
    /// bootstrapped yet).
    pub applied_offset: Option<u64>,
    /// The changelog's end offset at the last poll.
    pub end_offset: Option<u64>,
    /// Its lag.
    pub lag: Lag,
    /// Every (re)bootstrap, oldest first.
    pub bootstraps: Vec<Bootstrap>,
    /// The last failure, while [`StandbyState::Retrying`]: its kind, its
    /// refusal if any, and its message.
    pub last_error: Option<(ErrorKind, Option<Reason>, String)>,
    /// Changelog records applied by polls (bootstraps not counted).
    pub records_followed: u64,
    /// Records per second of the last poll that applied 10 000 or more.
    pub replay_records_per_sec: Option<f64>,
}
