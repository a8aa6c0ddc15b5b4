//! Portable format figures on a 1 M-key MemoryStore (100-byte values):
//! capture time, snapshot write throughput (logical MB/s), restore (keys/s),
//! the bytes a 1 %-random-change delta uploads, and store write throughput
//! while a snapshot of it is being serialised vs idle.
#![allow(clippy::unwrap_used)]

use bytes::Bytes;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use object_store::memory::InMemory;
use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use statesnap::changelog::file::{FileChangelog, FileChangelogOptions, FsyncPolicy};
use statesnap::changelog::{ChangelogId, Record};
use statesnap::format::portable::PortableFormat;
use statesnap::format::{RestoreContext, StoreFormat};
use statesnap::repo::{Repository, StoreKey};
use statesnap::snapshot::commit_snapshot;
use statesnap::store::StateStore;
use statesnap::store::logged::LoggedStore;
use statesnap::store::memory::MemoryStore;

const N: u64 = 1_000_000;

fn key(i: u64) -> Bytes {
    Bytes::from(format!("user:{i:010}"))
}

fn value(i: u64, g: u64) -> Bytes {
    let mut v = Vec::with_capacity(100);
    let mut x = i.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ g;
    while v.len() < 100 {
        x ^= x >> 31;
        x = x.wrapping_mul(0x94d0_49bb_1331_11eb);
        v.extend_from_slice(&x.to_le_bytes()[..4]);
        v.extend_from_slice(b"abcd");
    }
    v.truncate(100);
    Bytes::from(v)
}

/// The bench's changelog: a file log that fsyncs only when a snapshot asks.
fn open_log(dir: &std::path::Path) -> Arc<FileChangelog> {
    let opts = FileChangelogOptions {
        fsync: FsyncPolicy::Never,
        ..FileChangelogOptions::default()
    };
    Arc::new(
        FileChangelog::open(dir, ChangelogId::for_store("bench", "s", 0).unwrap(), opts).unwrap(),
    )
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

fn benches(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
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
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let repo = fresh_repo();
                fmt.forget_last_cut();
                let cut = fmt.capture(&store).unwrap();
                let t = Instant::now();
                rt.block_on(commit_snapshot(&fmt, cut, &repo, &sk(), &*log, None))
                    .unwrap();
                total += t.elapsed();
            }
            total
        })
    });

    let repo = fresh_repo();
    fmt.forget_last_cut();
    let full = rt
        .block_on(commit_snapshot(
            &fmt,
            fmt.capture(&store).unwrap(),
            &repo,
            &sk(),
            &*log,
            None,
        ))
        .unwrap();
    g.throughput(Throughput::Elements(N));
    g.bench_function("restore_1m_keys", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let dir = tempfile::tempdir().unwrap();
                let f = PortableFormat::memory();
                let t = Instant::now();
                let (s, _) = rt
                    .block_on(f.restore(
                        &full,
                        RestoreContext {
                            repo: &repo,
                            target: dir.path(),
                        },
                    ))
                    .unwrap();
                total += t.elapsed();
                assert_eq!(s.len() as u64, N);
            }
            total
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
    let delta = rt
        .block_on(commit_snapshot(
            &fmt,
            fmt.capture(&changed).unwrap(),
            &repo,
            &sk(),
            &*log,
            Some(&full),
        ))
        .unwrap();
    eprintln!(
        "portable/delta_1pct: full uploaded {} B, delta uploaded {} B = {:.2} % of full (target <= 5 %)",
        full.stats.bytes_uploaded,
        delta.stats.bytes_uploaded,
        100.0 * delta.stats.bytes_uploaded as f64 / full.stats.bytes_uploaded as f64
    );

    // Store write throughput idle vs while a snapshot of it serialises.
    const WRITES: u64 = 200_000;
    let run_writes = |s: &mut MemoryStore, base: u64| {
        let mut batch = Vec::with_capacity(1000);
        for i in 0..WRITES {
            let k = (i * 7919 + base) % N;
            batch.push(Record::put(key(k), value(k, base)));
            if batch.len() == 1000 {
                s.apply(&batch, N + 10 + base + i).unwrap();
                batch.clear();
            }
        }
    };
    g.throughput(Throughput::Elements(WRITES));
    g.bench_function("store_writes_idle", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for it in 0..iters {
                let mut s = store.clone();
                let t = Instant::now();
                run_writes(&mut s, it);
                total += t.elapsed();
            }
            total
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
        let mut batch = Vec::with_capacity(1000);
        while !snap.is_finished() {
            for _ in 0..1000 {
                let k = (writes * 7919 + round) % N;
                batch.push(Record::put(key(k), value(k, round + 7)));
                writes += 1;
            }
            s.apply(&batch, N + 10 + writes).unwrap();
            batch.clear();
        }
        let busy = writes as f64 / t.elapsed().as_secs_f64();
        rt.block_on(snap).unwrap();
        let mut s = store.clone();
        let t = Instant::now();
        let mut done = 0u64;
        while done < writes {
            for _ in 0..1000 {
                let k = (done * 7919 + round) % N;
                batch.push(Record::put(key(k), value(k, round + 7)));
                done += 1;
            }
            s.apply(&batch, N + 10 + done).unwrap();
            batch.clear();
        }
        let idle = done as f64 / t.elapsed().as_secs_f64();
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
