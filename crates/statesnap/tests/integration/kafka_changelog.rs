//! `KafkaChangelog` against a real Apache Kafka broker (a single-node KRaft
//! cluster started by `scripts/kafka.sh`), and librdkafka's mock cluster.
//!
//! - `STATESNAP_TEST_KAFKA_BOOTSTRAP`: the shared broker (`127.0.0.1:port`).
//!   Unset: every test that needs it prints a loud skip, or fails when
//!   `STATESNAP_REQUIRE_KAFKA=1`.
//! - `STATESNAP_TEST_KAFKA_CMD`: the broker command line with a `{port}`
//!   placeholder, run with its data dir as working directory, for the tests
//!   that stop and restart a broker of their own (never the shared one).
#![cfg(feature = "kafka")]
#![allow(clippy::unwrap_used)]

use crate::common;

use bytes::Bytes;
use rdkafka::mocking::MockCluster;
use rdkafka::producer::DefaultProducerContext;
use statesnap::StoreKey;
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use statesnap::changelog::kafka::{
    KafkaChangelog, KafkaOptions, LineageSource, NonCompactedPolicy,
};
use statesnap::changelog::{Changelog, ChangelogId, ChangelogReader, LoggedRecord, Record};
use statesnap::clock::{ManualClock, system_clock};
use statesnap::restore::{ReplayOptions, replay};
use statesnap::store::LoggedStore;
use statesnap::store::MemoryStore;
use statesnap::store::StateStore;
use statesnap::{ErrorKind, Reason};

use common::{Kv, contents, replayed, try_read_all, write_both};

fn required() -> bool {
    std::env::var("STATESNAP_REQUIRE_KAFKA").is_ok_and(|v| v == "1")
}

/// `var`'s value; unset, the running test is skipped (loudly), or fails
/// when `STATESNAP_REQUIRE_KAFKA=1`.
fn env_or_skip(var: &str) -> Option<String> {
    let test = std::thread::current()
        .name()
        .unwrap_or("a kafka test")
        .to_owned();
    match std::env::var(var) {
        Ok(v) if !v.trim().is_empty() => Some(v),
        _ => {
            assert!(
                !required(),
                "{var} is unset but STATESNAP_REQUIRE_KAFKA=1 ({test})"
            );
            eprintln!(
                "\n*** SKIPPED {test}: {var} is unset — run scripts/test.sh (or source scripts/kafka.sh; \
                 kafka_install; kafka_start) to test against a real broker ***\n"
            );
            None
        }
    }
}

/// Kafka tests run one at a time, each holding this lock: several of them
/// stop and restart a broker of their own, and on a 2-core machine a JVM
/// starting beside the shared broker and a dozen clients turns request
/// timeouts into noise. (It began as a tansu 0.6 workaround: that broker
/// panicked under the whole file in parallel.)
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// The shared broker (`STATESNAP_TEST_KAFKA_BOOTSTRAP`), held by one test
/// at a time.
struct SharedBroker {
    bootstrap: String,
    _serial: std::sync::MutexGuard<'static, ()>,
}

/// The shared broker for the running test; `None` (the test skips) when
/// there is none.
fn shared_broker() -> Option<SharedBroker> {
    let bootstrap = env_or_skip("STATESNAP_TEST_KAFKA_BOOTSTRAP")?;
    Some(SharedBroker {
        bootstrap,
        _serial: serial(),
    })
}

impl SharedBroker {
    fn options(&self) -> KafkaOptions {
        options(&self.bootstrap)
    }

    /// A changelog on a topic no other test or run uses, and its id (to
    /// open it again).
    fn open_fresh(&self, store: &str) -> (ChangelogId, KafkaChangelog) {
        let id = fresh_id(store);
        (
            id.clone(),
            KafkaChangelog::open(id, self.options()).unwrap(),
        )
    }
}

/// A topic name no other test or run uses.
fn fresh_id(store: &str) -> ChangelogId {
    let run = uuid::Uuid::new_v4().simple().to_string();
    StoreKey::new(&format!("t{}", &run[..12]), store, 0)
        .unwrap()
        .changelog_id()
}

fn options(bootstrap: &str) -> KafkaOptions {
    KafkaOptions::new(bootstrap)
        .request_timeout(Duration::from_secs(60))
        .delivery_timeout(Duration::from_secs(60))
}

fn read_all(log: &dyn Changelog, from: u64) -> Vec<LoggedRecord> {
    statesnap::conformance::changelog::read_all(log, from, 1000)
}

fn records(logged: Vec<LoggedRecord>) -> Vec<Record> {
    logged.into_iter().map(LoggedRecord::into_record).collect()
}

/// `got` holds the first `got.len()` records of `batch` (keys and values).
fn assert_prefix_of(got: &[LoggedRecord], batch: &[Record]) {
    assert!(got.len() <= batch.len(), "{} > {}", got.len(), batch.len());
    for (g, r) in got.iter().zip(batch) {
        assert_eq!((&g.key, &g.value), (&r.key, &r.value), "record {:?}", r.key);
    }
}

/// Calls `f` until it succeeds, 250 ms apart for up to 120 s (an attempt
/// may itself wait out a request or delivery timeout), as long as it fails
/// `transient` (any other kind fails the test); `Err` holds the last error
/// when it never succeeded.
fn retry_transient<T>(mut f: impl FnMut() -> statesnap::Result<T>) -> Result<T, String> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        match f() {
            Ok(v) => return Ok(v),
            Err(e) => {
                assert_eq!(e.kind(), ErrorKind::Transient, "{e}");
                eprintln!("transient failure (retrying): {e:?}");
                if Instant::now() >= deadline {
                    return Err(format!("{e:?}"));
                }
                std::thread::sleep(Duration::from_millis(250));
            }
        }
    }
}

type KafkaStore = LoggedStore<MemoryStore, KafkaChangelog>;

