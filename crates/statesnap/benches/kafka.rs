//! Kafka changelog benchmarks against a real broker
//! (`STATESNAP_TEST_KAFKA_BOOTSTRAP`, started by `scripts/kafka.sh`; skipped
//! with a message when unset).
//!
//! - `kafka_append`: batches of 10 000 records with 100-byte values,
//!   `acks=all`, idempotent producer — records/s and bytes/s.
//! - With `STATESNAP_BENCH_KAFKA_MOCK=1` (and no bootstrap) both run against
//!   librdkafka's in-process mock cluster instead: client-side figures only.
//! - `kafka_replay`: full replay of `STATESNAP_BENCH_KAFKA_RECORDS` (default
//!   300 000) distinct-key records into a `MemoryStore` and a `RocksStore`,
//!   next to a plain read of the same records (no store) to tell
//!   client/broker cost from store cost, and the same figures for the same
//!   records in a `FileChangelog` (the target compares the two replays into
//!   `RocksStore`).
//! - `kafka_follow`: what one poll of a standby following a live log pays,
//!   part by part: the end offset, the horizon (asked before and after every
//!   replay), and a replay of a 100-record tail into a `MemoryStore`.
//! - `STATESNAP_BENCH_KAFKA_PROPERTIES=k=v,k=v` passes librdkafka properties
//!   (experiments); `scripts/bench-kafka.sh` runs it all against tansu with
//!   each of its storage engines.

mod common;

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use statesnap::StoreKey;
use std::time::Duration;

use statesnap::changelog::file::FsyncPolicy;
use statesnap::changelog::kafka::{KafkaChangelog, KafkaOptions, NonCompactedPolicy};
use statesnap::changelog::{Changelog, Record};
use statesnap::restore::{ReplayOptions, replay};
use statesnap::store::MemoryStore;
use statesnap::store::RocksStore;

use common::{count_records, env_u64, temp_rocks};

type Mock = rdkafka::mocking::MockCluster<'static, rdkafka::producer::DefaultProducerContext>;

/// The broker to use: the real one, or a mock cluster (kept alive by the caller).
fn bootstrap(mock: &mut Option<Mock>) -> Option<String> {
    // Under `cargo test --benches` (no `--bench` argument) these would write
    // and re-read hundreds of thousands of records through the shared broker;
    // the broker tests in tests/integration/kafka_changelog.rs cover the code paths.
    if !std::env::args().any(|a| a == "--bench") {
        eprintln!("*** kafka benches run only under `cargo bench` ***");
        return None;
    }
    match std::env::var("STATESNAP_TEST_KAFKA_BOOTSTRAP") {
        Ok(b) if !b.is_empty() => Some(b),
        _ if std::env::var("STATESNAP_BENCH_KAFKA_MOCK").is_ok_and(|v| v == "1") => {
            let m = Mock::new(1).expect("mock cluster");
            let b = m.bootstrap_servers();
            *mock = Some(m);
            eprintln!(
                "*** kafka benches on librdkafka's MOCK cluster (client-side figures only) ***"
            );
            Some(b)
        }
        _ => {
            eprintln!(
                "*** kafka benches skipped: STATESNAP_TEST_KAFKA_BOOTSTRAP is unset (see scripts/kafka.sh) ***"
            );
            None
        }
    }
}

fn open(bootstrap: &str, store: &str, mock: Option<&Mock>) -> KafkaChangelog {
    let run = uuid::Uuid::new_v4().simple().to_string();
    let id = StoreKey::new(&format!("bench{}", &run[..8]), store, 0)
        .expect("topic name")
        .changelog_id();
    let mut options = KafkaOptions::new(bootstrap);
    // Extra librdkafka properties for experiments: `k=v,k=v`.
    if let Ok(extra) = std::env::var("STATESNAP_BENCH_KAFKA_PROPERTIES") {
        for kv in extra.split(',').filter(|kv| !kv.is_empty()) {
            let (k, v) = kv
                .split_once('=')
                .expect("STATESNAP_BENCH_KAFKA_PROPERTIES: k=v,k=v");
            options = options.property(k.trim(), v.trim());
        }
    }
    if let Some(m) = mock {
        m.create_topic(&id.topic, 1, 1).expect("mock topic");
        options = options
            .request_timeout(Duration::from_secs(5))
            .non_compacted_policy(NonCompactedPolicy::Warn);
    }
    KafkaChangelog::open(id, options).expect("open kafka changelog")
}

fn batch(start: u64, n: u64) -> Vec<Record> {
    (start..start + n)
        .map(|i| {
            let mut v = vec![b'v'; 100];
            v[..8].copy_from_slice(&i.to_le_bytes());
            Record::put(format!("key-{i:012}"), v)
        })
        .collect()
}

