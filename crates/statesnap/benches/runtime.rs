//! The runtime under load (`cargo bench -p statesnap --all-features --bench runtime`).
//!
//! For the in-memory store (portable format) and RocksDB, preloaded with
//! `STATESNAP_BENCH_RUNTIME_KEYS` keys (default 200 000; the figures
//! use 1 000 000):
//!
//! 1. **throughput**: a processing loop commits batches of 500 updates for
//!    `STATESNAP_BENCH_RUNTIME_SECS` seconds (default 5; at least two
//!    snapshot intervals, after a 1 s warm-up) with no background
//!    snapshots, one every 10 s and one every 1 s — records/s, its ratio to
//!    no snapshots, and `commit()` latency p50 / p99 / max (the capture
//!    stall is inside `commit()`);
//! 2. **restore-time objective**: with `max_restore_time = T`
//!    (`STATESNAP_BENCH_RUNTIME_RTO_MS`, default 2000), the loop runs for a
//!    random 0.5–3 s (0.05–0.3 s under `cargo test`) and the handle is dropped (a crash as the runtime sees
//!    it), `STATESNAP_BENCH_RUNTIME_CRASHES` times (default 20; 50 for the
//!    issue): how many reopens were ready within T;
//! 3. **handoff**: `close()` (the handoff snapshot) then `open()` in a
//!    fresh directory (another machine): both times, and records replayed.
//!
//! `STATESNAP_BENCH_RUNTIME_STORES` picks the store types (`memory,rocksdb`).
//! Prints one table per part and a `json:` line with every figure.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{env_u64, runtime};
use statesnap::changelog::ChangelogId;
use statesnap::format::StoreFormat;
use statesnap::{
    FileChangelog, FsyncPolicy, Repository, SnapshotPolicy, StateHandle, StateManager, StoreSpec,
};

const BATCH: usize = 500;

fn log(dir: &Path) -> statesnap::Result<FileChangelog> {
    let id = ChangelogId::for_store("bench", "runtime", 0)?;
    let opts = statesnap::FileChangelogOptions {
        fsync: FsyncPolicy::Never,
        ..Default::default()
    };
    FileChangelog::open(dir.join("log"), id, opts)
}

/// A store type under test: how to make its spec.
trait Kind {
    type F: StoreFormat + 'static;
    const NAME: &'static str;
    fn try_spec(
        dir: &Path,
        store_dir: &str,
    ) -> statesnap::Result<StoreSpec<Self::F, FileChangelog>>;

    fn spec(dir: &Path, store_dir: &str) -> StoreSpec<Self::F, FileChangelog> {
        Self::try_spec(dir, store_dir).expect("spec")
    }
}

struct Memory;
impl Kind for Memory {
    type F = statesnap::PortableFormat<statesnap::MemoryStore>;
    const NAME: &'static str = "memory";
    fn try_spec(
        dir: &Path,
        store_dir: &str,
    ) -> statesnap::Result<StoreSpec<Self::F, FileChangelog>> {
        StoreSpec::memory("bench", "runtime", 0, log(dir)?, dir.join(store_dir))
    }
}

struct Rocks;
impl Kind for Rocks {
    type F = statesnap::RocksFormat;
    const NAME: &'static str = "rocksdb";
    fn try_spec(
        dir: &Path,
        store_dir: &str,
    ) -> statesnap::Result<StoreSpec<Self::F, FileChangelog>> {
        StoreSpec::rocksdb("bench", "runtime", 0, log(dir)?, dir.join(store_dir))
    }
}

/// splitmix64.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

fn key(k: u64) -> Vec<u8> {
    format!("user-{k:010}").into_bytes()
}

/// One batch of `BATCH` updates to random keys below `keys`, committed;
/// returns the commit's duration.
fn batch<F: StoreFormat, C: statesnap::Changelog>(
    h: &mut StateHandle<F, C>,
    rng: &mut Rng,
    keys: u64,
) -> Duration {
    for _ in 0..BATCH {
        let k = rng.next() % keys;
        let v = rng.next().to_le_bytes().repeat(12); // 96 bytes
        h.put(key(k), v);
    }
    let t = Instant::now();
    h.commit().expect("commit");
    t.elapsed()
}

async fn manager(dir: &Path, policy: SnapshotPolicy) -> StateManager {
    let url = format!("file://{}", dir.join("repo").display());
    let repo = match Repository::open(&url, Default::default()).await {
        Ok(r) => r,
        Err(_) => Repository::init(&url, Default::default())
            .await
            .expect("init repo"),
    };
    StateManager::builder(repo)
        .policy(policy)
        .build()
        .expect("manager")
}

/// Loads `keys` keys and hands the store off (the base snapshot).
async fn preload<K: Kind>(dir: &Path, keys: u64) {
    let m = manager(dir, SnapshotPolicy::manual()).await;
    let mut h = m.open(K::spec(dir, "db")).await.expect("open");
    let mut k = 0;
    while k < keys {
        for _ in 0..10_000.min(keys - k) {
            h.put(key(k), k.to_le_bytes().repeat(12));
            k += 1;
        }
        h.commit().expect("commit");
    }
    h.close().await.expect("close");
    m.shutdown().await;
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i]
}

