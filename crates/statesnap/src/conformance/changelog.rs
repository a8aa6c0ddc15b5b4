//! The [`Changelog`](crate::changelog::Changelog) suite.
//!
//! Each check takes a *fresh, empty* changelog. [`run_all`] runs every check,
//! each on a new changelog from `make`. Backends that can be closed and
//! opened again also run [`reopen_keeps_records_and_lineage`].
//!
//! ```no_run
//! # use statesnap::changelog::file::{FileChangelog, FileChangelogOptions};
//! # use statesnap::changelog::ChangelogId;
//! let mut dirs = Vec::new();
//! statesnap::conformance::changelog::run_all(&mut || {
//!     let dir = tempfile::tempdir().unwrap();
//!     let log = FileChangelog::open(
//!         dir.path().join("log"),
//!         ChangelogId::new("app-store-changelog", 0).unwrap(),
//!         FileChangelogOptions::default(),
//!     )
//!     .unwrap();
//!     dirs.push(dir);
//!     log
//! });
//! ```

use bytes::Bytes;

use crate::changelog::{Changelog, LoggedRecord, Record};

/// One check of the suite, run on a fresh, empty changelog.
pub type Check = fn(&dyn Changelog);

/// Every check [`run_all`] runs, with its name (so that a backend that
/// cannot pass one can run all the others).
pub fn checks() -> Vec<(&'static str, Check)> {
    macro_rules! named {
        ($($check:ident),* $(,)?) => {
            vec![$((stringify!($check), $check as Check)),*]
        };
    }
    named![
        empty_log_has_no_offsets,
        append_returns_consecutive_offsets,
        read_returns_what_was_appended_in_order,
        read_from_middle_offset,
        read_from_beyond_end_returns_nothing,
        reader_is_bounded_by_end_at_open,
        batches_respect_max_records,
        lineage_is_stable,
        flush_works,
        empty_append_is_a_noop,
        large_values_round_trip,
        concurrent_reader_never_sees_torn_records,
    ]
}

/// Runs every check, each on a fresh changelog from `make`.
pub fn run_all<C: Changelog>(make: &mut dyn FnMut() -> C) {
    for (_, check) in checks() {
        check(&make());
    }
}

/// Reads every record from `from` to the reader's end, in batches of `batch`.
pub fn read_all(log: &dyn Changelog, from: u64, batch: usize) -> Vec<LoggedRecord> {
    let mut reader = log.read_from(from).expect("read_from");
    let mut out = Vec::new();
    while let Some(b) = reader.next_batch(batch).expect("next_batch") {
        assert!(
            !b.is_empty(),
            "next_batch returned Some(empty) instead of None at the end"
        );
        assert!(
            b.len() <= batch,
            "next_batch returned {} > max_records {batch}",
            b.len()
        );
        out.extend(b);
    }
    out
}

fn sample(n: usize, tag: &str) -> Vec<Record> {
    (0..n)
        .map(|i| {
            if i % 5 == 3 {
                Record::delete(format!("{tag}-key-{}", i % 7))
            } else {
                Record::put(format!("{tag}-key-{}", i % 7), format!("{tag}-value-{i}"))
            }
        })
        .collect()
}

fn assert_same(got: &[LoggedRecord], want: &[Record], first_offset: u64) {
    assert_eq!(got.len(), want.len(), "number of records read back");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g.offset, first_offset + i as u64, "offset of record {i}");
        assert_eq!(g.key, w.key, "key of record at offset {}", g.offset);
        assert_eq!(g.value, w.value, "value of record at offset {}", g.offset);
    }
}

/// A fresh log has start = end = 0 and nothing to read.
pub fn empty_log_has_no_offsets(log: &dyn Changelog) {
    assert_eq!(
        log.start_offset().expect("start_offset"),
        0,
        "start offset of an empty log"
    );
    assert_eq!(
        log.end_offset().expect("end_offset"),
        0,
        "end offset of an empty log"
    );
    let mut r = log.read_from(0).expect("read_from");
    assert_eq!(r.end_offset(), 0);
    assert!(
        r.next_batch(10).expect("next_batch").is_none(),
        "empty log returned records"
    );
}

