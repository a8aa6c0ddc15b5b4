//! How snapshots and restores scale: a series of store sizes (time and peak
//! memory), many partitions restored at once through the runtime, and a
//! restore against the transport's own limit (a plain parallel `get` of the
//! same objects).

use std::path::Path;
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use serde::Serialize;

use super::backup::{bench_options, loaded_store};
use super::{PeakRss, key, local_repo, remove, store_key, value};
use crate::changelog::Changelog;
use crate::changelog::file::{FileChangelog, FileChangelogOptions, FsyncPolicy};
use crate::error::{Error, Result};
use crate::format::rocks::RocksFormat;
use crate::format::{RestoreContext, StoreFormat};
use crate::repo::StoreKey;
use crate::repo::{Manifest, Repository};
use crate::runtime::{SnapshotPolicy, StateManager, StoreSpec};
use crate::snapshot::commit_snapshot;

/// One store size: a full snapshot of a freshly loaded RocksDB store and a
/// restore of it, with the process's peak memory during each.
#[derive(Debug, Clone, Serialize)]
pub struct ScalePoint {
    /// Keys (100-byte values).
    pub keys: u64,
    /// Bytes of the snapshot.
    pub snapshot_bytes: u64,
    /// Capture + upload + commit, seconds.
    pub snapshot_secs: f64,
    /// Restore (every blob verified, store opened), seconds.
    pub restore_secs: f64,
    /// How far the process's peak resident memory rose above what it held
    /// when the snapshot started, bytes (`None` without Linux's `/proc`).
    pub snapshot_peak_rss_growth: Option<u64>,
    /// The same during the restore.
    pub restore_peak_rss_growth: Option<u64>,
}

/// Loads `keys` keys into a RocksDB store under `dir`, snapshots it into a
/// local repository, deletes the store and restores it; everything is
/// removed afterwards.
pub async fn scale_point(dir: &Path, keys: u64) -> Result<ScalePoint> {
    let format = RocksFormat::new(bench_options());
    let name = format!("scale-{keys}");
    let cdir = dir.join(&name);
    let (store, log) = loaded_store(&cdir.join("db"), &cdir.join("log"), &name, keys)?;
    let repo = local_repo(&cdir.join("repo")).await?;
    let sk = store_key(&name)?;

    // The changelog synced first, untimed: this bench's log never syncs by
    // itself (`FsyncPolicy::Never`, to load fast), and the snapshot would
    // otherwise fsync all of it, which a log with the default policy did
    // as it was written (`backup.rs` does the same).
    log.flush()?;
    let rss = PeakRss::start();
    let t = Instant::now();
    let cut = format.capture(&store)?;
    let m = commit_snapshot(&format, cut, &repo, &sk, &log, None).await?;
    let snapshot = t.elapsed();
    let snapshot_rss = PeakRss::growth(&rss);
    drop(store);
    remove(&cdir.join("db"))?;

    let rss = PeakRss::start();
    let t = Instant::now();
    let target = cdir.join("restored");
    let (restored, _) = format
        .restore(
            &m,
            RestoreContext {
                repo: &repo,
                target: &target,
            },
        )
        .await?;
    let restore = t.elapsed();
    let restore_rss = PeakRss::growth(&rss);
    // The background fsync ends before the files are removed (which would
    // spare the disk its write-back).
    restored.wait_durable()?;
    drop(restored);
    remove(&cdir)?;
    Ok(ScalePoint {
        keys,
        snapshot_bytes: m.file_bytes(),
        snapshot_secs: snapshot.as_secs_f64(),
        restore_secs: restore.as_secs_f64(),
        snapshot_peak_rss_growth: snapshot_rss,
        restore_peak_rss_growth: restore_rss,
    })
}

/// Many partitions restored through one [`StateManager`]: one at a time,
/// then all at once.
#[derive(Debug, Clone, Serialize)]
pub struct ConcurrentRestores {
    /// Partitions.
    pub partitions: u32,
    /// Keys per partition (100-byte values).
    pub keys_per_partition: u64,
    /// Bytes of all the partitions' snapshots.
    pub bytes: u64,
    /// Opening every partition one after the other (each ready before the
    /// next starts), seconds.
    pub sequential_secs: f64,
    /// Opening them all at once, seconds.
    pub concurrent_secs: f64,
}

