//! Failover with a warm standby against the two ways back without one
//! (`cargo bench -p statesnap --all-features --bench standby`): a RocksDB
//! partition of `STATESNAP_BENCH_STANDBY_KEYS` keys (default 1 000 000,
//! 100-byte values) whose input flows at `STATESNAP_BENCH_STANDBY_RATE`
//! records per second (default 200 000) for
//! `STATESNAP_BENCH_STANDBY_FLOW_MS` (default 4 000) before its owner dies
//! without a handoff; then the time to a ready store by promoting the
//! standby, by the newest snapshot and the tail, and by a full replay.
//!
//! Under `cargo test --benches` it is a smoke test on small sizes.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::env_u64;
use statesnap::bench;

fn main() {
    let smoke = !std::env::args().any(|a| a == "--bench");
    let keys = env_u64(
        "STATESNAP_BENCH_STANDBY_KEYS",
        if smoke { 20_000 } else { 1_000_000 },
    );
    let rate = env_u64(
        "STATESNAP_BENCH_STANDBY_RATE",
        if smoke { 20_000 } else { 200_000 },
    );
    let flow = Duration::from_millis(env_u64(
        "STATESNAP_BENCH_STANDBY_FLOW_MS",
        if smoke { 500 } else { 4_000 },
    ));
    let scratch = common::scratch_dir();
    let rt = common::runtime();
    let r = rt
        .block_on(bench::failover(
            &scratch.path().join("failover"),
            keys,
            rate,
            flow,
        ))
        .unwrap();
    println!(
        "keys {}  input {} rec/s asked, {:.0} rec/s committed for {:.1} s",
        r.keys, r.target_records_per_sec, r.flow_records_per_sec, r.flow_secs
    );
    println!(
        "standby while following: max lag {} records / {} ms; followed {:.0} rec/s; last large poll {} rec/s",
        r.standby_max_lag_records,
        r.standby_max_lag_ms,
        r.standby_follow_records_per_sec,
        r.standby_replay_records_per_sec
            .map_or("-".to_owned(), |x| format!("{x:.0}"))
    );
    println!(
        "{:<22} {:>10} {:>12} {:>14}",
        "time to ready", "seconds", "replayed", "downloaded MB"
    );
    let mb = |b: u64| b as f64 / (1 << 20) as f64;
    println!(
        "{:<22} {:>10.4} {:>12} {:>14.1}",
        "promoted standby",
        r.standby_secs,
        r.standby_replayed,
        mb(r.standby_downloaded)
    );
    println!(
        "{:<22} {:>10.3} {:>12} {:>14.1}",
        "snapshot + tail",
        r.snapshot_tail_secs,
        r.snapshot_tail_replayed,
        mb(r.snapshot_tail_downloaded)
    );
    println!(
        "{:<22} {:>10.3} {:>12} {:>14.1}",
        "full replay", r.full_replay_secs, r.full_replay_records, 0.0
    );
    println!(
        "lag at the kill {} records, at the promotion {}; promotion beyond the lag's replay {:.1} ms; {:.1}x faster than snapshot + tail",
        r.lag_at_kill,
        r.lag_at_promote,
        r.standby_fixed_secs() * 1000.0,
        r.standby_speedup()
    );
    assert_eq!(r.standby_downloaded, 0, "a promotion downloads nothing");
    assert_eq!(
        r.standby_replayed, r.lag_at_promote,
        "a promotion replays the lag it finds"
    );
}