/// Appends return consecutive offsets across batches; end follows.
pub fn append_returns_consecutive_offsets(log: &dyn Changelog) {
    assert_eq!(log.append(&sample(3, "a")).expect("append"), vec![0, 1, 2]);
    assert_eq!(log.append(&sample(1, "b")).expect("append"), vec![3]);
    assert_eq!(
        log.append(&sample(4, "c")).expect("append"),
        vec![4, 5, 6, 7]
    );
    assert_eq!(log.end_offset().expect("end_offset"), 8);
    assert_eq!(log.start_offset().expect("start_offset"), 0);
}

/// `read_from(0)` returns exactly what was appended, tombstones included.
pub fn read_returns_what_was_appended_in_order(log: &dyn Changelog) {
    let mut want = sample(20, "x");
    want.push(Record::put("empty-value", Bytes::new()));
    want.push(Record::put(Bytes::new(), "empty-key"));
    log.append(&want[..10]).expect("append");
    log.append(&want[10..]).expect("append");
    let got = read_all(log, 0, 1000);
    assert_same(&got, &want, 0);
    assert!(
        got.iter().any(|r| r.value.is_none()),
        "tombstones must be read back"
    );
    assert_eq!(
        got[20].value.as_deref(),
        Some(&b""[..]),
        "an empty value is not a tombstone"
    );
}

/// Reading from a middle offset starts exactly there.
pub fn read_from_middle_offset(log: &dyn Changelog) {
    let want = sample(50, "m");
    log.append(&want).expect("append");
    for from in [1u64, 17, 49] {
        let got = read_all(log, from, 7);
        assert_same(&got, &want[from as usize..], from);
    }
}

/// Reading from the end or beyond returns nothing.
pub fn read_from_beyond_end_returns_nothing(log: &dyn Changelog) {
    log.append(&sample(5, "e")).expect("append");
    for from in [5u64, 6, 1_000_000, u64::MAX] {
        let mut r = log.read_from(from).expect("read_from");
        assert!(
            r.next_batch(10).expect("next_batch").is_none(),
            "records from {from}"
        );
    }
}

/// A reader stops at the end offset it saw when opened.
pub fn reader_is_bounded_by_end_at_open(log: &dyn Changelog) {
    log.append(&sample(10, "b")).expect("append");
    let mut r = log.read_from(0).expect("read_from");
    assert_eq!(r.end_offset(), 10);
    log.append(&sample(10, "later")).expect("append");
    let mut n = 0;
    while let Some(b) = r.next_batch(3).expect("next_batch") {
        assert!(
            b.iter().all(|x| x.offset < 10),
            "reader went past its end: {b:?}"
        );
        n += b.len();
    }
    assert_eq!(n, 10, "records before the reader's end");
    assert_eq!(
        read_all(log, 0, 100).len(),
        20,
        "a new reader sees the later appends"
    );
}

/// `next_batch(n)` never returns more than `n` records, and returns all.
pub fn batches_respect_max_records(log: &dyn Changelog) {
    let want = sample(25, "n");
    log.append(&want).expect("append");
    for max in [1usize, 4, 25, 100] {
        let mut r = log.read_from(0).expect("read_from");
        let mut got = Vec::new();
        while let Some(b) = r.next_batch(max).expect("next_batch") {
            assert!(
                !b.is_empty() && b.len() <= max,
                "batch of {} for max {max}",
                b.len()
            );
            got.extend(b);
        }
        assert_same(&got, &want, 0);
    }
}

/// The lineage does not change while the log lives.
pub fn lineage_is_stable(log: &dyn Changelog) {
    let l1 = log.lineage().expect("lineage");
    assert!(!l1.0.is_empty(), "lineage must not be empty");
    log.append(&sample(3, "l")).expect("append");
    log.flush().expect("flush");
    assert_eq!(log.lineage().expect("lineage"), l1);
}

/// `flush` succeeds with and without pending records and changes nothing.
pub fn flush_works(log: &dyn Changelog) {
    log.flush().expect("flush of an empty log");
    let want = sample(4, "f");
    log.append(&want).expect("append");
    log.flush().expect("flush");
    log.flush().expect("second flush");
    assert_same(&read_all(log, 0, 10), &want, 0);
    assert_eq!(log.end_offset().expect("end_offset"), 4);
}

