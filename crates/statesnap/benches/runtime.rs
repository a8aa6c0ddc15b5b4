//! The runtime under load (`cargo bench -p statesnap --all-features --bench runtime`).
//!
//! For the in-memory store (portable format) and RocksDB, preloaded with
//! `STATESNAP_BENCH_RUNTIME_KEYS` keys (default 200 000; the figures in docs/runtime.md
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
//!    it), `STATESNAP_BENCH_RUNTIME_CRASHES` times (default 20; 50 for the figures in
//!    docs/runtime.md): how many reopens were ready within T;
//! 3. **handoff**: `close()` (the handoff snapshot) then `open()` in a
//!    fresh directory (another machine): both times, and records replayed.
//!
//! `STATESNAP_BENCH_RUNTIME_STORES` picks the store types (`memory,rocksdb`),
//! `STATESNAP_BENCH_RUNTIME_INTERVALS` the intervals and their order
//! (`none,10,1`).
//! Prints one table per part and a `json:` line with every figure.

mod common;

use std::path::Path;
use std::time::Duration;

use common::{env_u64, runtime};
use statesnap::bench::{self, BATCH, StoreType};

async fn run(
    store: StoreType,
    intervals: &[Option<Duration>],
    keys: u64,
    secs: u64,
    objective: Duration,
    crashes: usize,
    max_run_ms: u64,
) -> String {
    let dir = tempfile::tempdir().expect("tempdir");
    let dir: &Path = dir.path();
    bench::preload(store, dir, keys).await.expect("preload");
    let name = store.name();
    println!("\n{name} store, {keys} keys, batches of {BATCH} updates");
    println!("snapshots  records/s  vs none  commit p50 µs  p99 µs  max µs  snapshots");
    let mut json = Vec::new();
    let mut base = 0.0;
    for &every in intervals {
        let t = bench::throughput(store, dir, keys, Duration::from_secs(secs), every)
            .await
            .expect("throughput");
        if every.is_none() {
            base = t.records_per_sec;
        }
        let label = every.map_or("none".to_owned(), |e| format!("every {}s", e.as_secs()));
        println!(
            "{label:<10} {:>9.0}  {:>6.1}%  {:>13}  {:>6}  {:>6}  {:>3} ({} failed)",
            t.records_per_sec,
            if base > 0.0 {
                100.0 * t.records_per_sec / base
            } else {
                f64::NAN
            },
            t.commit_p50_us,
            t.commit_p99_us,
            t.commit_max_us,
            t.snapshots,
            t.failed
        );
        json.push(format!(
            "\"{name}_{}\":{}",
            label.replace(' ', "_"),
            serde_json::to_string(&t).expect("json")
        ));
    }
    let max_run = Duration::from_millis(max_run_ms);
    let r = bench::restore_time_objective(store, dir, keys, objective, crashes, max_run)
        .await
        .expect("restore-time objective");
    let mut sorted = r.open_ms.clone();
    sorted.sort_unstable();
    println!(
        "restore-time objective {} ms: {} of {} reopens within it (open ms p50 {} / max {}; most records replayed {})",
        r.objective_ms,
        r.within,
        r.crashes,
        sorted.get(sorted.len() / 2).copied().unwrap_or(0),
        sorted.last().copied().unwrap_or(0),
        r.replayed_max
    );
    json.push(format!(
        "\"{name}_rto\":{}",
        serde_json::to_string(&r).expect("json")
    ));
    let h = bench::handoff(store, dir, keys).await.expect("handoff");
    println!(
        "handoff: close {} ms, next open here {} ms, elsewhere {} ms, records replayed {}",
        h.close_ms, h.open_here_ms, h.open_elsewhere_ms, h.replayed
    );
    json.push(format!(
        "\"{name}_handoff\":{}",
        serde_json::to_string(&h).expect("json")
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
    // STATESNAP_BENCH_RUNTIME_INTERVALS overrides the list and its order
    // (`none,10,1`: seconds between snapshots, `none` for no snapshots;
    // ratios are against the latest `none` run before them).
    let intervals: Vec<Option<Duration>> = match std::env::var("STATESNAP_BENCH_RUNTIME_INTERVALS")
    {
        Ok(list) => list
            .split(',')
            .map(|x| match x.trim() {
                "none" => None,
                secs => Some(Duration::from_secs_f64(
                    secs.parse()
                        .expect("STATESNAP_BENCH_RUNTIME_INTERVALS: `none` or seconds"),
                )),
            })
            .collect(),
        Err(_) if benching => vec![
            None,
            Some(Duration::from_secs(10)),
            Some(Duration::from_secs(1)),
        ],
        Err(_) => vec![None, Some(Duration::from_secs(1))],
    };
    let intervals = &intervals[..];
    // STATESNAP_BENCH_RUNTIME_STORES: which store types to run
    // (`memory,rocksdb` by default).
    let stores = std::env::var("STATESNAP_BENCH_RUNTIME_STORES")
        .unwrap_or_else(|_| "memory,rocksdb".to_owned());
    let mut json = Vec::new();
    for store in stores.split(',').map(str::trim) {
        let store: StoreType = store.parse().expect("STATESNAP_BENCH_RUNTIME_STORES");
        json.push(rt.block_on(run(
            store, intervals, keys, secs, objective, crashes, max_run_ms,
        )));
    }
    println!("json: {{{}}}", json.join(","));
}
