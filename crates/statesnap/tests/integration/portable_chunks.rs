//! The portable chunk format on disk: v1 fixtures still load, corrupt chunks
//! fail cleanly (kind `corrupt`, no panic, bounded allocation), random and
//! mutated bytes never panic the decoder, and a snapshot with a corrupt
//! chunk makes restore fall back.
//!
//! Fixtures live in `tests/fixtures/portable/`; regenerate them
//! (`cargo test --test integration -- --ignored portable_chunks::write_fixtures`) only
//! when the format version changes: old fixtures must keep loading.
#![allow(clippy::unwrap_used)]

use crate::common;

use bytes::Bytes;
use proptest::prelude::*;
use std::path::PathBuf;

use statesnap::changelog::{Changelog, Record};
use statesnap::format::StoreFormat;
use statesnap::format::portable::chunk::{ChunkBuilder, HEADER_LEN, ZSTD_LEVEL, decode_chunk};
use statesnap::format::portable::{PortableFormat, chunk_path};
use statesnap::repo::{ChangelogPosition, ManifestDraft, SnapshotWriter, StoreKey};
use statesnap::store::LoggedStore;
use statesnap::store::MemoryStore;
use statesnap::store::StateStoreExt;
use statesnap::{ErrorKind, Reason};

fn fixtures() -> PathBuf {
    common::package_dir().join("tests/fixtures/portable")
}

fn fixture_records() -> Vec<(&'static str, Vec<Record>)> {
    vec![
        (
            "v1_full.sspc",
            vec![
                Record::put("", "value of the empty key"),
                Record::put("alpha", "1"),
                Record::put("beta", ""),
                Record::put("gamma", vec![0xabu8; 300]),
            ],
        ),
        (
            "v1_delta.sspc",
            vec![
                Record::delete("alpha"),
                Record::put("beta", "2"),
                Record::delete("zeta"),
            ],
        ),
        ("v1_empty.sspc", vec![]),
    ]
}

fn encode(records: &[Record]) -> Bytes {
    let mut b = ChunkBuilder::new();
    for r in records {
        b.push(&r.key, r.value.as_deref()).unwrap();
    }
    b.seal().unwrap()
}

