//! Failover: a RocksDB partition's owner dies while its input flows (it
//! is dropped without a handoff, which is what a SIGKILL leaves behind),
//! and the next owner gets the store ready three ways, side by side on
//! the same log: promoting a warm standby, restoring the newest snapshot
//! and the tail, replaying the whole changelog. And what the standby cost
//! while the input flowed: its lag, and its replay rate.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::{file_log, local_repo, remove, store_key, value};
use crate::changelog::Changelog;
use crate::changelog::file::FileChangelog;
use crate::error::{Error, Result};
use crate::format::rocks::RocksFormat;
use crate::restore::{RestoreOptions, restore_store};
use crate::runtime::{SnapshotPolicy, StandbyOptions, StateManager, StoreSpec};
use crate::store::StateStore;

/// What one failover measured.
#[derive(Debug, Clone, Serialize)]
pub struct Failover {
    /// Live keys in the partition (100-byte values).
    pub keys: u64,
    /// The input's target rate, records per second.
    pub target_records_per_sec: u64,
    /// The rate the owner actually committed at while the input flowed.
    pub flow_records_per_sec: f64,
    /// How long the input flowed before the owner died.
    pub flow_secs: f64,
    /// The standby's largest lag, sampled after each of the owner's
    /// commits (every 10 ms) while the input flowed: records between its
    /// offset and the log's end, and ms since it last held everything.
    pub standby_max_lag_records: u64,
    /// See `standby_max_lag_records`.
    pub standby_max_lag_ms: u64,
    /// Records the standby applied while following, over the flow's time
    /// (it keeps up when this is the flow's rate).
    pub standby_follow_records_per_sec: f64,
    /// The replay rate of its last large poll (10 000 records or more).
    pub standby_replay_records_per_sec: Option<f64>,
    /// Records the log held beyond the standby right after the owner's
    /// last commit (the kill).
    pub lag_at_kill: u64,
    /// Records it held beyond the standby when the promotion began (the
    /// standby follows on after the kill until it is promoted).
    pub lag_at_promote: u64,
    /// From `promote` to a ready handle.
    pub standby_secs: f64,
    /// Of that: records replayed, and the replay's time.
    pub standby_replayed: u64,
    /// See `standby_replayed`.
    pub standby_replay_secs: f64,
    /// Bytes the promotion downloaded (none).
    pub standby_downloaded: u64,
    /// `StateManager::open` on a machine without the store: the newest
    /// snapshot (taken halfway through the flow) and the tail.
    pub snapshot_tail_secs: f64,
    /// Of that: the tail replayed.
    pub snapshot_tail_replayed: u64,
    /// Bytes it downloaded.
    pub snapshot_tail_downloaded: u64,
    /// A full replay of the changelog into an empty store.
    pub full_replay_secs: f64,
    /// Records it replayed.
    pub full_replay_records: u64,
}

impl Failover {
    /// How many times faster the promotion was than snapshot + tail.
    pub fn standby_speedup(&self) -> f64 {
        self.snapshot_tail_secs / self.standby_secs.max(1e-9)
    }

    /// The promotion's time beyond replaying the lag.
    pub fn standby_fixed_secs(&self) -> f64 {
        (self.standby_secs - self.standby_replay_secs).max(0.0)
    }
}

type Log = Arc<FileChangelog>;

fn spec(log: &Log, dir: &Path, name: &str) -> Result<StoreSpec<RocksFormat, Log>> {
    Ok(StoreSpec::rocksdb(
        store_key("failover")?,
        log.clone(),
        dir.join(name),
    ))
}

fn user(k: u64) -> Vec<u8> {
    format!("user-{k:010}").into_bytes()
}

