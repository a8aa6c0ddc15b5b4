//! The integration tests of `statesnap`, one module per subject, in one
//! test binary: each binary links RocksDB and librdkafka, so thirty binaries
//! cost CI minutes of linking for nothing (`cargo test --test integration
//! MODULE::` runs one module).

#![allow(clippy::unwrap_used)]

mod common;

mod changelog_conformance;
mod crash_kill;
mod digest_follow;
mod exactness;
mod file_changelog;
mod format_conformance;
mod format_fixtures;
mod kafka_changelog;
mod logged_model;
mod point_in_time;
mod portable_chunks;
mod portable_cross_store;
mod portable_hostile;
mod portable_incremental;
mod portable_model;
mod portable_restore_crash;
mod repo_conformance;
mod repo_faults;
mod repo_hostile;
mod repo_verify;
mod reshard;
mod restore_target;
mod rocks_snapshot;
mod runtime;
mod simulation;
mod snapshot_retry;
mod standby;
mod store_conformance;
mod store_owner;
