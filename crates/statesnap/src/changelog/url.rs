//! Naming a changelog by URL, for tools that read one (the CLI's `plan`
//! and `restore`): `file://DIR` for the embedded file log, and
//! `kafka://HOST:PORT/TOPIC/PARTITION` for a Kafka topic partition.
//!
//! Each backend a URL can name is one row of `SCHEMES`: its prefix, the
//! shape its URLs take, and how to read the rest of the URL into a
//! `Location` that opens the changelog. A new backend adds a row (and
//! its `Location`); parsing, the error for a bad URL and opening follow
//! from the table.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use super::{Changelog, ChangelogId};
use crate::error::{Error, Result};

/// One backend a changelog URL can name: a row of `SCHEMES`.
struct ChangelogScheme {
    /// What its URLs start with: `file://`.
    prefix: &'static str,
    /// Its URLs' shape, as the error for a bad URL lists it: `file://DIR`.
    shape: &'static str,
    /// Reads what follows the prefix, or says what is wrong with it.
    parse: fn(&str) -> std::result::Result<Arc<dyn Location>, &'static str>,
}

/// Every backend a changelog URL can name, in the order the error for a
/// bad URL lists them.
const SCHEMES: &[ChangelogScheme] = &[
    ChangelogScheme {
        prefix: "file://",
        shape: "file://DIR",
        parse: FileLocation::parse,
    },
    ChangelogScheme {
        prefix: "kafka://",
        shape: "kafka://HOST:PORT/TOPIC/PARTITION",
        parse: KafkaLocation::parse,
    },
];

/// What a changelog URL names, read by its scheme's `parse`: it opens the
/// changelog.
trait Location: fmt::Debug + Send + Sync {
    /// Opens the changelog. `id` is the changelog the caller expects.
    fn open(&self, id: ChangelogId, how: OpenAs) -> Result<Box<dyn Changelog>>;
}

/// How a [`Location`] opens its changelog.
#[derive(Debug, Clone, Copy)]
enum OpenAs {
    /// Only to read it (nothing created).
    Reader,
    /// To write to it, created if missing; a missing Kafka topic gets this
    /// many partitions (`None`: the client's default).
    Writer { topic_partitions: Option<u32> },
}

/// Where a changelog URL points.
#[derive(Debug, Clone)]
pub struct ChangelogUrl {
    location: Arc<dyn Location>,
}

impl std::str::FromStr for ChangelogUrl {
    type Err = Error;

    fn from_str(url: &str) -> Result<Self> {
        let bad = |why: &str| {
            let shapes: Vec<&str> = SCHEMES.iter().map(|s| s.shape).collect();
            Error::config(format!(
                "bad changelog url url=`{}`: {why}; use {}",
                url.escape_debug(),
                shapes.join(" or ")
            ))
        };
        for scheme in SCHEMES {
            if let Some(rest) = url.strip_prefix(scheme.prefix) {
                let location = (scheme.parse)(rest).map_err(bad)?;
                return Ok(ChangelogUrl { location });
            }
        }
        Err(bad("unknown scheme"))
    }
}

impl ChangelogUrl {
    /// Opens the changelog to write to it, as a store's writer does: the
    /// file log is created if missing (and locked), a Kafka topic is
    /// created if missing. `id` is the changelog a file log must be.
    pub fn open(&self, id: ChangelogId) -> Result<Box<dyn Changelog>> {
        self.location.open(
            id,
            OpenAs::Writer {
                topic_partitions: None,
            },
        )
    }

    /// [`ChangelogUrl::open`] for one partition of a topic of `partitions`
    /// partitions: a missing Kafka topic is created with that many (a
    /// reshard's targets); a file log is one directory per partition.
    pub fn open_partition_of(
        &self,
        id: ChangelogId,
        partitions: u32,
    ) -> Result<Box<dyn Changelog>> {
        self.location.open(
            id,
            OpenAs::Writer {
                topic_partitions: Some(partitions),
            },
        )
    }

