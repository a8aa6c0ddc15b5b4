//! The runtime under load: processing throughput and `commit()` latency
//! with background snapshots, the restore-time objective, and the handoff.
//!
//! A processing loop commits batches of [`BATCH`] updates to random keys
//! (96-byte values) through a [`StateHandle`], on the caller's thread; the
//! snapshots run in the background as the runtime runs them.

use std::path::Path;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::changelog::file::FileChangelog;
use crate::error::{Error, Result};
use crate::format::StoreFormat;
use crate::repo::StoreKey;
use crate::runtime::{SnapshotPolicy, StateHandle, StateManager, StoreSpec};

/// Updates per committed batch.
pub const BATCH: usize = 500;

/// The store type under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum StoreType {
    /// `MemoryStore` with the portable format.
    Memory,
    /// `RocksStore` with the RocksDB format.
    Rocksdb,
}

impl StoreType {
    /// `memory` or `rocksdb`.
    pub fn name(self) -> &'static str {
        match self {
            StoreType::Memory => "memory",
            StoreType::Rocksdb => "rocksdb",
        }
    }
}

impl std::str::FromStr for StoreType {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "memory" => Ok(StoreType::Memory),
            "rocksdb" => Ok(StoreType::Rocksdb),
            other => Err(Error::new(
                crate::ErrorKind::Config,
                format!("unknown store type store=`{other}`; use memory or rocksdb"),
            )),
        }
    }
}

fn log(dir: &Path) -> Result<FileChangelog> {
    super::file_log(&dir.join("log"), "runtime")
}

/// How to make a store type's spec.
trait Kind {
    type F: StoreFormat + 'static;
    fn spec(dir: &Path, store_dir: &str) -> Result<StoreSpec<Self::F, FileChangelog>>;
}

struct Memory;
impl Kind for Memory {
    type F = crate::PortableFormat<crate::MemoryStore>;
    fn spec(dir: &Path, store_dir: &str) -> Result<StoreSpec<Self::F, FileChangelog>> {
        Ok(StoreSpec::memory(
            StoreKey::new("bench", "runtime", 0)?,
            log(dir)?,
            dir.join(store_dir),
        ))
    }
}

struct Rocks;
impl Kind for Rocks {
    type F = crate::RocksFormat;
    fn spec(dir: &Path, store_dir: &str) -> Result<StoreSpec<Self::F, FileChangelog>> {
        Ok(StoreSpec::rocksdb(
            StoreKey::new("bench", "runtime", 0)?,
            log(dir)?,
            dir.join(store_dir),
        ))
    }
}

/// A seeded splitmix64 sequence, for reproducible workloads.
#[derive(Debug, Clone)]
pub struct SplitMix64(pub u64);

impl SplitMix64 {
    /// The next value.
    pub fn next_u64(&mut self) -> u64 {
        crate::util::splitmix64(&mut self.0)
    }
}

fn user(k: u64) -> Vec<u8> {
    format!("user-{k:010}").into_bytes()
}

/// One batch of [`BATCH`] updates below `keys`, committed; the commit's
/// duration.
fn batch<F: StoreFormat, C: crate::Changelog>(
    h: &mut StateHandle<F, C>,
    rng: &mut SplitMix64,
    keys: u64,
) -> Result<Duration> {
    for _ in 0..BATCH {
        let k = rng.next_u64() % keys.max(1);
        let v = rng.next_u64().to_le_bytes().repeat(12);
        h.put(user(k), v);
    }
    let t = Instant::now();
    h.commit()?;
    Ok(t.elapsed())
}

async fn manager(dir: &Path, policy: SnapshotPolicy) -> Result<StateManager> {
    let repo = super::local_repo(&dir.join("repo")).await?;
    StateManager::builder(repo).policy(policy).build()
}

/// Loads `keys` keys into the store under `dir` and hands it off (the base
/// snapshot every later measure starts from).
pub async fn preload(store: StoreType, dir: &Path, keys: u64) -> Result<()> {
    match store {
        StoreType::Memory => preload_k::<Memory>(dir, keys).await,
        StoreType::Rocksdb => preload_k::<Rocks>(dir, keys).await,
    }
}

