//! Helpers shared by the benches (`mod common;` in each bench that uses
//! them). Each bench compiles its own copy and uses a part of it.
#![allow(dead_code)]

use statesnap::StoreKey;
use std::path::Path;
use std::time::{Duration, Instant};

use statesnap::changelog::Changelog;
use statesnap::changelog::file::{FileChangelog, FileChangelogOptions, FsyncPolicy};

/// The number in environment variable `name`, or `default`.
pub fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The comma-separated numbers in environment variable `name`, or `default`.
pub fn env_list(name: &str, default: &[usize]) -> Vec<usize> {
    std::env::var(name)
        .ok()
        .map(|v| v.split(',').filter_map(|x| x.trim().parse().ok()).collect())
        .unwrap_or_else(|| default.to_vec())
}

/// A scratch directory under `STATESNAP_BENCH_DIR`, or the system's
/// temporary directory; removed when dropped.
pub fn scratch_dir() -> tempfile::TempDir {
    match std::env::var("STATESNAP_BENCH_DIR") {
        Ok(d) => tempfile::tempdir_in(d).expect("scratch dir under STATESNAP_BENCH_DIR"),
        Err(_) => tempfile::tempdir().expect("scratch dir"),
    }
}

/// A multi-threaded runtime with two workers.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// A file changelog in `dir` for partition 0 of store `bench/<store>`, with
/// `fsync`.
pub fn file_log(dir: &Path, store: &str, fsync: FsyncPolicy) -> FileChangelog {
    let id = StoreKey::new("bench", store, 0)
        .expect("changelog id")
        .changelog_id();
    let opts = FileChangelogOptions {
        fsync,
        ..FileChangelogOptions::default()
    };
    FileChangelog::open(dir, id, opts).expect("open file changelog")
}

/// `f`'s result and how long it took.
pub fn timed<T>(f: impl FnOnce() -> T) -> (T, Duration) {
    let t = Instant::now();
    let r = f();
    (r, t.elapsed())
}

/// The total of what `run` reports for runs `0..iters` (for criterion's
/// `iter_custom`: each run times only the part it measures).
pub fn sum_of_runs(iters: u64, run: impl FnMut(u64) -> Duration) -> Duration {
    (0..iters).map(run).sum()
}

/// How many records a full read of `log` returns (in batches of 10 000).
pub fn count_records(log: &dyn Changelog) -> u64 {
    let mut r = log.read_from(0).expect("read_from");
    let mut n = 0u64;
    while let Some(batch) = r.next_batch(10_000).expect("next_batch") {
        n += batch.len() as u64;
    }
    n
}

/// A RocksStore with the default options in a new temporary directory
/// (returned with it, to keep it alive).
#[cfg(feature = "rocksdb")]
pub fn temp_rocks() -> (tempfile::TempDir, statesnap::store::RocksStore) {
    use statesnap::store::{RocksOptions, RocksStore};
    let dir = tempfile::tempdir().expect("tempdir");
    let store = RocksStore::open(dir.path().join("db"), &RocksOptions::default()).expect("open");
    (dir, store)
}
