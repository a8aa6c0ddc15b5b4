//! Resharding `N` RocksDB partitions into `M` against what a user can do
//! today: replay every source changelog into the new layout through
//! per-key writes (a new store and changelog per target partition). And
//! against the disk's own pace: one sequential write of the same bytes.

use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::backup::bench_options;
use super::{PeakRss, key, local_repo, remove, value};
use crate::changelog::Changelog;
use crate::changelog::file::{FileChangelog, FileChangelogOptions, FsyncPolicy};
use crate::error::{Error, Result};
use crate::format::StoreFormat;
use crate::format::rocks::RocksFormat;
use crate::repo::{Repository, StoreKey};
use crate::reshard::{Murmur2, Partitioner, ReshardOptions, SourcePartition, TargetPartition};
use crate::snapshot::commit_snapshot;
use crate::store::StateStoreExt;
use crate::store::logged::LoggedStore;
use crate::store::rocks::RocksStore;

/// Records per commit in the bench's writers.
const COMMIT_EVERY: u64 = 1_000;

/// One reshard: `keys` keys (100-byte values) in `from` partitions, moved
/// into `to`.
#[derive(Debug, Clone, Serialize)]
pub struct ReshardCase {
    /// Live keys.
    pub keys: u64,
    /// Changelog records per key in the sources (each key written this
    /// many times; the last value is the state).
    pub records_per_key: u32,
    /// Source partitions.
    pub from: u32,
    /// Target partitions.
    pub to: u32,
    /// Key and value bytes moved.
    pub bytes: u64,
    /// `statesnap::reshard`: sources restored from their snapshots, the
    /// targets' changelogs and stores written, their snapshots committed.
    pub reshard_secs: f64,
    /// Of `reshard_secs`: restoring the sources.
    pub restore_secs: f64,
    /// Of `reshard_secs`: merging, placing, writing logs and stores.
    pub write_secs: f64,
    /// Of `reshard_secs`: committing the targets' snapshots.
    pub commit_secs: f64,
    /// Today's alternative: every source changelog read from the start,
    /// each record written to its new partition through a `LoggedStore`
    /// (target changelog, then RocksDB), committed every 1 000 records,
    /// the stores flushed and the logs synced at the end; no snapshots.
    pub replay_secs: f64,
    /// Writing `bytes` once, sequentially, in 1 MiB blocks, then fsync
    /// (the floor: what the disk does with the same bytes).
    pub raw_write_secs: f64,
    /// Reading every source store once, in key order, doing nothing with
    /// the entries (the floor of any reshard that reads the sources'
    /// state: the reshard's merge does this and more).
    pub source_scan_secs: f64,
    /// Peak resident memory during the reshard above what the process held
    /// before it (`VmHWM` after resetting it, minus `VmRSS` before), bytes;
    /// `None` where `/proc` does not say.
    pub peak_rss_delta: Option<u64>,
    /// CPU time (user + system, every thread) the process spent during the
    /// reshard; over `reshard_secs`, how many cores it kept busy. `None`
    /// where `/proc` does not say.
    pub reshard_cpu_secs: Option<f64>,
    /// The same during the replay.
    pub replay_cpu_secs: Option<f64>,
}

impl ReshardCase {
    /// How many times faster the reshard was than the replay.
    pub fn speedup(&self) -> f64 {
        self.replay_secs / self.reshard_secs.max(1e-9)
    }
    /// The reshard's time over the raw write's.
    pub fn over_raw(&self) -> f64 {
        self.reshard_secs / self.raw_write_secs.max(1e-9)
    }
}

fn log_options() -> FileChangelogOptions {
    FileChangelogOptions {
        fsync: FsyncPolicy::Never,
        ..FileChangelogOptions::default()
    }
}

fn open_log(dir: &Path, key: &StoreKey) -> Result<FileChangelog> {
    FileChangelog::open(
        dir.join(format!("log-{key}")),
        key.changelog_id(),
        log_options(),
    )
}

fn keys_of(app: &str, n: u32) -> Result<Vec<StoreKey>> {
    (0..n).map(|p| StoreKey::new(app, "reshard", p)).collect()
}

