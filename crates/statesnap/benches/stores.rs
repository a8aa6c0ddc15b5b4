//! Store benchmarks: `apply` throughput per store, and full replay from the
//! file changelog into each store next to the same records written straight
//! into RocksDB with `WriteBatch`es (the replay target is ≥ 80 % of that).
//!
//! Size: `STATESNAP_BENCH_RECORDS` (default 2 000 000) records of 100-byte
//! values over `STATESNAP_BENCH_KEYS` (default records / 10) keys.

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use std::time::Duration;

use statesnap::changelog::file::{FileChangelog, FileChangelogOptions};
use statesnap::changelog::{Changelog, ChangelogId, Record};
use statesnap::restore::{ReplayOptions, replay};
use statesnap::store::StateStore;
use statesnap::store::memory::MemoryStore;

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn batches(records: u64, keys: u64, batch: u64) -> Vec<Vec<Record>> {
    let mut out = Vec::new();
    let mut cur = Vec::with_capacity(batch as usize);
    for i in 0..records {
        let k = i.wrapping_mul(0x9e37_79b9_7f4a_7c15) % keys;
        let mut v = vec![b'v'; 100];
        v[..8].copy_from_slice(&i.to_le_bytes());
        cur.push(Record::put(format!("key-{k:012}"), v));
        if cur.len() as u64 == batch {
            out.push(std::mem::take(&mut cur));
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

fn apply_throughput(c: &mut Criterion) {
    let data = batches(200_000, 50_000, 1_000);
    let mut g = c.benchmark_group("apply");
    g.sample_size(10).measurement_time(Duration::from_secs(5));
    g.throughput(Throughput::Elements(200_000));
    g.bench_function("memory/batch=1000", |b| {
        b.iter_batched(
            MemoryStore::new,
            |mut s| {
                for (i, batch) in data.iter().enumerate() {
                    s.apply(batch, i as u64).expect("apply");
                }
                s
            },
            BatchSize::PerIteration,
        )
    });
    #[cfg(feature = "rocksdb")]
    g.bench_function("rocksdb/batch=1000", |b| {
        use statesnap::store::rocks::{RocksOptions, RocksStore};
        b.iter_batched(
            || {
                let dir = tempfile::tempdir().expect("tempdir");
                let s = RocksStore::open(dir.path().join("db"), &RocksOptions::default()).expect("open");
                (dir, s)
            },
            |(dir, mut s)| {
                for (i, batch) in data.iter().enumerate() {
                    s.apply(batch, i as u64).expect("apply");
                }
                (dir, s)
            },
            BatchSize::PerIteration,
        )
    });
    g.finish();
}

fn replay_throughput(c: &mut Criterion) {
    let records = env_u64("STATESNAP_BENCH_RECORDS", 2_000_000);
    let keys = env_u64("STATESNAP_BENCH_KEYS", (records / 10).max(1));
    let data = batches(records, keys, 10_000);
    let dir = tempfile::tempdir().expect("tempdir");
    let id = ChangelogId::for_store("bench", "replay", 0).expect("id");
    let log = FileChangelog::open(dir.path().join("log"), id, FileChangelogOptions::default()).expect("open log");
    for b in &data {
        log.append(b).expect("append");
    }
    log.flush().expect("flush");

    let mut g = c.benchmark_group(format!("replay/{records}x100B/{keys}keys"));
    g.sample_size(10).measurement_time(Duration::from_secs(10));
    g.throughput(Throughput::Elements(records));
    g.bench_function("file->memory", |b| {
        b.iter_batched(
            MemoryStore::new,
            |mut s| {
                replay(&mut s, &log, &ReplayOptions::default(), &mut |_| {}).expect("replay");
                s
            },
            BatchSize::PerIteration,
        )
    });
    #[cfg(feature = "rocksdb")]
    {
        use statesnap::store::rocks::{RocksOptions, RocksStore};
        g.bench_function("file->rocksdb", |b| {
            b.iter_batched(
                || {
                    let d = tempfile::tempdir().expect("tempdir");
                    let s = RocksStore::open(d.path().join("db"), &RocksOptions::default()).expect("open");
                    (d, s)
                },
                |(d, mut s)| {
                    replay(&mut s, &log, &ReplayOptions::default(), &mut |_| {}).expect("replay");
                    (d, s)
                },
                BatchSize::PerIteration,
            )
        });
        // The baseline: the same records straight into RocksDB, same options.
        g.bench_function("direct-writebatch->rocksdb", |b| {
            b.iter_batched(
                || {
                    let d = tempfile::tempdir().expect("tempdir");
                    let s = RocksStore::open(d.path().join("db"), &RocksOptions::default()).expect("open");
                    (d, s)
                },
                |(d, s)| {
                    let mut wo = rocksdb::WriteOptions::default();
                    wo.set_sync(false);
                    for batch in &data {
                        let mut wb = rocksdb::WriteBatch::default();
                        for r in batch {
                            if let Some(v) = &r.value {
                                wb.put(&r.key, v);
                            }
                        }
                        s.db().write_opt(wb, &wo).expect("write");
                    }
                    (d, s)
                },
                BatchSize::PerIteration,
            )
        });
    }
    g.finish();
}

criterion_group!(benches, apply_throughput, replay_throughput);
criterion_main!(benches);
