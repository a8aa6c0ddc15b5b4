//! The measurements behind `statesnap bench` and the `cargo bench` targets
//! (feature `bench`).
//!
//! Each function builds what it measures in a scratch directory it is
//! given, times exactly the work being compared with [`Instant`], and
//! returns the figures; printing is the caller's business (the CLI draws a
//! table, Markdown, JSON and a chart; the bench targets print a table).
//! The figures and their meaning are documented; the functions are not a
//! stable API.
//!
//! They run blocking work (RocksDB's `BackupEngine`, `cp -r`, loading
//! stores) inline: call them from a runtime with a worker to spare, not
//! from a latency-sensitive one.

mod backup;
mod delta;
mod replay;
mod reshard;
mod scale;
mod standby;
mod throughput;

pub use backup::{BackupComparison, INCREMENTAL_ROUNDS, RestoreBreakdown, rocks_vs_backup_engine};
pub use delta::{DeltaCase, memory_delta};
pub use replay::{ReplayCase, restore_vs_replay};
pub use reshard::{ReshardCase, reshard_vs_replay};
pub use scale::{
    ConcurrentRestores, ScalePoint, TransportComparison, concurrent_restores, restore_vs_raw_get,
    scale_point,
};
pub use standby::{Failover, failover};
pub use throughput::{
    BATCH, Handoff, Rto, SplitMix64, StoreType, Throughput, handoff, preload,
    restore_time_objective, throughput,
};

use std::path::Path;
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde::Serialize;

use crate::changelog::file::{FileChangelog, FileChangelogOptions, FsyncPolicy};
use crate::error::{Error, Result};
use crate::repo::{Repository, RepositoryOptions, StoreKey};

/// One measure, statesnap's figure beside the other side's.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Pair {
    /// statesnap's figure.
    pub ours: f64,
    /// The figure it is compared with.
    pub theirs: f64,
}

impl Pair {
    /// Two durations, in seconds.
    pub fn secs(ours: Duration, theirs: Duration) -> Pair {
        Pair {
            ours: ours.as_secs_f64(),
            theirs: theirs.as_secs_f64(),
        }
    }

    /// `ours / theirs` (below 1: statesnap needs less).
    pub fn ratio(&self) -> f64 {
        self.ours / self.theirs
    }
}

/// `f`'s result and how long it took.
pub fn timed<T>(f: impl FnOnce() -> T) -> (T, Duration) {
    let t = Instant::now();
    let r = f();
    (r, t.elapsed())
}

/// The median of `runs` (zero when empty).
pub fn median(mut runs: Vec<Duration>) -> Duration {
    runs.sort();
    runs.get(runs.len() / 2).copied().unwrap_or_default()
}

/// The bytes under `p` (files' lengths, recursively; 0 if it is missing).
pub fn disk_usage(p: &Path) -> u64 {
    let Ok(m) = std::fs::symlink_metadata(p) else {
        return 0;
    };
    if !m.is_dir() {
        return m.len();
    }
    std::fs::read_dir(p).map_or(0, |d| {
        d.filter_map(|e| e.ok())
            .map(|e| disk_usage(&e.path()))
            .sum()
    })
}

/// A fixed-width key: `key-000000000042`.
pub(crate) fn key(i: u64) -> Bytes {
    Bytes::from(format!("key-{i:012}"))
}

/// 100 bytes of noise derived from `seed` (incompressible, like most
/// application values once encoded).
pub(crate) fn value(seed: u64) -> Bytes {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let v: Vec<u8> = (0..100)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect();
    Bytes::from(v)
}

/// The store key `bench/<name>/0`.
pub(crate) fn store_key(name: &str) -> Result<StoreKey> {
    StoreKey::new("bench", name, 0)
}

/// A file changelog in `dir` for `bench/<name>/0` that fsyncs only when
/// asked (a snapshot asks).
pub(crate) fn file_log(dir: &Path, name: &str) -> Result<FileChangelog> {
    let id = store_key(name)?.changelog_id();
    let opts = FileChangelogOptions {
        fsync: FsyncPolicy::Never,
        ..FileChangelogOptions::default()
    };
    FileChangelog::open(dir, id, opts)
}

/// The local repository at `dir`, created if missing.
pub(crate) async fn local_repo(dir: &Path) -> Result<Repository> {
    let url = format!("file://{}", dir.display());
    match Repository::open(&url, RepositoryOptions::default()).await {
        Ok(r) => Ok(r),
        Err(e) if e.kind() == crate::ErrorKind::NotFound => {
            Repository::init(&url, RepositoryOptions::default()).await
        }
        Err(e) => Err(e),
    }
}

/// Removes `p` if it exists.
pub(crate) fn remove(p: &Path) -> Result<()> {
    match std::fs::remove_dir_all(p) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(Error::io(
            format!("cannot remove bench directory path={}", p.display()),
            e,
        )),
        _ => Ok(()),
    }
}

/// The process's peak resident memory from a starting point on (Linux:
/// writing `5` to `/proc/self/clear_refs` resets the peak to the current
/// resident size).
pub(crate) struct PeakRss {
    before: u64,
}

fn status_kib(field: &str) -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with(field))?;
    line[field.len()..]
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()
}

impl PeakRss {
    pub(crate) fn start() -> Option<PeakRss> {
        std::fs::write("/proc/self/clear_refs", "5").ok()?;
        Some(PeakRss {
            before: status_kib("VmRSS:")?,
        })
    }

    pub(crate) fn growth(this: &Option<PeakRss>) -> Option<u64> {
        let p = this.as_ref()?;
        Some(status_kib("VmHWM:")?.saturating_sub(p.before) * 1024)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn helpers_are_deterministic_and_sized() {
        assert_eq!(value(7), value(7));
        assert_ne!(value(7), value(8));
        assert_eq!(value(1).len(), 100);
        assert_eq!(&key(42)[..], b"key-000000000042");
        let ms = |n| Duration::from_millis(n);
        assert_eq!(median(vec![ms(3), ms(1), ms(2)]), ms(2));
        assert_eq!(median(Vec::new()), Duration::ZERO);
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir(d.path().join("a")).unwrap();
        std::fs::write(d.path().join("a/x"), [0u8; 10]).unwrap();
        std::fs::write(d.path().join("y"), [0u8; 5]).unwrap();
        assert_eq!(disk_usage(d.path()), 15);
        assert_eq!(disk_usage(&d.path().join("missing")), 0);
    }
}
