//! RocksDB snapshots side by side with RocksDB's own `BackupEngine`, on the
//! same database in one run: full and incremental (1 % of keys changed)
//! snapshot time and bytes, restore time (with full verification) against
//! `BackupEngine` restore and a plain `cp -r` of the same files, and
//! restore-from-snapshot against a full changelog replay of the same store.
//!
//! Plain `main` (harness = false) printing a table; every step is timed once
//! with `Instant` around exactly the work compared.
//!
//! Size by environment: `STATESNAP_BENCH_KEYS` (default 1 000 000 keys of
//! 100-byte values, ~110 MB of SSTs), `STATESNAP_BENCH_REPLAY_KEYS` (default
//! 100 000 keys for the replay comparison), `STATESNAP_BENCH_U100` (`0` skips
//! the 100-updates-per-key replay case). `STATESNAP_BENCH_DIR` picks the
//! scratch directory (default: a temporary directory).
#![allow(clippy::unwrap_used)]

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use bytes::Bytes;
use rocksdb::backup::{BackupEngine, BackupEngineOptions, RestoreOptions as BeRestoreOptions};
use statesnap::changelog::file::{FileChangelog, FsyncPolicy};
use statesnap::changelog::{Changelog, ChangelogBinding, Record};
use statesnap::format::rocks::RocksFormat;
use statesnap::format::{RestoreContext, StoreFormat};
use statesnap::repo::{Manifest, Repository, RepositoryOptions, StoreKey};
use statesnap::restore::{RestoreOptions, restore_store};
use statesnap::snapshot::commit_snapshot;
use statesnap::store::logged::LoggedStore;
use statesnap::store::rocks::{RocksOptions, RocksStore};
use statesnap::store::{StateStore, ensure_follows};

use common::{env_u64, timed};

fn noise(seed: u64, out: &mut [u8]) {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for b in out {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = (x >> 24) as u8;
    }
}

fn value(seed: u64) -> Bytes {
    let mut v = vec![0u8; 100];
    noise(seed, &mut v);
    Bytes::from(v)
}

fn key(i: u64) -> Bytes {
    Bytes::from(format!("key-{i:012}"))
}

