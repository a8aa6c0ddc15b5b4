//! The tests of the `statesnap` command line, in one test binary (one link
//! of RocksDB and librdkafka, not three): `cargo test -p statesnap-cli --test
//! integration MODULE::` runs one module.

#![allow(clippy::unwrap_used)]

mod common;

mod cli;
mod reshard;
mod signals;
