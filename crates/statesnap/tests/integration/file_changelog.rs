//! Behaviour specific to the file changelog: persistence, torn-tail
//! recovery, corruption detection, segment rolling, the index, compaction and
//! its horizon, crash leftovers, and model tests.
#![allow(clippy::unwrap_used)]

use crate::common;

use common::{Kv, apply_to, set_len};

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use statesnap::changelog::file::{
    CompactOptions, FileChangelog, FileChangelogOptions, FsyncPolicy, decode_segment,
};
use statesnap::changelog::{Changelog, ChangelogId, LoggedRecord, Record};
use statesnap::clock::ManualClock;
use statesnap::conformance::changelog::read_all;
use statesnap::{ErrorKind, Reason};

/// Segment header length and per-record framing overhead, from docs/format.md.
const HEADER: u64 = 32;
const FRAME: u64 = 32;

fn id() -> ChangelogId {
    ChangelogId::new("app-store-changelog", 0).unwrap()
}

/// Small segments, no fsync, and an open-file budget of 3 segments, so
/// that reads, compactions and reopens keep closing and reopening handles.
fn opts(segment_bytes: u64) -> FileChangelogOptions {
    FileChangelogOptions {
        segment_bytes,
        fsync: FsyncPolicy::Never,
        max_open_segments: 3,
        ..Default::default()
    }
}

fn open(dir: &Path, segment_bytes: u64) -> statesnap::Result<FileChangelog> {
    FileChangelog::open(dir, id(), opts(segment_bytes))
}

/// Record `i`: key `k00042` (6 bytes), value `v...` of 10 bytes.
fn rec(i: u64) -> Record {
    Record::put(format!("k{i:05}"), format!("v{i:09}"))
}
const REC_LEN: u64 = FRAME + 6 + 10;

fn fill(log: &FileChangelog, n: u64) {
    let batch: Vec<Record> = (0..n).map(rec).collect();
    log.append(&batch).unwrap();
    log.flush().unwrap();
}

fn check_records(got: &[LoggedRecord], range: std::ops::Range<u64>) {
    let offsets: Vec<u64> = got.iter().map(|r| r.offset).collect();
    assert_eq!(offsets, range.clone().collect::<Vec<_>>());
    for r in got {
        assert_eq!(
            Record {
                key: r.key.clone(),
                value: r.value.clone()
            },
            rec(r.offset)
        );
    }
}

fn log_files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .collect();
    v.sort();
    v
}

fn flip_byte(path: &Path, at: u64) {
    common::flip_file_byte(path, at, 0x5a);
}

/// A closed log in a new directory holding records `0..n` in segments of
/// `segment_bytes`, and its segment files (oldest first).
fn closed_log(segment_bytes: u64, n: u64) -> (tempfile::TempDir, Vec<PathBuf>) {
    let dir = tempfile::tempdir().unwrap();
    fill(&open(dir.path(), segment_bytes).unwrap(), n);
    let files = log_files(dir.path());
    (dir, files)
}

#[test]
fn reopen_persists_records_lineage_and_offsets() {
    let dir = tempfile::tempdir().unwrap();
    let lineage = {
        let log = open(dir.path(), 10 * REC_LEN).unwrap();
        fill(&log, 95);
        assert!(
            log.segment_paths().unwrap().len() > 5,
            "rolled into several segments"
        );
        log.lineage().unwrap()
    };
    let log = open(dir.path(), 10 * REC_LEN).unwrap();
    assert!(
        log.recovery_report().is_none(),
        "a clean log needs no recovery"
    );
    assert_eq!(log.lineage().unwrap(), lineage);
    assert_eq!(log.end_offset().unwrap(), 95);
    check_records(&read_all(&log, 0, 7), 0..95);
    assert_eq!(log.append(&[rec(95)]).unwrap(), vec![95]);

    let other = tempfile::tempdir().unwrap();
    let fresh = open(other.path(), 10 * REC_LEN).unwrap();
    assert_ne!(
        fresh.lineage().unwrap(),
        lineage,
        "a new log gets a new lineage"
    );
}

#[test]
fn opening_with_another_topic_or_partition_is_a_config_error() {
    let dir = tempfile::tempdir().unwrap();
    drop(open(dir.path(), 1 << 20).unwrap());
    for other in [
        ChangelogId::new("other-changelog", 0).unwrap(),
        ChangelogId::new("app-store-changelog", 1).unwrap(),
    ] {
        let err = FileChangelog::open(dir.path(), other, opts(1 << 20)).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Config, "{err}");
        assert_eq!(err.reason(), Some(Reason::OtherChangelog), "{err}");
    }
}

#[test]
fn unknown_metadata_version_is_a_config_error_naming_both_versions() {
    let dir = tempfile::tempdir().unwrap();
    drop(open(dir.path(), 1 << 20).unwrap());
    let meta = dir.path().join("changelog.json");
    let text = fs::read_to_string(&meta)
        .unwrap()
        .replace("\"format_version\": 3", "\"format_version\": 7");
    fs::write(&meta, text).unwrap();
    let err = open(dir.path(), 1 << 20).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Config, "{err}");
    assert_eq!(err.reason(), Some(Reason::UnsupportedVersion), "{err}");
}

