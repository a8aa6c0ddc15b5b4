//! Feeds arbitrary and mutated segments to the file changelog's segment
//! decoder, which must never panic, must reject bad input as corrupt (or, for
//! a valid header of another version, as a config error), and must decode an
//! unmutated encoded segment back to exactly its records.
//!
//! The first input byte picks the mode: raw bytes; a valid header followed by
//! raw bytes (so the fuzzer reaches the frame decoder without forging the
//! header CRC); or records built from the input, encoded, then mutated.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use statesnap::ErrorKind;
use statesnap::changelog::LoggedRecord;
use statesnap::changelog::file::{SegmentHeader, decode_segment, encode_segment};

fn check(data: &[u8]) -> Option<Vec<LoggedRecord>> {
    match decode_segment(data) {
        Ok(seg) => {
            assert_eq!(seg.valid_len + seg.torn_tail_bytes, data.len() as u64);
            let mut last = None;
            for r in &seg.records {
                assert!(last.is_none_or(|l| r.offset > l), "offsets must increase");
                assert!(r.offset >= seg.header.base_offset);
                last = Some(r.offset);
            }
            Some(seg.records)
        }
        Err(e) => {
            assert!(
                matches!(e.kind(), ErrorKind::Corrupt | ErrorKind::Config),
                "unexpected error kind: {e}"
            );
            None
        }
    }
}

const HEADER: SegmentHeader = SegmentHeader {
    base_offset: 100,
    prev_base_offset: Some(50),
};

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    match mode % 3 {
        0 => {
            check(rest);
        }
        1 => {
            let mut seg = encode_segment(HEADER, &[]);
            seg.extend_from_slice(rest);
            check(&seg);
        }
        _ => {
            let split = rest.len() * 3 / 4;
            let (spec, mutations) = rest.split_at(split);
            let mut records = Vec::new();
            let mut offset = HEADER.base_offset;
            for chunk in spec.chunks(17) {
                let half = chunk.len() / 2;
                records.push(LoggedRecord {
                    offset,
                    timestamp_ms: i64::from(chunk[0]) - 100,
                    key: Bytes::copy_from_slice(&chunk[1..=half.max(1).min(chunk.len() - 1)]),
                    value: (chunk[0] & 1 == 0).then(|| Bytes::copy_from_slice(&chunk[half..])),
                });
                offset += 1 + u64::from(chunk[0] >> 5);
            }
            let mut seg = encode_segment(HEADER, &records);
            if mutations.is_empty() {
                assert_eq!(check(&seg), Some(records), "round trip");
                return;
            }
            for m in mutations.chunks(3) {
                if m.len() < 3 {
                    let keep = usize::from(m[0]) * seg.len() / 256;
                    seg.truncate(keep);
                    break;
                }
                let at = usize::from(u16::from_le_bytes([m[0], m[1]])) % seg.len();
                seg[at] ^= m[2];
            }
            check(&seg);
        }
    }
});