/// Builds `from` source partitions of `keys` keys under `dir` (each key
/// written `records_per_key` times, placed by murmur2, every partition
/// snapshotted), measures both ways of moving them into `to` partitions
/// and the raw write, and removes `dir`.
pub async fn reshard_vs_replay(
    dir: &Path,
    keys: u64,
    records_per_key: u32,
    from: u32,
    to: u32,
) -> Result<ReshardCase> {
    remove(dir)?;
    let repo = local_repo(&dir.join("repo")).await?;
    let sources = keys_of("src", from)?;
    let logs = build_sources(dir, &repo, &sources, keys, records_per_key).await?;

    let targets = keys_of("dst", to)?;
    let target_logs = targets
        .iter()
        .map(|k| open_log(&dir.join("targets"), k))
        .collect::<Result<Vec<_>>>()?;
    let src = SourcePartition::zip(&sources, &logs);
    let dst = TargetPartition::zip(&targets, &target_logs);
    let format = RocksFormat::new(bench_options());
    let peak = PeakRss::start();
    let cpu = cpu_secs();
    let started = Instant::now();
    let report = crate::reshard::reshard(
        &repo,
        &format,
        &src,
        &format,
        &dst,
        &dir.join("scratch"),
        &ReshardOptions::default(),
    )
    .await?;
    let reshard = started.elapsed();
    let reshard_cpu_secs = cpu_secs().zip(cpu).map(|(b, a)| b - a);
    let peak_rss_delta = PeakRss::growth(&peak);
    if report.keys != keys {
        return Err(Error::internal(format!(
            "bench: the reshard moved {} of {keys} keys",
            report.keys
        )));
    }
    drop((src, dst));
    drop(target_logs);

    let cpu = cpu_secs();
    let replay = replay_into_new_layout(dir, &logs, to, keys * u64::from(records_per_key))?;
    let replay_cpu_secs = cpu_secs().zip(cpu).map(|(b, a)| b - a);
    let raw = raw_write(&dir.join("raw"), report.bytes)?;
    let scan = scan_sources(dir, &sources, keys)?;
    remove(dir)?;
    Ok(ReshardCase {
        keys,
        records_per_key,
        from,
        to,
        bytes: report.bytes,
        reshard_secs: reshard.as_secs_f64(),
        restore_secs: report.restore_time.as_secs_f64(),
        write_secs: report.write_time.as_secs_f64(),
        commit_secs: report.commit_time.as_secs_f64(),
        replay_secs: replay.as_secs_f64(),
        raw_write_secs: raw.as_secs_f64(),
        source_scan_secs: scan.as_secs_f64(),
        peak_rss_delta,
        reshard_cpu_secs,
        replay_cpu_secs,
    })
}

/// The sources: each key written `records_per_key` times (in rounds over
/// every key) into the partition murmur2 names, through a `LoggedStore` on
/// RocksDB, then a snapshot of every partition.
async fn build_sources(
    dir: &Path,
    repo: &Repository,
    sources: &[StoreKey],
    keys: u64,
    records_per_key: u32,
) -> Result<Vec<FileChangelog>> {
    let n = u32::try_from(sources.len()).unwrap_or(u32::MAX);
    let mut writers = Vec::with_capacity(sources.len());
    for k in sources {
        let store = RocksStore::open(dir.join(format!("src-{k}")), &bench_options())?;
        writers.push(LoggedStore::new(store, open_log(dir, k)?)?);
    }
    let records = keys * u64::from(records_per_key.max(1));
    for r in 0..records {
        let i = r % keys.max(1);
        let k = key(i);
        let p = Murmur2.partition(&k, n) as usize;
        writers[p].put(k, value(r));
        if r % COMMIT_EVERY == COMMIT_EVERY - 1 {
            for w in &mut writers {
                w.commit()?;
            }
        }
    }
    let format = RocksFormat::new(bench_options());
    let mut logs = Vec::with_capacity(writers.len());
    for (w, k) in writers.into_iter().zip(sources) {
        let mut w = w;
        w.commit()?;
        let cut = format.capture(w.store())?;
        commit_snapshot(&format, cut, repo, k, w.changelog(), None).await?;
        let (store, log) = w.into_parts();
        drop(store);
        logs.push(log);
    }
    Ok(logs)
}