/// The epoch history as `(epoch, start_offset)` pairs, read from the
/// metadata file the way an operator would.
fn epochs_on_disk(dir: &Path) -> Vec<(u64, u64)> {
    let v: serde_json::Value =
        serde_json::from_slice(&fs::read(dir.join("changelog.json")).unwrap()).unwrap();
    v["epochs"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|e| {
                    (
                        e["epoch"].as_u64().unwrap(),
                        e["start_offset"].as_u64().unwrap(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn each_appending_session_starts_an_epoch_and_idle_reopens_add_none() {
    let dir = tempfile::tempdir().unwrap();
    let log = open(dir.path(), 1 << 20).unwrap();
    assert_eq!(log.epoch_at(0).unwrap(), None, "empty log");
    fill(&log, 3);
    assert_eq!(epochs_on_disk(dir.path()), vec![(1, 0)]);
    assert_eq!(log.epoch_at(2).unwrap(), Some(1));
    assert_eq!(log.epoch_at(3).unwrap(), None, "not in the log yet");
    drop(log);
    for _ in 0..3 {
        drop(open(dir.path(), 1 << 20).unwrap());
    }
    assert_eq!(epochs_on_disk(dir.path()), vec![(1, 0)], "idle reopens");
    let log = open(dir.path(), 1 << 20).unwrap();
    log.append(&[rec(3), rec(4)]).unwrap();
    log.append(&[rec(5)]).unwrap();
    assert_eq!(epochs_on_disk(dir.path()), vec![(1, 0), (2, 3)]);
    assert_eq!(log.epoch_at(2).unwrap(), Some(1));
    assert_eq!(log.epoch_at(5).unwrap(), Some(2));
    drop(log);
    // A read-only handle sees the history and never changes it.
    let ro = FileChangelog::open_read_only(dir.path(), id()).unwrap();
    assert_eq!(ro.epoch_at(4).unwrap(), Some(2));
}

/// Defect 5b, at the log: the disk loses records that were synced; the
/// offsets handed out again belong to a new epoch whose number was never
/// used, and an epoch that lost all its records leaves the history.
#[test]
fn records_lost_below_synced_data_come_back_under_a_new_epoch() {
    let dir = tempfile::tempdir().unwrap();
    let log = FileChangelog::open(dir.path(), id(), FileChangelogOptions::default()).unwrap();
    log.append(&[rec(0), rec(1)]).unwrap();
    let (seg, len_after_two) = log.durable_tail().unwrap();
    drop(log);
    let log = FileChangelog::open(dir.path(), id(), FileChangelogOptions::default()).unwrap();
    log.append(&[rec(2), rec(3), rec(4)]).unwrap();
    assert_eq!(log.epoch_at(4).unwrap(), Some(2));
    drop(log);
    assert_eq!(epochs_on_disk(dir.path()), vec![(1, 0), (2, 2)]);

    // The disk gives back only the first two records (plus half a frame).
    set_len(&seg, len_after_two + 7);
    let log = FileChangelog::open(dir.path(), id(), FileChangelogOptions::default()).unwrap();
    assert_eq!(log.end_offset().unwrap(), 2);
    assert_eq!(log.epoch_at(1).unwrap(), Some(1));
    log.append(&[rec(20), rec(30), rec(40)]).unwrap();
    assert_eq!(epochs_on_disk(dir.path()), vec![(1, 0), (3, 2)]);
    for o in 2..5 {
        assert_eq!(log.epoch_at(o).unwrap(), Some(3), "offset {o}");
    }
}

#[test]
fn a_version_1_metadata_file_is_read_and_upgraded_by_the_next_writer() {
    let dir = tempfile::tempdir().unwrap();
    let log = open(dir.path(), 1 << 20).unwrap();
    let lineage = log.lineage().unwrap();
    fill(&log, 2);
    drop(log);
    // What a build before the epoch history wrote.
    let meta = dir.path().join("changelog.json");
    let mut v: serde_json::Value = serde_json::from_slice(&fs::read(&meta).unwrap()).unwrap();
    v["format_version"] = 1.into();
    v.as_object_mut().unwrap().remove("epochs");
    fs::write(&meta, serde_json::to_vec_pretty(&v).unwrap()).unwrap();

    let log = open(dir.path(), 1 << 20).unwrap();
    assert_eq!(log.lineage().unwrap(), lineage);
    assert_eq!(
        log.epoch_at(1).unwrap(),
        None,
        "history unknown before the upgrade"
    );
    fill(&log, 1);
    assert_eq!(log.epoch_at(2).unwrap(), Some(1));
    drop(log);
    let v: serde_json::Value = serde_json::from_slice(&fs::read(&meta).unwrap()).unwrap();
    assert_eq!(v["format_version"], 3);
    assert_eq!(epochs_on_disk(dir.path()), vec![(1, 2)]);
    // The old version did not record what compaction examined: every
    // record before the upgrade counts as possibly compacted.
    assert_eq!(v["horizon"]["superseded_before"], 2);
}

#[test]
fn a_malformed_epoch_history_is_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    drop(open(dir.path(), 1 << 20).unwrap());
    let meta = dir.path().join("changelog.json");
    let mut v: serde_json::Value = serde_json::from_slice(&fs::read(&meta).unwrap()).unwrap();
    v["epochs"] = serde_json::json!([
        {"epoch": 2, "start_offset": 0},
        {"epoch": 1, "start_offset": 5}
    ]);
    fs::write(&meta, serde_json::to_vec_pretty(&v).unwrap()).unwrap();
    let err = open(dir.path(), 1 << 20).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Corrupt, "{err}");
}

#[test]
fn missing_dir_without_create_is_not_found_and_lock_excludes_a_second_handle() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nope");
    let o = FileChangelogOptions {
        create_if_missing: false,
        ..opts(1 << 20)
    };
    let err = FileChangelog::open(&path, id(), o).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound, "{err}");
    assert!(!path.exists());

    let first = open(dir.path(), 1 << 20).unwrap();
    let err = open(dir.path(), 1 << 20).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Transient, "{err}");
    drop(first);
    open(dir.path(), 1 << 20).unwrap();
}

#[test]
fn timestamps_come_from_the_injected_clock() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(1_000);
    let o = FileChangelogOptions {
        clock: Arc::new(clock.clone()),
        ..opts(1 << 20)
    };
    let log = FileChangelog::open(dir.path(), id(), o).unwrap();
    log.append(&[rec(0)]).unwrap();
    clock.advance_ms(500);
    log.append(&[rec(1), rec(2)]).unwrap();
    let ts: Vec<i64> = read_all(&log, 0, 10)
        .iter()
        .map(|r| r.timestamp_ms)
        .collect();
    assert_eq!(ts, vec![1_000, 1_500, 1_500]);
}

