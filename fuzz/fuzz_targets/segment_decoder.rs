//! Feeds arbitrary bytes to the file changelog's segment decoder, which must
//! never panic and must reject bad input as corrupt (or, for a valid header
//! of another version, as a config error).
#![no_main]

use libfuzzer_sys::fuzz_target;
use statesnap::ErrorKind;
use statesnap::changelog::file::decode_segment;

fuzz_target!(|data: &[u8]| {
    match decode_segment(data) {
        Ok(seg) => {
            assert_eq!(seg.valid_len + seg.torn_tail_bytes, data.len() as u64);
            let mut last = None;
            for r in &seg.records {
                assert!(last.is_none_or(|l| r.offset > l), "offsets must increase");
                assert!(r.offset >= seg.header.base_offset);
                last = Some(r.offset);
            }
        }
        Err(e) => assert!(
            matches!(e.kind(), ErrorKind::Corrupt | ErrorKind::Config),
            "unexpected error kind: {e}"
        ),
    }
});
