//! On-disk formats other than the portable chunk (`portable_chunks.rs`):
//! fixtures of manifest v1 and of the file changelog (metadata versions 1
//! and 2, one segment) still load with the expected contents, and corrupt
//! or too-new manifests fail with the right error kind.
//!
//! Fixtures live in `tests/fixtures/manifest/` and
//! `tests/fixtures/file_changelog/`; they were written by this code. Regenerate
//! them (`cargo test --test integration -- --ignored format_fixtures::write_`) only when a
//! format version changes, and then add new files next to the old ones: old
//! fixtures must keep loading.
#![allow(clippy::unwrap_used)]

use crate::common;

use bytes::Bytes;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use statesnap::changelog::file::{
    FileChangelog, FileChangelogOptions, SegmentHeader, decode_segment, encode_segment,
};
use statesnap::changelog::{Changelog, ChangelogId, Horizon, Lineage, LoggedRecord, Record};
use statesnap::clock::ManualClock;
use statesnap::repo::{
    BlobHash, ChangelogPosition, FileEntry, Manifest, ManifestDraft, SnapshotId, SnapshotStats,
    StoreFormatId, StoreKey,
};
use statesnap::{ErrorKind, Reason};

fn fixtures(sub: &str) -> PathBuf {
    common::package_dir().join("tests/fixtures").join(sub)
}

// ---------------------------------------------------------------- manifest v1

const CREATED_AT: i64 = 1_700_000_000_000;

fn snapshot_id() -> SnapshotId {
    SnapshotId::from_parts(CREATED_AT as u64, 0x00c0_ffee_0000_0000_0042)
}

fn parent_id() -> SnapshotId {
    SnapshotId::from_parts(CREATED_AT as u64 - 60_000, 7)
}

fn store_key() -> StoreKey {
    StoreKey::new("app", "store", 0).unwrap()
}

/// The manifests the valid fixtures hold, as this code builds them.
fn manifest_fixtures() -> Vec<(&'static str, Manifest)> {
    let full = ManifestDraft {
        store_key: store_key(),
        changelog: ChangelogPosition {
            topic: "app-store-changelog".into(),
            partition: 0,
            offset: 41,
            lineage: Lineage("5f0c3f0e-8a9e-4c5b-9e0e-2f3c1d7a9b10".into()),
            epoch: Some(3),
        },
        store_format: StoreFormatId {
            name: "portable".into(),
            version: 1,
        },
        parent: Some(parent_id()),
        depends_on: vec![parent_id()],
        files: vec![
            FileEntry {
                path: "chunks/00000000000000000041/000000.sspc".into(),
                size: 3,
                blake3: BlobHash::of(b"abc"),
            },
            FileEntry {
                path: "chunks/00000000000000000041/000001.sspc".into(),
                size: 0,
                blake3: BlobHash::of(b""),
            },
        ],
        stats: SnapshotStats {
            keys: 2,
            logical_bytes: 10,
            bytes_uploaded: 3,
            bytes_reused: 0,
            // Absent from the fixture (written before the field existed):
            // decodes as not known to be exact.
            counts_exact: false,
        },
        format_metadata: serde_json::json!({"chunk_version": 1, "ratio": 0.5, "note": null}),
        required_features: vec![],
    };
    let minimal = ManifestDraft {
        changelog: ChangelogPosition {
            offset: 0,
            epoch: None,
            ..full.changelog.clone()
        },
        store_format: StoreFormatId {
            name: "rocksdb".into(),
            version: 1,
        },
        parent: None,
        depends_on: vec![],
        files: vec![],
        stats: SnapshotStats::default(),
        format_metadata: serde_json::Value::Null,
        ..full.clone()
    };
    vec![
        (
            "v1_full.json",
            Manifest::from_draft(full, snapshot_id(), CREATED_AT).unwrap(),
        ),
        (
            "v1_minimal.json",
            Manifest::from_draft(minimal, parent_id(), CREATED_AT - 60_000).unwrap(),
        ),
    ]
}

/// The object key a manifest is stored under, spelled out as in
/// `docs/format.md` (not through the code under test).
fn manifest_key(offset: u64, id: SnapshotId) -> String {
    format!("stores/app.store.0/manifests/{offset:020}-{id}.json")
}

/// Recomputes the checksum after an edit, as a writer would.
fn reseal(v: &mut serde_json::Value) {
    let body = Manifest::canonical_body(v).unwrap();
    v["checksum"] = blake3::hash(&body).to_hex().to_string().into();
}