async fn preload_k<K: Kind>(dir: &Path, keys: u64) -> Result<()> {
    let m = manager(dir, SnapshotPolicy::manual()).await?;
    let mut h = m.open(K::spec(dir, "db")?).await?;
    let mut k = 0;
    while k < keys {
        for _ in 0..10_000.min(keys - k) {
            h.put(user(k), k.to_le_bytes().repeat(12));
            k += 1;
        }
        h.commit()?;
    }
    h.close().await?;
    m.shutdown().await;
    Ok(())
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i]
}

/// Throughput and `commit()` latency for one snapshot interval.
#[derive(Debug, Clone, Serialize)]
pub struct Throughput {
    /// The store type.
    pub store: StoreType,
    /// Seconds between background snapshots (`None`: no snapshots).
    pub every_secs: Option<f64>,
    /// Records committed per second.
    pub records_per_sec: f64,
    /// `commit()` latency percentiles and maximum, microseconds.
    pub commit_p50_us: u64,
    /// 99th percentile.
    pub commit_p99_us: u64,
    /// Maximum.
    pub commit_max_us: u64,
    /// Background snapshots taken during the run.
    pub snapshots: u64,
    /// Background snapshots that failed.
    pub failed: u64,
}

/// Runs the processing loop on the preloaded store under `dir` for `run`
/// (at least two intervals plus a second), after a one-second warm-up,
/// with a background snapshot `every` interval (or none).
pub async fn throughput(
    store: StoreType,
    dir: &Path,
    keys: u64,
    run: Duration,
    every: Option<Duration>,
) -> Result<Throughput> {
    match store {
        StoreType::Memory => throughput_k::<Memory>(store, dir, keys, run, every).await,
        StoreType::Rocksdb => throughput_k::<Rocks>(store, dir, keys, run, every).await,
    }
}

async fn throughput_k<K: Kind>(
    store: StoreType,
    dir: &Path,
    keys: u64,
    run: Duration,
    every: Option<Duration>,
) -> Result<Throughput> {
    let policy = match every {
        Some(e) => SnapshotPolicy::manual()
            .every(e)
            .min_interval(Duration::ZERO),
        None => SnapshotPolicy::manual(),
    };
    let m = manager(dir, policy).await?;
    let mut h = m.open(K::spec(dir, "db")?).await?;
    let mut rng = SplitMix64(7);
    let warm = Instant::now();
    while warm.elapsed() < Duration::from_secs(1) {
        batch(&mut h, &mut rng, keys)?;
    }
    let run = every.map_or(run, |e| run.max(e * 2 + Duration::from_secs(1)));
    let mut lat = Vec::new();
    let start = Instant::now();
    while start.elapsed() < run {
        lat.push(batch(&mut h, &mut rng, keys)?);
    }
    let elapsed = start.elapsed();
    let st = h.wait_for_snapshot().await;
    h.abandon().await;
    m.shutdown().await;
    lat.sort();
    let us = |d: Duration| u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
    Ok(Throughput {
        store,
        every_secs: every.map(|e| e.as_secs_f64()),
        records_per_sec: (lat.len() * BATCH) as f64 / elapsed.as_secs_f64(),
        commit_p50_us: us(percentile(&lat, 0.5)),
        commit_p99_us: us(percentile(&lat, 0.99)),
        commit_max_us: us(lat.last().copied().unwrap_or_default()),
        snapshots: st.snapshots_taken,
        failed: st.snapshots_failed,
    })
}

/// Reopens after crashes, with a restore-time objective set.
#[derive(Debug, Clone, Serialize)]
pub struct Rto {
    /// The objective, milliseconds.
    pub objective_ms: u64,
    /// Reopens ready within it.
    pub within: usize,
    /// Crashes (reopens).
    pub crashes: usize,
    /// Each reopen's time from the crash to a ready store, milliseconds.
    pub open_ms: Vec<u64>,
    /// The most records one reopen replayed.
    pub replayed_max: u64,
}