/// `n` commits of one put each (`k{i % keys}` = `v{i}`), mirrored in `model`.
fn commit_puts(store: &mut KafkaStore, model: &mut Kv, n: u32, keys: u32) {
    for i in 0..n {
        let (k, v) = (format!("k{}", i % keys), format!("v{i}"));
        write_both(store, model, k.into(), Some(v.into()));
        store.commit().unwrap();
    }
}

/// Puts `during-outage` while the broker is down: the commit
/// fails `transient`, applies nothing, and keeps the
/// write pending for a retry.
fn a_commit_fails_during_the_outage(store: &mut KafkaStore) {
    let applied = store.store().applied_offset().unwrap();
    store.put("during-outage", "x");
    let err = store.commit().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Transient, "{err}");
    assert_eq!(
        store.store().applied_offset().unwrap(),
        applied,
        "nothing applied to the store"
    );
    assert_eq!(store.store().get(b"during-outage").unwrap(), None);
    assert_eq!(
        store.pending_len(),
        1,
        "the failed writes stay pending for a retry"
    );
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A broker process this test owns, on its own port and data dir. It holds
/// the lock that runs Kafka tests one at a time.
struct OwnBroker {
    template: String,
    port: u16,
    dir: tempfile::TempDir,
    child: Option<Child>,
    _serial: std::sync::MutexGuard<'static, ()>,
}

impl OwnBroker {
    /// Starts a broker from `STATESNAP_TEST_KAFKA_CMD`; `None` (the test
    /// skips) when it is unset.
    fn start_own() -> Option<Self> {
        let template = env_or_skip("STATESNAP_TEST_KAFKA_CMD")?;
        let mut broker = OwnBroker {
            template,
            port: free_port(),
            _serial: serial(),
            dir: tempfile::tempdir().unwrap(),
            child: None,
        };
        broker.start();
        Some(broker)
    }

    fn bootstrap(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    fn start(&mut self) {
        let line = self
            .template
            .replace("{port}", &self.port.to_string())
            .replace("{dir}", &self.dir.path().display().to_string());
        let mut parts = line.split_whitespace();
        let prog = parts.next().unwrap();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("broker.log"))
            .unwrap();
        let child = Command::new(prog)
            .args(parts)
            .current_dir(self.dir.path())
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(120);
        while TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "own broker did not start; see {}/broker.log",
                self.dir.path().display()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The last lines of the broker's log, for failure messages.
    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.path().join("broker.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        // Panics first (a broker task that died explains what follows), then the end.
        let panics = lines.iter().filter(|l| l.contains("panicked")).take(5);
        let tail = &lines[lines.len().saturating_sub(20)..];
        panics.chain(tail).copied().collect::<Vec<_>>().join("\n")
    }

    fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for OwnBroker {
    fn drop(&mut self) {
        self.stop();
    }
}

#[test]
fn append_returns_consecutive_offsets_and_reads_them_back() {
    let Some(b) = shared_broker() else {
        return;
    };
    let now = system_clock().now_ms();
    let clock = ManualClock::new(now);
    let log = KafkaChangelog::open(
        fresh_id("basic"),
        b.options().clock(Arc::new(clock.clone())),
    )
    .unwrap();
    assert_eq!(log.cleanup_policy(), "compact");
    let end0 = log.end_offset().unwrap();
    assert!(
        end0 <= 1,
        "a fresh changelog holds at most its lineage marker, end_offset={end0}"
    );
    assert!(
        read_all(&log, 0).is_empty(),
        "the lineage marker is not returned as a record"
    );

    let batch = vec![
        Record::put("a", "1"),
        Record::put("b", Bytes::new()),
        Record::delete("a"),
        Record::put(Bytes::new(), "empty-key"),
        Record::put(vec![0u8, 0xff], vec![0u8; 3]),
    ];
    let offsets = log.append(&batch).unwrap();
    // The first append writes this handle's writer claim first.
    let end0 = end0 + 1;
    assert_eq!(offsets, (end0..end0 + 5).collect::<Vec<_>>());
    assert_eq!(log.end_offset().unwrap(), end0 + 5);
    assert!(log.start_offset().unwrap() <= end0);

    let got = read_all(&log, 0);
    assert_eq!(
        records(got.clone()),
        batch,
        "tombstones stay tombstones, empty values stay empty"
    );
    assert_eq!(got.iter().map(|r| r.offset).collect::<Vec<_>>(), offsets);
    assert!(
        got.iter().all(|r| r.timestamp_ms == now),
        "timestamps come from the injected clock: {got:?}"
    );

    // From the middle, and bounded by the end at call time.
    let mid = read_all(&log, offsets[2]);
    assert_eq!(
        mid.iter().map(|r| r.offset).collect::<Vec<_>>(),
        offsets[2..].to_vec()
    );
    let mut reader = log.read_from(offsets[0]).unwrap();
    assert_eq!(reader.end_offset(), end0 + 5);
    let more = log.append(&[Record::put("late", "x")]).unwrap();
    assert_eq!(more, vec![end0 + 5]);
    let mut seen = Vec::new();
    while let Some(b) = reader.next_batch(2).unwrap() {
        assert!(b.len() <= 2);
        seen.extend(b.into_iter().map(|r| r.offset));
    }
    assert_eq!(
        seen, offsets,
        "a reader stops at the end offset seen when it was opened"
    );
    assert!(read_all(&log, end0 + 6).is_empty());
    assert!(read_all(&log, 1_000_000).is_empty());
    assert_eq!(log.append(&[]).unwrap(), Vec::<u64>::new());
    log.flush().unwrap();

    // The reserved marker keys are refused.
    for key in [
        statesnap::changelog::kafka::LINEAGE_MARKER_KEY,
        statesnap::changelog::kafka::WRITER_MARKER_KEY,
    ] {
        let err = log.append(&[Record::put(key.to_vec(), "x")]).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Config);
    }
}

/// One writer per partition on Kafka (invariant 9): a handle that takes
/// the partition over fences the previous one, which is refused `stale`
/// before it writes again, for good; readers skip claim records, and the
/// new owner's store stays exact.
#[test]
fn a_new_writer_fences_the_previous_one_before_it_writes_again() {
    let Some(b) = shared_broker() else {
        return;
    };
    let (id, old) = b.open_fresh("fence");
    let mut zombie = LoggedStore::new(MemoryStore::new(), &old).unwrap();
    zombie.put("k", "old-1");
    zombie.commit().unwrap();
    zombie.put("k", "old-2");
    zombie.commit().unwrap();

    // The partition moves: the new owner claims it before its first commit.
    let new = KafkaChangelog::open(id.clone(), b.options()).unwrap();
    new.claim_writer().unwrap();
    let end = new.end_offset().unwrap();

    zombie.put("k", "zombie");
    let err = zombie.commit().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Stale, "{err}");
    assert_eq!(err.reason(), Some(Reason::Fenced), "{err}");
    assert_eq!(
        new.end_offset().unwrap(),
        end,
        "the fenced writer wrote nothing"
    );
    let err = old.append(&[Record::put("x", "y")]).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Stale, "fenced for good: {err}");
    assert_eq!(new.end_offset().unwrap(), end);

    let mut owner = LoggedStore::new(MemoryStore::new(), &new).unwrap();
    owner.catch_up(&ReplayOptions::default()).unwrap();
    assert_eq!(owner.get(b"k").unwrap().as_deref(), Some(&b"old-2"[..]));
    owner.put("k", "new-1");
    owner.commit().unwrap();
    assert_eq!(
        records(read_all(&new, 0)),
        vec![
            Record::put("k", "old-1"),
            Record::put("k", "old-2"),
            Record::put("k", "new-1")
        ],
        "claim records are skipped by readers; the zombie's batch is not in the log"
    );

    // With fencing off (an explicit opt-out), a handle is never fenced.
    let loose = KafkaChangelog::open(id, b.options().fence_writers(false)).unwrap();
    loose.append(&[Record::put("y", "1")]).unwrap();
    owner.put("k", "new-2");
    owner.commit().unwrap();
    loose.append(&[Record::put("y", "2")]).unwrap();
}