#[test]
fn segments_roll_by_size_and_are_named_by_base_offset() {
    let dir = tempfile::tempdir().unwrap();
    let log = open(dir.path(), HEADER + 4 * REC_LEN).unwrap();
    fill(&log, 10);
    log.append(&[Record::put("big", vec![7u8; 1000])]).unwrap();
    log.append(&[rec(11)]).unwrap();
    let names: Vec<String> = log_files(dir.path())
        .iter()
        .map(|p| p.file_name().unwrap().to_str().unwrap().to_string())
        .collect();
    assert_eq!(
        names,
        [
            "00000000000000000000.log",
            "00000000000000000004.log",
            "00000000000000000008.log",
            "00000000000000000010.log",
            "00000000000000000011.log",
        ]
    );
    // A record larger than the segment size gets a segment of its own.
    let big = fs::metadata(dir.path().join("00000000000000000010.log"))
        .unwrap()
        .len();
    assert_eq!(big, HEADER + FRAME + 3 + 1000);
    for p in &log_files(dir.path())[..2] {
        assert_eq!(
            fs::metadata(p).unwrap().len(),
            HEADER + 4 * REC_LEN,
            "{}",
            p.display()
        );
    }
    assert_eq!(log.segment_paths().unwrap(), log_files(dir.path()));
}

#[test]
fn truncated_last_record_is_cut_reported_and_appends_continue() {
    let (dir, mut files) = closed_log(HEADER + 10 * REC_LEN, 25);
    let last = files.pop().unwrap();
    assert!(last.ends_with("00000000000000000020.log"));
    set_len(&last, fs::metadata(&last).unwrap().len() - 7);

    let log = open(dir.path(), HEADER + 10 * REC_LEN).unwrap();
    let rep = log.recovery_report().expect("recovery report").clone();
    assert_eq!(rep.segment, last);
    assert_eq!(rep.bytes_truncated, REC_LEN - 7);
    assert_eq!(rep.records_dropped, 1);
    assert_eq!(rep.file_offset, HEADER + 4 * REC_LEN);
    assert_eq!(rep.next_offset, 24);
    assert_eq!(log.end_offset().unwrap(), 24);
    check_records(&read_all(&log, 0, 100), 0..24);
    assert_eq!(log.append(&[rec(24), rec(25)]).unwrap(), vec![24, 25]);
    log.flush().unwrap();
    drop(log);
    let log = open(dir.path(), HEADER + 10 * REC_LEN).unwrap();
    assert!(log.recovery_report().is_none(), "the repair was durable");
    check_records(&read_all(&log, 0, 100), 0..26);
}

#[test]
fn flipped_byte_in_the_last_record_is_cut_and_reported() {
    let (dir, mut files) = closed_log(1 << 20, 5);
    let seg = files.pop().unwrap();
    flip_byte(&seg, HEADER + 4 * REC_LEN + FRAME + 2); // inside the key of record 4
    let log = open(dir.path(), 1 << 20).unwrap();
    let rep = log.recovery_report().expect("recovery report");
    assert_eq!((rep.bytes_truncated, rep.records_dropped), (REC_LEN, 1));
    assert_eq!(rep.reason, "crc mismatch");
    check_records(&read_all(&log, 0, 100), 0..4);
    assert_eq!(log.append(&[rec(4)]).unwrap(), vec![4]);
}

#[test]
fn garbage_after_valid_records_is_cut_and_reported() {
    let (dir, mut files) = closed_log(1 << 20, 5);
    let seg = files.pop().unwrap();
    let garbage: Vec<u8> = (0..777u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    OpenOptions::new()
        .append(true)
        .open(&seg)
        .unwrap()
        .write_all(&garbage)
        .unwrap();
    let log = open(dir.path(), 1 << 20).unwrap();
    let rep = log.recovery_report().expect("recovery report");
    assert_eq!(rep.bytes_truncated, 777);
    assert_eq!(fs::metadata(&seg).unwrap().len(), HEADER + 5 * REC_LEN);
    check_records(&read_all(&log, 0, 100), 0..5);
}

#[test]
fn torn_header_of_a_new_last_segment_is_rewritten() {
    let (dir, _) = closed_log(HEADER + 5 * REC_LEN, 10);
    // A crash while rolling: the new segment exists with half a header.
    let torn = dir.path().join("00000000000000000010.log");
    assert!(!torn.exists(), "rolling happens on the next append");
    let header = fs::read(dir.path().join("00000000000000000005.log")).unwrap();
    fs::write(&torn, &header[..13]).unwrap();
    let log = open(dir.path(), HEADER + 5 * REC_LEN).unwrap();
    assert_eq!(
        log.recovery_report().unwrap().reason,
        "truncated segment header"
    );
    assert_eq!(log.append(&[rec(10)]).unwrap(), vec![10]);
    check_records(&read_all(&log, 0, 100), 0..11);
}

#[test]
fn bad_record_followed_by_valid_ones_in_the_last_segment_is_corrupt_not_torn() {
    let (dir, mut files) = closed_log(1 << 20, 10);
    let seg = files.pop().unwrap();
    let before = fs::read(&seg).unwrap();
    let pos = HEADER + 3 * REC_LEN;
    flip_byte(&seg, pos + FRAME + 8); // a value byte of record 3
    let err = open(dir.path(), 1 << 20).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Corrupt, "{err}");
    // Nothing was cut off.
    assert_eq!(fs::read(&seg).unwrap().len(), before.len());

    // A damaged length field (so the next frame cannot be found by length) too.
    fs::write(&seg, &before).unwrap();
    flip_byte(&seg, pos);
    let err = open(dir.path(), 1 << 20).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Corrupt, "{err}");
}

#[test]
fn flipped_byte_in_an_early_segment_fails_reads_of_it_but_not_of_later_segments() {
    let seg_bytes = HEADER + 10 * REC_LEN;
    let (dir, files) = closed_log(seg_bytes, 40);
    let first = files[0].clone();
    let pos = HEADER + 6 * REC_LEN;
    flip_byte(&first, pos + FRAME + 1);
    // Closed segments are validated lazily: open succeeds...
    let log = open(dir.path(), seg_bytes).unwrap();
    // ...reading the damaged segment fails, naming the file and position...
    let mut r = log.read_from(0).unwrap();
    let err = loop {
        match r.next_batch(3) {
            Ok(Some(b)) => assert!(b.iter().all(|x| x.offset < 6), "returned data after damage"),
            Ok(None) => panic!("read past a corrupt record"),
            Err(e) => break e,
        }
    };
    assert_eq!(err.kind(), ErrorKind::Corrupt, "{err}");
    // ...seeking into it also fails (the index build validates the segment)...
    let err = log.read_from(8).err().expect("seek into a corrupt segment");
    assert_eq!(err.kind(), ErrorKind::Corrupt, "{err}");
    // ...while reading from later segments finds them by base offset and never
    // touches the damaged first one.
    check_records(&read_all(&log, 10, 100), 10..40);
    check_records(&read_all(&log, 25, 4), 25..40);
}

