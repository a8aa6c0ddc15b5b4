//! `statesnap bench`: the headline comparisons side by side in one run,
//! printed as a table and written as Markdown, JSON and an SVG chart of
//! restore time against history length. The measurements themselves are
//! `statesnap::bench` (shared with `cargo bench`).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use plotters::prelude::*;
use serde_json::json;
use statesnap::bench::{
    self, BackupComparison, ConcurrentRestores, DeltaCase, Failover, ReplayCase, ReshardCase,
    ScalePoint, StoreType, Throughput,
};
use statesnap::{Error, ErrorKind, Result};

use crate::args::BenchArgs;
use crate::out::{self, Out};

/// How big each part runs.
#[derive(Debug, Clone, Copy)]
struct Sizes {
    replay_keys: u64,
    histories: [u64; 3],
    backup_keys: u64,
    delta_keys: u64,
    runtime_keys: u64,
    runtime_secs: u64,
    scale_keys: &'static [u64],
    partitions: u32,
    partition_keys: u64,
    reshard_keys: u64,
    /// `(from, to, records per key)` of each reshard measured.
    reshard_cases: &'static [(u32, u32, u32)],
    /// The failover: keys, the input's records per second, how long it
    /// flows (ms).
    failover: (u64, u64, u64),
}

const FULL: Sizes = Sizes {
    replay_keys: 100_000,
    histories: [10, 30, 100],
    backup_keys: 1_000_000,
    delta_keys: 1_000_000,
    runtime_keys: 200_000,
    runtime_secs: 5,
    scale_keys: &[1_000_000, 4_000_000],
    partitions: 16,
    partition_keys: 250_000,
    reshard_keys: 4_000_000,
    reshard_cases: RESHARD_CASES,
    failover: (1_000_000, 200_000, 4_000),
};

/// `--scale` adds this size to the series (about 1.8 GB; 4x that free).
const SCALE_LARGEST: u64 = 16_000_000;

const QUICK: Sizes = Sizes {
    replay_keys: 10_000,
    histories: [10, 30, 100],
    backup_keys: 50_000,
    delta_keys: 50_000,
    runtime_keys: 20_000,
    runtime_secs: 1,
    scale_keys: &[20_000, 80_000],
    partitions: 4,
    partition_keys: 5_000,
    reshard_keys: 40_000,
    reshard_cases: RESHARD_CASES,
    failover: (20_000, 20_000, 500),
};

/// Split and merge with one record per key (the replay's best case), and
/// the split with a history of 5 records per key.
const RESHARD_CASES: &[(u32, u32, u32)] = &[(4, 8, 1), (8, 4, 1), (4, 8, 5)];

