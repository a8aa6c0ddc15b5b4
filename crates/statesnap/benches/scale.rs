//! How snapshots and restores scale (`cargo bench -p statesnap --all-features
//! --bench scale`), RocksDB stores of 100-byte values:
//!
//! 1. **series**: for each size in `STATESNAP_BENCH_SCALE_KEYS` (default
//!    `1000000,4000000,16000000`, about 0.1 / 0.45 / 1.8 GB), a full snapshot
//!    and a restore into a local repository: time, bytes, and how far the
//!    process's peak resident memory rose during each (time should grow
//!    linearly, memory not at all);
//! 2. **partitions**: `STATESNAP_BENCH_SCALE_PARTITIONS` partitions (default
//!    16) of `STATESNAP_BENCH_SCALE_PARTITION_KEYS` keys (default 250 000)
//!    handed off through the runtime, then opened through one
//!    `StateManager` one at a time and all at once: aggregate bandwidth;
//! 3. **transport**: with `STATESNAP_TEST_S3_URL` set (`source scripts/s3.sh;
//!    s3_start`), a restore of `STATESNAP_BENCH_S3_KEYS` keys (default
//!    1 000 000) from the S3 server against a plain parallel `get` of the same
//!    objects through `object_store` (median of 3): the restore's share of
//!    the transport's bandwidth.
//!
//! Needs about 4x the largest store free under `STATESNAP_BENCH_DIR`
//! (default: the temporary directory). Under `cargo test --benches` it is a
//! smoke test on small sizes.
#![allow(clippy::unwrap_used)]

mod common;

use common::{env_list, env_u64};
use statesnap::bench;
use statesnap::repo::{Repository, RepositoryOptions};

fn mb(b: u64) -> f64 {
    b as f64 / 1e6
}

fn rss(b: Option<u64>) -> String {
    b.map_or_else(|| "n/a".to_owned(), |b| format!("{:.1}", mb(b)))
}

fn main() {
    let smoke = !std::env::args().any(|a| a == "--bench");
    let sizes = env_list(
        "STATESNAP_BENCH_SCALE_KEYS",
        if smoke {
            &[2_000, 8_000]
        } else {
            &[1_000_000, 4_000_000, 16_000_000]
        },
    );
    let partitions = env_u64(
        "STATESNAP_BENCH_SCALE_PARTITIONS",
        if smoke { 4 } else { 16 },
    );
    let partition_keys = env_u64(
        "STATESNAP_BENCH_SCALE_PARTITION_KEYS",
        if smoke { 1_000 } else { 250_000 },
    );
    let s3_keys = env_u64(
        "STATESNAP_BENCH_S3_KEYS",
        if smoke { 2_000 } else { 1_000_000 },
    );
    let scratch = common::scratch_dir();
    let dir = scratch.path();
    let rt = common::runtime();

    println!("series: full snapshot and restore, local repository");
    println!(
        "{:>10} {:>10} {:>12} {:>11} {:>10} {:>11} {:>12}",
        "keys", "MB", "snapshot s", "restore s", "MB/s", "snap RSS+", "restore RSS+"
    );
    let mut points = Vec::new();
    for keys in sizes {
        let p = rt.block_on(bench::scale_point(dir, keys as u64)).unwrap();
        println!(
            "{:>10} {:>10.1} {:>12.3} {:>11.3} {:>10.0} {:>11} {:>12}",
            p.keys,
            mb(p.snapshot_bytes),
            p.snapshot_secs,
            p.restore_secs,
            mb(p.snapshot_bytes) / p.restore_secs.max(1e-9),
            rss(p.snapshot_peak_rss_growth),
            rss(p.restore_peak_rss_growth),
        );
        points.push(p);
    }

    let c = rt
        .block_on(bench::concurrent_restores(
            dir,
            u32::try_from(partitions).unwrap(),
            partition_keys,
        ))
        .unwrap();
    println!(
        "partitions: {} x {} keys ({:.1} MB) through one StateManager: one at a time {:.3} s \
         ({:.0} MB/s), all at once {:.3} s ({:.0} MB/s)",
        c.partitions,
        c.keys_per_partition,
        mb(c.bytes),
        c.sequential_secs,
        c.sequential_bandwidth() / 1e6,
        c.concurrent_secs,
        c.concurrent_bandwidth() / 1e6,
    );

    let transport = match std::env::var("STATESNAP_TEST_S3_URL") {
        Ok(base) => {
            let id = uuid::Uuid::new_v4().simple().to_string();
            let url = format!("{}/bench{}", base.trim_end_matches('/'), &id[..8]);
            let t = rt
                .block_on(async {
                    let repo = Repository::init(&url, RepositoryOptions::default()).await?;
                    bench::restore_vs_raw_get(dir, &repo, s3_keys, 3).await
                })
                .unwrap();
            println!(
                "transport: {} keys ({:.1} MB) from {}: restore {:.3} s, raw parallel ranged get \
                 {:.3} s (whole objects {:.3} s) -> restore at {:.0} % of the transport's \
                 bandwidth (target >= 80 %)",
                s3_keys,
                mb(t.bytes),
                t.url,
                t.restore_secs,
                t.raw_get_secs,
                t.raw_whole_get_secs,
                t.efficiency() * 100.0
            );
            Some(t)
        }
        Err(_) => {
            println!(
                "transport: skipped (STATESNAP_TEST_S3_URL is not set; source scripts/s3.sh; s3_start)"
            );
            None
        }
    };
    println!(
        "json: {}",
        serde_json::json!({"series": points, "partitions": c, "transport": transport})
    );
}