/// Corrupt or too-new variants of `v1_full.json`: file name, bytes, the
/// error kind decoding must fail with, and a part of its message.
fn manifest_bad_fixtures() -> Vec<(&'static str, Vec<u8>, ErrorKind, Option<Reason>)> {
    let good: serde_json::Value =
        serde_json::from_slice(&manifest_fixtures()[0].1.encode().unwrap()).unwrap();
    let edited = |edit: &dyn Fn(&mut serde_json::Value), seal: bool| {
        let mut v = good.clone();
        edit(&mut v);
        if seal {
            reseal(&mut v);
        }
        serde_json::to_vec_pretty(&v).unwrap()
    };
    vec![
        (
            "corrupt_checksum.json",
            edited(&|v| v["created_at"] = (CREATED_AT + 1).into(), false),
            ErrorKind::Corrupt,
            None,
        ),
        (
            "unknown_format_version.json",
            edited(&|v| v["format_version"] = 2.into(), true),
            ErrorKind::Config,
            Some(Reason::UnsupportedVersion),
        ),
        (
            "unknown_required_feature.json",
            edited(
                &|v| v["required_features"] = serde_json::json!(["encryption"]),
                true,
            ),
            ErrorKind::Config,
            Some(Reason::UnsupportedVersion),
        ),
        (
            "corrupt_dotdot_path.json",
            edited(&|v| v["files"][1]["path"] = "../../escape.sst".into(), true),
            ErrorKind::Corrupt,
            None,
        ),
    ]
}

#[test]
#[ignore = "rewrites tests/fixtures/manifest: run it (--ignored) only when the manifest format changes"]
fn write_manifest_fixtures_when_asked() {
    let dir = fixtures("manifest");
    std::fs::create_dir_all(&dir).unwrap();
    for (name, m) in manifest_fixtures() {
        std::fs::write(dir.join(name), m.encode().unwrap()).unwrap();
    }
    for (name, bytes, _, _) in manifest_bad_fixtures() {
        std::fs::write(dir.join(name), bytes).unwrap();
    }
}

#[test]
fn manifest_v1_fixtures_still_load() {
    for (name, expected) in manifest_fixtures() {
        let bytes = std::fs::read(fixtures("manifest").join(name)).unwrap();
        let key = manifest_key(expected.changelog.offset, expected.snapshot_id);
        let m = Manifest::decode(&key, &bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(m, expected, "{name}");
        // This build still writes the same bytes.
        assert_eq!(m.encode().unwrap(), bytes, "{name} re-encodes identically");
    }
}

#[test]
fn manifest_v1_full_fixture_fields() {
    let bytes = std::fs::read(fixtures("manifest").join("v1_full.json")).unwrap();
    let key = manifest_key(41, snapshot_id());
    let m = Manifest::decode(&key, &bytes).unwrap();
    assert_eq!(m.format_version, 1);
    assert_eq!(m.snapshot_id, snapshot_id());
    assert_eq!(m.store_key, store_key());
    assert_eq!(m.changelog.topic, "app-store-changelog");
    assert_eq!(m.changelog.partition, 0);
    assert_eq!(m.changelog.offset, 41);
    assert_eq!(
        m.changelog.lineage,
        Lineage("5f0c3f0e-8a9e-4c5b-9e0e-2f3c1d7a9b10".into())
    );
    assert_eq!(m.changelog.epoch, Some(3));
    assert_eq!(m.store_format.name, "portable");
    assert_eq!(m.store_format.version, 1);
    assert_eq!(m.created_at, CREATED_AT);
    assert_eq!(m.parent, Some(parent_id()));
    assert_eq!(m.depends_on, vec![parent_id()]);
    assert_eq!(m.files.len(), 2);
    assert_eq!(m.files[0].path, "chunks/00000000000000000041/000000.sspc");
    assert_eq!(m.files[0].size, 3);
    assert_eq!(m.files[0].blake3, BlobHash::of(b"abc"));
    assert_eq!(m.stats.keys, 2);
    assert_eq!(m.stats.logical_bytes, 10);
    assert_eq!(m.format_metadata["chunk_version"], 1);
    assert_eq!(m.format_metadata["ratio"], 0.5);
    assert!(m.required_features.is_empty());
    assert_eq!(m.checksum.len(), 64);
    // The stored checksum is the blake3 of the canonical body.
    let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    let body = Manifest::canonical_body(&v).unwrap();
    assert_eq!(m.checksum, blake3::hash(&body).to_hex().to_string());
    assert_eq!(v["changelog"]["epoch"], 3);

    let bytes = std::fs::read(fixtures("manifest").join("v1_minimal.json")).unwrap();
    let m = Manifest::decode(&manifest_key(0, parent_id()), &bytes).unwrap();
    assert_eq!(m.changelog.offset, 0);
    assert_eq!(m.changelog.epoch, None);
    let raw: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    assert!(
        raw["changelog"].get("epoch").is_none(),
        "an absent epoch is not written"
    );
    assert_eq!(m.parent, None);
    assert!(m.files.is_empty());
    assert_eq!(m.store_format.name, "rocksdb");
}

#[test]
fn bad_manifest_fixtures_fail_with_the_right_kind() {
    let key = manifest_key(41, snapshot_id());
    for (name, generated, kind, reason) in manifest_bad_fixtures() {
        let bytes = std::fs::read(fixtures("manifest").join(name)).unwrap();
        assert_eq!(bytes, generated, "{name} fixture is current");
        let e = Manifest::decode(&key, &bytes).unwrap_err();
        assert_eq!(e.kind(), kind, "{name}: {e}");
        assert_eq!(e.reason(), reason, "{name}: {e}");
    }
}

#[test]
fn a_manifest_fixture_under_another_key_is_corrupt() {
    let bytes = std::fs::read(fixtures("manifest").join("v1_full.json")).unwrap();
    let e = Manifest::decode(&manifest_key(42, snapshot_id()), &bytes).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Corrupt, "{e}");
}