/// Builds a chunk from a raw payload following `docs/format.md` byte by
/// byte (independently of the encoder), with valid checksums.
fn raw_chunk(payload: &[u8], record_count: u32, uncompressed_len: u32) -> Vec<u8> {
    let compressed = zstd::bulk::compress(payload, ZSTD_LEVEL).unwrap();
    let mut out = Vec::new();
    out.extend_from_slice(b"SSPC");
    out.extend_from_slice(&1u16.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    out.extend_from_slice(&record_count.to_le_bytes());
    out.extend_from_slice(&uncompressed_len.to_le_bytes());
    out.extend_from_slice(&(compressed.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32c::crc32c(payload).to_le_bytes());
    out.extend_from_slice(&crc32c::crc32c(&compressed).to_le_bytes());
    let hcrc = crc32c::crc32c(&out);
    out.extend_from_slice(&hcrc.to_le_bytes());
    assert_eq!(out.len(), HEADER_LEN);
    out.extend_from_slice(&compressed);
    out
}

/// Re-seals the header checksum after editing header fields.
fn reseal_header(b: &mut [u8]) {
    let crc = crc32c::crc32c(&b[..HEADER_LEN - 4]);
    b[HEADER_LEN - 4..HEADER_LEN].copy_from_slice(&crc.to_le_bytes());
}

fn corrupt_fixtures() -> Vec<(&'static str, Vec<u8>)> {
    let good = encode(&fixture_records()[0].1).to_vec();
    let mut flipped = good.clone();
    let last = flipped.len() - 1;
    flipped[last] ^= 0x01;
    let truncated = good[..good.len() - 5].to_vec();
    let mut bad_header_crc = good.clone();
    bad_header_crc[9] ^= 0x40; // record count, header crc not updated
    let mut bad_payload_crc = good.clone();
    bad_payload_crc[24] ^= 0xff;
    reseal_header(&mut bad_payload_crc);
    let mut huge = good.clone();
    huge[12..16].copy_from_slice(&u32::MAX.to_le_bytes());
    reseal_header(&mut huge);
    // A valid frame whose single record claims a 4 GiB key.
    let mut payload = Vec::new();
    payload.extend_from_slice(&0xffff_fff0u32.to_le_bytes());
    payload.extend_from_slice(b"k\x00");
    let absurd_key = raw_chunk(&payload, 1, payload.len() as u32);
    // Claims 1 KiB uncompressed, decompresses to 8 MiB of zeros.
    let bomb_payload = vec![0u8; 8 << 20];
    let mut bomb = raw_chunk(&bomb_payload, 1, 1024);
    bomb[20..24].copy_from_slice(&0u32.to_le_bytes());
    reseal_header(&mut bomb);
    vec![
        ("corrupt_flipped_byte.sspc", flipped),
        ("corrupt_truncated.sspc", truncated),
        ("corrupt_header_checksum.sspc", bad_header_crc),
        ("corrupt_payload_checksum.sspc", bad_payload_crc),
        ("corrupt_huge_uncompressed_len.sspc", huge),
        ("corrupt_absurd_key_len.sspc", absurd_key),
        ("corrupt_decompression_bomb.sspc", bomb),
        (
            "corrupt_not_a_chunk.sspc",
            b"PK\x03\x04 this is a zip file, not a statesnap chunk".to_vec(),
        ),
    ]
}

#[test]
#[ignore = "rewrites tests/fixtures/portable: run it (--ignored) only when the chunk format changes"]
fn write_fixtures_when_asked() {
    std::fs::create_dir_all(fixtures()).unwrap();
    for (name, recs) in fixture_records() {
        std::fs::write(fixtures().join(name), encode(&recs)).unwrap();
    }
    for (name, bytes) in corrupt_fixtures() {
        std::fs::write(fixtures().join(name), bytes).unwrap();
    }
}

#[test]
fn v1_fixtures_still_load() {
    for (name, recs) in fixture_records() {
        let bytes = std::fs::read(fixtures().join(name)).unwrap();
        let chunk = decode_chunk(&bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(chunk.records, recs, "{name}");
        assert_eq!(chunk.header.version, 1);
        // This build still writes the same bytes (deterministic encoding).
        assert_eq!(
            encode(&recs)[..],
            bytes[..],
            "{name} re-encodes identically"
        );
    }
}

#[test]
fn corrupt_fixtures_fail_cleanly() {
    for (name, generated) in corrupt_fixtures() {
        let bytes = std::fs::read(fixtures().join(name)).unwrap();
        assert_eq!(bytes, generated, "{name} fixture is current");
        let err = decode_chunk(&bytes).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Corrupt, "{name}: {err}");
        assert_eq!(err.reason(), None, "{name}: {err}");
        println!("{name}: {err}");
    }
}

#[test]
fn specific_corruptions_are_corrupt() {
    let read = |n: &str| std::fs::read(fixtures().join(n)).unwrap();
    for n in [
        "corrupt_truncated.sspc",
        "corrupt_header_checksum.sspc",
        "corrupt_payload_checksum.sspc",
        "corrupt_huge_uncompressed_len.sspc",
        "corrupt_absurd_key_len.sspc",
        "corrupt_decompression_bomb.sspc",
        "corrupt_not_a_chunk.sspc",
    ] {
        let err = decode_chunk(&read(n)).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Corrupt, "{n}: {err}");
    }
}

#[test]
fn newer_version_is_a_config_error() {
    let mut b = encode(&fixture_records()[0].1).to_vec();
    b[4..6].copy_from_slice(&2u16.to_le_bytes());
    reseal_header(&mut b);
    let e = decode_chunk(&b).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Config, "{e}");
    assert_eq!(e.reason(), Some(Reason::UnsupportedVersion), "{e}");
}