/// The machine the figures come from.
fn machine() -> serde_json::Value {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let cpu = read("/proc/cpuinfo")
        .lines()
        .find_map(|l| {
            l.strip_prefix("model name")
                .map(|r| r.trim_start_matches([' ', '\t', ':']).to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".to_owned());
    let mem_kib: u64 = read("/proc/meminfo")
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|r| r.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0);
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    json!({
        "cpu": cpu,
        "cores": cores,
        "memory_gib": (mem_kib as f64 / (1024.0 * 1024.0) * 10.0).round() / 10.0,
        "os": std::env::consts::OS,
        "arch": std::env::consts::ARCH,
        "statesnap": env!("CARGO_PKG_VERSION"),
    })
}

fn machine_line(m: &serde_json::Value) -> String {
    format!(
        "{} cores ({}), {} GiB, {}/{}; statesnap {}",
        m["cores"],
        m["cpu"].as_str().unwrap_or("?"),
        m["memory_gib"],
        m["os"].as_str().unwrap_or("?"),
        m["arch"].as_str().unwrap_or("?"),
        m["statesnap"].as_str().unwrap_or("?")
    )
}

/// One row of the table: measure, statesnap, compared with, ratio.
type Row = [String; 4];

fn secs(s: f64) -> String {
    out::secs(Duration::from_secs_f64(s.max(0.0)))
}

fn times(ours: f64, theirs: f64) -> String {
    if ours <= theirs {
        format!("{:.1}x faster", theirs / ours.max(1e-9))
    } else {
        format!("{:.1}x slower", ours / theirs.max(1e-9))
    }
}

/// The table's rows, one section of measurements after another.
fn rows(m: &Measured) -> Vec<Row> {
    let mut rows: Vec<Row> = Vec::new();
    replay_rows(&m.replay, &mut rows);
    backup_snapshot_rows(&m.backup, &mut rows);
    backup_restore_rows(&m.backup, &mut rows);
    delta_row(&m.delta, &mut rows);
    throughput_rows(&m.throughput, &mut rows);
    scale_rows(&m.scale, &mut rows);
    partitions_row(&m.partitions, &mut rows);
    reshard_rows(&m.reshard, &mut rows);
    failover_rows(&m.failover, &mut rows);
    rows
}

/// A crashed owner's partition made ready by promoting a warm standby,
/// against the two ways back without one; and the standby's pace.
fn failover_rows(f: &Failover, rows: &mut Vec<Row>) {
    let what = format!(
        "failover of a RocksDB partition, {} keys, input at {} records/s, owner dropped \
         without a handoff: promoted standby",
        f.keys, f.target_records_per_sec
    );
    let standby = format!(
        "{} ({} records replayed, {} downloaded)",
        secs(f.standby_secs),
        f.standby_replayed,
        out::bytes(f.standby_downloaded)
    );
    rows.push([
        format!("{what} vs newest snapshot + tail"),
        standby.clone(),
        format!(
            "{} ({} records replayed, {} downloaded)",
            secs(f.snapshot_tail_secs),
            f.snapshot_tail_replayed,
            out::bytes(f.snapshot_tail_downloaded)
        ),
        times(f.standby_secs, f.snapshot_tail_secs),
    ]);
    rows.push([
        format!("{what} vs full replay"),
        standby,
        format!(
            "{} ({} records)",
            secs(f.full_replay_secs),
            f.full_replay_records
        ),
        times(f.standby_secs, f.full_replay_secs),
    ]);
    rows.push([
        "a standby following that input: records applied per second vs committed per second"
            .to_owned(),
        format!(
            "{:.0}/s (lag at most {} records, {} ms)",
            f.standby_follow_records_per_sec, f.standby_max_lag_records, f.standby_max_lag_ms
        ),
        format!("{:.0}/s", f.flow_records_per_sec),
        format!(
            "{:.2}x",
            f.standby_follow_records_per_sec / f.flow_records_per_sec.max(1e-9)
        ),
    ]);
}

/// Reshards against replaying the sources into the new layout, and
/// against one sequential write of the same bytes.
fn reshard_rows(reshard: &[ReshardCase], rows: &mut Vec<Row>) {
    for r in reshard {
        let rss = r
            .peak_rss_delta
            .map_or(String::new(), |b| format!(", peak RSS +{}", out::bytes(b)));
        let cores = |cpu: Option<f64>, wall: f64| {
            cpu.map_or(String::new(), |c| {
                format!(", {:.1} cores busy", c / wall.max(1e-9))
            })
        };
        rows.push([
            format!(
                "reshard {} -> {} partitions, {} keys ({}) x {} changelog records/key vs \
                 replaying the sources into the new layout",
                r.from,
                r.to,
                r.keys,
                out::bytes(r.bytes),
                r.records_per_key
            ),
            format!(
                "{} (restore {}, write {}, commit {}{rss}{})",
                secs(r.reshard_secs),
                secs(r.restore_secs),
                secs(r.write_secs),
                secs(r.commit_secs),
                cores(r.reshard_cpu_secs, r.reshard_secs)
            ),
            format!(
                "{} (per-key writes{})",
                secs(r.replay_secs),
                cores(r.replay_cpu_secs, r.replay_secs)
            ),
            times(r.reshard_secs, r.replay_secs),
        ]);
        rows.push([
            format!(
                "reshard {} -> {} vs one sequential write of the same bytes",
                r.from, r.to
            ),
            secs(r.reshard_secs),
            format!("{} (1 MiB writes + fsync)", secs(r.raw_write_secs)),
            times(r.reshard_secs, r.raw_write_secs),
        ]);
        rows.push([
            format!(
                "reshard {} -> {}: the sources' state read once, in key order (the floor of \
                 any reshard)",
                r.from, r.to
            ),
            secs(r.reshard_secs),
            format!("{} (scan only)", secs(r.source_scan_secs)),
            times(r.reshard_secs, r.source_scan_secs),
        ]);
    }
}

/// Restore against a full replay, per history length.
fn replay_rows(replay: &[ReplayCase], rows: &mut Vec<Row>) {
    for r in replay {
        rows.push([
            format!(
                "restore vs full replay, {} keys x {} updates/key",
                r.keys, r.updates_per_key
            ),
            secs(r.restore_secs),
            format!("{} (replay of {} records)", secs(r.replay_secs), r.records),
            times(r.restore_secs, r.replay_secs),
        ]);
    }
}

/// Snapshots against RocksDB's BackupEngine: full, incremental, unsynced, hard-linked.
fn backup_snapshot_rows(backup: &BackupComparison, rows: &mut Vec<Row>) {
    let b = backup;
    let bytes = |x: f64| out::bytes(x as u64);
    rows.push([
        format!("full snapshot vs BackupEngine, {} keys", b.keys),
        format!("{} ({})", secs(b.full_secs.ours), bytes(b.full_bytes.ours)),
        format!(
            "{} ({})",
            secs(b.full_secs.theirs),
            bytes(b.full_bytes.theirs)
        ),
        times(b.full_secs.ours, b.full_secs.theirs),
    ]);
    rows.push([
        "incremental snapshot vs BackupEngine, 1 % of keys rewritten (the changelog synced by its policy)".to_owned(),
        format!(
            "{} ({})",
            secs(b.incremental_secs.ours),
            bytes(b.incremental_bytes.ours)
        ),
        format!(
            "{} ({})",
            secs(b.incremental_secs.theirs),
            bytes(b.incremental_bytes.theirs)
        ),
        times(b.incremental_secs.ours, b.incremental_secs.theirs),
    ]);
    rows.push([
        "the same, the changelog's tail left unsynced (FsyncPolicy::Never): copy / hard links"
            .to_owned(),
        format!(
            "{} / {}",
            secs(b.incremental_unsynced_secs.ours),
            secs(b.incremental_linked_unsynced_secs.ours)
        ),
        secs(b.incremental_unsynced_secs.theirs),
        format!(
            "{} / {}",
            times(
                b.incremental_unsynced_secs.ours,
                b.incremental_unsynced_secs.theirs
            ),
            times(
                b.incremental_linked_unsynced_secs.ours,
                b.incremental_linked_unsynced_secs.theirs
            )
        ),
    ]);
    rows.push([
        "the same two, into a local repository that hard-links SSTs \
         (`link_immutable_files`): full / incremental"
            .to_owned(),
        format!(
            "{} / {}",
            secs(b.full_linked_secs.ours),
            secs(b.incremental_linked_secs.ours)
        ),
        format!(
            "{} / {}",
            secs(b.full_linked_secs.theirs),
            secs(b.incremental_linked_secs.theirs)
        ),
        format!(
            "{} / {}",
            times(b.full_linked_secs.ours, b.full_linked_secs.theirs),
            times(
                b.incremental_linked_secs.ours,
                b.incremental_linked_secs.theirs
            )
        ),
    ]);
}

/// Restores against BackupEngine's and against a plain copy.
fn backup_restore_rows(backup: &BackupComparison, rows: &mut Vec<Row>) {
    let b = backup;
    let bytes = |x: f64| out::bytes(x as u64);
    rows.push([
        format!(
            "restore (verified, opened) vs BackupEngine restore, {}",
            bytes(b.restored_bytes as f64)
        ),
        secs(b.restore_secs.ours),
        secs(b.restore_secs.theirs),
        times(b.restore_secs.ours, b.restore_secs.theirs),
    ]);
    rows.push([
        "restore until its files are on disk (background fsync ended) vs BackupEngine".to_owned(),
        secs(b.restore_durable_secs),
        secs(b.restore_secs.theirs),
        times(b.restore_durable_secs, b.restore_secs.theirs),
    ]);
    let d = b.restore_breakdown;
    rows.push([
        "restore breakdown: files in place (download, verify) + open".to_owned(),
        format!("{} + {}", secs(d.transfer_secs), secs(d.open_secs)),
        format!("{} (blake3 of the bytes in memory)", secs(d.hash_secs)),
        String::new(),
    ]);
    rows.push([
        "restore vs cp -r of the same files + fsync".to_owned(),
        secs(b.restore_vs_cp_secs.ours),
        format!(
            "{} ({} without fsync)",
            secs(b.restore_vs_cp_secs.theirs),
            secs(b.cp_nosync_secs)
        ),
        times(b.restore_vs_cp_secs.ours, b.restore_vs_cp_secs.theirs),
    ]);
}

/// The in-memory delta snapshot against a full one.
fn delta_row(delta: &DeltaCase, rows: &mut Vec<Row>) {
    rows.push([
        format!(
            "in-memory delta snapshot after {} of {} keys changed",
            delta.changed, delta.keys
        ),
        format!(
            "{} in {}",
            out::bytes(delta.delta_bytes),
            secs(delta.delta_secs)
        ),
        format!(
            "{} in {} (full snapshot)",
            out::bytes(delta.full_bytes),
            secs(delta.full_secs)
        ),
        format!("{:.2} % of full", 100.0 * delta.fraction()),
    ]);
}

/// Throughput with periodic snapshots against none, per store type.
fn throughput_rows(throughput: &[Throughput], rows: &mut Vec<Row>) {
    for store in [StoreType::Memory, StoreType::Rocksdb] {
        let base = throughput
            .iter()
            .find(|t| t.store == store && t.every_secs.is_none());
        for t in throughput
            .iter()
            .filter(|t| t.store == store && t.every_secs.is_some())
        {
            let Some(base) = base else { continue };
            rows.push([
                format!(
                    "{} throughput, snapshot every {} s vs none",
                    store.name(),
                    t.every_secs.unwrap_or_default()
                ),
                format!(
                    "{:.0} rec/s (commit p99 {} µs)",
                    t.records_per_sec, t.commit_p99_us
                ),
                format!(
                    "{:.0} rec/s (commit p99 {} µs)",
                    base.records_per_sec, base.commit_p99_us
                ),
                format!("{:.1} %", 100.0 * t.records_per_sec / base.records_per_sec),
            ]);
        }
    }
}

/// Full snapshot and restore at each size of the scale series.
fn scale_rows(scale: &[ScalePoint], rows: &mut Vec<Row>) {
    let rss = |b: Option<u64>| b.map_or_else(|| "n/a".to_owned(), out::bytes);
    for p in scale {
        rows.push([
            format!(
                "scale: full snapshot + restore, {} keys ({})",
                p.keys,
                out::bytes(p.snapshot_bytes)
            ),
            format!("{} + {}", secs(p.snapshot_secs), secs(p.restore_secs)),
            format!(
                "peak memory +{} / +{}",
                rss(p.snapshot_peak_rss_growth),
                rss(p.restore_peak_rss_growth)
            ),
            format!(
                "restore {}/s",
                out::bytes((p.snapshot_bytes as f64 / p.restore_secs.max(1e-9)) as u64)
            ),
        ]);
    }
}

/// Partitions opened at once against one at a time.
fn partitions_row(partitions: &ConcurrentRestores, rows: &mut Vec<Row>) {
    let c = partitions;
    rows.push([
        format!(
            "{} partitions x {} keys ({}) opened at once vs one at a time",
            c.partitions,
            c.keys_per_partition,
            out::bytes(c.bytes)
        ),
        format!(
            "{} ({}/s)",
            secs(c.concurrent_secs),
            out::bytes(c.concurrent_bandwidth() as u64)
        ),
        format!(
            "{} ({}/s)",
            secs(c.sequential_secs),
            out::bytes(c.sequential_bandwidth() as u64)
        ),
        times(c.concurrent_secs, c.sequential_secs),
    ]);
}

fn markdown(machine: &serde_json::Value, rows: &[Row], chart: &str) -> String {
    let mut s = String::from("# statesnap bench\n\n");
    s.push_str(&format!("Machine: {}.\n\n", machine_line(machine)));
    s.push_str("| measure | statesnap | compared with | ratio |\n|---|---|---|---|\n");
    for r in rows {
        let cells: Vec<String> = r.iter().map(|c| c.replace('|', "\\|")).collect();
        s.push_str(&format!("| {} |\n", cells.join(" | ")));
    }
    s.push_str(&format!(
        "\n![restore time vs history length]({chart})\n\nMedians where repeated \
         (restores: 3 runs); single runs otherwise. The machine is shared: expect \
         ±20 % between runs.\n"
    ));
    s
}

/// Restore time and replay time against history length.
fn chart(path: &Path, cases: &[ReplayCase]) -> Result<()> {
    let draw = |e: &dyn std::fmt::Display| {
        Error::new(
            ErrorKind::Io,
            format!("cannot draw the chart path={}: {e}", path.display()),
        )
    };
    let max_x = cases.iter().map(|c| c.updates_per_key).max().unwrap_or(100);
    let max_y = cases
        .iter()
        .map(|c| c.replay_secs.max(c.restore_secs))
        .fold(0.0f64, f64::max)
        * 1.15;
    let root = SVGBackend::new(path, (760, 440)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| draw(&e))?;
    let keys = cases.first().map_or(0, |c| c.keys);
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("Rebuilding a RocksDB store of {keys} keys"),
            ("sans-serif", 20),
        )
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(60)
        .build_cartesian_2d(0u64..max_x + max_x / 10, 0f64..max_y.max(1e-3))
        .map_err(|e| draw(&e))?;
    chart
        .configure_mesh()
        .x_desc("updates per key (changelog records / live keys)")
        .y_desc("seconds")
        .draw()
        .map_err(|e| draw(&e))?;
    let series = [
        (
            "full changelog replay",
            RED,
            cases
                .iter()
                .map(|c| (c.updates_per_key, c.replay_secs))
                .collect::<Vec<_>>(),
        ),
        (
            "restore from the newest snapshot",
            BLUE,
            cases
                .iter()
                .map(|c| (c.updates_per_key, c.restore_secs))
                .collect(),
        ),
    ];
    for (label, color, points) in series {
        chart
            .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))
            .map_err(|e| draw(&e))?
            .label(label)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        chart
            .draw_series(points.iter().map(|&p| Circle::new(p, 4, color.filled())))
            .map_err(|e| draw(&e))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .draw()
        .map_err(|e| draw(&e))?;
    root.present().map_err(|e| draw(&e))
}

