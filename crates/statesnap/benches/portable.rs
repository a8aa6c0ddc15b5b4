//! Portable format figures on a 1 M-key MemoryStore (100-byte values):
//! capture time, snapshot write throughput (logical MB/s), restore (keys/s),
//! the bytes a 1 %-random-change delta uploads, and store write throughput
//! while a snapshot of it is being serialised vs idle.
#![allow(clippy::unwrap_used)]

mod common;
#[path = "../tests/integration/common/data.rs"]
mod data;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use object_store::memory::InMemory;
use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use statesnap::changelog::Record;
use statesnap::changelog::file::{FileChangelog, FsyncPolicy};
use statesnap::commit_snapshot;
use statesnap::format::portable::PortableFormat;
use statesnap::format::{RestoreContext, StoreFormat};
use statesnap::repo::{Manifest, Repository, StoreKey};
use statesnap::store::LoggedStore;
use statesnap::store::MemoryStore;
use statesnap::store::StateStore;

const N: u64 = 1_000_000;

use common::{runtime, sum_of_runs};
use data::{user_key as key, user_value as value};

/// The bench's changelog: a file log that fsyncs only when a snapshot asks.
fn open_log(dir: &std::path::Path) -> Arc<FileChangelog> {
    Arc::new(common::file_log(dir, "s", FsyncPolicy::Never))
}

/// N keys written through the changelog, 10 000 per commit.
fn build_store(log: &Arc<FileChangelog>) -> MemoryStore {
    let mut s = LoggedStore::new(MemoryStore::new(), Arc::clone(log)).unwrap();
    for i in 0..N {
        s.put(key(i), value(i, 0));
        if s.pending_len() == 10_000 {
            s.commit().unwrap();
        }
    }
    s.commit().unwrap();
    s.into_parts().0
}

fn sk() -> StoreKey {
    StoreKey::new("bench", "s", 0).unwrap()
}

fn fresh_repo() -> Repository {
    Repository::from_store(Arc::new(InMemory::new()), "").unwrap()
}

/// Writes `i` in `range` (user `(i * 7919 + seed) % N`, value generation
/// `generation`) applied to `s`, 1 000 per batch.
fn apply_writes(s: &mut MemoryStore, range: std::ops::Range<u64>, seed: u64, generation: u64) {
    let mut batch = Vec::with_capacity(1000);
    for i in range {
        let k = (i * 7919 + seed) % N;
        batch.push(Record::put(key(k), value(k, generation)));
        if batch.len() == 1000 {
            s.apply(&batch, N + 10 + seed + i).unwrap();
            batch.clear();
        }
    }
}

fn benches(c: &mut Criterion) {
    let rt = runtime();
    let log_dir = tempfile::tempdir().unwrap();
    let log = open_log(log_dir.path());
    let store = build_store(&log);
    let logical = store.approximate_size().unwrap().bytes;
    let fmt = PortableFormat::memory();

    let mut g = c.benchmark_group("portable");
    g.sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(5));

    g.bench_function("capture_1m_keys", |b| {
        b.iter(|| black_box(fmt.capture(&store).unwrap()))
    });

    g.throughput(Throughput::Bytes(logical));
    g.bench_function("write_full_1m_keys", |b| {
        b.iter_custom(|iters| {
            sum_of_runs(iters, |_| {
                let repo = fresh_repo();
                fmt.forget_last_cut();
                let cut = fmt.capture(&store).unwrap();
                let t = Instant::now();
                rt.block_on(commit_snapshot(&fmt, cut, &repo, &sk(), &*log, None))
                    .unwrap();
                t.elapsed()
            })
        })
    });

    let repo = fresh_repo();
    fmt.forget_last_cut();
    let snapshot = |store: &MemoryStore, parent: Option<&Manifest>| {
        let cut = fmt.capture(store).unwrap();
        rt.block_on(commit_snapshot(&fmt, cut, &repo, &sk(), &*log, parent))
            .unwrap()
    };
    let full = snapshot(&store, None);
    g.throughput(Throughput::Elements(N));
    g.bench_function("restore_1m_keys", |b| {
        b.iter_custom(|iters| {
            sum_of_runs(iters, |_| {
                let dir = tempfile::tempdir().unwrap();
                let f = PortableFormat::memory();
                let target = dir.path();
                let t = Instant::now();
                let restored = rt.block_on(f.restore(
                    &full,
                    RestoreContext {
                        repo: &repo,
                        target,
                    },
                ));
                let took = t.elapsed();
                assert_eq!(restored.unwrap().0.len() as u64, N);
                took
            })
        })
    });

    // Bytes uploaded by a delta after 1 % of keys changed at random.
    let mut changed = LoggedStore::new(store.clone(), Arc::clone(&log)).unwrap();
    let mut x = 12345u64;
    for _ in 0..N / 100 {
        x = x
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        let i = (x >> 11) % N;
        changed.put(key(i), value(i, 1));
    }
    changed.commit().unwrap();
    let changed = changed.into_parts().0;
    let delta = snapshot(&changed, Some(&full));
    eprintln!(
        "portable/delta_1pct: full uploaded {} B, delta uploaded {} B = {:.2} % of full (target <= 5 %)",
        full.stats.bytes_uploaded,
        delta.stats.bytes_uploaded,
        100.0 * delta.stats.bytes_uploaded as f64 / full.stats.bytes_uploaded as f64
    );

    // Store write throughput idle vs while a snapshot of it serialises.
    const WRITES: u64 = 200_000;
    g.throughput(Throughput::Elements(WRITES));
    g.bench_function("store_writes_idle", |b| {
        b.iter_custom(|iters| {
            sum_of_runs(iters, |it| {
                let mut s = store.clone();
                let t = Instant::now();
                apply_writes(&mut s, 0..WRITES, it, it);
                t.elapsed()
            })
        })
    });
    g.finish();

    // Overlap: writes applied while a full snapshot of the same store is
    // serialised, counted until the snapshot finishes, vs the same number
    // of writes on an idle store. (Manual: the write count depends on how
    // long the snapshot takes, which criterion's fixed iterations can't.)
    for round in 0..3u64 {
        let mut s = store.clone();
        let f = Arc::new(PortableFormat::memory());
        let cut = f.capture(&s).unwrap();
        let repo = fresh_repo();
        let f2 = Arc::clone(&f);
        let log2 = Arc::clone(&log);
        let snap = rt.spawn(async move {
            commit_snapshot(&*f2, cut, &repo, &sk(), &*log2, None)
                .await
                .unwrap()
        });
        let t = Instant::now();
        let mut writes = 0u64;
        while !snap.is_finished() {
            apply_writes(&mut s, writes..writes + 1000, round, round + 7);
            writes += 1000;
        }
        let busy = writes as f64 / t.elapsed().as_secs_f64();
        rt.block_on(snap).unwrap();
        let mut s = store.clone();
        let ((), idle_time) = common::timed(|| apply_writes(&mut s, 0..writes, round, round + 7));
        let idle = writes as f64 / idle_time.as_secs_f64();
        eprintln!(
            "portable/writes_during_snapshot round {round}: {writes} writes, {:.0} writes/s during vs {:.0} idle = {:.0} % (target >= 80 %)",
            busy,
            idle,
            100.0 * busy / idle
        );
    }
}

criterion_group!(portable, benches);
criterion_main!(portable);
