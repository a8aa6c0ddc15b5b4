//! Feeds arbitrary bytes to the manifest decoder, which must never panic and
//! must reject bad input as corrupt (or, for an unknown format version or
//! required feature, as a config error). A manifest that decodes must, once
//! resealed, encode and decode again to the same manifest.
//!
//! The first input byte picks the mode: raw bytes, or the input as a JSON
//! value whose checksum is recomputed (so the fuzzer gets past the checksum
//! and reaches the shape and semantic checks).
#![no_main]

use libfuzzer_sys::fuzz_target;
use statesnap::ErrorKind;
use statesnap::repo::Manifest;

const KEY: &str =
    "stores/app.store.0/manifests/00000000000000000042-01ARZ3NDEKTSV4RRFFQ69G5FAV.json";

fn check(key: &str, data: &[u8]) {
    match Manifest::decode(key, data) {
        Ok(mut m) => {
            // Unknown plain fields are covered by the stored checksum but
            // not kept: reseal before re-encoding.
            m.seal().expect("a decoded manifest seals");
            let again = m.encode().expect("a decoded manifest encodes");
            let back = Manifest::decode(key, &again).expect("a re-encoded manifest decodes");
            assert_eq!(back, m, "round trip");
        }
        Err(e) => assert!(
            matches!(e.kind(), ErrorKind::Corrupt | ErrorKind::Config),
            "unexpected error kind: {e}"
        ),
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    if mode % 2 == 0 {
        check(KEY, rest);
        // A key that is not a manifest key skips the key/body agreement check.
        check("not/a/manifest/key", rest);
        return;
    }
    let Ok(mut v) = serde_json::from_slice::<serde_json::Value>(rest) else {
        return;
    };
    let Ok(body) = Manifest::canonical_body(&v) else {
        return;
    };
    if let Some(obj) = v.as_object_mut() {
        obj.insert(
            "checksum".into(),
            blake3::hash(&body).to_hex().to_string().into(),
        );
    }
    let sealed = serde_json::to_vec(&v).expect("a json value serializes");
    check(KEY, &sealed);
    check("not/a/manifest/key", &sealed);
});
