//! RocksDB snapshots side by side with RocksDB's own `BackupEngine`, on the
//! same database in one run: full and incremental (1 % of keys changed)
//! snapshot time and bytes, restore time (with full verification) against
//! `BackupEngine` restore and a plain `cp -r` of the same files, and
//! restore-from-snapshot against a full changelog replay of the same store.
//!
//! Plain `main` (harness = false) printing a table. The measurements are
//! `statesnap::bench` (shared with `statesnap bench`); each times exactly
//! the work compared with `Instant`.
//!
//! Size by environment: `STATESNAP_BENCH_KEYS` (default 1 000 000 keys of
//! 100-byte values, ~110 MB of SSTs), `STATESNAP_BENCH_REPLAY_KEYS` (default
//! 100 000 keys for the replay comparison), `STATESNAP_BENCH_U100` (`0` skips
//! the 100-updates-per-key replay case). `STATESNAP_BENCH_DIR` picks the
//! scratch directory (default: a temporary directory).
#![allow(clippy::unwrap_used)]

mod common;

use common::env_u64;
use statesnap::bench::{self, Pair};

fn mb(b: f64) -> f64 {
    b / 1e6
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` does not: then
    // this is a smoke test of the same code paths on a small store.
    let smoke = !std::env::args().any(|a| a == "--bench");
    let keys = env_u64(
        "STATESNAP_BENCH_KEYS",
        if smoke { 20_000 } else { 1_000_000 },
    );
    let replay_keys = env_u64(
        "STATESNAP_BENCH_REPLAY_KEYS",
        if smoke { 5_000 } else { 100_000 },
    );
    let u100 = env_u64("STATESNAP_BENCH_U100", u64::from(!smoke)) != 0;
    let scratch = common::scratch_dir();
    let dir = scratch.path();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();

    let c = rt
        .block_on(bench::rocks_vs_backup_engine(dir, keys, 3))
        .unwrap();
    println!(
        "loaded {keys} keys x 100 B; store {:.1} MB on disk; restores: median of 3",
        mb(c.store_bytes as f64)
    );
    let mut rows: Vec<(String, Pair, &str, &str)> = vec![
        ("full snapshot time".into(), c.full_secs, "s", "<= 1.0x"),
        ("full snapshot bytes".into(), scale(c.full_bytes), "MB", "-"),
        (
            "incremental snapshot time (1 % keys)".into(),
            c.incremental_secs,
            "s",
            "<= 1.0x",
        ),
        (
            "incremental, the log's tail unsynced (FsyncPolicy::Never)".into(),
            c.incremental_unsynced_secs,
            "s",
            "(info)",
        ),
        (
            "full snapshot time, SSTs hard-linked (local repository)".into(),
            c.full_linked_secs,
            "s",
            "(info)",
        ),
        (
            "incremental snapshot time, SSTs hard-linked, no digest".into(),
            c.incremental_linked_secs,
            "s",
            "(info)",
        ),
        (
            "incremental, SSTs hard-linked, no digest, the log unsynced".into(),
            c.incremental_linked_unsynced_secs,
            "s",
            "(info)",
        ),
        (
            "incremental snapshot bytes".into(),
            scale(c.incremental_bytes),
            "MB",
            "<= 1.0x",
        ),
        (
            "restore time (verified, store opened) vs BackupEngine".into(),
            c.restore_secs,
            "s",
            "<= 0.5x",
        ),
        (
            "restore time vs cp -r (+fsync per file)".into(),
            c.restore_vs_cp_secs,
            "s",
            "<= 2.0x",
        ),
        (
            "restore until its files are on disk (background fsync ended) vs BackupEngine".into(),
            Pair {
                ours: c.restore_durable_secs,
                theirs: c.restore_secs.theirs,
            },
            "s",
            "(info)",
        ),
        (
            "restore time vs cp -r (no sync)".into(),
            Pair {
                ours: c.restore_secs.ours,
                theirs: c.cp_nosync_secs,
            },
            "s",
            "(info)",
        ),
    ];
    let b = c.restore_breakdown;
    println!(
        "restore breakdown (median): files in place {:.3} s (blake3 of the same bytes in memory \
         {:.3} s), rename + open {:.3} s",
        b.transfer_secs, b.hash_secs, b.open_secs
    );
    let mut cases = vec![10u64];
    if u100 {
        cases.push(100);
    }
    for updates in cases {
        let r = rt
            .block_on(bench::restore_vs_replay(dir, replay_keys, updates))
            .unwrap();
        println!(
            "replay case: {replay_keys} keys x {updates} updates = {} records, snapshot {:.1} MB; \
             restore = files in place {:.3} s + open {:.3} s; on disk (background fsync ended) \
             after {:.3} s",
            r.records,
            mb(r.snapshot_bytes as f64),
            r.restore_transfer_secs,
            r.restore_open_secs,
            r.restore_durable_secs
        );
        rows.push((
            format!("restore from snapshot vs full replay ({updates} updates/key)"),
            Pair {
                ours: r.restore_secs,
                theirs: r.replay_secs,
            },
            "s",
            "<= 0.01x",
        ));
    }

    println!();
    println!(
        "{:<58} {:>10} {:>10} {:>5} {:>8} {:>8}",
        "measure", "statesnap", "other", "unit", "ratio", "target"
    );
    for (what, p, unit, target) in &rows {
        println!(
            "{what:<58} {:>10.3} {:>10.3} {unit:>5} {:>8.3} {target:>8}",
            p.ours,
            p.theirs,
            p.ratio()
        );
    }
}

fn scale(p: Pair) -> Pair {
    Pair {
        ours: mb(p.ours),
        theirs: mb(p.theirs),
    }
}