impl ConcurrentRestores {
    /// Aggregate restore bandwidth one at a time, bytes/s.
    pub fn sequential_bandwidth(&self) -> f64 {
        self.bytes as f64 / self.sequential_secs.max(1e-9)
    }

    /// Aggregate restore bandwidth all at once, bytes/s.
    pub fn concurrent_bandwidth(&self) -> f64 {
        self.bytes as f64 / self.concurrent_secs.max(1e-9)
    }
}

fn partition_log(dir: &Path, p: u32) -> Result<FileChangelog> {
    FileChangelog::open(
        dir.join(format!("log-{p}")),
        StoreKey::new("bench", "scale", p)?.changelog_id(),
        FileChangelogOptions {
            fsync: FsyncPolicy::Never,
            ..FileChangelogOptions::default()
        },
    )
}

fn spec(dir: &Path, p: u32, into: &str) -> Result<StoreSpec<RocksFormat, FileChangelog>> {
    Ok(StoreSpec::rocksdb(
        StoreKey::new("bench", "scale", p)?,
        partition_log(dir, p)?,
        dir.join(format!("{into}-{p}")),
    ))
}

/// Writes `keys_per_partition` keys into each of `partitions` RocksDB
/// stores through the runtime and closes them (a handoff snapshot each),
/// then opens every partition in a fresh directory (another machine), one
/// at a time and then all at once.
pub async fn concurrent_restores(
    dir: &Path,
    partitions: u32,
    keys_per_partition: u64,
) -> Result<ConcurrentRestores> {
    let dir = dir.join("concurrent");
    let repo = local_repo(&dir.join("repo")).await?;
    let manager = StateManager::builder(repo.clone())
        .policy(SnapshotPolicy::manual())
        .build()?;
    for p in 0..partitions {
        let mut h = manager.open(spec(&dir, p, "src")?).await?;
        let mut k = 0;
        while k < keys_per_partition {
            for _ in 0..10_000.min(keys_per_partition - k) {
                h.put(key(k), value(k ^ u64::from(p) << 40));
                k += 1;
            }
            h.commit()?;
        }
        h.close().await?;
        remove(&dir.join(format!("src-{p}")))?;
    }
    let bytes = super::disk_usage(&dir.join("repo"));

    let t = Instant::now();
    for p in 0..partitions {
        let h = manager.open(spec(&dir, p, "seq")?).await?;
        check_restored(h.report())?;
        h.abandon().await;
    }
    let sequential = t.elapsed();
    for p in 0..partitions {
        remove(&dir.join(format!("seq-{p}")))?;
    }

    let t = Instant::now();
    let specs = (0..partitions)
        .map(|p| spec(&dir, p, "con"))
        .collect::<Result<Vec<_>>>()?;
    let handles = futures::future::try_join_all(specs.into_iter().map(|s| manager.open(s))).await?;
    let concurrent = t.elapsed();
    for h in handles {
        check_restored(h.report())?;
        h.abandon().await;
    }
    manager.shutdown().await;
    remove(&dir)?;
    Ok(ConcurrentRestores {
        partitions,
        keys_per_partition,
        bytes,
        sequential_secs: sequential.as_secs_f64(),
        concurrent_secs: concurrent.as_secs_f64(),
    })
}

fn check_restored(report: &crate::restore::RestoreReport) -> Result<()> {
    if report.snapshot.is_none() || report.replay.records != 0 {
        return Err(Error::internal(format!(
            "bench: a partition did not open from its handoff snapshot report={report:?}"
        )));
    }
    Ok(())
}

