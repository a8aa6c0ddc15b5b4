//! The group's membership board, for placing standbys: each process
//! publishes the input partitions it owns to a one-partition topic
//! (`<app>-members`, keyed by the process name) every half second, reads
//! everyone's, and follows as standbys the partitions
//! [`statesnap::group::place_standbys`] gives it. Every process computes
//! the same placement from the same board.
//!
//! A process that leaves gracefully writes a tombstone; a killed one's
//! entry stays until it is older than `expire`, so its partitions keep
//! their standbys until the group has given them to someone else.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};
use serde::{Deserialize, Serialize};

use crate::Result;

/// The board's topic for application `app_id`.
pub fn members_topic(app_id: &str) -> String {
    format!("{app_id}-members")
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Entry {
    partitions: Vec<i32>,
    at_ms: i64,
}

/// One process's view of the board.
pub struct Board {
    topic: String,
    name: String,
    expire: Duration,
    producer: BaseProducer,
    consumer: BaseConsumer,
    entries: BTreeMap<String, Entry>,
}

impl std::fmt::Debug for Board {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Board")
            .field("topic", &self.topic)
            .field("name", &self.name)
            .field("entries", &self.entries)
            .finish_non_exhaustive()
    }
}

impl Board {
    /// Joins the board of `topic` as `name`; entries older than `expire`
    /// count as gone.
    pub fn new(bootstrap: &str, topic: &str, name: &str, expire: Duration) -> Result<Board> {
        let producer: BaseProducer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .set("linger.ms", "0")
            .create()?;
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .set("group.id", format!("{topic}-{name}-reader"))
            .set("enable.auto.commit", "false")
            .create()?;
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(topic, 0, Offset::Beginning)?;
        consumer.assign(&tpl)?;
        Ok(Board {
            topic: topic.to_owned(),
            name: name.to_owned(),
            expire,
            producer,
            consumer,
            entries: BTreeMap::new(),
        })
    }

    /// Publishes that this process owns `partitions` (at `now_ms`).
    pub fn publish(&mut self, partitions: &[i32], now_ms: i64) -> Result<()> {
        let entry = Entry {
            partitions: partitions.to_vec(),
            at_ms: now_ms,
        };
        let value = serde_json::to_vec(&entry)?;
        self.producer
            .send(
                BaseRecord::to(&self.topic)
                    .partition(0)
                    .key(&self.name)
                    .payload(&value),
            )
            .map_err(|(e, _)| e)?;
        self.producer.poll(Duration::ZERO);
        self.entries.insert(self.name.clone(), entry);
        Ok(())
    }

    /// Leaves the board (a tombstone), waiting up to 5 s for the broker.
    pub fn leave(&mut self) -> Result<()> {
        self.producer
            .send(
                BaseRecord::<str, [u8]>::to(&self.topic)
                    .partition(0)
                    .key(&self.name),
            )
            .map_err(|(e, _)| e)?;
        self.producer.flush(Duration::from_secs(5))?;
        Ok(())
    }

    /// Reads what the other processes published since the last call.
    pub fn read(&mut self) -> Result<()> {
        while let Some(m) = self.consumer.poll(Duration::ZERO) {
            let m = m?;
            let Some(key) = m.key().map(|k| String::from_utf8_lossy(k).into_owned()) else {
                continue;
            };
            if key == self.name {
                continue; // this process's own entry is what it publishes
            }
            match m.payload() {
                None => {
                    self.entries.remove(&key);
                }
                Some(v) => match serde_json::from_slice::<Entry>(v) {
                    Ok(e) => {
                        self.entries.insert(key, e);
                    }
                    Err(e) => tracing::warn!(member = key, error = %e, "unreadable board entry"),
                },
            }
        }
        Ok(())
    }

    /// The live members (entries newer than `expire` at `now_ms`) and the
    /// partitions each owns.
    pub fn owners(&self, now_ms: i64) -> BTreeMap<String, BTreeSet<i32>> {
        let expire = i64::try_from(self.expire.as_millis()).unwrap_or(i64::MAX);
        self.entries
            .iter()
            .filter(|(_, e)| now_ms.saturating_sub(e.at_ms) <= expire)
            .map(|(n, e)| (n.clone(), e.partitions.iter().copied().collect()))
            .collect()
    }
}