/// With `max_restore_time = objective`, runs the loop for a random time
/// up to `max_run` and drops the handle (a crash as the runtime sees it),
/// `crashes` times, timing each reopen.
pub async fn restore_time_objective(
    store: StoreType,
    dir: &Path,
    keys: u64,
    objective: Duration,
    crashes: usize,
    max_run: Duration,
) -> Result<Rto> {
    match store {
        StoreType::Memory => rto_k::<Memory>(dir, keys, objective, crashes, max_run).await,
        StoreType::Rocksdb => rto_k::<Rocks>(dir, keys, objective, crashes, max_run).await,
    }
}

async fn rto_k<K: Kind>(
    dir: &Path,
    keys: u64,
    objective: Duration,
    crashes: usize,
    max_run: Duration,
) -> Result<Rto> {
    let policy = SnapshotPolicy::manual()
        .max_restore_time(objective)
        .min_interval(Duration::from_millis(200));
    let m = manager(dir, policy).await?;
    let mut rng = SplitMix64(11);
    let max_run_ms = u64::try_from(max_run.as_millis())
        .unwrap_or(u64::MAX)
        .max(6);
    let mut out = Rto {
        objective_ms: u64::try_from(objective.as_millis()).unwrap_or(u64::MAX),
        within: 0,
        crashes,
        open_ms: Vec::new(),
        replayed_max: 0,
    };
    let mut h = m.open(K::spec(dir, "db")?).await?;
    for _ in 0..crashes {
        let run = Duration::from_millis(max_run_ms / 6 + rng.next_u64() % (max_run_ms * 5 / 6));
        let start = Instant::now();
        while start.elapsed() < run {
            batch(&mut h, &mut rng, keys)?;
        }
        let crashed = Instant::now();
        drop(h);
        h = loop {
            // The dropped handle's cancelled snapshot may hold the log's
            // lock for a moment: that time counts.
            let opened = match K::spec(dir, "db") {
                Ok(spec) => m.open(spec).await,
                Err(e) => Err(e),
            };
            match opened {
                Ok(h) => break h,
                Err(e) if e.is_transient() => tokio::time::sleep(Duration::from_millis(2)).await,
                Err(e) => return Err(e),
            }
        };
        let t = crashed.elapsed();
        out.open_ms
            .push(u64::try_from(t.as_millis()).unwrap_or(u64::MAX));
        out.replayed_max = out.replayed_max.max(h.report().replay.records);
        if t <= objective {
            out.within += 1;
        }
    }
    h.abandon().await;
    m.shutdown().await;
    Ok(out)
}

/// `close()` (the handoff snapshot), then the next `open()`.
#[derive(Debug, Clone, Serialize)]
pub struct Handoff {
    /// `close()`, milliseconds.
    pub close_ms: u64,
    /// The next `open()` in the same directory, milliseconds.
    pub open_here_ms: u64,
    /// The next `open()` in a fresh directory (another machine),
    /// milliseconds.
    pub open_elsewhere_ms: u64,
    /// The most records either open replayed.
    pub replayed: u64,
}

/// Writes a little, closes, and opens twice: here and elsewhere.
pub async fn handoff(store: StoreType, dir: &Path, keys: u64) -> Result<Handoff> {
    match store {
        StoreType::Memory => handoff_k::<Memory>(dir, keys).await,
        StoreType::Rocksdb => handoff_k::<Rocks>(dir, keys).await,
    }
}

async fn handoff_k<K: Kind>(dir: &Path, keys: u64) -> Result<Handoff> {
    let m = manager(dir, SnapshotPolicy::manual()).await?;
    let mut h = m.open(K::spec(dir, "db")?).await?;
    let mut rng = SplitMix64(13);
    for _ in 0..20 {
        batch(&mut h, &mut rng, keys)?;
    }
    let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    let t = Instant::now();
    h.close().await?;
    let close = t.elapsed();
    let h = m.open(K::spec(dir, "db")?).await?;
    let open_here = h.opened_in();
    let mut replayed = h.report().replay.records;
    h.abandon().await;
    let h = m.open(K::spec(dir, "elsewhere")?).await?;
    let open_elsewhere = h.opened_in();
    replayed = replayed.max(h.report().replay.records);
    h.abandon().await;
    m.shutdown().await;
    Ok(Handoff {
        close_ms: ms(close),
        open_here_ms: ms(open_here),
        open_elsewhere_ms: ms(open_elsewhere),
        replayed,
    })
}
