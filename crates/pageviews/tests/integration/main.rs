//! The tests of the example consumer-group application, in one test binary
//! (one link, not five): `cargo test -p pageviews --test integration
//! MODULE::` runs one scenario.

#![allow(clippy::unwrap_used)]

mod common;

mod group;
mod outage;
mod partitioner;
mod reshard;
mod standby;