/// Today's alternative, timed: each source changelog replayed from its
/// start into `to` new stores, every record through a `LoggedStore` (its
/// new changelog first, then RocksDB). `records`: how many the logs hold.
fn replay_into_new_layout(
    dir: &Path,
    logs: &[FileChangelog],
    to: u32,
    records: u64,
) -> Result<Duration> {
    let targets = keys_of("replay", to)?;
    let started = Instant::now();
    let mut writers = Vec::with_capacity(targets.len());
    for k in &targets {
        let store = RocksStore::open(dir.join(format!("replay-{k}")), &bench_options())?;
        writers.push(LoggedStore::new(
            store,
            open_log(&dir.join("replay-logs"), k)?,
        )?);
    }
    let mut pending = vec![0u64; writers.len()];
    let mut moved = 0u64;
    for log in logs {
        let mut reader = log.read_from(log.start_offset()?)?;
        while let Some(batch) = reader.next_batch(10_000)? {
            for r in batch {
                let j = Murmur2.partition(&r.key, to) as usize;
                match r.value {
                    Some(v) => writers[j].put(r.key, v),
                    None => writers[j].delete(r.key),
                }
                moved += 1;
                pending[j] += 1;
                if pending[j] == COMMIT_EVERY {
                    writers[j].commit()?;
                    pending[j] = 0;
                }
            }
        }
    }
    // Ready means on disk, as the reshard's targets are: the memtables
    // flushed (the bench's stores run without a WAL) and the logs synced.
    for w in &mut writers {
        w.commit()?;
        w.changelog().flush()?;
        w.store().flush()?;
    }
    let took = started.elapsed();
    if moved != records {
        return Err(Error::internal(format!(
            "bench: the replay moved {moved} of {records} records"
        )));
    }
    Ok(took)
}

/// Every source store read once in key order (as the reshard's restore
/// left them: the writers' stores, flushed), timed.
fn scan_sources(dir: &Path, sources: &[StoreKey], keys: u64) -> Result<Duration> {
    let stores = sources
        .iter()
        .map(|k| RocksStore::open(dir.join(format!("src-{k}")), &bench_options()))
        .collect::<Result<Vec<_>>>()?;
    let started = Instant::now();
    let mut seen = 0u64;
    for s in &stores {
        for kv in s.iter()? {
            kv?;
            seen += 1;
        }
    }
    let took = started.elapsed();
    if seen != keys {
        return Err(Error::internal(format!(
            "bench: the scan saw {seen} of {keys} keys"
        )));
    }
    Ok(took)
}

/// `bytes` written once to one file in 1 MiB blocks, then fsynced.
fn raw_write(dir: &Path, bytes: u64) -> Result<Duration> {
    std::fs::create_dir_all(dir).map_err(|e| Error::io("bench: cannot create the raw dir", e))?;
    let path = dir.join("raw.bin");
    let block = vec![0xa5u8; 1 << 20];
    let started = Instant::now();
    let mut f = std::fs::File::create(&path).map_err(|e| Error::io("bench: raw write", e))?;
    let mut left = bytes;
    while left > 0 {
        let n = left.min(block.len() as u64) as usize;
        f.write_all(&block[..n])
            .map_err(|e| Error::io("bench: raw write", e))?;
        left -= n as u64;
    }
    f.sync_all().map_err(|e| Error::io("bench: raw fsync", e))?;
    Ok(started.elapsed())
}

/// CPU time of this process so far (user + system, every thread), from
/// `/proc/self/stat` (clock ticks of 1/100 s, Linux's `USER_HZ`).
fn cpu_secs() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // After the command name, which may hold spaces, in parentheses.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime: fields 14 and 15 of the line, 12 and 13 here.
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(ticks as f64 / 100.0)
}