struct Throughput {
    records_per_sec: f64,
    p50: Duration,
    p99: Duration,
    max: Duration,
    snapshots: u64,
    failed: u64,
}

async fn throughput<K: Kind>(
    dir: &Path,
    keys: u64,
    secs: u64,
    every: Option<Duration>,
) -> Throughput {
    let policy = match every {
        Some(e) => SnapshotPolicy::manual()
            .every(e)
            .min_interval(Duration::ZERO),
        None => SnapshotPolicy::manual(),
    };
    let m = manager(dir, policy).await;
    let mut h = m.open(K::spec(dir, "db")).await.expect("open");
    let mut rng = Rng(7);
    // Warm up (caches, allocator) before measuring, then run at least two
    // snapshot intervals.
    let warm = Instant::now();
    while warm.elapsed() < Duration::from_secs(1) {
        batch(&mut h, &mut rng, keys);
    }
    let run = every.map_or(Duration::from_secs(secs), |e| {
        Duration::from_secs(secs).max(e * 2 + Duration::from_secs(1))
    });
    let mut lat = Vec::new();
    let start = Instant::now();
    while start.elapsed() < run {
        lat.push(batch(&mut h, &mut rng, keys));
    }
    let elapsed = start.elapsed();
    let st = h.wait_for_snapshot().await;
    h.abandon().await;
    m.shutdown().await;
    lat.sort();
    Throughput {
        records_per_sec: (lat.len() * BATCH) as f64 / elapsed.as_secs_f64(),
        p50: percentile(&lat, 0.5),
        p99: percentile(&lat, 0.99),
        max: lat.last().copied().unwrap_or_default(),
        snapshots: st.snapshots_taken,
        failed: st.snapshots_failed,
    }
}

struct Rto {
    within: usize,
    crashes: usize,
    open_ms: Vec<u64>,
    replayed_max: u64,
}

async fn rto<K: Kind>(
    dir: &Path,
    keys: u64,
    objective: Duration,
    crashes: usize,
    max_run_ms: u64,
) -> Rto {
    let policy = SnapshotPolicy::manual()
        .max_restore_time(objective)
        .min_interval(Duration::from_millis(200));
    let m = manager(dir, policy).await;
    let mut rng = Rng(11);
    let mut out = Rto {
        within: 0,
        crashes,
        open_ms: Vec::new(),
        replayed_max: 0,
    };
    let mut h = m.open(K::spec(dir, "db")).await.expect("open");
    for _ in 0..crashes {
        let run = Duration::from_millis(max_run_ms / 6 + rng.next() % (max_run_ms * 5 / 6));
        let start = Instant::now();
        while start.elapsed() < run {
            batch(&mut h, &mut rng, keys);
        }
        let crashed = Instant::now();
        drop(h); // a crash, as far as the runtime can tell
        h = loop {
            // The dropped handle's cancelled snapshot may hold the log's
            // lock for a moment.
            let opened = match K::try_spec(dir, "db") {
                Ok(spec) => m.open(spec).await,
                Err(e) => Err(e),
            };
            match opened {
                Ok(h) => break h,
                Err(e) if e.is_transient() => tokio::time::sleep(Duration::from_millis(2)).await,
                Err(e) => panic!("reopen: {e}"),
            }
        };
        // From the crash to a ready store (a cancelled snapshot may hold
        // the changelog's lock for a moment: that counts).
        let t = crashed.elapsed();
        out.open_ms.push(t.as_millis() as u64);
        out.replayed_max = out.replayed_max.max(h.report().replay.records);
        if t <= objective {
            out.within += 1;
        }
    }
    h.abandon().await;
    m.shutdown().await;
    out
}

struct Handoff {
    close: Duration,
    open_here: Duration,
    open_elsewhere: Duration,
    replayed: u64,
}

async fn handoff<K: Kind>(dir: &Path, keys: u64) -> Handoff {
    let m = manager(dir, SnapshotPolicy::manual()).await;
    let mut h = m.open(K::spec(dir, "db")).await.expect("open");
    let mut rng = Rng(13);
    for _ in 0..20 {
        batch(&mut h, &mut rng, keys);
    }
    let t = Instant::now();
    h.close().await.expect("close");
    let close = t.elapsed();
    let h = m.open(K::spec(dir, "db")).await.expect("open");
    let open_here = h.opened_in();
    let mut replayed = h.report().replay.records;
    h.abandon().await;
    let h = m.open(K::spec(dir, "elsewhere")).await.expect("open");
    let open_elsewhere = h.opened_in();
    replayed = replayed.max(h.report().replay.records);
    h.abandon().await;
    m.shutdown().await;
    Handoff {
        close,
        open_here,
        open_elsewhere,
        replayed,
    }
}

fn us(d: Duration) -> u128 {
    d.as_micros()
}