// ------------------------------------------------------------ file changelog

const LINEAGE: &str = "5f0c3f0e-8a9e-4c5b-9e0e-2f3c1d7a9b10";
const T0: i64 = 1_700_000_000_000;

fn changelog_id() -> ChangelogId {
    StoreKey::new("app", "store", 0).unwrap().changelog_id()
}

/// The records of the segment fixture: what the third writer session left
/// (the second session's record at offset 2 was lost to a torn tail).
fn segment_records() -> Vec<LoggedRecord> {
    let r = |offset: u64, ms: i64, key: &'static str, value: Option<&'static str>| LoggedRecord {
        offset,
        timestamp_ms: ms,
        key: Bytes::from(key),
        value: value.map(Bytes::from),
    };
    vec![
        r(0, T0, "alpha", Some("1")),
        r(1, T0 + 1, "beta", Some("2")),
        r(2, T0 + 20, "alpha", None),
        r(3, T0 + 21, "gamma", Some("")),
    ]
}

const SEGMENT: &str = "00000000000000000000.log";

/// Writes the file changelog fixtures with the real writer: session 1
/// appends offsets 0–1 (epoch 1), session 2 appends offset 2 (epoch 2) whose
/// frame is then torn, session 3 recovers and appends offsets 2–3 (epoch 3,
/// replacing the lost epoch 2). The random lineage is replaced by
/// [`LINEAGE`] so that regenerating gives the same bytes.
fn write_file_changelog_fixtures(out: &Path) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("log");
    let clock = ManualClock::new(T0);
    let options = FileChangelogOptions {
        clock: Arc::new(clock.clone()),
        ..FileChangelogOptions::default()
    };
    let open = || FileChangelog::open(&dir, changelog_id(), options.clone()).unwrap();
    {
        let log = open();
        log.append(&[Record::put("alpha", "1")]).unwrap();
        clock.advance_ms(1);
        log.append(&[Record::put("beta", "2")]).unwrap();
    }
    {
        clock.set_ms(T0 + 10);
        let log = open();
        log.append(&[Record::put("lost", "in a torn tail")])
            .unwrap();
    }
    let seg = dir.join(SEGMENT);
    let len = std::fs::metadata(&seg).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&seg)
        .unwrap()
        .set_len(len - 3)
        .unwrap();
    {
        clock.set_ms(T0 + 20);
        let log = open();
        assert_eq!(log.recovery_report().unwrap().next_offset, 2);
        log.append(&[Record::delete("alpha")]).unwrap();
        clock.advance_ms(1);
        log.append(&[Record::put("gamma", "")]).unwrap();
    }
    std::fs::create_dir_all(out).unwrap();
    std::fs::copy(&seg, out.join(SEGMENT)).unwrap();
    let meta = std::fs::read_to_string(dir.join("changelog.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&meta).unwrap();
    let lineage = v["lineage"].as_str().unwrap();
    std::fs::write(out.join("changelog.json"), meta.replace(lineage, LINEAGE)).unwrap();
    let write_json = |name: &str, v: &serde_json::Value| {
        let mut bytes = serde_json::to_vec_pretty(v).unwrap();
        bytes.push(b'\n');
        std::fs::write(out.join(name), bytes).unwrap();
    };
    // Version 2 did not record what compaction examined; nothing writes it
    // any more.
    let mut v2: serde_json::Value = serde_json::from_str(&meta.replace(lineage, LINEAGE)).unwrap();
    v2["format_version"] = 2.into();
    v2["horizon"]
        .as_object_mut()
        .unwrap()
        .remove("superseded_before");
    write_json("changelog_v2.json", &v2);
    // Version 1 had no epoch history either.
    let mut v1 = v2;
    v1["format_version"] = 1.into();
    v1.as_object_mut().unwrap().remove("epochs");
    write_json("changelog_v1.json", &v1);
}

#[test]
#[ignore = "rewrites tests/fixtures/file_changelog: run it (--ignored) only when a file changelog format changes"]
fn write_file_changelog_fixtures_when_asked() {
    write_file_changelog_fixtures(&fixtures("file_changelog"));
}

/// A log directory made of the segment fixture and the metadata fixture
/// `meta` (as `changelog.json`).
fn log_dir_from_fixtures(meta: &str) -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    let src = fixtures("file_changelog");
    std::fs::copy(src.join(SEGMENT), tmp.path().join(SEGMENT)).unwrap();
    std::fs::copy(src.join(meta), tmp.path().join("changelog.json")).unwrap();
    tmp
}

