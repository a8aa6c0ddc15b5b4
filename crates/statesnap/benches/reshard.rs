//! Resharding against replaying the sources into the new layout
//! (`cargo bench -p statesnap --all-features --bench reshard`): RocksDB
//! partitions of `STATESNAP_BENCH_RESHARD_KEYS` keys in all (default
//! 4 000 000, 100-byte values), moved for each case of
//! `STATESNAP_BENCH_RESHARD_CASES` (`from:to:records_per_key`, default
//! `4:8:1,8:4:1,4:8:5`); also against one sequential write of the same
//! bytes. `statesnap bench` reports the same cases.
//!
//! Under `cargo test --benches` it is a smoke test on small sizes.
#![allow(clippy::unwrap_used)]

mod common;

use common::env_u64;
use statesnap::bench;

fn main() {
    let smoke = !std::env::args().any(|a| a == "--bench");
    let keys = env_u64(
        "STATESNAP_BENCH_RESHARD_KEYS",
        if smoke { 10_000 } else { 4_000_000 },
    );
    let default_cases = if smoke { "2:3:2" } else { "4:8:1,8:4:1,4:8:5" };
    let cases =
        std::env::var("STATESNAP_BENCH_RESHARD_CASES").unwrap_or_else(|_| default_cases.to_owned());
    let scratch = common::scratch_dir();
    let rt = common::runtime();
    println!(
        "{:>6} {:>4} {:>9} {:>10} {:>22} {:>8} {:>10} {:>8} {:>8} {:>8} {:>9}",
        "from",
        "to",
        "rec/key",
        "reshard s",
        "restore/write/commit",
        "cores",
        "replay s",
        "cores",
        "speedup",
        "raw s",
        "RSS+ MB"
    );
    for case in cases.split(',') {
        let n: Vec<u32> = case
            .split(':')
            .filter_map(|x| x.trim().parse().ok())
            .collect();
        let [from, to, history] = n[..] else {
            panic!("STATESNAP_BENCH_RESHARD_CASES: `{case}` is not from:to:records_per_key");
        };
        let dir = scratch.path().join("reshard");
        let r = rt
            .block_on(bench::reshard_vs_replay(&dir, keys, history, from, to))
            .unwrap();
        let cores = |cpu: Option<f64>, wall: f64| cpu.map_or(f64::NAN, |c| c / wall.max(1e-9));
        println!(
            "{:>6} {:>4} {:>9} {:>10.2} {:>22} {:>8.2} {:>10.2} {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>9.0}",
            r.from,
            r.to,
            r.records_per_key,
            r.reshard_secs,
            format!(
                "{:.2}/{:.2}/{:.2}",
                r.restore_secs, r.write_secs, r.commit_secs
            ),
            cores(r.reshard_cpu_secs, r.reshard_secs),
            r.replay_secs,
            cores(r.replay_cpu_secs, r.replay_secs),
            r.speedup(),
            r.raw_write_secs,
            r.source_scan_secs,
            r.peak_rss_delta
                .map_or(f64::NAN, |b| b as f64 / (1 << 20) as f64),
        );
        assert_eq!(r.keys, keys, "the reshard moved every key");
    }
}