async fn run<K: Kind>(
    intervals: &[Option<Duration>],
    keys: u64,
    secs: u64,
    objective: Duration,
    crashes: usize,
    max_run_ms: u64,
) -> String {
    let dir = tempfile::tempdir().expect("tempdir");
    preload::<K>(dir.path(), keys).await;
    println!(
        "\n{} store, {keys} keys, batches of {BATCH} updates",
        K::NAME
    );
    println!("snapshots  records/s  vs none  commit p50 µs  p99 µs  max µs  snapshots");
    let mut json = Vec::new();
    let mut base = 0.0;
    for &every in intervals {
        let t = throughput::<K>(dir.path(), keys, secs, every).await;
        if every.is_none() {
            base = t.records_per_sec;
        }
        let label = every.map_or("none".to_owned(), |e| format!("every {}s", e.as_secs()));
        println!(
            "{label:<10} {:>9.0}  {:>6.1}%  {:>13}  {:>6}  {:>6}  {:>3} ({} failed)",
            t.records_per_sec,
            100.0 * t.records_per_sec / base,
            us(t.p50),
            us(t.p99),
            us(t.max),
            t.snapshots,
            t.failed
        );
        json.push(format!(
            "\"{}_{}\":{{\"records_per_sec\":{:.0},\"ratio\":{:.3},\"p50_us\":{},\"p99_us\":{},\"max_us\":{},\"snapshots\":{}}}",
            K::NAME,
            label.replace(' ', "_"),
            t.records_per_sec,
            t.records_per_sec / base,
            us(t.p50),
            us(t.p99),
            us(t.max),
            t.snapshots
        ));
    }
    let r = rto::<K>(dir.path(), keys, objective, crashes, max_run_ms).await;
    let mut sorted = r.open_ms.clone();
    sorted.sort_unstable();
    println!(
        "restore-time objective {} ms: {} of {} reopens within it (open ms p50 {} / max {}; most records replayed {})",
        objective.as_millis(),
        r.within,
        r.crashes,
        sorted.get(sorted.len() / 2).copied().unwrap_or(0),
        sorted.last().copied().unwrap_or(0),
        r.replayed_max
    );
    json.push(format!(
        "\"{}_rto\":{{\"objective_ms\":{},\"within\":{},\"crashes\":{},\"open_ms\":{:?}}}",
        K::NAME,
        objective.as_millis(),
        r.within,
        r.crashes,
        r.open_ms
    ));
    let h = handoff::<K>(dir.path(), keys).await;
    println!(
        "handoff: close {} ms, next open here {} ms, elsewhere {} ms, records replayed {}",
        h.close.as_millis(),
        h.open_here.as_millis(),
        h.open_elsewhere.as_millis(),
        h.replayed
    );
    json.push(format!(
        "\"{}_handoff\":{{\"close_ms\":{},\"open_here_ms\":{},\"open_elsewhere_ms\":{},\"replayed\":{}}}",
        K::NAME,
        h.close.as_millis(),
        h.open_here.as_millis(),
        h.open_elsewhere.as_millis(),
        h.replayed
    ));
    json.join(",")
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` runs this
    // harness-less target without it: keep that run short.
    let benching = std::env::args().any(|a| a == "--bench");
    let keys = env_u64(
        "STATESNAP_BENCH_RUNTIME_KEYS",
        if benching { 200_000 } else { 5_000 },
    );
    let secs = env_u64("STATESNAP_BENCH_RUNTIME_SECS", if benching { 5 } else { 1 });
    let objective = Duration::from_millis(env_u64("STATESNAP_BENCH_RUNTIME_RTO_MS", 2000));
    let crashes = env_u64(
        "STATESNAP_BENCH_RUNTIME_CRASHES",
        if benching { 20 } else { 2 },
    ) as usize;
    let max_run_ms = if benching { 3000 } else { 300 };
    // STATESNAP_BENCH_RUNTIME_WORKERS: tokio workers for the background
    // work (the processing loop runs on the main thread); default 2.
    let rt = match env_u64("STATESNAP_BENCH_RUNTIME_WORKERS", 0) {
        0 => runtime(),
        n => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(n as usize)
            .enable_all()
            .build()
            .expect("tokio runtime"),
    };
    // Under `cargo test` the 10 s interval (a 21 s run) is left out.
    let intervals: &[Option<Duration>] = if benching {
        &[
            None,
            Some(Duration::from_secs(10)),
            Some(Duration::from_secs(1)),
        ]
    } else {
        &[None, Some(Duration::from_secs(1))]
    };
    // STATESNAP_BENCH_RUNTIME_STORES: which store types to run
    // (`memory,rocksdb` by default).
    let stores = std::env::var("STATESNAP_BENCH_RUNTIME_STORES")
        .unwrap_or_else(|_| "memory,rocksdb".to_owned());
    let mut json = Vec::new();
    for store in stores.split(',').map(str::trim) {
        json.push(match store {
            "memory" => rt.block_on(run::<Memory>(
                intervals, keys, secs, objective, crashes, max_run_ms,
            )),
            "rocksdb" => rt.block_on(run::<Rocks>(
                intervals, keys, secs, objective, crashes, max_run_ms,
            )),
            other => panic!("STATESNAP_BENCH_RUNTIME_STORES: unknown store type `{other}`"),
        });
    }
    println!("json: {{{}}}", json.join(","));
}
