//! `pageviews`: an example stream processor on statesnap.
//!
//! A Kafka consumer group counts page views per user — views, sessions
//! (30 minutes of inactivity ends one), views in the current session — in
//! one RocksDB store per input partition, and writes an update per view to
//! an output topic. Partitions move between processes through the group's
//! rebalances; their state moves with them through handoff snapshots in an
//! S3 repository ([`statesnap::group`]), so a moved partition is ready
//! without replaying its changelog.
//!
//! - [`model`]: the logic and a single-process model of it;
//! - [`app`]: one process of the group;
//! - [`scenario`]: several processes coming and going while input flows,
//!   checked against the model;
//! - [`bench`]: time to ready of a moved partition, handoff vs replay.

pub mod app;
pub mod bench;
pub mod board;
pub mod kafka;
pub mod model;
pub mod scenario;

/// Errors of the example: anything, with a message.
pub type Result<T, E = Box<dyn std::error::Error + Send + Sync>> = std::result::Result<T, E>;