#[test]
fn read_from_seeks_with_the_index_inside_a_large_segment() {
    // One big segment whose early part is damaged after it was indexed: a
    // read from a late offset starts at an index entry near it, after the damage.
    let dir = tempfile::tempdir().unwrap();
    let log = open(dir.path(), 1 << 30).unwrap();
    let n = 20_000; // ~1 MB, so the sparse index (every 64 KiB) has ~15 entries
    fill(&log, n);
    check_records(&read_all(&log, 0, 5000), 0..n); // everything valid
    let seg = log_files(dir.path()).remove(0);
    // Damage record 10 in place (the active segment's index lives in memory).
    let mut f = OpenOptions::new().write(true).open(&seg).unwrap();
    use std::os::unix::fs::FileExt;
    f.write_all_at(b"XX", HEADER + 10 * REC_LEN + FRAME)
        .unwrap();
    f.flush().unwrap();
    let err = common::try_read_all(&log, 0, 1000).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Corrupt, "{err}");
    check_records(&read_all(&log, n - 100, 1000), n - 100..n);
}

#[test]
fn a_missing_middle_segment_is_a_corrupt_gap() {
    let seg_bytes = HEADER + 10 * REC_LEN;
    let (dir, files) = closed_log(seg_bytes, 40);
    fs::remove_file(&files[1]).unwrap();
    let err = open(dir.path(), seg_bytes).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Corrupt, "{err}");

    // The first segment missing is a gap too.
    let (dir, files) = closed_log(seg_bytes, 40);
    fs::remove_file(&files[0]).unwrap();
    let err = open(dir.path(), seg_bytes).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Corrupt, "{err}");
}

/// `state` with the records of `log` from `from` on applied.
fn replay_onto(mut state: Kv, log: &dyn Changelog, from: u64) -> Kv {
    apply_to(
        &mut state,
        read_all(log, from, 64)
            .into_iter()
            .map(|r| (r.key, r.value)),
    );
    state
}

/// The key -> value map `records` leave, applied in order.
fn state_of(records: &[Record]) -> Kv {
    let mut state = Kv::new();
    apply_to(
        &mut state,
        records.iter().map(|r| (r.key.clone(), r.value.clone())),
    );
    state
}

fn replay(log: &dyn Changelog) -> Kv {
    replay_onto(Kv::new(), log, 0)
}

fn with_clock(clock: &ManualClock, segment_bytes: u64) -> FileChangelogOptions {
    FileChangelogOptions {
        clock: Arc::new(clock.clone()),
        ..opts(segment_bytes)
    }
}

fn open_with_clock(dir: &Path, clock: &ManualClock, segment_bytes: u64) -> FileChangelog {
    FileChangelog::open(dir, id(), with_clock(clock, segment_bytes)).unwrap()
}

/// A new log in a new directory, on a manual clock at 1 000 s.
fn clocked_log(segment_bytes: u64) -> (tempfile::TempDir, ManualClock, FileChangelog) {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(1_000_000);
    let log = open_with_clock(dir.path(), &clock, segment_bytes);
    (dir, clock, log)
}

/// Compaction that keeps tombstones for `secs` seconds.
fn retention(secs: u64) -> CompactOptions {
    CompactOptions {
        delete_retention: Duration::from_secs(secs),
    }
}

#[test]
fn compaction_keeps_tombstones_within_retention_and_deleted_keys_stay_deleted() {
    let (dir, clock, log) = clocked_log(300);
    for i in 0..30u64 {
        log.append(&[Record::put(format!("k{}", i % 3), format!("v{i}"))])
            .unwrap();
    }
    log.append(&[Record::delete("k1")]).unwrap(); // offset 30
    for i in 0..10u64 {
        log.append(&[Record::put(format!("x{i}"), "y")]).unwrap();
    }
    let before = replay(&log);
    let end = log.end_offset().unwrap();
    clock.advance_ms(1000);
    let rep = log.compact(&retention(60)).unwrap();
    assert!(rep.segments_rewritten > 0, "{rep:?}");
    assert!(rep.records_after < rep.records_before, "{rep:?}");
    assert!(rep.bytes_after < rep.bytes_before, "{rep:?}");
    assert_eq!(
        rep.horizon.tombstones_before, 0,
        "tombstone within retention: no horizon"
    );
    assert_eq!(log.horizon().unwrap().tombstones_before, 0);
    assert_eq!(replay(&log), before);
    assert!(!replay(&log).contains_key(&b"k1"[..]));
    let recs = read_all(&log, 0, 1000);
    assert!(
        recs.iter().any(|r| r.offset == 30 && r.value.is_none()),
        "tombstone kept"
    );
    assert!(recs.windows(2).all(|w| w[0].offset < w[1].offset));
    assert_eq!(log.end_offset().unwrap(), end, "compaction keeps offsets");
    assert!(
        log.start_offset().unwrap() > 0,
        "the lowest records were superseded"
    );
    assert_eq!(log.start_offset().unwrap(), recs[0].offset);
    // Reopen: same content, nothing to recover.
    drop(log);
    let log = open_with_clock(dir.path(), &clock, 300);
    assert!(log.recovery_report().is_none());
    assert_eq!(replay(&log), before);
}