#[test]
fn a_batch_of_ten_thousand_gets_consecutive_offsets_in_order() {
    let Some(b) = shared_broker() else {
        return;
    };
    let (_, log) = b.open_fresh("big");
    let batch: Vec<Record> = (0..10_000u32)
        .map(|i| Record::put(format!("k{i:05}"), vec![(i % 251) as u8; 100]))
        .collect();
    let offsets = log.append(&batch).unwrap();
    assert_eq!(offsets.len(), 10_000);
    assert!(
        offsets.windows(2).all(|w| w[1] == w[0] + 1),
        "offsets are consecutive"
    );
    let got = read_all(&log, offsets[0]);
    assert_eq!(got.len(), 10_000);
    assert_prefix_of(&got, &batch);
}

/// Small records, one record of `mib` MiB, small records: one batch each
/// side of a batch bigger than the producer's `batch.size` (1 MiB).
fn around_a_big_value(mib: u32) -> Vec<Record> {
    let big: Vec<u8> = (0..mib * 1024 * 1024).map(|i| (i % 253) as u8).collect();
    let mut batch: Vec<Record> = (0..100u32)
        .map(|i| Record::put(format!("a{i:03}"), vec![1u8; 1000]))
        .collect();
    batch.push(Record::put("big", big));
    batch.extend((0..100u32).map(|i| Record::put(format!("b{i:03}"), vec![2u8; 1000])));
    batch
}

/// A 3 MiB value between small records reads back whole and in order.
#[test]
fn a_value_bigger_than_a_producer_batch_reads_back_whole() {
    let Some(b) = shared_broker() else {
        return;
    };
    let (_, log) = b.open_fresh("big3");
    let batch = around_a_big_value(3);
    let offsets = log.append(&batch).unwrap();
    let got = read_all(&log, offsets[0]);
    assert_eq!(got.len(), batch.len());
    assert_prefix_of(&got, &batch);
}

/// A 6 MiB value, larger than a fetch's partition limit: Kafka returns an
/// oversized first batch (KIP-74), so the read is whole and in order.
#[test]
fn a_value_above_the_fetch_limit_reads_back_whole() {
    let Some(b) = shared_broker() else {
        return;
    };
    // 30 s: room for the records before the big one and the big one on a
    // slow machine.
    let log = KafkaChangelog::open(
        fresh_id("big6"),
        b.options().request_timeout(Duration::from_secs(30)),
    )
    .unwrap();
    let batch = around_a_big_value(6);
    let offsets = log.append(&batch).unwrap();
    let mut r = log.read_from(offsets[0]).unwrap();
    let mut got = Vec::new();
    let outcome = loop {
        match r.next_batch(1000) {
            Ok(Some(b)) => got.extend(b),
            Ok(None) => break Ok(()),
            Err(e) => break Err(e),
        }
    };
    if let Err(e) = outcome {
        panic!(
            "the read failed after {} of {} records: {e}",
            got.len(),
            batch.len()
        );
    }
    assert_eq!(got.len(), batch.len());
    assert_prefix_of(&got, &batch);
}