fn read_all(log: &FileChangelog, from: u64) -> Vec<LoggedRecord> {
    let mut reader = log.read_from(from).unwrap();
    let mut out = Vec::new();
    while let Some(batch) = reader.next_batch(2).unwrap() {
        out.extend(batch);
    }
    out
}

#[test]
fn segment_fixture_decodes() {
    let bytes = std::fs::read(fixtures("file_changelog").join(SEGMENT)).unwrap();
    let seg = decode_segment(&bytes).unwrap();
    assert_eq!(
        seg.header,
        SegmentHeader {
            base_offset: 0,
            prev_base_offset: None
        }
    );
    assert_eq!(seg.records, segment_records());
    assert!(seg.records[2].value.is_none(), "offset 2 is a tombstone");
    assert_eq!(seg.records[3].value.as_deref(), Some(&b""[..]));
    assert_eq!(seg.valid_len, bytes.len() as u64);
    assert_eq!(seg.torn_tail_bytes, 0);
    assert_eq!(&bytes[..8], b"SSNAPCL\0");
    // This build still writes the same bytes.
    assert_eq!(encode_segment(seg.header, &segment_records()), bytes);
}

#[test]
fn segment_fixture_bit_flips_are_corrupt() {
    let bytes = std::fs::read(fixtures("file_changelog").join(SEGMENT)).unwrap();
    let mut header = bytes.clone();
    header[13] ^= 0x01; // base_offset; header crc not updated
    let e = decode_segment(&header).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Corrupt, "{e}");
    // A flipped byte in the first record's key: damage followed by valid
    // frames is corruption, not a torn tail.
    let mut frame = bytes.clone();
    frame[32 + 32] ^= 0x01;
    let e = decode_segment(&frame).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Corrupt, "{e}");
}

#[test]
fn changelog_v3_fixture_opens_with_its_epoch_history_and_horizon() {
    changelog_fixture_opens("changelog.json", Horizon::default());
}

#[test]
fn changelog_v2_fixture_opens_as_compacted_up_to_its_end() {
    // Version 2 did not record what compaction examined: the whole log is
    // taken as possibly compacted (point-in-time reads below its end are
    // refused), never as untouched.
    let tmp = changelog_fixture_opens(
        "changelog_v2.json",
        Horizon {
            superseded_before: 4,
            ..Horizon::default()
        },
    );
    let log =
        FileChangelog::open(tmp.path(), changelog_id(), FileChangelogOptions::default()).unwrap();
    log.append(&[Record::put("delta", "4")]).unwrap();
    drop(log);
    let v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(tmp.path().join("changelog.json")).unwrap()).unwrap();
    assert_eq!(v["format_version"], 3);
    assert_eq!(v["horizon"]["superseded_before"], 4, "kept by the upgrade");
    let log = FileChangelog::open_read_only(tmp.path(), changelog_id()).unwrap();
    assert_eq!(log.horizon().unwrap().superseded_before, 4);
}