    /// Opens the changelog for reading: the file log read-only (no lock,
    /// nothing created; it must exist), Kafka with default options (the
    /// topic must exist). `id` is the changelog a file log must be; a Kafka
    /// URL names its own topic and partition.
    pub fn open_for_reading(&self, id: ChangelogId) -> Result<Box<dyn Changelog>> {
        self.location.open(id, OpenAs::Reader)
    }
}

/// `file://DIR`: the file log in this directory; its id is the one the
/// caller expects (the file log checks it against what it recorded).
#[derive(Debug, PartialEq, Eq)]
struct FileLocation(PathBuf);

impl FileLocation {
    fn parse(path: &str) -> std::result::Result<Arc<dyn Location>, &'static str> {
        if path.is_empty() {
            return Err("no directory");
        }
        Ok(Arc::new(FileLocation(PathBuf::from(path))))
    }
}

impl Location for FileLocation {
    fn open(&self, id: ChangelogId, how: OpenAs) -> Result<Box<dyn Changelog>> {
        let dir = &self.0;
        if let OpenAs::Writer { .. } = how {
            Ok(Box::new(super::file::FileChangelog::open(
                dir,
                id,
                Default::default(),
            )?))
        } else {
            Ok(Box::new(super::file::FileChangelog::open_read_only(
                dir, id,
            )?))
        }
    }
}

/// `kafka://HOST:PORT/TOPIC/PARTITION`: a Kafka topic partition.
#[derive(Debug, PartialEq, Eq)]
#[cfg_attr(not(feature = "kafka"), allow(dead_code))]
struct KafkaLocation {
    /// `host:port[,host:port...]`.
    bootstrap_servers: String,
    /// The topic.
    topic: String,
    /// The partition.
    partition: u32,
}

impl KafkaLocation {
    fn parse(rest: &str) -> std::result::Result<Arc<dyn Location>, &'static str> {
        let mut parts = rest.splitn(3, '/');
        let (servers, topic, partition) = (parts.next(), parts.next(), parts.next());
        let (Some(servers), Some(topic), Some(partition)) = (servers, topic, partition) else {
            return Err("expected HOST:PORT/TOPIC/PARTITION after kafka://");
        };
        if servers.is_empty() || topic.is_empty() {
            return Err("empty broker address or topic");
        }
        let partition = partition
            .parse()
            .map_err(|_| "the partition is not a number")?;
        Ok(Arc::new(KafkaLocation {
            bootstrap_servers: servers.to_owned(),
            topic: topic.to_owned(),
            partition,
        }))
    }
}

impl Location for KafkaLocation {
    #[cfg(feature = "kafka")]
    fn open(&self, _id: ChangelogId, how: OpenAs) -> Result<Box<dyn Changelog>> {
        let id = ChangelogId::new(self.topic.clone(), self.partition)?;
        let mut options = super::kafka::KafkaOptions::new(self.bootstrap_servers.clone());
        match how {
            OpenAs::Reader => options.create_topic = false,
            OpenAs::Writer { topic_partitions } => {
                options.create_topic = true;
                if let Some(n) = topic_partitions {
                    options.partitions = i32::try_from(n).unwrap_or(i32::MAX);
                }
            }
        }
        Ok(Box::new(super::kafka::KafkaChangelog::open(id, options)?))
    }

    #[cfg(not(feature = "kafka"))]
    fn open(&self, _id: ChangelogId, _how: OpenAs) -> Result<Box<dyn Changelog>> {
        Err(Error::config(
            "this build has no Kafka support; rebuild with the `kafka` feature",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse_or_say_what_is_wrong() {
        assert_eq!(
            format!(
                "{:?}",
                "file:///tmp/log".parse::<ChangelogUrl>().unwrap().location
            ),
            format!("{:?}", FileLocation("/tmp/log".into()))
        );
        assert_eq!(
            format!(
                "{:?}",
                "kafka://127.0.0.1:9092/shop-carts-changelog/3"
                    .parse::<ChangelogUrl>()
                    .unwrap()
                    .location
            ),
            format!(
                "{:?}",
                KafkaLocation {
                    bootstrap_servers: "127.0.0.1:9092".into(),
                    topic: "shop-carts-changelog".into(),
                    partition: 3
                }
            )
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
        }
    }
}