fn append_throughput(c: &mut Criterion) {
    let mut mock = None;
    let Some(b) = bootstrap(&mut mock) else {
        return;
    };
    let log = open(&b, "append", mock.as_ref());
    let records = batch(0, 10_000);
    let bytes: u64 = records
        .iter()
        .map(|r| (r.key.len() + r.value.as_ref().map_or(0, |v| v.len())) as u64)
        .sum();
    let mut g = c.benchmark_group("kafka_append");
    g.sample_size(10).measurement_time(Duration::from_secs(15));
    g.throughput(Throughput::Elements(records.len() as u64));
    g.bench_function("batch_10k_100B_records", |bn| {
        bn.iter(|| log.append(&records).expect("append"))
    });
    g.throughput(Throughput::Bytes(bytes));
    g.bench_function("batch_10k_100B_bytes", |bn| {
        bn.iter(|| log.append(&records).expect("append"))
    });
    g.finish();
}

fn replay_throughput(c: &mut Criterion) {
    let mut mock = None;
    let Some(b) = bootstrap(&mut mock) else {
        return;
    };
    let n = env_u64("STATESNAP_BENCH_KAFKA_RECORDS", 300_000);
    let log = open(&b, "replay", mock.as_ref());
    // The same records in a file changelog: the baseline of the target.
    let dir = tempfile::tempdir().expect("tempdir");
    let file = common::file_log(&dir.path().join("log"), "replay", FsyncPolicy::EveryBatch);
    let mut i = 0;
    while i < n {
        let k = 10_000.min(n - i);
        let records = batch(i, k);
        log.append(&records).expect("prefill");
        file.append(&records).expect("prefill file log");
        i += k;
    }
    file.flush().expect("flush file log");
    let start = log.start_offset().expect("start");
    let end = log.end_offset().expect("end");
    eprintln!("kafka replay bench: {n} records appended, offsets {start}..{end}");

    // What a full replay reads: compaction or (on the mock) a dropped prefix
    // may leave fewer than `n`.
    let readable = read_all(&log);
    eprintln!("kafka replay bench: {readable} records readable");

    let mut g = c.benchmark_group("kafka_replay");
    g.sample_size(10).measurement_time(Duration::from_secs(20));
    g.throughput(Throughput::Elements(readable));
    g.bench_function("kafka/read_only", |bn| bn.iter(|| read_all(&log)));
    g.bench_function("kafka/into_memory_store", |bn| {
        bn.iter_batched(
            MemoryStore::new,
            |mut s| replay(&mut s, &log, &ReplayOptions::default(), &mut |_| {}).expect("replay"),
            BatchSize::PerIteration,
        )
    });
    g.bench_function("kafka/into_rocks_store", |bn| {
        bn.iter_batched(
            temp_rocks,
            |(d, mut s)| replay_into(&mut s, d, &log),
            BatchSize::PerIteration,
        )
    });
    g.throughput(Throughput::Elements(n));
    g.bench_function("file/read_only", |bn| bn.iter(|| read_all(&file)));
    g.bench_function("file/into_rocks_store", |bn| {
        bn.iter_batched(
            temp_rocks,
            |(d, mut s)| replay_into(&mut s, d, &file),
            BatchSize::PerIteration,
        )
    });
    g.finish();
}

fn follow_cost(c: &mut Criterion) {
    let mut mock = None;
    let Some(b) = bootstrap(&mut mock) else {
        return;
    };
    let log = open(&b, "follow", mock.as_ref());
    log.append(&batch(0, 10_000)).expect("prefill");
    let mut store = MemoryStore::new();
    replay(&mut store, &log, &ReplayOptions::default(), &mut |_| {}).expect("bootstrap");
    let mut next = 10_000;
    let mut g = c.benchmark_group("kafka_follow");
    g.sample_size(10).measurement_time(Duration::from_secs(10));
    g.bench_function("end_offset", |bn| {
        bn.iter(|| log.end_offset().expect("end"))
    });
    g.bench_function("horizon", |bn| bn.iter(|| log.horizon().expect("horizon")));
    g.bench_function("tail_of_100_records", |bn| {
        bn.iter_batched(
            || {
                log.append(&batch(next, 100)).expect("append");
                next += 100;
            },
            |()| {
                let r = replay(&mut store, &log, &ReplayOptions::default(), &mut |_| {})
                    .expect("replay");
                assert!(r.records >= 100, "{r:?}");
            },
            BatchSize::PerIteration,
        )
    });
    g.finish();
}

fn read_all(log: &dyn Changelog) -> u64 {
    let got = count_records(log);
    assert!(got > 0, "nothing read");
    got
}

fn replay_into(s: &mut RocksStore, d: tempfile::TempDir, log: &dyn Changelog) -> tempfile::TempDir {
    let report = replay(s, log, &ReplayOptions::default(), &mut |_| {}).expect("replay");
    assert!(report.records > 0);
    d
}

criterion_group!(benches, append_throughput, replay_throughput, follow_cost);
criterion_main!(benches);