#[test]
fn end_to_end_logged_store_rebuilds_from_kafka_by_full_replay() {
    let Some(b) = shared_broker() else {
        return;
    };
    let (id, log) = b.open_fresh("e2e");
    let mut store = LoggedStore::new(MemoryStore::new(), log).unwrap();
    let mut model = Kv::new();
    let mut next = common::xorshift(0x2545_f491_4f6c_dd1d);
    let commits = 2_000;
    for c in 0..commits {
        for _ in 0..(1 + next() % 8) {
            let key = Bytes::from(format!("key-{:04}", next() % 500));
            // One delete in five; a put's value draws once more.
            let put = !next().is_multiple_of(5);
            let value = put.then(|| Bytes::from(format!("v{c}-{}", next() % 1000)));
            write_both(&mut store, &mut model, key, value);
        }
        store.commit().unwrap();
    }
    let applied = store.store().applied_offset().unwrap();
    drop(store);

    // A new machine: empty store, same topic.
    let log = KafkaChangelog::open(id, b.options()).unwrap();
    let mut fresh = MemoryStore::new();
    let report = replay(&mut fresh, &log, &ReplayOptions::default(), &mut |_| {}).unwrap();
    assert_eq!(fresh.applied_offset().unwrap(), applied);
    assert!(report.records > 0);
    assert_eq!(contents(&fresh), model);
}

#[cfg(feature = "rocksdb")]
#[test]
fn end_to_end_rocks_store_rebuilds_from_kafka_by_full_replay() {
    use statesnap::store::{RocksOptions, RocksStore};
    let Some(b) = shared_broker() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (id, log) = b.open_fresh("e2erocks");
    let mut store = LoggedStore::new(
        RocksStore::open(dir.path().join("a"), &RocksOptions::default()).unwrap(),
        log,
    )
    .unwrap();
    let mut model = Kv::new();
    for c in 0..1_000u32 {
        let key = Bytes::from(format!("key-{:04}", (c * 7919) % 300));
        let value = (c % 6 != 0).then(|| Bytes::from(format!("v{c}")));
        write_both(&mut store, &mut model, key, value);
        store.commit().unwrap();
    }
    drop(store);
    let log = KafkaChangelog::open(id, b.options()).unwrap();
    let mut fresh = RocksStore::open(dir.path().join("b"), &RocksOptions::default()).unwrap();
    replay(&mut fresh, &log, &ReplayOptions::default(), &mut |_| {}).unwrap();
    assert_eq!(contents(&fresh), model);
}

#[test]
fn broker_down_at_startup_is_a_transient_error_naming_the_bootstrap_servers() {
    // Needs no broker: nothing listens on this port.
    let port = free_port();
    let servers = format!("127.0.0.1:{port}");
    let started = Instant::now();
    let err = KafkaChangelog::open(
        fresh_id("down"),
        KafkaOptions::new(&servers).request_timeout(Duration::from_secs(2)),
    )
    .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Transient, "{err}");
    // Bounded by the request timeout (generous margin; speed is for benches).
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "open took {:?}",
        started.elapsed()
    );
}

#[test]
fn broker_stopped_mid_run_fails_the_commit_and_a_restart_recovers_exactly() {
    let Some(mut broker) = OwnBroker::start_own() else {
        return;
    };
    // One handle serves the whole run, so its request timeout is a balance:
    // it is how long the commit during the outage waits for its watermark
    // fetch before it fails (10 s, still prompt), and it gives each request
    // before the stop and after the restart room on a slow machine (a failed
    // attempt after the restart is retried). Delivery is only awaited from a
    // broker that is up: the watermark fetch fails first during the outage.
    let opts = options(&broker.bootstrap())
        .request_timeout(Duration::from_secs(10))
        .delivery_timeout(Duration::from_secs(30));
    let id = fresh_id("restart");
    let log = KafkaChangelog::open(id.clone(), opts).unwrap();
    let mut store = LoggedStore::new(MemoryStore::new(), log).unwrap();
    let mut model = Kv::new();
    commit_puts(&mut store, &mut model, 100, 30);
    let applied = store.store().applied_offset().unwrap();

    broker.stop();
    a_commit_fails_during_the_outage(&mut store);

    broker.start(); // same port, same data dir
    if let Err(last_error) = retry_transient(|| store.commit()) {
        panic!(
            "no commit after the broker restarted; last error: {last_error}; broker log:\n{}",
            broker.log_tail()
        );
    }
    model.insert(Bytes::from("during-outage"), Bytes::from("x"));
    store.put("after", "y");
    store.commit().unwrap();
    model.insert(Bytes::from("after"), Bytes::from("y"));
    assert!(store.store().applied_offset().unwrap() > applied);
    drop(store);

    let log = KafkaChangelog::open(id, options(&broker.bootstrap())).unwrap();
    assert_eq!(replayed(&log).0, model, "replay after the restart is exact");
}

#[test]
fn non_compacted_topic_warns_or_errors_per_policy() {
    let Some(b) = shared_broker() else {
        return;
    };
    let id = fresh_id("nocompact");
    let warn = b
        .options()
        .topic_config("cleanup.policy", "delete")
        .non_compacted_policy(NonCompactedPolicy::Warn);
    let log = KafkaChangelog::open(id.clone(), warn).unwrap();
    assert_eq!(log.cleanup_policy(), "delete");
    log.append(&[Record::put("k", "v")]).unwrap();
    let h = log.horizon().unwrap();
    assert_eq!(
        h.deleted_before,
        log.start_offset().unwrap(),
        "a delete policy reports its log start as deleted"
    );
    drop(log);

    let err = KafkaChangelog::open(id.clone(), b.options()).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Config, "{err}");
}

#[test]
fn missing_topic_without_creation_is_not_found() {
    let Some(b) = shared_broker() else {
        return;
    };
    let err =
        KafkaChangelog::open(fresh_id("absent"), b.options().create_topic(false)).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound, "{err}");
    let err = KafkaChangelog::open(
        ChangelogId::new(fresh_id("p").topic, 5).unwrap(),
        b.options(),
    )
    .unwrap_err();
    assert_eq!(
        err.kind(),
        ErrorKind::NotFound,
        "partition 5 of a 1-partition topic: {err}"
    );
}

