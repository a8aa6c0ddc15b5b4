//! statesnap's `Murmur2` partitioner places every key where a Kafka
//! producer does: records produced through librdkafka with
//! `partitioner=murmur2_random` (the Java client's placement) land, on the
//! broker the test script starts, in the partition `Murmur2` names.

use crate::common;

use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::producer::{FutureProducer, FutureRecord};
use statesnap::reshard::{Murmur2, Partitioner};

use common::{env_or_skip, unique};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn murmur2_places_keys_where_librdkafka_does() {
    let Some(bootstrap) = env_or_skip("STATESNAP_TEST_KAFKA_BOOTSTRAP", "STATESNAP_REQUIRE_KAFKA")
    else {
        return;
    };
    let partitions = 7u32;
    let topic = unique("murmur2");
    pageviews::kafka::create_topics(&bootstrap, &[(&topic, partitions as i32)])
        .await
        .expect("create topic");
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("partitioner", "murmur2_random")
        .set("message.timeout.ms", "30000")
        .create()
        .expect("producer");
    // Text keys of every length mod 4 (the hash's tail cases), and binary
    // keys with high bytes (sign extension is where ports go wrong).
    let mut keys: Vec<Vec<u8>> = (0..200).map(|i| format!("user-{i}").into_bytes()).collect();
    keys.extend((0..64u8).map(|i| vec![0xff - i; usize::from(i % 9) + 1]));
    keys.push(b"a".to_vec());
    let mut spread = std::collections::BTreeSet::new();
    for key in &keys {
        let record = FutureRecord::<[u8], str>::to(&topic).key(key).payload("x");
        let partition = producer
            .send(record, Duration::from_secs(30))
            .await
            .unwrap_or_else(|(e, _)| panic!("produce: {e}"))
            .partition;
        let ours = Murmur2.partition(key, partitions);
        assert_eq!(
            u32::try_from(partition).expect("partition"),
            ours,
            "key {key:?}: librdkafka chose {partition}, Murmur2 {ours}"
        );
        spread.insert(ours);
    }
    assert_eq!(
        spread.len(),
        partitions as usize,
        "every partition was used"
    );
}
