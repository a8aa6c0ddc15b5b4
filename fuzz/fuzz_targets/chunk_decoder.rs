//! Fuzzes the portable chunk decoder: any input must decode or fail with a
//! `corrupt`/`config` error — never panic, never allocate beyond the
//! header's (capped) claim. A chunk that decodes must re-encode to the same
//! bytes (the format is canonical).
#![no_main]

use libfuzzer_sys::fuzz_target;
use statesnap::ErrorKind;
use statesnap::format::portable::chunk::{ChunkBuilder, decode_chunk};

fuzz_target!(|data: &[u8]| {
    match decode_chunk(data) {
        Ok(chunk) => {
            let mut b = ChunkBuilder::new();
            for r in &chunk.records {
                b.push(&r.key, r.value.as_deref()).expect("decoded keys are ascending");
            }
            let again = b.seal().expect("decoded chunk re-encodes");
            // The zstd frame may differ from a foreign encoder's, so compare
            // records rather than bytes.
            let round = decode_chunk(&again).expect("re-encoded chunk decodes");
            assert_eq!(round.records, chunk.records);
        }
        Err(e) => assert!(matches!(e.kind(), ErrorKind::Corrupt | ErrorKind::Config)),
    }
});
