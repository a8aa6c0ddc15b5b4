//! Feeds arbitrary bytes, as a broker's response bodies, to the Kafka
//! wire-protocol parsers the lineage check uses to read a topic id
//! (`ApiVersions` v0 and `Metadata` v10..=12). They parse bytes from the
//! network and must never panic, loop without end or allocate by a length
//! field; whatever they return must be consistent.
//!
//! Needs the crate features `kafka` and `fuzzing` (the parsers are private
//! otherwise; see `changelog::kafka::wire_fuzz`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use statesnap::changelog::kafka::wire_fuzz::{
    TopicId, parse_api_versions, parse_metadata_response,
};

const TOPIC: &str = "app-store-changelog";

fuzz_target!(|data: &[u8]| {
    match parse_api_versions(data) {
        Ok(Ok(version)) => assert!((10..=12).contains(&version), "version {version}"),
        Ok(Err(answer)) => assert!(matches!(answer, TopicId::Unsupported(_)), "{answer:?}"),
        Err(_) => {}
    }
    match parse_metadata_response(data, TOPIC) {
        Ok(TopicId::Id(id)) => assert_ne!(id, [0u8; 16], "a zero id is not an id"),
        Ok(TopicId::UnknownTopic | TopicId::Unsupported(_)) | Err(_) => {}
    }
});