#[test]
fn compaction_drops_expired_tombstones_and_advances_the_horizon_durably() {
    let (dir, clock, log) = clocked_log(200);
    log.append(&[Record::put("a", "1"), Record::put("b", "1")])
        .unwrap(); // 0, 1
    log.append(&[Record::delete("a")]).unwrap(); // 2: old tombstone
    clock.advance_ms(50_000);
    log.append(&[Record::delete("b")]).unwrap(); // 3: recent tombstone
    for i in 0..10u64 {
        log.append(&[Record::put(format!("z{i}"), "y")]).unwrap();
    }
    let before = replay(&log);
    clock.advance_ms(20_000); // tombstone 2 is 70 s old, tombstone 3 is 20 s old
    let rep = log.compact(&retention(60)).unwrap();
    assert_eq!(rep.horizon.tombstones_before, 3, "{rep:?}");
    assert!(rep.tombstones_dropped >= 1, "{rep:?}");
    assert_eq!(log.horizon().unwrap().tombstones_before, 3);
    let recs = read_all(&log, 0, 1000);
    assert!(
        !recs.iter().any(|r| r.key == "a"),
        "expired tombstone and its put are gone"
    );
    assert!(
        recs.iter().any(|r| r.offset == 3 && r.value.is_none()),
        "recent tombstone kept"
    );
    assert!(
        !recs.iter().any(|r| r.offset == 1),
        "put of b superseded by its tombstone"
    );
    assert_eq!(replay(&log), before);
    assert!(
        !log.horizon().unwrap().can_resume_after(Some(1)),
        "a snapshot at 1 is stale"
    );
    drop(log);
    let log = open_with_clock(dir.path(), &clock, 200);
    assert_eq!(
        log.horizon().unwrap().tombstones_before,
        3,
        "horizon persisted"
    );
    assert_eq!(replay(&log), before);
    // Later, the second tombstone expires too.
    clock.advance_ms(60_000);
    let rep = log.compact(&retention(60)).unwrap();
    assert_eq!(rep.horizon.tombstones_before, 4, "{rep:?}");
    assert_eq!(replay(&log), before);
}

#[test]
fn compaction_drops_keys_whose_newest_record_is_in_the_active_segment() {
    let dir = tempfile::tempdir().unwrap();
    let log = open(dir.path(), 1 << 20).unwrap();
    // Force segments: tiny first log, then reopen with large segments.
    drop(log);
    let log = open(dir.path(), HEADER + 3 * REC_LEN).unwrap();
    fill(&log, 9); // three closed-to-be segments
    drop(log);
    let log = open(dir.path(), 1 << 20).unwrap();
    let batch: Vec<Record> = (0..9).map(rec).collect();
    log.append(&batch).unwrap(); // all keys again, in the active segment
    let rep = log.compact(&CompactOptions::default()).unwrap();
    // Segments 0 and 3 are closed; segment 6 (records 6..9) is still active.
    assert_eq!(rep.segments_examined, 2, "{rep:?}");
    assert_eq!(rep.records_before, 6, "{rep:?}");
    assert_eq!(rep.records_after, 0, "{rep:?}");
    let recs = read_all(&log, 0, 100);
    assert_eq!(
        recs.iter().map(|r| r.offset).collect::<Vec<_>>(),
        (6..18).collect::<Vec<_>>()
    );
    assert_eq!(log.start_offset().unwrap(), 6);
}

#[test]
fn a_reader_open_during_compaction_keeps_reading_the_old_segments() {
    let dir = tempfile::tempdir().unwrap();
    let log = open(dir.path(), HEADER + 5 * REC_LEN).unwrap();
    for _ in 0..4 {
        fill(&log, 10); // the same 10 keys four times
    }
    let mut r = log.read_from(0).unwrap();
    let first = r.next_batch(3).unwrap().unwrap();
    let rep = log.compact(&CompactOptions::default()).unwrap();
    assert!(rep.segments_rewritten >= 6, "{rep:?}");
    let mut got = first;
    while let Some(b) = r.next_batch(7).unwrap() {
        got.extend(b);
    }
    assert_eq!(
        got.iter().map(|r| r.offset).collect::<Vec<_>>(),
        (0..40).collect::<Vec<_>>()
    );
    // A new reader sees the compacted log.
    let now = read_all(&log, 0, 100);
    assert_eq!(
        now.iter().map(|r| r.offset).collect::<Vec<_>>(),
        (30..40).collect::<Vec<_>>()
    );
}

/// Descriptors this process holds on files in `dir`.
#[cfg(target_os = "linux")]
fn fds_in(dir: &Path) -> usize {
    let dir = dir.canonicalize().unwrap();
    fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| fs::read_link(e.ok()?.path()).ok())
        .filter(|target| target.starts_with(&dir))
        .count()
}

/// Files in `dir` whose names say they are retired segments.
#[cfg(target_os = "linux")]
fn retired_files(dir: &Path) -> usize {
    fs::read_dir(dir)
        .unwrap()
        .filter(|e| {
            let name = e.as_ref().unwrap().file_name();
            name.to_string_lossy().contains(".retired.")
        })
        .count()
}

/// A log of hundreds of segments, written without flushes under
/// `FsyncPolicy::Never`, read from its start, and compacted under a reader
/// that holds every segment, keeps its open files within its budget (the
/// segment handles, the write handle, the lock and at most eight unsynced
/// segments); the reader still reads the old records, the retired names go
/// with it, and a reopen reads the compacted log.
#[cfg(target_os = "linux")]
#[test]
fn a_log_of_many_segments_holds_a_bounded_number_of_open_files() {
    let dir = tempfile::tempdir().unwrap();
    let max_open = 4;
    let o = FileChangelogOptions {
        max_open_segments: max_open,
        ..opts(HEADER + 4 * REC_LEN)
    };
    let bound = max_open + 1 + 1 + 8;
    let log = FileChangelog::open(dir.path(), id(), o.clone()).unwrap();
    for pass in 0..2 {
        for i in 0..600 {
            log.append(&[rec(i)]).unwrap();
            assert!(fds_in(dir.path()) <= bound, "pass {pass} record {i}");
        }
    }
    assert!(log_files(dir.path()).len() > 250);
    let mut r = log.read_from(0).unwrap();
    let mut got = r.next_batch(10).unwrap().unwrap();
    let rep = log.compact(&CompactOptions::default()).unwrap();
    assert!(rep.segments_rewritten >= 150, "{rep:?}");
    assert!(fds_in(dir.path()) <= bound);
    assert!(
        retired_files(dir.path()) > 0,
        "the reader holds old segments"
    );
    while let Some(b) = r.next_batch(50).unwrap() {
        got.extend(b);
        assert!(fds_in(dir.path()) <= bound);
    }
    let offsets: Vec<u64> = got.iter().map(|x| x.offset).collect();
    assert_eq!(offsets, (0..1200).collect::<Vec<_>>(), "the old records");
    assert_eq!(
        retired_files(dir.path()),
        0,
        "the reader let go of each old segment as it moved past it"
    );
    drop(r);
    assert_eq!(replay(&log).len(), 600);
    drop(log);
    let log = FileChangelog::open(dir.path(), id(), o).unwrap();
    let now = read_all(&log, 0, 2000);
    let offsets: Vec<u64> = now.iter().map(|x| x.offset).collect();
    assert_eq!(offsets, (600..1200).collect::<Vec<_>>());
    for x in &now {
        assert_eq!(x.key, rec(x.offset - 600).key, "offset {}", x.offset);
    }
}