#[test]
fn lineage_is_stable_and_changes_when_the_topic_is_recreated() {
    let Some(b) = shared_broker() else {
        return;
    };
    let (id, log) = b.open_fresh("lineage");
    let l1 = log.lineage().unwrap();
    log.append(&[Record::put("k", "v")]).unwrap();
    assert_eq!(log.lineage().unwrap(), l1);
    drop(log);
    let again = KafkaChangelog::open(id.clone(), b.options()).unwrap();
    assert_eq!(again.lineage().unwrap(), l1, "reopening keeps the lineage");
    drop(again);

    KafkaChangelog::delete_topic(&b.options(), &id.topic).unwrap();
    // Deletion may take a moment to be visible; recreate once it is.
    let deadline = Instant::now() + Duration::from_secs(60);
    let recreated = loop {
        match KafkaChangelog::open(id.clone(), b.options()) {
            Ok(log) if read_all(&log, 0).is_empty() => break log,
            Ok(_) | Err(_) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(200))
            }
            Ok(_) => panic!("topic still holds the old records after deletion"),
            Err(e) => panic!("reopen after delete: {e}"),
        }
    };
    assert_ne!(
        recreated.lineage().unwrap(),
        l1,
        "a recreated topic has a new lineage"
    );
}

#[test]
fn horizon_follows_delete_retention_and_the_injected_clock() {
    let Some(b) = shared_broker() else {
        return;
    };
    let clock = ManualClock::new(system_clock().now_ms());
    let opts = b
        .options()
        .topic_config("delete.retention.ms", "60000")
        .clock(Arc::new(clock.clone()));
    let log = KafkaChangelog::open(fresh_id("horizon"), opts).unwrap();
    assert_eq!(log.delete_retention_ms(), 60_000);
    let first = log
        .append(&[Record::put("a", "1"), Record::delete("a")])
        .unwrap();
    let h = log.horizon().unwrap();
    assert_eq!(
        h.deleted_before, 0,
        "compact-only topics never report a deleted prefix"
    );
    assert!(
        h.tombstones_before <= first[0],
        "fresh tombstones are all still there: {h:?}"
    );
    assert!(h.can_resume_after(Some(first[0])));

    clock.advance_ms(120_000); // every record is now older than delete.retention.ms
    let h = log.horizon().unwrap();
    assert_eq!(h.tombstones_before, log.end_offset().unwrap(), "{h:?}");
    assert!(
        !h.can_resume_after(Some(first[0])),
        "a snapshot that old may miss purged deletes"
    );

    let later = log.append(&[Record::put("b", "2")]).unwrap();
    let h = log.horizon().unwrap();
    assert_eq!(h.tombstones_before, later[0], "{h:?}");
    assert!(h.can_resume_after(Some(later[0] - 1)));
}

/// librdkafka's in-process mock cluster: exercises produce, fetch, watermarks
/// and topic ids without a broker. It does not replace a broker (no
/// DescribeConfigs, so the policy is unknown and only `Warn` opens; no
/// compaction). 5 s for a request (it was 1 s): the mock answers at once,
/// but a slow machine's scheduler may not; not more, because every open
/// waits out one request timeout on the mock (its DescribeConfigs finds no
/// controller), so the timeout is paid by every mock open.
fn mock_options(mock: &MockCluster<'_, DefaultProducerContext>) -> KafkaOptions {
    KafkaOptions::new(mock.bootstrap_servers())
        .request_timeout(Duration::from_secs(5))
        .non_compacted_policy(NonCompactedPolicy::Warn)
}

/// A mock cluster of one broker, and a fresh changelog id whose
/// one-partition topic it holds.
fn mock_topic(store: &str) -> (MockCluster<'static, DefaultProducerContext>, ChangelogId) {
    let mock = MockCluster::new(1).unwrap();
    let id = fresh_id(store);
    mock.create_topic(&id.topic, 1, 1).unwrap();
    (mock, id)
}

#[test]
fn mock_cluster_smoke() {
    let (mock, id) = mock_topic("mock");
    let log = KafkaChangelog::open(id.clone(), mock_options(&mock)).unwrap();
    let offsets = log
        .append(&[
            Record::put("a", "1"),
            Record::delete("a"),
            Record::put("b", ""),
        ])
        .unwrap();
    // Offset 0 is the handle's writer claim (skipped by readers).
    assert_eq!(offsets, vec![1, 2, 3]);
    assert_eq!(
        records(read_all(&log, 0)),
        vec![
            Record::put("a", "1"),
            Record::delete("a"),
            Record::put("b", "")
        ]
    );
    let l = log.lineage().unwrap();
    assert!(l.0.starts_with("topic-id:"), "{l}");
    assert_eq!(log.lineage().unwrap(), l);
    let marker = KafkaChangelog::open(
        id,
        mock_options(&mock).lineage_source(LineageSource::Marker),
    )
    .unwrap();
    let m = marker.lineage().unwrap();
    assert!(m.0.starts_with("marker:"), "{m}");
    assert_eq!(marker.lineage().unwrap(), m);
    assert_eq!(
        marker.end_offset().unwrap(),
        5,
        "the writer claim and the lineage marker took one offset each"
    );
    assert_eq!(read_all(&marker, 0).len(), 3, "readers skip the marker");
}

