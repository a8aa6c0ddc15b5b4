//! Naming a changelog by URL, for tools that read one (the CLI's `plan`
//! and `restore`): `file://DIR` for the embedded file log, and
//! `kafka://HOST:PORT/TOPIC/PARTITION` for a Kafka topic partition.

use std::path::PathBuf;

use super::{Changelog, ChangelogId};
use crate::error::{Error, Result};

/// Where a changelog URL points.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChangelogUrl {
    /// The file log in this directory; its id is the one the caller
    /// expects (the file log checks it against what it recorded).
    File(PathBuf),
    /// A Kafka topic partition.
    Kafka {
        /// `host:port[,host:port...]`.
        bootstrap_servers: String,
        /// The topic.
        topic: String,
        /// The partition.
        partition: u32,
    },
}

impl std::str::FromStr for ChangelogUrl {
    type Err = Error;

    fn from_str(url: &str) -> Result<Self> {
        let bad = |why: &str| {
            Error::config(format!(
                "bad changelog url url=`{}`: {why}; use file://DIR or \
                 kafka://HOST:PORT/TOPIC/PARTITION",
                url.escape_debug()
            ))
        };
        if let Some(path) = url.strip_prefix("file://") {
            if path.is_empty() {
                return Err(bad("no directory"));
            }
            return Ok(ChangelogUrl::File(PathBuf::from(path)));
        }
        if let Some(rest) = url.strip_prefix("kafka://") {
            let mut parts = rest.splitn(3, '/');
            let (servers, topic, partition) = (parts.next(), parts.next(), parts.next());
            let (Some(servers), Some(topic), Some(partition)) = (servers, topic, partition) else {
                return Err(bad("expected HOST:PORT/TOPIC/PARTITION after kafka://"));
            };
            if servers.is_empty() || topic.is_empty() {
                return Err(bad("empty broker address or topic"));
            }
            let partition = partition
                .parse()
                .map_err(|_| bad("the partition is not a number"))?;
            return Ok(ChangelogUrl::Kafka {
                bootstrap_servers: servers.to_owned(),
                topic: topic.to_owned(),
                partition,
            });
        }
        Err(bad("unknown scheme"))
    }
}

impl ChangelogUrl {
    /// Opens the changelog to write to it, as a store's writer does: the
    /// file log is created if missing (and locked), a Kafka topic is
    /// created if missing. `id` is the changelog a file log must be.
    pub fn open(&self, id: ChangelogId) -> Result<Box<dyn Changelog>> {
        self.open_with(id, true)
    }

    /// Opens the changelog for reading: the file log read-only (no lock,
    /// nothing created; it must exist), Kafka with default options (the
    /// topic must exist). `id` is the changelog a file log must be; a Kafka
    /// URL names its own topic and partition.
    pub fn open_for_reading(&self, id: ChangelogId) -> Result<Box<dyn Changelog>> {
        self.open_with(id, false)
    }

    fn open_with(&self, id: ChangelogId, write: bool) -> Result<Box<dyn Changelog>> {
        match self {
            ChangelogUrl::File(dir) if write => Ok(Box::new(super::file::FileChangelog::open(
                dir,
                id,
                Default::default(),
            )?)),
            ChangelogUrl::File(dir) => Ok(Box::new(super::file::FileChangelog::open_read_only(
                dir, id,
            )?)),
            #[cfg(feature = "kafka")]
            ChangelogUrl::Kafka {
                bootstrap_servers,
                topic,
                partition,
            } => {
                let id = ChangelogId::new(topic.clone(), *partition)?;
                let mut options = super::kafka::KafkaOptions::new(bootstrap_servers.clone());
                options.create_topic = write;
                Ok(Box::new(super::kafka::KafkaChangelog::open(id, options)?))
            }
            #[cfg(not(feature = "kafka"))]
            ChangelogUrl::Kafka { .. } => Err(Error::config(
                "this build has no Kafka support; rebuild with the `kafka` feature",
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse_or_say_what_is_wrong() {
        assert_eq!(
            "file:///tmp/log".parse::<ChangelogUrl>().unwrap(),
            ChangelogUrl::File("/tmp/log".into())
        );
        assert_eq!(
            "kafka://127.0.0.1:9092/shop-carts-changelog/3"
                .parse::<ChangelogUrl>()
                .unwrap(),
            ChangelogUrl::Kafka {
                bootstrap_servers: "127.0.0.1:9092".into(),
                topic: "shop-carts-changelog".into(),
                partition: 3
            }
        );
        for bad in [
            "file://",
            "kafka://h:1/t",
            "kafka://h:1/t/x",
            "kafka:///t/1",
            "s3://b/x",
            "log",
        ] {
            let e = bad.parse::<ChangelogUrl>().unwrap_err();
            assert_eq!(e.kind(), crate::ErrorKind::Config, "{bad}");
            assert!(e.to_string().contains("file://DIR"), "{e}");
        }
    }
}