fn write(path: &Path, contents: &str) -> Result<()> {
    std::fs::write(path, contents).map_err(|e| {
        Error::new(
            ErrorKind::Io,
            format!("cannot write bench output path={}", path.display()),
        )
        .with_source(e)
    })
}

/// Runs every part, then prints and writes the results.
/// Every measurement of one run.
struct Measured {
    replay: Vec<ReplayCase>,
    backup: BackupComparison,
    delta: DeltaCase,
    throughput: Vec<Throughput>,
    scale: Vec<ScalePoint>,
    partitions: ConcurrentRestores,
    reshard: Vec<ReshardCase>,
    failover: Failover,
}

pub async fn run(a: &BenchArgs, out: Out) -> Result<ExitCode> {
    let sizes = if a.quick { QUICK } else { FULL };
    let out_dir: PathBuf = a.out.clone();
    std::fs::create_dir_all(&out_dir).map_err(|e| {
        Error::new(
            ErrorKind::Io,
            format!(
                "cannot create the output directory path={}",
                out_dir.display()
            ),
        )
        .with_source(e)
    })?;
    let scratch = match &a.scratch {
        Some(d) => tempfile::tempdir_in(d),
        None => tempfile::tempdir(),
    }
    .map_err(|e| {
        Error::new(
            ErrorKind::Io,
            "cannot create a scratch directory (--scratch DIR picks where)",
        )
        .with_source(e)
    })?;
    let dir = scratch.path();
    if !out.json {
        crate::outln!(
            "statesnap bench{}: scratch in {}, results to {}",
            if a.quick { " --quick" } else { "" },
            dir.display(),
            out_dir.display()
        );
    }

    let (replay, backup, delta) = measure_snapshots(sizes, dir, out).await?;
    let (throughput, scale, partitions) = measure_runtime(a, sizes, dir, out).await?;
    let mut reshard = Vec::new();
    for &(from, to, history) in sizes.reshard_cases {
        let sp = out.spinner(&format!(
            "reshard {from} -> {to} partitions vs replay: {} keys x {history} records",
            sizes.reshard_keys
        ));
        let dir = dir.join("reshard");
        let keys = sizes.reshard_keys;
        reshard.push(bench::reshard_vs_replay(&dir, keys, history, from, to).await?);
        sp.finish_and_clear();
    }
    let (keys, rate, flow_ms) = sizes.failover;
    let sp = out.spinner(&format!(
        "failover: promoted standby vs snapshot + tail vs full replay, {keys} keys at {rate} records/s"
    ));
    let failover = bench::failover(
        &dir.join("failover"),
        keys,
        rate,
        Duration::from_millis(flow_ms),
    )
    .await?;
    sp.finish_and_clear();
    let m = Measured {
        failover,
        reshard,
        replay,
        backup,
        delta,
        throughput,
        scale,
        partitions,
    };
    report(a, &out_dir, &m, out)?;
    Ok(ExitCode::SUCCESS)
}

