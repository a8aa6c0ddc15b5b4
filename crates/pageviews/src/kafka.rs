//! Small Kafka helpers for the app, its scenario and its tests: topic
//! creation, reading a topic to its end, and group offsets.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::RDKafkaErrorCode;
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};

use crate::Result;

const TIMEOUT: Duration = Duration::from_secs(60);

fn config(bootstrap: &str) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", bootstrap);
    c
}

/// Creates `topics` (name, partitions) unless they exist.
pub async fn create_topics(bootstrap: &str, topics: &[(&str, i32)]) -> Result<()> {
    let admin: AdminClient<DefaultClientContext> = config(bootstrap).create()?;
    let new: Vec<NewTopic<'_>> = topics
        .iter()
        .map(|(name, partitions)| NewTopic::new(name, *partitions, TopicReplication::Fixed(1)))
        .collect();
    let results = admin
        .create_topics(&new, &AdminOptions::new().operation_timeout(Some(TIMEOUT)))
        .await?;
    for r in results {
        match r {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((topic, code)) => return Err(format!("creating topic `{topic}`: {code}").into()),
        }
    }
    Ok(())
}

/// The end offset (high watermark) of each partition of `topic`.
pub fn end_offsets(bootstrap: &str, topic: &str) -> Result<BTreeMap<i32, i64>> {
    let consumer: BaseConsumer = config(bootstrap).create()?;
    let metadata = consumer.fetch_metadata(Some(topic), TIMEOUT)?;
    let t = metadata
        .topics()
        .first()
        .ok_or_else(|| format!("topic `{topic}` not in metadata"))?;
    if t.partitions().is_empty() {
        return Err(format!("topic `{topic}` has no partitions (does it exist?)").into());
    }
    let mut out = BTreeMap::new();
    for p in t.partitions() {
        let (_, high) = consumer.fetch_watermarks(topic, p.id(), TIMEOUT)?;
        out.insert(p.id(), high);
    }
    Ok(out)
}

/// A client of group `group` that reads its committed offsets
/// ([`committed_offsets`]) without joining it.
pub fn group_client(bootstrap: &str, group: &str) -> Result<BaseConsumer> {
    Ok(config(bootstrap).set("group.id", group).create()?)
}

/// The offsets `client`'s group committed for `partitions` of `topic`
/// (partitions without a commit are left out).
pub fn committed_offsets(
    client: &BaseConsumer,
    topic: &str,
    partitions: impl IntoIterator<Item = i32>,
) -> Result<BTreeMap<i32, i64>> {
    let mut tpl = TopicPartitionList::new();
    for p in partitions {
        tpl.add_partition(topic, p);
    }
    let committed = client.committed_offsets(tpl, TIMEOUT)?;
    Ok(committed
        .elements()
        .iter()
        .filter_map(|e| match e.offset() {
            Offset::Offset(o) => Some((e.partition(), o)),
            _ => None,
        })
        .collect())
}

/// One record read back from a topic.
#[derive(Debug, Clone)]
pub struct ReadRecord {
    /// Partition.
    pub partition: i32,
    /// Offset.
    pub offset: i64,
    /// Key.
    pub key: Option<Vec<u8>>,
    /// Value.
    pub value: Vec<u8>,
}

/// Every record of `topic` up to its end offsets at the call, partition by
/// partition in offset order, and those end offsets.
pub fn read_topic(bootstrap: &str, topic: &str) -> Result<(Vec<ReadRecord>, BTreeMap<i32, i64>)> {
    let ends = end_offsets(bootstrap, topic)?;
    let consumer: BaseConsumer = config(bootstrap)
        .set("group.id", "pageviews-reader")
        .set("enable.auto.commit", "false")
        .create()?;
    let mut tpl = TopicPartitionList::new();
    for p in ends.keys() {
        tpl.add_partition_offset(topic, *p, Offset::Beginning)?;
    }
    consumer.assign(&tpl)?;
    let mut by_partition: BTreeMap<i32, Vec<ReadRecord>> = BTreeMap::new();
    let mut pos: BTreeMap<i32, i64> = ends.keys().map(|p| (*p, 0)).collect();
    let mut idle_since = Instant::now();
    while pos.iter().any(|(p, o)| *o < ends[p]) {
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => {
                idle_since = Instant::now();
                if m.offset() >= ends[&m.partition()] {
                    continue;
                }
                pos.insert(m.partition(), m.offset() + 1);
                by_partition
                    .entry(m.partition())
                    .or_default()
                    .push(ReadRecord {
                        partition: m.partition(),
                        offset: m.offset(),
                        key: m.key().map(<[u8]>::to_vec),
                        value: m.payload().unwrap_or_default().to_vec(),
                    });
            }
            Some(Err(e)) => return Err(format!("reading `{topic}`: {e}").into()),
            None if idle_since.elapsed() > Duration::from_secs(30) => {
                return Err(format!(
                    "reading `{topic}`: nothing for 30 s at {pos:?}, expected up to {ends:?}"
                )
                .into());
            }
            None => {}
        }
    }
    Ok((by_partition.into_values().flatten().collect(), ends))
}