/// A replay whose last offsets hold nothing it applies (here the lineage
/// marker, written at the end of a topic that already had records) still
/// leaves the store at the end. Left at the last record instead, the store
/// (and any snapshot of it) sat one offset below the end for good, and once
/// the topic had been idle for `delete.retention.ms` every restore refused
/// it as below the tombstone horizon.
#[test]
fn replay_ends_at_the_log_end_even_when_the_last_offset_is_a_marker() {
    let (mock, id) = mock_topic("mocktail");
    let clock = ManualClock::new(1_000_000);
    let opts = mock_options(&mock)
        .lineage_source(LineageSource::Marker)
        .clock(Arc::new(clock.clone()));
    let log = KafkaChangelog::open(id, opts).unwrap();
    let batch: Vec<Record> = (0..10).map(|i| Record::put(format!("k{i}"), "v")).collect();
    log.append(&batch).unwrap(); // offsets 1..=10 after the writer claim
    log.lineage().unwrap(); // the marker takes offset 11
    assert_eq!(log.end_offset().unwrap(), 12);

    let mut store = MemoryStore::new();
    let report = replay(&mut store, &log, &ReplayOptions::default(), &mut |_| {}).unwrap();
    assert_eq!(report.records, 10);
    assert_eq!(report.applied_offset, Some(11));
    assert_eq!(store.applied_offset().unwrap(), Some(11));
    assert_eq!(store.len(), 10);
    // Much later, with nothing written meanwhile, the store can still resume.
    clock.advance_ms(30 * 24 * 60 * 60 * 1000);
    assert!(log.horizon().unwrap().can_resume_after(Some(11)));
    let again = replay(&mut store, &log, &ReplayOptions::default(), &mut |_| {}).unwrap();
    assert_eq!(again.records, 0);
}

/// The changelog conformance suite on the mock cluster, every check but
/// `concurrent_reader_never_sees_torn_records`: the mock keeps a bounded log
/// per partition and drops its oldest message sets once that check's ~5 MB
/// are in, moving the low watermark (a deleted prefix, which the check cannot
/// allow). That check runs against Kafka in `conformance_against_kafka`.
#[test]
fn mock_cluster_conformance() {
    use statesnap::conformance::changelog as suite;
    let mock = rdkafka::mocking::MockCluster::new(1).unwrap();
    let make = || {
        let id = fresh_id("mockconf");
        mock.create_topic(&id.topic, 1, 1).unwrap();
        // The suite checks the log's own offsets; the writer claim a
        // fencing handle writes first is tested on its own.
        KafkaChangelog::open(id, mock_options(&mock).fence_writers(false)).unwrap()
    };
    const LEFT_OUT: &str = "concurrent_reader_never_sees_torn_records";
    let checks = suite::checks();
    assert!(checks.iter().any(|(name, _)| *name == LEFT_OUT));
    for (_, check) in checks.into_iter().filter(|(name, _)| *name != LEFT_OUT) {
        check(&make());
    }
    let id = fresh_id("mockreopen");
    mock.create_topic(&id.topic, 1, 1).unwrap();
    suite::reopen_keeps_records_and_lineage(&mut || {
        KafkaChangelog::open(id.clone(), mock_options(&mock).fence_writers(false)).unwrap()
    });
}

/// The whole changelog conformance suite against Apache Kafka, plus reopen.
#[test]
fn conformance_against_kafka() {
    let Some(b) = shared_broker() else {
        return;
    };
    use statesnap::conformance::changelog as suite;
    // Fencing off: the suite checks the log's own offsets (the writer claim
    // a fencing handle writes first is tested on its own, and every other
    // test here runs with fencing on).
    let opts = || b.options().fence_writers(false);
    suite::run_all(&mut || KafkaChangelog::open(fresh_id("conf"), opts()).unwrap());
    let id = fresh_id("reopen");
    suite::reopen_keeps_records_and_lineage(&mut || {
        KafkaChangelog::open(id.clone(), opts()).unwrap()
    });
}

/// The broker-down path on the mock cluster (the own-broker variant is
/// `broker_stopped_mid_run_fails_the_commit_and_a_restart_recovers_exactly`).
#[test]
fn mock_cluster_broker_down_fails_the_commit_and_recovery_is_exact() {
    let (mock, id) = mock_topic("mockdown");
    // The handle that sees the outage has short timeouts, so its commit
    // fails promptly (the watermark fetch before the append times out);
    // the reopen that checks the recovery has the generous ones.
    let opts = mock_options(&mock)
        .request_timeout(Duration::from_secs(5))
        .delivery_timeout(Duration::from_secs(5));
    let log = KafkaChangelog::open(id.clone(), opts).unwrap();
    let mut store = LoggedStore::new(MemoryStore::new(), log).unwrap();
    let mut model = Kv::new();
    commit_puts(&mut store, &mut model, 50, 7);

    mock.broker_down(1).unwrap();
    a_commit_fails_during_the_outage(&mut store);

    mock.broker_up(1).unwrap();
    if let Err(last_error) = retry_transient(|| store.commit()) {
        panic!("no commit after the broker came back; last error: {last_error}");
    }
    model.insert(Bytes::from("during-outage"), Bytes::from("x"));
    drop(store);
    let log = KafkaChangelog::open(id, mock_options(&mock)).unwrap();
    assert_eq!(replayed(&log).0, model);
}

/// Records `0..n` with distinct keys and values, appended in batches of 10 000.
fn append_numbered(log: &KafkaChangelog, n: u32) -> Vec<Record> {
    let all: Vec<Record> = (0..n)
        .map(|i| Record::put(format!("k{i:07}"), format!("v{i:07}-{}", "x".repeat(88))))
        .collect();
    for chunk in all.chunks(10_000) {
        log.append(chunk).unwrap();
    }
    all
}

/// Reads batches of 1 000 (after the records already in `got`) until the
/// reader fails, and returns the error and every record read. A read that
/// ends without one (a short read that looks like the end) fails the test,
/// and so do records read that are not a strict prefix of `all`.
fn read_until_error(
    r: &mut dyn ChangelogReader,
    mut got: Vec<LoggedRecord>,
    all: &[Record],
) -> (statesnap::Error, Vec<Record>) {
    let err = loop {
        match r.next_batch(1_000) {
            Ok(Some(b)) => got.extend(b),
            Ok(None) => panic!(
                "the read ended without an error after {} of {} records",
                got.len(),
                all.len()
            ),
            Err(e) => break e,
        }
    };
    let got = records(got);
    assert!(got.len() < all.len(), "{}", got.len());
    assert!(
        got == all[..got.len()],
        "the {} records read before the error are not the log's first ones",
        got.len()
    );
    (err, got)
}