/// Restores against replay, snapshots and restores against BackupEngine,
/// the in-memory delta snapshot.
async fn measure_snapshots(
    sizes: Sizes,
    dir: &Path,
    out: Out,
) -> Result<(Vec<ReplayCase>, BackupComparison, DeltaCase)> {
    let mut replay = Vec::new();
    for &u in &sizes.histories {
        let sp = out.spinner(&format!(
            "restore vs full replay: {} keys x {u} updates/key",
            sizes.replay_keys
        ));
        replay.push(bench::restore_vs_replay(dir, sizes.replay_keys, u).await?);
        sp.finish_and_clear();
    }
    let sp = out.spinner(&format!(
        "RocksDB snapshots vs BackupEngine and cp -r: {} keys",
        sizes.backup_keys
    ));
    let backup = bench::rocks_vs_backup_engine(&dir.join("backup"), sizes.backup_keys, 3).await?;
    sp.finish_and_clear();
    let sp = out.spinner(&format!(
        "in-memory delta snapshot: {} keys",
        sizes.delta_keys
    ));
    let delta = bench::memory_delta(dir, sizes.delta_keys, 10).await?;
    sp.finish_and_clear();
    Ok((replay, backup, delta))
}

/// Throughput with background snapshots, the scale series, partitions
/// opened at once.
async fn measure_runtime(
    a: &BenchArgs,
    sizes: Sizes,
    dir: &Path,
    out: Out,
) -> Result<(Vec<Throughput>, Vec<ScalePoint>, ConcurrentRestores)> {
    let mut throughput = Vec::new();
    for store in [StoreType::Memory, StoreType::Rocksdb] {
        let sdir = dir.join(format!("runtime-{}", store.name()));
        let sp = out.spinner(&format!(
            "{} throughput with and without background snapshots: {} keys",
            store.name(),
            sizes.runtime_keys
        ));
        bench::preload(store, &sdir, sizes.runtime_keys).await?;
        for every in [None, Some(Duration::from_secs(1))] {
            let run = Duration::from_secs(sizes.runtime_secs);
            throughput.push(bench::throughput(store, &sdir, sizes.runtime_keys, run, every).await?);
        }
        sp.finish_and_clear();
    }

    let mut scale = Vec::new();
    let largest = a.scale.then_some(SCALE_LARGEST);
    for &keys in sizes.scale_keys.iter().chain(largest.iter()) {
        let sp = out.spinner(&format!("scale: full snapshot and restore, {keys} keys"));
        scale.push(bench::scale_point(dir, keys).await?);
        sp.finish_and_clear();
    }
    let sp = out.spinner(&format!(
        "{} partitions x {} keys opened through one StateManager",
        sizes.partitions, sizes.partition_keys
    ));
    let partitions =
        bench::concurrent_restores(dir, sizes.partitions, sizes.partition_keys).await?;
    sp.finish_and_clear();
    Ok((throughput, scale, partitions))
}

