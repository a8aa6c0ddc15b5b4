//! Store benchmarks: `apply` throughput per store, and full replay from the
//! file changelog into each store next to the same records written straight
//! into RocksDB with `WriteBatch`es (the replay target is ≥ 80 % of that).
//!
//! Size: `STATESNAP_BENCH_RECORDS` (default 2 000 000) records of 100-byte
//! values over `STATESNAP_BENCH_KEYS` (default records / 10) keys.

mod common;

use criterion::measurement::WallTime;
use criterion::{
    BatchSize, BenchmarkGroup, Criterion, Throughput, criterion_group, criterion_main,
};
use std::time::Duration;

use statesnap::changelog::file::FsyncPolicy;
use statesnap::changelog::{Changelog, Record};
use statesnap::restore::{ReplayOptions, replay};
use statesnap::store::MemoryStore;
use statesnap::store::StateStore;

use common::env_u64;

/// Applies `data`, batch `i` at offset `i`.
fn apply_all(s: &mut dyn StateStore, data: &[Vec<Record>]) {
    for (i, batch) in data.iter().enumerate() {
        s.apply(batch, i as u64).expect("apply");
    }
}

/// A full replay of `log` into `s`.
fn replay_all(s: &mut dyn StateStore, log: &dyn Changelog) {
    replay(s, log, &ReplayOptions::default(), &mut |_| {}).expect("replay");
}

/// Benches `work` on a new, empty store of each type, named
/// `name("memory")` and `name("rocksdb")`. The stores are created and
/// dropped outside the timing.
fn on_each_store(
    g: &mut BenchmarkGroup<'_, WallTime>,
    name: impl Fn(&str) -> String,
    work: impl Fn(&mut dyn StateStore),
) {
    g.bench_function(name("memory"), |b| {
        b.iter_batched(
            MemoryStore::new,
            |mut s| {
                work(&mut s);
                s
            },
            BatchSize::PerIteration,
        )
    });
    #[cfg(feature = "rocksdb")]
    g.bench_function(name("rocksdb"), |b| {
        b.iter_batched(
            common::temp_rocks,
            |(dir, mut s)| {
                work(&mut s);
                (dir, s)
            },
            BatchSize::PerIteration,
        )
    });
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
    on_each_store(
        &mut g,
        |store| format!("{store}/batch=1000"),
        |s| apply_all(s, &data),
    );
    g.finish();
}

fn replay_throughput(c: &mut Criterion) {
    let records = env_u64("STATESNAP_BENCH_RECORDS", 2_000_000);
    let keys = env_u64("STATESNAP_BENCH_KEYS", (records / 10).max(1));
    let data = batches(records, keys, 10_000);
    let dir = tempfile::tempdir().expect("tempdir");
    let log = common::file_log(&dir.path().join("log"), "replay", FsyncPolicy::EveryBatch);
    for b in &data {
        log.append(b).expect("append");
    }
    log.flush().expect("flush");

    let mut g = c.benchmark_group(format!("replay/{records}x100B/{keys}keys"));
    g.sample_size(10).measurement_time(Duration::from_secs(10));
    g.throughput(Throughput::Elements(records));
    on_each_store(
        &mut g,
        |store| format!("file->{store}"),
        |s| replay_all(s, &log),
    );
    #[cfg(feature = "rocksdb")]
    {
        // The baseline: the same records straight into RocksDB, same options.
        g.bench_function("direct-writebatch->rocksdb", |b| {
            b.iter_batched(
                common::temp_rocks,
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