fn arb_records() -> impl Strategy<Value = Vec<Record>> {
    proptest::collection::btree_map(
        proptest::collection::vec(any::<u8>(), 0..12),
        proptest::option::of(proptest::collection::vec(any::<u8>(), 0..40)),
        0..40,
    )
    .prop_map(|m| {
        m.into_iter()
            .map(|(k, v)| Record {
                key: Bytes::from(k),
                value: v.map(Bytes::from),
            })
            .collect()
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Random bytes: the decoder returns a `corrupt` error (or, with
    /// astronomically small probability, a valid chunk) and never panics.
    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
        let mut with_magic = b"SSPC\x01\x00".to_vec();
        with_magic.extend_from_slice(&bytes);
        for input in [&bytes, &with_magic] {
            if let Err(e) = decode_chunk(input) {
                prop_assert_eq!(e.kind(), ErrorKind::Corrupt, "{}", e);
            }
        }
    }

    /// Every single-byte change and every truncation of a valid chunk is
    /// detected as corrupt (header and payload are both checksummed).
    #[test]
    fn mutated_chunks_fail_as_corrupt(
        recs in arb_records(),
        pos in any::<prop::sample::Index>(),
        xor in 1u8..=255,
        cut in any::<prop::sample::Index>(),
    ) {
        let good = encode(&recs);
        prop_assert_eq!(&decode_chunk(&good).unwrap().records, &recs);
        let mut bad = good.to_vec();
        let i = pos.index(bad.len());
        bad[i] ^= xor;
        let e = decode_chunk(&bad).unwrap_err();
        prop_assert_eq!(e.kind(), ErrorKind::Corrupt);
        let n = cut.index(good.len());
        let e = decode_chunk(&good[..n]).unwrap_err();
        prop_assert_eq!(e.kind(), ErrorKind::Corrupt);
    }

    /// Payloads with valid checksums but arbitrary record bytes: framing
    /// errors are corrupt, never a panic or an oversized allocation.
    #[test]
    fn checksummed_garbage_payloads_fail_cleanly(
        payload in proptest::collection::vec(any::<u8>(), 0..200),
        count in 0u32..50,
    ) {
        let chunk = raw_chunk(&payload, count, payload.len() as u32);
        if let Err(e) = decode_chunk(&chunk) {
            prop_assert_eq!(e.kind(), ErrorKind::Corrupt);
        }
    }
}

/// A snapshot whose chunk blob is intact (hash matches) but does not decode
/// is skipped as corrupt, and restore falls back to the older snapshot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restore_falls_back_past_an_undecodable_chunk() {
    let dir = tempfile::tempdir().unwrap();
    let log = common::file_log(&dir.path().join("log"), "app", "s");
    let mut ls = LoggedStore::new(MemoryStore::new(), log).unwrap();
    let (repo, _) = common::memory_repo();
    let sk = StoreKey::new("app", "s", 0).unwrap();
    let fmt = PortableFormat::memory();
    ls.put("a", "1");
    ls.commit().unwrap();
    let good = common::snapshot(&fmt, ls.store(), &repo, &sk, ls.changelog(), None).await;
    ls.put("b", "2");
    ls.commit().unwrap();
    // A newer "snapshot" whose one chunk has a bad payload checksum.
    let mut w = SnapshotWriter::new(&repo, sk.clone());
    let bad = std::fs::read(fixtures().join("corrupt_payload_checksum.sspc")).unwrap();
    w.put_bytes(&chunk_path(0, 0), Bytes::from(bad))
        .await
        .unwrap();
    let draft = ManifestDraft {
        store_key: sk.clone(),
        changelog: ChangelogPosition {
            topic: ls.changelog().id().topic.clone(),
            partition: 0,
            offset: ls.store().applied_offset_value(),
            lineage: ls.changelog().lineage().unwrap(),
            epoch: None,
        },
        store_format: fmt.id(),
        parent: Some(good.snapshot_id),
        depends_on: vec![],
        files: vec![],
        stats: Default::default(),
        format_metadata: serde_json::json!({
            "chunk_version": 1,
            "layers": [{"kind": "full", "offset": 1, "records": 4, "logical_bytes": 10, "chunks": 1}]
        }),
        required_features: vec![],
    };
    let bad_m = w.commit(draft).await.unwrap();
    let target = dir.path().join("restored");
    let (store, report) = common::restore_latest(
        &PortableFormat::memory(),
        &repo,
        &sk,
        ls.changelog(),
        &target,
    )
    .await
    .unwrap();
    assert_eq!(report.snapshot, Some(good.snapshot_id));
    assert_eq!(report.skipped.len(), 1);
    assert_eq!(report.skipped[0].id, bad_m.snapshot_id);
    assert_eq!(report.skipped[0].kind, ErrorKind::Corrupt);
    let got: Vec<_> = store.iter().unwrap().map(|kv| kv.unwrap().0).collect();
    assert_eq!(got, vec![Bytes::from("a"), Bytes::from("b")]);
}

trait AppliedOffset {
    fn applied_offset_value(&self) -> u64;
}
impl AppliedOffset for MemoryStore {
    fn applied_offset_value(&self) -> u64 {
        statesnap::store::StateStore::applied_offset(self)
            .unwrap()
            .unwrap()
    }
}