/// Writes `bench.json`, `bench.md` and the chart to `out_dir`, and prints
/// the table (or the JSON).
fn report(a: &BenchArgs, out_dir: &Path, m: &Measured, out: Out) -> Result<()> {
    let machine = machine();
    let rows = rows(m);
    let chart_name = "restore-vs-history.svg";
    chart(&out_dir.join(chart_name), &m.replay)?;
    let result = json!({
        "machine": machine,
        "quick": a.quick,
        "restore_vs_replay": m.replay,
        "rocksdb_vs_backup_engine": m.backup,
        "memory_delta": m.delta,
        "throughput": m.throughput,
        "scale": m.scale,
        "partitions": m.partitions,
        "reshard": m.reshard,
        "failover": m.failover,
    });
    let pretty = serde_json::to_string_pretty(&result)
        .map_err(|e| Error::new(ErrorKind::Internal, "cannot encode the results").with_source(e))?;
    write(&out_dir.join("bench.json"), &pretty)?;
    write(
        &out_dir.join("bench.md"),
        &markdown(&machine, &rows, chart_name),
    )?;
    if out.json {
        out.json(&result);
    } else {
        let mut t = out.table(&["measure", "statesnap", "compared with", "ratio"]);
        for r in &rows {
            t.add_row(r.to_vec());
        }
        crate::outln!("{t}");
        crate::outln!("machine: {}", machine_line(&machine));
        crate::outln!(
            "wrote {}, {} and {}",
            out_dir.join("bench.md").display(),
            out_dir.join("bench.json").display(),
            out_dir.join(chart_name).display()
        );
    }
    Ok(())
}
