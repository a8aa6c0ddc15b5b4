//! Crash test: a child process commits through `LoggedStore<RocksStore,
//! FileChangelog>` in a loop and is killed with SIGKILL mid-commit. After
//! reopen + replay the store must equal the changelog's committed prefix, and
//! every commit the child acknowledged must still be in the changelog.
#![cfg(feature = "rocksdb")]
#![allow(clippy::unwrap_used)]

use bytes::Bytes;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};

use statesnap::changelog::file::{FileChangelog, FileChangelogOptions};
use statesnap::changelog::{Changelog, ChangelogId};
use statesnap::restore::ReplayOptions;
use statesnap::store::logged::LoggedStore;
use statesnap::store::rocks::{RocksOptions, RocksStore};
use statesnap::store::{StateStore, StateStoreExt};

const CHILD_ENV: &str = "STATESNAP_CRASH_CHILD_DIR";

fn id() -> ChangelogId {
    ChangelogId::for_store("crash", "store", 0).unwrap()
}

fn log_options() -> FileChangelogOptions {
    // Small segments so kills also land around segment rolls.
    FileChangelogOptions {
        segment_bytes: 256 << 10,
        ..FileChangelogOptions::default()
    }
}

fn open(dir: &Path) -> LoggedStore<RocksStore, FileChangelog> {
    let log = FileChangelog::open(dir.join("log"), id(), log_options()).unwrap();
    let store = RocksStore::open(dir.join("db"), &RocksOptions::default()).unwrap();
    let mut ls = LoggedStore::new(store, log).unwrap();
    ls.catch_up(&ReplayOptions::default()).unwrap();
    ls
}

/// The child: commits forever, printing each acknowledged last offset.
/// Only runs when spawned by `sigkill_mid_commit_recovers_committed_prefix`.
#[test]
#[ignore = "spawned as a child process by sigkill_mid_commit_recovers_committed_prefix"]
fn crash_child() {
    let Ok(dir) = std::env::var(CHILD_ENV) else {
        panic!("run only as a child of sigkill_mid_commit_recovers_committed_prefix");
    };
    let mut ls = open(Path::new(&dir));
    let mut n: u64 = ls.changelog().end_offset().unwrap();
    loop {
        // Batches of varying size, with deletes, spread over 500 keys.
        let size = 1 + (n % 97) as usize * 13;
        for j in 0..size {
            let k = (n.wrapping_mul(31) + j as u64 * 7) % 500;
            if (n + j as u64).is_multiple_of(5) {
                ls.delete(format!("k{k:04}"));
            } else {
                ls.put(format!("k{k:04}"), vec![(n % 251) as u8; 64 + (j % 300)]);
            }
        }
        let info = ls.commit().unwrap().unwrap();
        println!("committed {}", info.last_offset);
        n += 1;
    }
}

fn changelog_contents(log: &FileChangelog) -> BTreeMap<Bytes, Bytes> {
    let mut m = BTreeMap::new();
    let mut r = log.read_from(0).unwrap();
    while let Some(batch) = r.next_batch(4096).unwrap() {
        for rec in batch {
            match rec.value {
                Some(v) => m.insert(rec.key, v),
                None => m.remove(&rec.key),
            };
        }
    }
    m
}

#[test]
fn sigkill_mid_commit_recovers_committed_prefix() {
    let dir = tempfile::tempdir().unwrap();
    let exe = std::env::current_exe().unwrap();
    let mut acknowledged: Option<u64> = None;
    for round in 0..6u64 {
        let mut child = Command::new(&exe)
            .args([
                "--exact",
                "crash_child",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_ENV, dir.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let want = 5 + round * 37 % 60;
        let mut seen = 0;
        for line in BufReader::new(stdout).lines() {
            let line = line.unwrap();
            if let Some(o) = line.strip_prefix("committed ") {
                acknowledged = Some(o.trim().parse().unwrap());
                seen += 1;
                if seen >= want {
                    break;
                }
            }
        }
        assert!(
            seen >= want,
            "child stopped early in round {round} after {seen} commits"
        );
        // SIGKILL: no destructors, no flush, somewhere inside a commit.
        child.kill().unwrap();
        child.wait().unwrap();

        let ls = open(dir.path());
        let end = ls.changelog().end_offset().unwrap();
        let acked = acknowledged.unwrap();
        assert!(
            end > acked,
            "acknowledged commit lost: end_offset={end} acknowledged={acked}"
        );
        let applied = ls.store().applied_offset().unwrap().unwrap();
        assert!(applied < end, "store ahead of changelog");
        let want = changelog_contents(ls.changelog());
        let got: BTreeMap<Bytes, Bytes> =
            ls.store().iter().unwrap().map(|kv| kv.unwrap()).collect();
        assert_eq!(got.len(), want.len(), "round {round}: key count differs");
        assert!(
            got == want,
            "round {round}: store differs from the changelog's committed prefix"
        );
    }
}