/// Opens the log of the segment fixture with metadata fixture `meta`,
/// read-only and as a writer, checks what it reads, and returns the
/// directory (its metadata as the writer open left it: not rewritten).
fn changelog_fixture_opens(meta: &str, horizon: Horizon) -> tempfile::TempDir {
    let tmp = log_dir_from_fixtures(meta);
    let before: serde_json::Value =
        serde_json::from_slice(&std::fs::read(tmp.path().join("changelog.json")).unwrap()).unwrap();
    for read_only in [true, false] {
        let log = if read_only {
            FileChangelog::open_read_only(tmp.path(), changelog_id()).unwrap()
        } else {
            FileChangelog::open(tmp.path(), changelog_id(), FileChangelogOptions::default())
                .unwrap()
        };
        assert_eq!(log.is_read_only(), read_only);
        assert!(log.recovery_report().is_none(), "nothing to repair");
        assert_eq!(log.lineage().unwrap(), Lineage(LINEAGE.into()));
        assert_eq!(log.horizon().unwrap(), horizon);
        assert_eq!(log.start_offset().unwrap(), 0);
        assert_eq!(log.end_offset().unwrap(), 4);
        // Epoch 1 wrote 0–1; epoch 2 lost its record; epoch 3 wrote 2–3.
        let epochs: Vec<_> = (0..5).map(|o| log.epoch_at(o).unwrap()).collect();
        assert_eq!(epochs, vec![Some(1), Some(1), Some(3), Some(3), None]);
        assert_eq!(read_all(&log, 0), segment_records());
        assert_eq!(read_all(&log, 2), segment_records()[2..].to_vec());
    }
    let v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(tmp.path().join("changelog.json")).unwrap()).unwrap();
    assert_eq!(
        v, before,
        "an open that appends nothing leaves the metadata as it was"
    );
    assert_eq!(
        v["epochs"],
        serde_json::json!([{"epoch": 1, "start_offset": 0}, {"epoch": 3, "start_offset": 2}])
    );
    tmp
}

#[test]
fn changelog_v1_fixture_opens_and_is_upgraded_by_the_next_append() {
    let tmp = log_dir_from_fixtures("changelog_v1.json");
    {
        let log = FileChangelog::open_read_only(tmp.path(), changelog_id()).unwrap();
        assert_eq!(log.lineage().unwrap(), Lineage(LINEAGE.into()));
        assert_eq!(log.end_offset().unwrap(), 4);
        assert_eq!(log.epoch_at(0).unwrap(), None, "version 1 has no epochs");
        assert_eq!(log.epoch_at(3).unwrap(), None);
        assert_eq!(read_all(&log, 0), segment_records());
    }
    let log =
        FileChangelog::open(tmp.path(), changelog_id(), FileChangelogOptions::default()).unwrap();
    assert_eq!(log.lineage().unwrap(), Lineage(LINEAGE.into()));
    assert_eq!(log.horizon().unwrap().tombstones_before, 0);
    assert_eq!(log.epoch_at(3).unwrap(), None);
    assert_eq!(log.append(&[Record::put("delta", "4")]).unwrap(), vec![4]);
    assert_eq!(
        log.epoch_at(3).unwrap(),
        None,
        "history starts at the upgrade"
    );
    assert_eq!(log.epoch_at(4).unwrap(), Some(1));
    let v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(tmp.path().join("changelog.json")).unwrap()).unwrap();
    assert_eq!(v["format_version"], 3);
    assert_eq!(v["lineage"], LINEAGE);
    assert_eq!(
        v["horizon"]["superseded_before"], 4,
        "a version 1 log may have been compacted up to its end"
    );
    assert_eq!(
        v["epochs"],
        serde_json::json!([{"epoch": 1, "start_offset": 4}])
    );
    let got = read_all(&log, 3);
    assert_eq!(got.len(), 2);
    assert_eq!(got[0], segment_records()[3]);
    assert_eq!((got[1].offset, &got[1].key[..]), (4, &b"delta"[..]));
}

#[test]
fn changelog_fixtures_belong_to_their_topic() {
    let tmp = log_dir_from_fixtures("changelog.json");
    let other = StoreKey::new("app", "other", 0).unwrap().changelog_id();
    let e = FileChangelog::open_read_only(tmp.path(), other).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Config, "{e}");
    assert_eq!(e.reason(), Some(Reason::OtherChangelog), "{e}");
}

/// The committed fixtures are what the current writer produces (with the
/// lineage pinned): the layout of `changelog.json` and the segment bytes
/// have not drifted.
#[test]
fn file_changelog_fixtures_are_current() {
    let tmp = tempfile::tempdir().unwrap();
    write_file_changelog_fixtures(tmp.path());
    for name in [
        SEGMENT,
        "changelog.json",
        "changelog_v2.json",
        "changelog_v1.json",
    ] {
        let committed = std::fs::read(fixtures("file_changelog").join(name)).unwrap();
        let fresh = std::fs::read(tmp.path().join(name)).unwrap();
        assert_eq!(committed, fresh, "{name}");
    }
}