/// A read-only handle whose segment was closed for the budget and then
/// replaced by the writer's compaction says to open it again; it never reads
/// the compacted file with the old one's positions. Retired names a crash
/// left are removed by the next writer.
#[cfg(unix)]
#[test]
fn a_read_only_handle_refuses_a_segment_the_writer_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let writer = open(dir.path(), HEADER + 2 * REC_LEN).unwrap();
    fill(&writer, 200);
    fill(&writer, 200); // the same keys again: every old segment compacts away
    assert!(log_files(dir.path()).len() > 64 + 10);
    // Opening scans every segment; only the newest 64 (the default) stay open.
    let reader = FileChangelog::open_read_only(dir.path(), id()).unwrap();
    writer.compact(&CompactOptions::default()).unwrap();
    let err = reader
        .read_from(0)
        .and_then(|mut r| r.next_batch(10))
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Transient, "{err}");
    assert!(
        err.to_string().contains("open the changelog again"),
        "{err}"
    );
    let again = FileChangelog::open_read_only(dir.path(), id()).unwrap();
    assert_eq!(replay(&again).len(), 200);
    // A retired name left by a crash goes at the next writer's open.
    drop(writer);
    let stray = log_files(dir.path())[0].with_extension("log.retired.7");
    fs::write(&stray, b"old bytes").unwrap();
    let writer = open(dir.path(), HEADER + 2 * REC_LEN).unwrap();
    assert!(!stray.exists());
    assert_eq!(replay(&writer).len(), 200);
}

#[test]
fn a_leftover_compacting_file_is_removed_on_open() {
    let (dir, files) = closed_log(HEADER + 5 * REC_LEN, 12);
    let leftover = files[0].with_extension("log.compacting");
    fs::write(&leftover, b"half a compacted segment").unwrap();
    fs::write(dir.path().join("changelog.json.tmp"), b"{half").unwrap();
    let log = open(dir.path(), HEADER + 5 * REC_LEN).unwrap();
    assert!(!leftover.exists(), "leftover removed");
    assert!(!dir.path().join("changelog.json.tmp").exists());
    check_records(&read_all(&log, 0, 100), 0..12);
}

#[test]
fn compaction_leftover_of_a_real_compaction_is_safe_either_way() {
    // Simulate a crash after the compacted file was written but before the
    // rename: the compacted bytes sit in `.compacting` beside the old segment.
    let dir = tempfile::tempdir().unwrap();
    let seg_bytes = HEADER + 5 * REC_LEN;
    let saved = {
        let log = open(dir.path(), seg_bytes).unwrap();
        fill(&log, 10);
        fill(&log, 10);
        let old = fs::read(&log_files(dir.path())[0]).unwrap();
        log.compact(&CompactOptions::default()).unwrap();
        let new = fs::read(&log_files(dir.path())[0]).unwrap();
        assert!(new.len() < old.len());
        (old, new)
    };
    let first = log_files(dir.path()).remove(0);
    fs::write(&first, &saved.0).unwrap(); // old segment back in place
    fs::write(first.with_extension("log.compacting"), &saved.1).unwrap();
    let log = open(dir.path(), seg_bytes).unwrap();
    assert_eq!(fs::read(&first).unwrap(), saved.0, "old segment kept");
    assert_eq!(replay(&log).len(), 10);
}

#[test]
fn decoder_accepts_a_real_segment() {
    let dir = tempfile::tempdir().unwrap();
    let log = open(dir.path(), 1 << 20).unwrap();
    log.append(&[rec(0), Record::delete("gone"), rec(2)])
        .unwrap();
    let bytes = fs::read(&log_files(dir.path())[0]).unwrap();
    let d = decode_segment(&bytes).unwrap();
    assert_eq!(d.header.base_offset, 0);
    assert_eq!(d.header.prev_base_offset, None);
    assert_eq!(d.records.len(), 3);
    assert_eq!(d.records[1].value, None);
    assert_eq!(d.valid_len, bytes.len() as u64);
}

fn valid_segment() -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let log = open(dir.path(), 1 << 20).unwrap();
    log.append(&[rec(0), Record::delete("gone"), rec(2), Record::put("", "")])
        .unwrap();
    fs::read(&log_files(dir.path())[0]).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn decoder_never_panics_on_random_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
        if let Err(e) = decode_segment(&bytes) {
            prop_assert_eq!(e.kind(), ErrorKind::Corrupt);
        }
    }

    #[test]
    fn decoder_never_panics_on_mutated_segments(
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
        cut in any::<prop::sample::Index>(),
        cut_it in any::<bool>(),
    ) {
        let mut bytes = valid_segment();
        for (at, b) in edits {
            let i = at.index(bytes.len());
            bytes[i] = b;
        }
        if cut_it {
            let n = cut.index(bytes.len() + 1);
            bytes.truncate(n);
        }
        match decode_segment(&bytes) {
            Ok(d) => prop_assert!(d.valid_len + d.torn_tail_bytes == bytes.len() as u64),
            Err(e) => prop_assert_eq!(e.kind(), ErrorKind::Corrupt, "{}", e),
        }
    }
}

#[derive(Debug, Clone)]
enum Op {
    Append(Vec<(u8, Option<u8>)>),
    Reopen,
    Read(u64),
    Compact,
    Tick,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => proptest::collection::vec((0u8..8, proptest::option::weighted(0.8, any::<u8>())), 0..12)
            .prop_map(Op::Append),
        1 => Just(Op::Reopen),
        2 => (0u64..80).prop_map(Op::Read),
        1 => Just(Op::Compact),
        1 => Just(Op::Tick),
    ]
}