/// Replay reads through a prefetch thread that hands over chunks of its own
/// size: any `max_records` the caller asks for is honoured exactly, several
/// readers can be open at once, and a reader dropped half-way leaves the next
/// one exact.
#[test]
fn reads_honour_any_batch_size_and_readers_can_be_dropped_half_way() {
    let (mock, id) = mock_topic("mockprefetch");
    let log = KafkaChangelog::open(id, mock_options(&mock)).unwrap();
    let all = append_numbered(&log, 30_000);

    let mut a = log.read_from(0).unwrap();
    // Offset 0 is the writer claim: record i is at offset i + 1.
    let mut b = log.read_from(12_346).unwrap();
    let sizes = [1usize, 7, 9_000, 20_000, 3, 8_192, 8_193];
    let (mut got_a, mut got_b) = (Vec::new(), Vec::new());
    let mut i = 0;
    loop {
        let max = sizes[i % sizes.len()];
        i += 1;
        let ba = a.next_batch(max).unwrap();
        let bb = b.next_batch(max).unwrap();
        for batch in [&ba, &bb].into_iter().flatten() {
            assert!(
                !batch.is_empty() && batch.len() <= max,
                "{} > {max}",
                batch.len()
            );
        }
        let done = ba.is_none() && bb.is_none();
        got_a.extend(ba.into_iter().flatten());
        got_b.extend(bb.into_iter().flatten());
        if done {
            break;
        }
    }
    assert_eq!(records(got_a), all);
    assert_eq!(records(got_b), all[12_345..].to_vec());
    assert_eq!(a.next_batch(10).unwrap(), None, "stays at the end");

    // Dropped after one small batch, with the prefetch thread mid-read or
    // blocked on a full queue: the drop returns and the next reader is exact.
    for _ in 0..5 {
        let mut r = log.read_from(100).unwrap();
        let first = r.next_batch(5).unwrap().unwrap();
        assert_eq!(first[0].offset, 100);
        drop(r);
    }
    assert_eq!(
        records(read_all(&log, 0)),
        all,
        "a full read after the drops"
    );
}

/// Records deleted from under a reader (the log start moves past its
/// position while it reads: retention, DeleteRecords, here the mock
/// cluster's bounded log) fail the read after an exact prefix: `stale` when
/// librdkafka reports the reset, `transient` when it just stops fetching (as
/// librdkafka 2.12 does against the mock cluster), and the next replay is
/// refused `stale` by the horizon. (This does not tell `earliest` from
/// `error`: against the mock, librdkafka 2.12 resets to its cached log start
/// and keeps fetching out of range either way. Readers use `error` because
/// with a broker that reports the new log start, `earliest` jumps past the
/// deleted records, and a reader whose end lies below it reports a complete
/// read.)
#[test]
fn records_deleted_under_a_reader_fail_it_stale_never_a_short_read() {
    let (mock, id) = mock_topic("mockdeleted");
    // Small fetches and a small client queue: the reader stays close behind
    // what the caller has taken.
    let opts = mock_options(&mock)
        .property("queued.min.messages", "1000")
        .property("queued.max.messages.kbytes", "64")
        .property("fetch.max.bytes", "1048576")
        .property("max.partition.fetch.bytes", "65536");
    let log = KafkaChangelog::open(id, opts).unwrap();
    let n = 35_000u32;
    let all = append_numbered(&log, n);
    assert_eq!(log.start_offset().unwrap(), 0);
    let mut r = log.read_from(0).unwrap();
    let got = r.next_batch(1).unwrap().unwrap();
    std::thread::sleep(Duration::from_millis(300)); // the prefetch queue fills
    // 45 000 more records push the first 30 000 or more out of the mock's
    // 5 MB log, past what the reader (~25 000 ahead at most) has fetched.
    let more: Vec<Record> = (0..45_000u32)
        .map(|i| Record::put(format!("m{i:07}"), "y".repeat(97)))
        .collect();
    for chunk in more.chunks(10_000) {
        log.append(chunk).unwrap();
    }
    let lo = log.start_offset().unwrap();
    assert!(lo >= 30_000, "the log start did not pass the reader: {lo}");
    let (err, got) = read_until_error(&mut *r, got, &all);
    match err.kind() {
        ErrorKind::Stale => assert_eq!(err.reason(), Some(Reason::BelowHorizon), "{err}"),
        ErrorKind::Transient => assert_eq!(err.reason(), None, "{err}"),
        other => panic!("unexpected error kind {other:?}: {err}"),
    }
    let again = r.next_batch(1).expect_err("a failed reader stays failed");
    assert_eq!(again.kind(), err.kind(), "{again}");
    assert_eq!(again.reason(), Some(Reason::FailedEarlier), "{again}");
    drop(r);
    // Resuming after the records read is refused: they are gone.
    let mut store = MemoryStore::new();
    store.apply(&got, (got.len() - 1) as u64).unwrap();
    let again = replay(&mut store, &log, &ReplayOptions::default(), &mut |_| {})
        .expect_err("a replay over deleted records");
    assert_eq!(again.kind(), ErrorKind::Stale, "{again}");
}