/// Appending an empty batch returns no offsets and moves nothing.
pub fn empty_append_is_a_noop(log: &dyn Changelog) {
    assert!(log.append(&[]).expect("empty append").is_empty());
    assert_eq!(log.end_offset().expect("end_offset"), 0);
    log.append(&sample(2, "z")).expect("append");
    assert!(log.append(&[]).expect("empty append").is_empty());
    assert_eq!(log.end_offset().expect("end_offset"), 2);
    assert_eq!(log.append(&sample(1, "z")).expect("append"), vec![2]);
}

/// 1 MiB values round-trip intact.
pub fn large_values_round_trip(log: &dyn Changelog) {
    let big: Vec<u8> = (0..1024 * 1024).map(|i: u32| (i % 251) as u8).collect();
    let want = vec![
        Record::put("big-1", big.clone()),
        Record::put("small", "s"),
        Record::put("big-2", big.iter().rev().copied().collect::<Vec<u8>>()),
    ];
    log.append(&want[..1]).expect("append");
    log.append(&want[1..]).expect("append");
    assert_same(&read_all(log, 0, 2), &want, 0);
    assert_same(&read_all(log, 2, 2), &want[2..], 2);
}

fn concurrent_record(i: u64) -> Record {
    let len = (i * 37 % 3000) as usize;
    let fill = (i % 251) as u8;
    if i % 11 == 10 {
        Record::delete(format!("key-{i}"))
    } else {
        Record::put(format!("key-{i}"), vec![fill; len])
    }
}

/// A reader running while another thread appends only ever sees complete,
/// correct records, contiguous from 0 up to its end offset.
pub fn concurrent_reader_never_sees_torn_records(log: &dyn Changelog) {
    const BATCHES: u64 = 200;
    const PER_BATCH: u64 = 25;
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        let writer = s.spawn(|| {
            for b in 0..BATCHES {
                let batch: Vec<Record> = (b * PER_BATCH..(b + 1) * PER_BATCH)
                    .map(concurrent_record)
                    .collect();
                let offsets = log.append(&batch).expect("append");
                let want: Vec<u64> = (b * PER_BATCH..(b + 1) * PER_BATCH).collect();
                assert_eq!(offsets, want);
            }
            done.store(true, std::sync::atomic::Ordering::SeqCst);
        });
        let mut passes = 0u32;
        loop {
            let finished = done.load(std::sync::atomic::Ordering::SeqCst);
            let mut r = log.read_from(0).expect("read_from");
            let end = r.end_offset();
            let mut next = 0u64;
            while let Some(batch) = r.next_batch(64).expect("next_batch while appending") {
                for rec in batch {
                    assert_eq!(rec.offset, next, "offsets are contiguous");
                    let want = concurrent_record(rec.offset);
                    assert_eq!(rec.key, want.key, "key at offset {}", rec.offset);
                    assert_eq!(rec.value, want.value, "value at offset {}", rec.offset);
                    next += 1;
                }
            }
            assert_eq!(next, end, "reader returned every record below its end");
            passes += 1;
            if finished {
                assert_eq!(end, BATCHES * PER_BATCH);
                break;
            }
        }
        writer.join().expect("writer thread");
        assert!(passes >= 1);
    });
}

/// Records, offsets and lineage survive closing and reopening. `open`
/// must open the *same* log each time (the previous handle is dropped
/// before the next call).
pub fn reopen_keeps_records_and_lineage<C: Changelog>(open: &mut dyn FnMut() -> C) {
    let want = sample(30, "r");
    let lineage = {
        let log = open();
        log.append(&want[..20]).expect("append");
        log.append(&want[20..]).expect("append");
        log.flush().expect("flush");
        log.lineage().expect("lineage")
    };
    let log = open();
    assert_eq!(
        log.lineage().expect("lineage"),
        lineage,
        "lineage after reopen"
    );
    assert_eq!(
        log.end_offset().expect("end_offset"),
        30,
        "end offset after reopen"
    );
    assert_same(&read_all(&log, 0, 8), &want, 0);
    assert_eq!(log.append(&sample(1, "after")).expect("append"), vec![30]);
}