fn du(p: &Path) -> u64 {
    let Ok(m) = std::fs::symlink_metadata(p) else {
        return 0;
    };
    if m.is_dir() {
        std::fs::read_dir(p)
            .unwrap()
            .map(|e| du(&e.unwrap().path()))
            .sum()
    } else {
        m.len()
    }
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

fn mb(b: u64) -> f64 {
    b as f64 / 1e6
}

struct Row {
    what: String,
    ours: f64,
    theirs: f64,
    unit: &'static str,
    target: String,
}

fn sk(name: &str) -> StoreKey {
    StoreKey::new("bench", name, 0).unwrap()
}

/// A file changelog that fsyncs only when asked (a snapshot asks).
fn bench_log(dir: &Path, name: &str) -> FileChangelog {
    common::file_log(dir, name, FsyncPolicy::Never)
}

/// Logs `records` 1 000 per batch and applies each batch to `store` at its
/// last offset (the LoggedStore path without its per-key pending map, for
/// bulk loading), then flushes the store.
fn load(log: &FileChangelog, store: &mut RocksStore, records: impl Iterator<Item = Record>) {
    let mut records = records.peekable();
    while records.peek().is_some() {
        let batch: Vec<Record> = records.by_ref().take(1000).collect();
        let offsets = log.append(&batch).unwrap();
        store.apply(&batch, *offsets.last().unwrap()).unwrap();
    }
    store.flush().unwrap();
}

fn bench_options() -> RocksOptions {
    RocksOptions {
        // Loading speed only: the changelog is not in play for the
        // BackupEngine comparison, and both sides flush first.
        wal: false,
        ..RocksOptions::default()
    }
}

async fn snap(
    format: &RocksFormat,
    store: &RocksStore,
    repo: &Repository,
    name: &str,
    log: &FileChangelog,
    parent: Option<&Manifest>,
) -> (Manifest, Duration) {
    let started = Instant::now();
    let cut = format.capture(store).unwrap();
    let captured = started.elapsed();
    let m = commit_snapshot(format, cut, repo, &sk(name), log, parent)
        .await
        .unwrap();
    let total = started.elapsed();
    println!(
        "  snapshot {}: capture {:.3}s, write+commit {:.3}s, {} files, {:.1} MB uploaded, {:.1} MB reused",
        sk(name),
        secs(captured),
        secs(total - captured),
        m.files.len(),
        mb(m.stats.bytes_uploaded),
        mb(m.stats.bytes_reused)
    );
    (m, total)
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
    let scratch = match std::env::var("STATESNAP_BENCH_DIR") {
        Ok(d) => tempfile::tempdir_in(d).unwrap(),
        Err(_) => tempfile::tempdir().unwrap(),
    };
    let dir = scratch.path().to_path_buf();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut rows: Vec<Row> = Vec::new();

    // ---------------------------------------------------------- load
    let opts = bench_options();
    let format = RocksFormat::new(opts.clone());
    let mut store = RocksStore::open(dir.join("db"), &opts).unwrap();
    let main_log = bench_log(&dir.join("log-main"), "main");
    ensure_follows(&mut store, &ChangelogBinding::of(&main_log).unwrap()).unwrap();
    let all = (0..keys).map(|i| Record::put(key(i), value(i)));
    let ((), load_time) = timed(|| load(&main_log, &mut store, all));
    let db_bytes = du(&dir.join("db"));
    println!(
        "loaded {keys} keys x 100 B in {:.1}s; store {:.1} MB on disk",
        secs(load_time),
        mb(db_bytes)
    );

    let repo_dir = dir.join("repo");
    let repo = rt
        .block_on(Repository::init(
            &format!("file://{}", repo_dir.display()),
            RepositoryOptions::default(),
        ))
        .unwrap();

    // ---------------------------------------------------------- full snapshot
    let (full, ours_full) = rt.block_on(snap(&format, &store, &repo, "main", &main_log, None));
    let be_dir = dir.join("backup");
    let mut be = BackupEngine::open(
        &BackupEngineOptions::new(&be_dir).unwrap(),
        &rocksdb::Env::new().unwrap(),
    )
    .unwrap();
    let ((), be_full) = timed(|| be.create_new_backup_flush(store.db(), true).unwrap());
    let be_full_bytes = du(&be_dir);
    rows.push(Row {
        what: "full snapshot time".into(),
        ours: secs(ours_full),
        theirs: secs(be_full),
        unit: "s",
        target: "<= 1.0x".into(),
    });
    rows.push(Row {
        what: "full snapshot bytes".into(),
        ours: mb(full.stats.bytes_uploaded),
        theirs: mb(be_full_bytes),
        unit: "MB",
        target: "-".into(),
    });

    // ---------------------------------------------------------- 1 % change
    let changed = (0..keys / 100).map(|j| {
        let i = j.wrapping_mul(0x9E37_79B9_7F4A_7C15) % keys;
        Record::put(key(i), value(i ^ 0xdead_beef))
    });
    load(&main_log, &mut store, changed);
    let (inc, ours_inc) = rt.block_on(snap(&format, &store, &repo, "main", &main_log, Some(&full)));
    let ((), be_inc) = timed(|| be.create_new_backup_flush(store.db(), true).unwrap());
    let be_inc_bytes = du(&be_dir) - be_full_bytes;
    rows.push(Row {
        what: "incremental snapshot time (1 % keys)".into(),
        ours: secs(ours_inc),
        theirs: secs(be_inc),
        unit: "s",
        target: "<= 1.0x".into(),
    });
    rows.push(Row {
        what: "incremental snapshot bytes".into(),
        ours: mb(inc.stats.bytes_uploaded),
        theirs: mb(be_inc_bytes),
        unit: "MB",
        target: "<= 1.0x".into(),
    });
    let inc_total: u64 = inc.files.iter().map(|f| f.size).sum();
    drop(store);

    // ---------------------------------------------------------- restore
    // Each restore reads its source from the page cache where it can: all
    // three sides get the same treatment (the sources were just written).
    // Three runs of each, into fresh directories; the median is reported
    // (the machine is shared, single runs are noisy).
    let median = |mut v: Vec<Duration>| {
        v.sort();
        v[v.len() / 2]
    };
    let mut ours_runs = Vec::new();
    let mut be_runs = Vec::new();
    let mut cp_runs = Vec::new();
    let mut cp_nosync_runs = Vec::new();
    let r_ours = dir.join("restore-ours");
    let cp_src = dir.join("cp-src");
    std::fs::create_dir_all(&cp_src).unwrap();
    for f in &inc.files {
        let blob = statesnap::repo::paths::blob(&inc.store_key, &f.blake3);
        std::fs::copy(repo_dir.join(blob.as_ref()), cp_src.join(&f.path)).unwrap();
    }
    // Restores snapshot `m` into `r_ours` (timed).
    let restore_ours = |m: &Manifest| {
        let ctx = RestoreContext {
            repo: &repo,
            target: &r_ours,
        };
        timed(|| rt.block_on(format.restore(m, ctx)).unwrap())
    };
    for run in 0..3 {
        let _ = std::fs::remove_dir_all(&r_ours);
        let ((restored, rstats), d) = restore_ours(&inc);
        assert_eq!(rstats.bytes_downloaded, inc_total);
        drop(restored);
        ours_runs.push(d);
        let r_be = dir.join(format!("restore-be-{run}"));
        let ((), d) = timed(|| {
            be.restore_from_latest_backup(&r_be, &r_be, &BeRestoreOptions::default())
                .unwrap()
        });
        be_runs.push(d);
        let _ = std::fs::remove_dir_all(&r_be);
        // cp -r of the same files (the snapshot's blobs under their file names).
        let cp_dst = dir.join(format!("cp-dst-{run}"));
        let (status, cp_time) = timed(|| {
            std::process::Command::new("cp")
                .arg("-r")
                .arg(&cp_src)
                .arg(&cp_dst)
                .status()
                .unwrap()
        });
        assert!(status.success());
        // As durable as a restore: fsync every file and the directory (not
        // `sync -f`, which flushes the whole filesystem).
        let ((), cp_sync_time) = timed(|| {
            for e in std::fs::read_dir(&cp_dst).unwrap() {
                std::fs::File::open(e.unwrap().path())
                    .unwrap()
                    .sync_all()
                    .unwrap();
            }
            std::fs::File::open(&cp_dst).unwrap().sync_all().unwrap();
        });
        cp_runs.push(cp_time + cp_sync_time);
        cp_nosync_runs.push(cp_time);
        let _ = std::fs::remove_dir_all(&cp_dst);
    }
    let ours_restore = median(ours_runs);
    let be_restore = median(be_runs);
    let cp_total = median(cp_runs);
    let cp_time = median(cp_nosync_runs);
    rows.push(Row {
        what: "restore time (verified, store opened) vs BackupEngine".into(),
        ours: secs(ours_restore),
        theirs: secs(be_restore),
        unit: "s",
        target: "<= 0.5x".into(),
    });
    let bw = |d: Duration| mb(inc_total) / secs(d);
    rows.push(Row {
        what: "restore bandwidth vs cp -r (+fsync per file)".into(),
        ours: bw(ours_restore),
        theirs: bw(cp_total),
        unit: "MB/s",
        target: ">= 0.5x".into(),
    });
    rows.push(Row {
        what: "restore bandwidth vs cp -r (no sync)".into(),
        ours: bw(ours_restore),
        theirs: bw(cp_time),
        unit: "MB/s",
        target: "(info)".into(),
    });
    // Local-first: restore the full snapshot over the incremental's target.
    let ((restored, lstats), local_restore) = restore_ours(&full);
    drop(restored);
    println!(
        "local-first restore of the full snapshot over the incremental's directory: {:.2}s, \
         {} files ({:.1} MB) reused locally, {} files ({:.1} MB) downloaded",
        secs(local_restore),
        lstats.files_reused_locally,
        mb(lstats.bytes_reused_locally),
        lstats.files_downloaded,
        mb(lstats.bytes_downloaded)
    );
    for p in [
        "restore-ours",
        "restore-be",
        "cp-src",
        "cp-dst",
        "backup",
        "db",
    ] {
        let _ = std::fs::remove_dir_all(dir.join(p));
    }

    // ---------------------------------------------------------- vs replay
    let mut cases = vec![10u64];
    if u100 {
        cases.push(100);
    }
    for updates in cases {
        let name = format!("replay-u{updates}");
        let cdir = dir.join(&name);
        let log = bench_log(&cdir.join("log"), &name);
        let st = RocksStore::open(cdir.join("db"), &opts).unwrap();
        let mut ls = LoggedStore::new(st, log).unwrap();
        let ((), build) = timed(|| {
            for u in 0..updates {
                for i in 0..replay_keys {
                    ls.put(key(i), value(i ^ (u << 40)));
                    if i % 1000 == 999 {
                        ls.commit().unwrap();
                    }
                }
                ls.commit().unwrap();
            }
            ls.changelog().flush().unwrap();
        });
        let (st, log) = ls.into_parts();
        let (m, _) = rt.block_on(snap(&format, &st, &repo, &name, &log, None));
        drop(st);
        let records = log.end_offset().unwrap();
        let (r, snap_restore) = timed(|| {
            rt.block_on(restore_store(
                &format,
                &repo,
                &sk(&name),
                &log,
                &cdir.join("from-snapshot"),
                &RestoreOptions::default(),
            ))
            .unwrap()
        });
        assert_eq!(r.1.snapshot, Some(m.snapshot_id));
        drop(r);
        let (r, full_replay) = timed(|| {
            rt.block_on(restore_store(
                &format,
                &repo,
                &sk(&name),
                &log,
                &cdir.join("from-replay"),
                &RestoreOptions {
                    full_replay: true,
                    ..RestoreOptions::default()
                },
            ))
            .unwrap()
        });
        assert_eq!(r.1.replay.records, records);
        drop(r);
        println!(
            "replay case: {replay_keys} keys x {updates} updates = {records} records (built in {:.1}s), \
             snapshot {:.1} MB",
            secs(build),
            mb(m.stats.bytes_uploaded)
        );
        rows.push(Row {
            what: format!("restore from snapshot vs full replay ({updates} updates/key)"),
            ours: secs(snap_restore),
            theirs: secs(full_replay),
            unit: "s",
            target: "<= 0.01x".into(),
        });
        let _ = std::fs::remove_dir_all(&cdir);
    }

    println!();
    println!(
        "{:<58} {:>10} {:>10} {:>5} {:>8} {:>8}",
        "measure", "statesnap", "other", "unit", "ratio", "target"
    );
    for r in &rows {
        println!(
            "{:<58} {:>10.3} {:>10.3} {:>5} {:>8.3} {:>8}",
            r.what,
            r.ours,
            r.theirs,
            r.unit,
            r.ours / r.theirs,
            r.target
        );
    }
    let _: PathBuf = dir;
}