/// The broker goes away in the middle of a long read: the reader hands out
/// what it already fetched, then fails `transient` naming the bootstrap
/// servers (never a silent short read), and a reader dropped while its
/// thread waits on the dead broker returns promptly. Once the broker is back,
/// a new reader reads everything exactly. (A broker of the test's own: the
/// mock cluster drops old records once a few MB are in.)
#[test]
fn broker_down_mid_read_is_a_transient_error_after_an_exact_prefix() {
    let Some(mut broker) = OwnBroker::start_own() else {
        return;
    };
    // Small client-side buffers, so most of the log is still on the broker
    // when it goes down. 60 s: generous for a slow machine (a broker that
    // served slowly here once, tansu 0.6, took 3-10 s for a second
    // consumer's first fetch). The read that fails once the broker is
    // stopped waits this long for it.
    let opts = options(&broker.bootstrap())
        .request_timeout(Duration::from_secs(60))
        .property("queued.max.messages.kbytes", "256")
        .property("max.partition.fetch.bytes", "262144");
    let id = fresh_id("readdown");
    let log = KafkaChangelog::open(id.clone(), opts.clone()).unwrap();
    let n = 100_000u32;
    let all = append_numbered(&log, n);

    let mut r = log.read_from(0).unwrap();
    let mut idle = log.read_from(0).unwrap();
    let got = r.next_batch(1_000).unwrap().unwrap();
    idle.next_batch(1).unwrap().unwrap();
    broker.stop();
    let (err, _) = read_until_error(&mut *r, got, &all);
    assert_eq!(err.kind(), ErrorKind::Transient, "{err}");
    // The reader is spent: asking again must not look like the end of the
    // log (its read thread has ended) nor skip records.
    for _ in 0..3 {
        match r.next_batch(1_000) {
            Err(again) => {
                assert_eq!(again.kind(), ErrorKind::Transient, "{again}");
                assert_eq!(again.reason(), Some(Reason::FailedEarlier), "{again}");
            }
            Ok(b) => panic!(
                "a failed reader went on: {:?} records after the error",
                b.map(|b| b.len())
            ),
        }
    }
    drop(idle); // its thread is polling a dead broker: stopped and joined
    drop(r);
    drop(log);

    broker.start(); // same port, same data dir
    let again = retry_transient(|| {
        try_read_all(&KafkaChangelog::open(id.clone(), opts.clone())?, 0, 10_000)
    })
    .unwrap_or_else(|last_error| {
        panic!("no read after the broker came back; last error: {last_error}")
    });
    let again = records(again);
    assert!(
        again.len() == all.len() && again == all,
        "{} records",
        again.len()
    );
}

/// A standby promoted in another `StateManager` fences the old owner on the
/// Kafka changelog whether the two managers each have their own handle of
/// the partition (the writer claim record the promoted handle writes) or
/// share one (the claim the promoted handle takes on it): the old owner's
/// next commit is refused (`stale`, reason `fenced`) and nothing of it
/// reaches the log. `log_b` is the promoted side's handle (`log_a`'s clone
/// when shared).
async fn promotion_fences_the_old_owner(
    log_a: Arc<KafkaChangelog>,
    log_b: Arc<KafkaChangelog>,
    label: &str,
) {
    use statesnap::runtime::{SnapshotPolicy, StandbyOptions, StateManager, StoreSpec};
    use statesnap::{PortableFormat, StoreKey as Key};
    let key = Key::new("app", "fence", 0).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (repo, _) = common::memory_repo();
    let manager = || {
        StateManager::builder(repo.clone())
            .policy(SnapshotPolicy::manual())
            .standby_options(StandbyOptions {
                poll_interval: Duration::from_millis(20),
                ..StandbyOptions::default()
            })
            .build()
            .unwrap()
    };
    let (a, b) = (manager(), manager());
    let spec = |log: &Arc<KafkaChangelog>, d: &str| {
        StoreSpec::new(
            key.clone(),
            Arc::clone(log),
            PortableFormat::memory(),
            dir.path().join(d),
        )
    };
    let mut owner = a.open(spec(&log_a, "a")).await.unwrap();
    let mut model = Kv::new();
    for i in 0..50u32 {
        let (k, v) = (format!("k{}", i % 7), format!("v{i}"));
        owner.put(k.clone(), v.clone());
        model.insert(Bytes::from(k), Bytes::from(v));
        if i % 10 == 9 {
            owner.commit().unwrap();
        }
    }
    assert!(owner.snapshot_now().unwrap());
    assert!(owner.wait_for_snapshot().await.last_error.is_none());
    let sb = b.standby(spec(&log_b, "b")).unwrap();
    sb.ready(Duration::from_secs(60)).await.unwrap();
    let mut promoted = sb.promote(Duration::from_secs(60)).await.unwrap();
    promoted.put("k-new", "from the new owner");
    promoted.commit().unwrap();
    model.insert(Bytes::from("k-new"), Bytes::from("from the new owner"));

    owner.put("k0", "from the old owner");
    let e = owner.commit().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Stale, "{label}: {e}");
    assert_eq!(e.reason(), Some(Reason::Fenced), "{label}: {e}");
    let (from_log, _) = replayed(&*log_b);
    assert_eq!(from_log, model, "{label}: no write of the old owner");
    assert_eq!(contents(promoted.store()), model);
    owner.abandon().await;
    promoted.abandon().await;
    a.shutdown().await;
    b.shutdown().await;
}

/// Each manager with a handle of its own, on the real broker: the claim
/// record of the promoted handle's first commit fences the old owner.
#[test]
fn a_promotion_in_another_manager_fences_the_old_owner_on_kafka() {
    let Some(broker) = shared_broker() else {
        return;
    };
    let id = fresh_id("fence-own");
    let log_a = Arc::new(KafkaChangelog::open(id.clone(), broker.options()).unwrap());
    let log_b = Arc::new(KafkaChangelog::open(id, broker.options()).unwrap());
    common::rt().block_on(promotion_fences_the_old_owner(log_a, log_b, "own handles"));
}

/// Both managers sharing one handle (the mock cluster is enough: no claim
/// record is written, the handle's own claims fence).
#[test]
fn a_promotion_in_another_manager_sharing_the_handle_fences_the_old_owner() {
    let (mock, id) = mock_topic("fence-shared");
    let log = Arc::new(KafkaChangelog::open(id, mock_options(&mock)).unwrap());
    common::rt().block_on(promotion_fences_the_old_owner(
        Arc::clone(&log),
        log,
        "shared handle",
    ));
}