/// Loads `keys` keys, snapshots, starts a standby elsewhere, lets the
/// input flow at `rate` records per second for `flow` (a second snapshot
/// halfway), drops the owner, and times the three ways back. Removes
/// `dir` first.
pub async fn failover(dir: &Path, keys: u64, rate: u64, flow: Duration) -> Result<Failover> {
    remove(dir)?;
    let repo = local_repo(&dir.join("repo")).await?;
    let m = StateManager::builder(repo.clone())
        .policy(SnapshotPolicy::manual())
        .standby_options(StandbyOptions::default())
        .build()?;
    let log: Log = Arc::new(file_log(&dir.join("log"), "failover")?);
    let mut owner = m.open(spec(&log, dir, "owner")?).await?;
    let mut k = 0;
    while k < keys {
        for _ in 0..10_000.min(keys - k) {
            owner.put(user(k), value(k));
            k += 1;
        }
        owner.commit()?;
    }
    owner.snapshot_now()?;
    owner.wait_for_snapshot().await;
    let standby = m.standby(spec(&log, dir, "standby")?)?;
    standby.ready(Duration::from_secs(600)).await?;

    let followed_before = standby.status().records_followed;
    let flowed = flow_input(&mut owner, &standby, &log, keys, rate, flow).await?;
    let flow_secs = flowed.secs;
    // The kill comes right after the last commit: what the standby lacks
    // then.
    let applied = standby.status().applied_offset;
    let lag_at_kill = log
        .end_offset()?
        .saturating_sub(applied.map_or(0, |a| a + 1));
    owner.wait_for_snapshot().await;
    let st = standby.status();
    // The owner dies: no handoff.
    owner.abandon().await;
    let end = log.end_offset()?;

    let t = Instant::now();
    let h = standby
        .promote(Duration::from_secs(600))
        .await
        .map_err(Error::from)?;
    let standby_secs = t.elapsed().as_secs_f64();
    let report = h.report().clone();
    // Where the standby was when the promotion began: the lag it found.
    let lag_at_promote = end.saturating_sub(report.source.start_offset().map_or(0, |a| a + 1));
    h.abandon().await;

    let h = m.open(spec(&log, dir, "fresh")?).await?;
    let snapshot_tail_secs = h.opened_in().as_secs_f64();
    let snap_report = h.report().clone();
    h.abandon().await;

    let t = Instant::now();
    let options = RestoreOptions {
        full_replay: true,
        ..RestoreOptions::default()
    };
    let (store, full) = restore_store(
        &RocksFormat::new(Default::default()),
        &repo,
        &store_key("failover")?,
        &*log,
        &dir.join("full"),
        &options,
    )
    .await?;
    let full_replay_secs = t.elapsed().as_secs_f64();
    if store.applied_offset()? != end.checked_sub(1) {
        return Err(Error::internal(
            "the full replay did not reach the log's end",
        ));
    }
    drop(store);
    m.shutdown().await;
    remove(dir)?;
    Ok(Failover {
        keys,
        target_records_per_sec: rate,
        flow_records_per_sec: flowed.written as f64 / flow_secs,
        flow_secs,
        standby_max_lag_records: flowed.max_lag,
        standby_max_lag_ms: flowed.max_lag_ms,
        standby_follow_records_per_sec: (st.records_followed - followed_before) as f64 / flow_secs,
        standby_replay_records_per_sec: st.replay_records_per_sec,
        lag_at_kill,
        lag_at_promote,
        standby_secs,
        standby_replayed: report.replay.records,
        standby_replay_secs: report.replay.duration.as_secs_f64(),
        standby_downloaded: report.transfer.bytes_downloaded,
        snapshot_tail_secs,
        snapshot_tail_replayed: snap_report.replay.records,
        snapshot_tail_downloaded: snap_report.transfer.bytes_downloaded,
        full_replay_secs,
        full_replay_records: full.replay.records,
    })
}

/// What the input's flow measured.
struct Flowed {
    secs: f64,
    written: u64,
    max_lag: u64,
    max_lag_ms: u64,
}

/// Commits `rate` records per second to `owner` for `flow`, a batch every
/// 10 ms (a snapshot halfway), sampling `standby`'s lag after each batch.
async fn flow_input(
    owner: &mut crate::runtime::StateHandle<RocksFormat, Log>,
    standby: &crate::runtime::StandbyHandle<RocksFormat, Log>,
    log: &Log,
    keys: u64,
    rate: u64,
    flow: Duration,
) -> Result<Flowed> {
    let per_tick = (rate / 100).max(1);
    let (mut max_lag, mut max_lag_ms, mut written) = (0u64, 0u64, 0u64);
    let mut seed = keys;
    let started = Instant::now();
    let mut snapshotted = false;
    let mut tick = 0u32;
    while started.elapsed() < flow {
        for _ in 0..per_tick {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
            owner.put(user(seed % keys.max(1)), value(seed));
        }
        owner.commit()?;
        written += per_tick;
        if !snapshotted && started.elapsed() >= flow / 2 {
            owner.snapshot_now()?;
            snapshotted = true;
        }
        // The lag against the log's end now (`lag()` counts records as of
        // the standby's last poll).
        let applied = standby.status().applied_offset;
        let behind = log
            .end_offset()?
            .saturating_sub(applied.map_or(0, |a| a + 1));
        max_lag = max_lag.max(behind);
        max_lag_ms = max_lag_ms.max(standby.lag().time.as_millis() as u64);
        tick += 1;
        let next = started + Duration::from_millis(10) * tick;
        tokio::time::sleep_until(next.into()).await;
    }
    Ok(Flowed {
        secs: started.elapsed().as_secs_f64(),
        written,
        max_lag,
        max_lag_ms,
    })
}