/// A restore from a (remote) repository against the transport's limit.
#[derive(Debug, Clone, Serialize)]
pub struct TransportComparison {
    /// The repository's URL.
    pub url: String,
    /// Bytes of the snapshot.
    pub bytes: u64,
    /// Restore (download, verify, write, fsync, open), seconds (median).
    pub restore_secs: f64,
    /// Ranged `get`s of the same objects through `object_store`, in the
    /// restore's ranges and as many at once, bytes read and dropped:
    /// the transport's limit for this access pattern, seconds (median).
    pub raw_get_secs: f64,
    /// The same with one whole-object `get` per blob, seconds (median).
    pub raw_whole_get_secs: f64,
}

impl TransportComparison {
    /// The restore's bandwidth as a share of the raw ranged `get`s'.
    pub fn efficiency(&self) -> f64 {
        self.raw_get_secs / self.restore_secs.max(1e-9)
    }
}

/// Snapshots a RocksDB store of `keys` keys into `repo` (under store
/// `bench/transport-<keys>/0`), then times `runs` restores of it into `dir`
/// against `runs` raw parallel `get`s of its blobs.
pub async fn restore_vs_raw_get(
    dir: &Path,
    repo: &Repository,
    keys: u64,
    runs: usize,
) -> Result<TransportComparison> {
    let format = RocksFormat::new(bench_options());
    let name = format!("transport-{keys}");
    let cdir = dir.join(&name);
    let (store, log) = loaded_store(&cdir.join("db"), &cdir.join("log"), &name, keys)?;
    let sk = store_key(&name)?;
    let cut = format.capture(&store)?;
    let m = commit_snapshot(&format, cut, repo, &sk, &log, None).await?;
    drop(store);

    let (mut ours, mut raw, mut whole) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..runs.max(1) {
        let target = cdir.join("restored");
        remove(&target)?;
        let t = Instant::now();
        let (restored, _) = format
            .restore(
                &m,
                RestoreContext {
                    repo,
                    target: &target,
                },
            )
            .await?;
        ours.push(t.elapsed());
        restored.wait_durable()?;
        drop(restored);
        remove(&target)?;
        let t = Instant::now();
        raw_get(repo, &m, true).await?;
        raw.push(t.elapsed());
        let t = Instant::now();
        raw_get(repo, &m, false).await?;
        whole.push(t.elapsed());
    }
    remove(&cdir)?;
    let secs = |d: Duration| d.as_secs_f64();
    Ok(TransportComparison {
        url: repo.url().to_owned(),
        bytes: m.files.iter().map(|f| f.size).sum(),
        restore_secs: secs(super::median(ours)),
        raw_get_secs: secs(super::median(raw)),
        raw_whole_get_secs: secs(super::median(whole)),
    })
}

/// Every blob of `m`, read through the object store and dropped, with the
/// repository's transfer parallelism: in the ranges a restore fetches
/// (`ranged`), or one `get` per blob.
async fn raw_get(repo: &Repository, m: &Manifest, ranged: bool) -> Result<()> {
    let store = repo.object_store();
    let parallelism = repo.transfer().parallelism.max(1);
    let mut gets = Vec::new();
    for f in &m.files {
        let key = crate::repo::paths::blob(&m.store_key, &f.blake3);
        match repo.transfer().download_ranges(f.size).filter(|_| ranged) {
            Some(ranges) => gets.extend(ranges.into_iter().map(|r| (key.clone(), Some(r)))),
            None => gets.push((key, None)),
        }
    }
    futures::stream::iter(gets)
        .map(|(key, range)| {
            let store = store.clone();
            async move {
                let opts = object_store::GetOptions {
                    range: range.map(object_store::GetRange::Bounded),
                    ..Default::default()
                };
                let mut s = store
                    .get_opts(&key, opts)
                    .await
                    .map_err(|e| Error::internal(format!("bench: get {key}")).with_source(e))?
                    .into_stream();
                while let Some(chunk) = s.next().await {
                    std::hint::black_box(chunk.map_err(|e| {
                        Error::internal(format!("bench: read {key}")).with_source(e)
                    })?);
                }
                Ok::<_, Error>(())
            }
        })
        .buffer_unordered(parallelism)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(())
}