/// The records of an `Op::Append`: `v` is a put of `v % 40` bytes `v`.
fn to_batch(recs: Vec<(u8, Option<u8>)>) -> Vec<Record> {
    let to_record = |(k, v): (u8, Option<u8>)| {
        let key = format!("key{k}");
        match v {
            Some(v) => Record::put(key, vec![v; usize::from(v % 40)]),
            None => Record::delete(key),
        }
    };
    recs.into_iter().map(to_record).collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Appends, reopens and reads against a `Vec` model (no compaction).
    #[test]
    fn model_append_reopen_read(ops in proptest::collection::vec(op(), 1..40), seg in 100u64..600) {
        let dir = tempfile::tempdir().unwrap();
        let mut log = Some(open(dir.path(), seg).unwrap());
        let mut model: Vec<Record> = Vec::new();
        for op in ops {
            let l = log.as_ref().unwrap();
            match op {
                Op::Append(recs) => {
                    let batch = to_batch(recs);
                    let offsets = l.append(&batch).unwrap();
                    let want: Vec<u64> = (model.len() as u64..(model.len() + batch.len()) as u64).collect();
                    prop_assert_eq!(offsets, want);
                    model.extend(batch);
                }
                Op::Reopen | Op::Compact | Op::Tick => {
                    l.flush().unwrap();
                    drop(log.take());
                    log = Some(open(dir.path(), seg).unwrap());
                    prop_assert!(log.as_ref().unwrap().recovery_report().is_none());
                }
                Op::Read(from) => {
                    let got = read_all(l, from, 5);
                    let from = (from as usize).min(model.len());
                    prop_assert_eq!(got.len(), model.len() - from);
                    for (g, w) in got.iter().zip(&model[from..]) {
                        prop_assert_eq!(&g.key, &w.key);
                        prop_assert_eq!(&g.value, &w.value);
                    }
                }
            }
            let l = log.as_ref().unwrap();
            prop_assert_eq!(l.end_offset().unwrap(), model.len() as u64);
        }
    }

    /// Random puts/deletes across many segments, compactions (with tombstone
    /// expiry by a manual clock) and reopens: a full replay always gives the
    /// same key -> value map as the model, offsets never change, and reads from
    /// the horizon on are exact.
    #[test]
    fn model_compaction_preserves_final_state(ops in proptest::collection::vec(op(), 1..50), seg in 120u64..500) {
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::new(0);
        let o = with_clock(&clock, seg);
        let mut log = Some(FileChangelog::open(dir.path(), id(), o.clone()).unwrap());
        // Every record appended, at its offset.
        let mut history = Vec::new();
        for op in ops {
            let l = log.as_ref().unwrap();
            match op {
                Op::Append(recs) => {
                    let batch = to_batch(recs);
                    l.append(&batch).unwrap();
                    history.extend(batch);
                }
                Op::Reopen => {
                    drop(log.take());
                    log = Some(FileChangelog::open(dir.path(), id(), o.clone()).unwrap());
                }
                Op::Compact => {
                    let rep = l.compact(&CompactOptions { delete_retention: Duration::from_millis(100) }).unwrap();
                    prop_assert!(rep.records_after <= rep.records_before);
                    prop_assert_eq!(rep.horizon, l.horizon().unwrap());
                }
                Op::Tick => clock.advance_ms(60),
                Op::Read(_) => {}
            }
            let l = log.as_ref().unwrap();
            let model = state_of(&history);
            prop_assert_eq!(replay(l), model.clone());
            prop_assert_eq!(l.end_offset().unwrap(), history.len() as u64);
            // Every surviving record is the one appended at its offset.
            let recs = read_all(l, 0, 64);
            for r in &recs {
                let h = &history[r.offset as usize];
                prop_assert_eq!(&r.key, &h.key);
                prop_assert_eq!(&r.value, &h.value);
            }
            if let Some(first) = recs.first() {
                prop_assert_eq!(l.start_offset().unwrap(), first.offset);
            }
            // Resuming is exact from every offset at or above the horizon: a
            // state built from the history below `o`, plus a replay from `o`,
            // gives the final state. (A horizon that is too low fails here.)
            let h = l.horizon().unwrap().tombstones_before;
            let end = history.len() as u64;
            let mut points: Vec<u64> = (0..=8u64).map(|i| h + (end.saturating_sub(h)) * i / 8).collect();
            points.dedup();
            for o in points {
                let state = replay_onto(state_of(&history[..o as usize]), l, o);
                prop_assert_eq!(&state, &model, "resume from offset {} (horizon {})", o, h);
            }
        }
    }
}

/// A read error half way through a batch (here: the segment shrinks under
/// the reader, then comes back) must end the reader. Before readers were
/// fused, the next call went on after the records the failed call had
/// already passed, and they were silently skipped.
#[test]
fn a_reader_that_failed_mid_batch_never_skips_records_afterwards() {
    let dir = tempfile::tempdir().unwrap();
    let log = open(dir.path(), 1 << 30).unwrap();
    let n = 100_000;
    fill(&log, n);
    let seg = log_files(dir.path()).pop().unwrap();
    let original = fs::read(&seg).unwrap();
    assert!(original.len() > 4 << 20, "{}", original.len());

    let mut r = log.read_from(0).unwrap();
    let first = r.next_batch(10).unwrap().unwrap();
    check_records(&first, 0..10);
    set_len(&seg, 3 << 19);
    let err = r.next_batch(n as usize).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Corrupt, "{err}");
    fs::write(&seg, &original).unwrap(); // the file is whole again
    for _ in 0..2 {
        match r.next_batch(n as usize) {
            Err(again) => assert_eq!(again.reason(), Some(Reason::FailedEarlier), "{again}"),
            Ok(b) => panic!(
                "a failed reader went on with {:?} records, from offset {:?}",
                b.as_ref().map(Vec::len),
                b.as_ref().and_then(|b| b.first()).map(|r| r.offset)
            ),
        }
    }
    drop(r);
    let all = read_all(&log, 0, 4096);
    check_records(&all, 0..n);
}

