//! The changelog conformance suite against [`FileChangelog`], with each fsync
//! policy and with tiny segments (so that every check also crosses segment
//! boundaries).
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use statesnap::changelog::ChangelogId;
use statesnap::changelog::file::{FileChangelog, FileChangelogOptions, FsyncPolicy};
use statesnap::conformance::changelog as suite;

fn id() -> ChangelogId {
    ChangelogId::new("app-store-changelog", 0).unwrap()
}

fn run(options: FileChangelogOptions) {
    let mut dirs = Vec::new();
    suite::run_all(&mut || {
        let dir = tempfile::tempdir().unwrap();
        let log = FileChangelog::open(dir.path().join("log"), id(), options.clone()).unwrap();
        dirs.push(dir);
        log
    });
}

#[test]
fn conformance_default_options() {
    run(FileChangelogOptions::default());
}

#[test]
fn conformance_small_segments_no_fsync() {
    run(FileChangelogOptions {
        segment_bytes: 512,
        fsync: FsyncPolicy::Never,
        ..FileChangelogOptions::default()
    });
}

#[test]
fn conformance_interval_fsync() {
    run(FileChangelogOptions {
        segment_bytes: 4096,
        fsync: FsyncPolicy::Interval(Duration::from_millis(5)),
        ..FileChangelogOptions::default()
    });
}

#[test]
fn conformance_reopen() {
    for segment_bytes in [64 * 1024 * 1024, 300] {
        let dir = tempfile::tempdir().unwrap();
        let options = FileChangelogOptions {
            segment_bytes,
            ..FileChangelogOptions::default()
        };
        suite::reopen_keeps_records_and_lineage(&mut || {
            FileChangelog::open(dir.path(), id(), options.clone()).unwrap()
        });
    }
}
