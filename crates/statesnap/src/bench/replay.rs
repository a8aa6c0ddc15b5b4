//! Restore from a snapshot against a full changelog replay of the same
//! store, for one history length.

use std::path::Path;
use std::time::Instant;

use serde::Serialize;

use super::backup::bench_options;
use super::{file_log, key, local_repo, remove, store_key, value};
use crate::changelog::Changelog;
use crate::error::{Error, Result};
use crate::format::StoreFormat;
use crate::format::rocks::RocksFormat;
use crate::restore::{RestoreOptions, restore_store};
use crate::snapshot::commit_snapshot;
use crate::store::logged::LoggedStore;
use crate::store::rocks::RocksStore;

/// One history length: `keys` keys each written `updates_per_key` times
/// through a `LoggedStore` (RocksDB + file changelog), then one snapshot.
#[derive(Debug, Clone, Serialize)]
pub struct ReplayCase {
    /// Live keys (100-byte values).
    pub keys: u64,
    /// Writes per key: the changelog holds `keys × updates_per_key` records.
    pub updates_per_key: u64,
    /// Records in the changelog.
    pub records: u64,
    /// Bytes of the snapshot (what a restore downloads).
    pub snapshot_bytes: u64,
    /// Restore from the snapshot (verified, opened, tail replayed: none
    /// here), seconds.
    pub restore_secs: f64,
    /// Of `restore_secs`: every file downloaded and verified (and fsynced,
    /// unless the restore syncs in the background).
    pub restore_transfer_secs: f64,
    /// The restore until its files were on disk as well (the background
    /// fsync ended), seconds.
    pub restore_durable_secs: f64,
    /// Of `restore_secs`: staging renamed into place and the store opened.
    pub restore_open_secs: f64,
    /// Rebuilding the store by replaying the whole changelog, seconds.
    pub replay_secs: f64,
}

impl ReplayCase {
    /// How many times faster the restore was.
    pub fn speedup(&self) -> f64 {
        self.replay_secs / self.restore_secs.max(1e-9)
    }
}

/// Builds the case under `dir` (removed afterwards) and times both ways of
/// rebuilding the store, each into a fresh directory.
pub async fn restore_vs_replay(dir: &Path, keys: u64, updates_per_key: u64) -> Result<ReplayCase> {
    let name = format!("replay-u{updates_per_key}");
    let cdir = dir.join(&name);
    let repo = local_repo(&dir.join("repo")).await?;
    let format = RocksFormat::new(bench_options());
    let log = file_log(&cdir.join("log"), &name)?;
    let store = RocksStore::open(cdir.join("db"), &bench_options())?;
    let mut ls = LoggedStore::new(store, log)?;
    for u in 0..updates_per_key {
        for i in 0..keys {
            ls.put(key(i), value(i ^ (u << 40)));
            if i % 1000 == 999 {
                ls.commit()?;
            }
        }
        ls.commit()?;
    }
    ls.changelog().flush()?;
    let (store, log) = ls.into_parts();
    let sk = store_key(&name)?;
    let cut = format.capture(&store)?;
    let m = commit_snapshot(&format, cut, &repo, &sk, &log, None).await?;
    drop(store);
    let records = log.end_offset()?;

    let started = Instant::now();
    let (restored, report) = restore_store(
        &format,
        &repo,
        &sk,
        &log,
        &cdir.join("from-snapshot"),
        &RestoreOptions::default(),
    )
    .await?;
    let restore = started.elapsed();
    let breakdown = report.transfer;
    // Waited for before the replay is timed, so the replay does not share
    // the disk with this restore's write-back.
    restored.wait_durable()?;
    let durable = started.elapsed();
    drop(restored);
    if report.snapshot != Some(m.snapshot_id) {
        return Err(Error::new(
            crate::ErrorKind::Internal,
            format!("bench: the restore did not use the snapshot it was given report={report:?}"),
        ));
    }

    let started = Instant::now();
    let (replayed, report) = restore_store(
        &format,
        &repo,
        &sk,
        &log,
        &cdir.join("from-replay"),
        &RestoreOptions {
            full_replay: true,
            ..RestoreOptions::default()
        },
    )
    .await?;
    let replay = started.elapsed();
    drop(replayed);
    if report.replay.records != records {
        return Err(Error::new(
            crate::ErrorKind::Internal,
            format!(
                "bench: the full replay read {} of {records} records",
                report.replay.records
            ),
        ));
    }
    remove(&cdir)?;
    Ok(ReplayCase {
        keys,
        updates_per_key,
        records,
        snapshot_bytes: m.file_bytes(),
        restore_secs: restore.as_secs_f64(),
        restore_transfer_secs: breakdown.transfer.as_secs_f64(),
        restore_open_secs: breakdown.open.as_secs_f64(),
        restore_durable_secs: durable.as_secs_f64(),
        replay_secs: replay.as_secs_f64(),
    })
}