/// Compaction that purges tombstones while a replay is reading (the horizon
/// passes the replay's start under it) fails the replay `stale` rather than
/// leaving a store that may hold a deleted key (invariant 7). Checked only
/// before the replay, it succeeded.
#[test]
fn a_horizon_that_passes_a_running_replay_fails_it_stale() {
    use statesnap::restore::{ReplayOptions, replay as replay_into};
    use statesnap::store::MemoryStore;
    use statesnap::store::StateStore;

    let (_dir, clock, log) = clocked_log(300);
    for i in 0..10u64 {
        log.append(&[rec(i)]).unwrap();
    }
    // The store has the first ten records; the changelog then deletes one of
    // them and goes on.
    let mut store = MemoryStore::new();
    statesnap::store::ensure_follows(
        &mut store,
        &statesnap::changelog::ChangelogBinding::of(&log).unwrap(),
    )
    .unwrap();
    let first: Vec<Record> = (0..10).map(rec).collect();
    store.apply(&first, 9).unwrap();
    log.append(&[Record::delete(rec(3).key)]).unwrap(); // offset 10
    for i in 11..60u64 {
        log.append(&[rec(i)]).unwrap();
    }
    assert!(log.horizon().unwrap().can_resume_after(Some(9)));

    let mut compacted = None;
    let err = replay_into(
        &mut store,
        &log,
        &ReplayOptions { batch_size: 1 },
        &mut |_| {
            if compacted.is_none() {
                clock.advance_ms(2 * 60 * 60 * 1000);
                compacted = Some(log.compact(&retention(60 * 60)).unwrap());
            }
        },
    )
    .expect_err("the horizon moved past the replay's start while it ran");
    let rep = compacted.expect("compaction ran during the replay");
    assert!(rep.horizon.tombstones_before > 10, "{rep:?}");
    assert_eq!(err.kind(), ErrorKind::Stale, "{err}");
    assert_eq!(err.reason(), Some(Reason::BelowHorizon), "{err}");
}

/// Readers never need the writer's lock: a read-only handle opens a log a
/// writer holds, sees it as it was when opened, leaves a torn tail alone,
/// and refuses to write.
#[test]
fn a_read_only_handle_reads_a_log_a_writer_holds() {
    use statesnap::restore::{ReplayOptions, replay};
    use statesnap::store::MemoryStore;
    use statesnap::store::StateStoreExt;
    let dir = tempfile::tempdir().unwrap();
    let writer = FileChangelog::open(dir.path(), id(), FileChangelogOptions::default()).unwrap();
    for i in 0..50u64 {
        writer.append(&[rec(i)]).unwrap();
    }
    // A second writer is still refused: the log is in use...
    let err = FileChangelog::open(dir.path(), id(), FileChangelogOptions::default()).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Transient, "{err}");
    assert_eq!(err.reason(), Some(Reason::InUse), "{err}");
    // ...a reader is not.
    let reader = FileChangelog::open_read_only(dir.path(), id()).unwrap();
    assert!(reader.is_read_only());
    assert_eq!(reader.end_offset().unwrap(), 50);
    assert_eq!(reader.lineage().unwrap(), writer.lineage().unwrap());
    writer.append(&[rec(50)]).unwrap();
    assert_eq!(reader.end_offset().unwrap(), 50, "a point-in-time view");
    let mut store = MemoryStore::new();
    replay(&mut store, &reader, &ReplayOptions::default(), &mut |_| {}).unwrap();
    assert_eq!(store.iter().unwrap().count(), 50);
    for err in [
        reader.append(&[rec(99)]).unwrap_err(),
        reader.compact(&CompactOptions::default()).unwrap_err(),
    ] {
        assert_eq!(err.kind(), ErrorKind::Config, "{err}");
        assert_eq!(err.reason(), Some(Reason::ReadOnly), "{err}");
    }
    reader.flush().unwrap();
    drop(writer);

    // A torn tail: the reader stops before it and leaves the file as it is.
    let last = reader.segment_paths().unwrap().pop().unwrap();
    drop(reader);
    let mut f = OpenOptions::new().append(true).open(&last).unwrap();
    f.write_all(b"\x07\x00\x00garbage").unwrap();
    let len = std::fs::metadata(&last).unwrap().len();
    let reader = FileChangelog::open_read_only(dir.path(), id()).unwrap();
    assert_eq!(reader.end_offset().unwrap(), 51);
    assert_eq!(
        std::fs::metadata(&last).unwrap().len(),
        len,
        "nothing repaired"
    );
    // No log at all: not found, and nothing created.
    let empty = dir.path().join("none");
    let err = FileChangelog::open_read_only(&empty, id()).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound, "{err}");
    assert!(!empty.exists());
}

/// `flush` syncs outside the writer lock while appends go on: racing
/// appends (with segment rolls) against flushes from another thread leaves
/// the bookkeeping right — a flush that returned covers every record
/// appended before it began (its durable tail reaches that record's
/// position in the same segment, or the segment was rolled and synced), a
/// final flush covers the whole active segment, and a reopen reads every
/// record.
#[test]
fn flushes_racing_appends_cover_what_came_before_them() {
    let dir = tempfile::tempdir().unwrap();
    let log = std::sync::Arc::new(open(dir.path(), 4 << 10).unwrap());
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let appender = {
        let (log, stop) = (log.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut i = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let batch: Vec<Record> = (i..i + 7).map(rec).collect();
                log.append(&batch).unwrap();
                i += 7;
            }
            i
        })
    };
    for _ in 0..300 {
        let (seg_before, pos_before) = log.durable_tail().unwrap();
        let end = log.end_offset().unwrap();
        log.flush().unwrap();
        let (seg_after, pos_after) = log.durable_tail().unwrap();
        if seg_after == seg_before {
            assert!(pos_after >= pos_before, "the durable tail went back");
        }
        assert!(log.end_offset().unwrap() >= end);
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let appended = appender.join().unwrap();
    log.flush().unwrap();
    let (seg, synced) = log.durable_tail().unwrap();
    assert_eq!(
        synced,
        std::fs::metadata(&seg).unwrap().len(),
        "all of the active segment"
    );
    drop(log);
    let log = open(dir.path(), 4 << 10).unwrap();
    assert_eq!(log.end_offset().unwrap(), appended);
    let got = common::try_read_all(&log, 0, 4096).unwrap();
    check_records(&got, 0..appended);
}
