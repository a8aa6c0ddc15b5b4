//! File changelog throughput: appends of 100-byte values in batches of
//! 1 / 100 / 10 000 under each fsync policy, and replay of 1 M records.
//!
//! `cargo bench -p statesnap --no-default-features --bench changelog`
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use bytes::Bytes;
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use statesnap::changelog::file::{FileChangelog, FileChangelogOptions, FsyncPolicy};
use statesnap::changelog::{Changelog, ChangelogId, Record};

const VALUE_LEN: usize = 100;

fn id() -> ChangelogId {
    ChangelogId::new("bench-store-changelog", 0).unwrap()
}

fn batch(n: usize) -> Vec<Record> {
    let value = Bytes::from(vec![0xabu8; VALUE_LEN]);
    (0..n)
        .map(|i| Record::put(format!("key-{i:012}"), value.clone()))
        .collect()
}

fn logical_bytes(b: &[Record]) -> u64 {
    b.iter()
        .map(|r| (r.key.len() + r.value.as_ref().map_or(0, |v| v.len())) as u64)
        .sum()
}

fn append(c: &mut Criterion) {
    let mut g = c.benchmark_group("changelog_append");
    g.sample_size(10).warm_up_time(Duration::from_millis(500));
    let policies = [
        ("never", FsyncPolicy::Never),
        (
            "interval_100ms",
            FsyncPolicy::Interval(Duration::from_millis(100)),
        ),
        ("every_batch", FsyncPolicy::EveryBatch),
    ];
    for (name, fsync) in policies {
        for n in [1usize, 100, 10_000] {
            let b = batch(n);
            // Elements and bytes as two throughput figures need two runs;
            // the byte figure is elements x (key + value bytes).
            for (unit, tp) in [
                ("records", Throughput::Elements(n as u64)),
                ("bytes", Throughput::Bytes(logical_bytes(&b))),
            ] {
                if unit == "bytes" && n != 10_000 {
                    continue;
                }
                g.throughput(tp);
                g.measurement_time(if fsync == FsyncPolicy::EveryBatch && n == 1 {
                    Duration::from_secs(1)
                } else {
                    Duration::from_secs(2)
                });
                let dir = tempfile::tempdir().unwrap();
                let opts = FileChangelogOptions {
                    fsync,
                    ..FileChangelogOptions::default()
                };
                let log = FileChangelog::open(dir.path(), id(), opts).unwrap();
                g.bench_with_input(
                    BenchmarkId::new(format!("{name}/{unit}"), n),
                    &b,
                    |bn, b| bn.iter(|| log.append(b).unwrap()),
                );
            }
        }
    }
    g.finish();
}

fn replay(c: &mut Criterion) {
    const RECORDS: usize = 1_000_000;
    let dir = tempfile::tempdir().unwrap();
    let opts = FileChangelogOptions {
        fsync: FsyncPolicy::Never,
        ..FileChangelogOptions::default()
    };
    let log = FileChangelog::open(dir.path(), id(), opts).unwrap();
    let b = batch(10_000);
    for _ in 0..RECORDS / b.len() {
        log.append(&b).unwrap();
    }
    log.flush().unwrap();
    let mut g = c.benchmark_group("changelog_replay");
    g.sample_size(10).measurement_time(Duration::from_secs(4));
    g.throughput(Throughput::Elements(RECORDS as u64));
    g.bench_function("read_1m_records", |bn| {
        bn.iter(|| assert_eq!(common::count_records(&log), RECORDS as u64))
    });
    g.finish();
}

criterion_group!(benches, append, replay);
criterion_main!(benches);
