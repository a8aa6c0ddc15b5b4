//! Point-in-time restores are exact or refused: an offset past the log's
//! end is refused (`config`, naming the end); on a compacted log, a replay
//! that stops before the end may miss records compaction dropped in favour
//! of later writes, so such a restore is refused (`stale`) unless a source
//! sits exactly at the offset, and every answer given equals the log's
//! state at that offset.
#![allow(clippy::unwrap_used)]

use crate::common;

use std::collections::BTreeMap;
use std::path::Path;

use bytes::Bytes;
use statesnap::changelog::file::{CompactOptions, FileChangelog, FileChangelogOptions};
use statesnap::changelog::{Changelog, Record};
use statesnap::restore::{PlanOptions, Source, plan_restore};
use statesnap::{
    ErrorKind, LoggedStore, MemoryStore, PortableFormat, Repository, RestoreOptions, StoreKey,
    restore_store,
};

use common::{Kv, contents, memory_repo};

const KEYS: u64 = 10;

fn sk() -> StoreKey {
    StoreKey::new("app", "pit", 0).unwrap()
}

fn open_log(dir: &Path) -> FileChangelog {
    let id = StoreKey::new("app", "pit", 0).unwrap().changelog_id();
    let options = FileChangelogOptions {
        // Small segments: most of the log is closed, so compaction reaches it.
        segment_bytes: 512,
        ..FileChangelogOptions::default()
    };
    FileChangelog::open(dir, id, options).unwrap()
}

/// Record `i` writes key `i % KEYS` (every key is written again ten
/// records later) and every seventh one deletes it.
fn record(i: u64) -> Record {
    let k = Bytes::from(format!("k{}", i % KEYS));
    if i % 7 == 6 {
        Record::delete(k)
    } else {
        Record::put(k, Bytes::from(format!("v{i}")))
    }
}

/// The log's state at offset `o`: records `0..=o` applied in order.
fn model_at(o: u64) -> Kv {
    let mut m = BTreeMap::new();
    for i in 0..=o {
        let r = record(i);
        match r.value {
            Some(v) => {
                m.insert(r.key, v);
            }
            None => {
                m.remove(&r.key);
            }
        }
    }
    m
}

/// A log of `n` records, with a snapshot after each offset in `snaps`.
async fn build(dir: &Path, repo: &Repository, n: u64, snaps: &[u64]) -> FileChangelog {
    let format = PortableFormat::memory();
    let mut ls = LoggedStore::new(MemoryStore::new(), open_log(&dir.join("log"))).unwrap();
    let mut parent = None;
    for i in 0..n {
        let r = record(i);
        match r.value {
            Some(v) => ls.put(r.key, v),
            None => ls.delete(r.key),
        }
        ls.commit().unwrap();
        if snaps.contains(&i) {
            let cut = statesnap::StoreFormat::capture(&format, ls.store()).unwrap();
            let m = statesnap::commit_snapshot(
                &format,
                cut,
                repo,
                &sk(),
                ls.changelog(),
                parent.as_ref(),
            )
            .await
            .unwrap();
            parent = Some(m);
        }
    }
    let (_, log) = ls.into_parts();
    log
}

/// Restores the state at `until` into a fresh directory.
async fn restore_at(
    repo: &Repository,
    log: &FileChangelog,
    dir: &Path,
    until: u64,
) -> statesnap::Result<(Kv, statesnap::RestoreReport)> {
    let target = dir.join(format!("at-{until}"));
    let options = RestoreOptions {
        until: Some(until),
        ..RestoreOptions::default()
    };
    let result = restore_store(
        &PortableFormat::memory(),
        repo,
        &sk(),
        log,
        &target,
        &options,
    )
    .await;
    result.map(|(store, report)| (contents(&store), report))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_offset_past_the_logs_end_is_refused_naming_the_end() {
    let dir = tempfile::tempdir().unwrap();
    let (repo, _) = memory_repo();
    let log = build(dir.path(), &repo, 50, &[19]).await;
    assert_eq!(log.end_offset().unwrap(), 50);
    for until in [50, 51, 99_999_999, u64::MAX] {
        let plan = plan_at(&repo, &log, &dir.path().join("p"), until).await;
        let e = plan.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Config, "{until}: {e}");
        let e = restore_at(&repo, &log, dir.path(), until)
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Config, "{until}: {e}");
        assert!(
            !dir.path().join(format!("at-{until}")).exists(),
            "a refused restore creates nothing"
        );
    }
    // The last record's offset is the newest point in time.
    let (kv, _) = restore_at(&repo, &log, dir.path(), 49).await.unwrap();
    assert_eq!(kv, model_at(49));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_point_in_time_is_exact_on_a_log_that_never_compacted() {
    let dir = tempfile::tempdir().unwrap();
    let (repo, _) = memory_repo();
    let log = build(dir.path(), &repo, 120, &[29, 79]).await;
    assert_eq!(log.horizon().unwrap().superseded_before, 0);
    for until in 0..120 {
        let (kv, report) = restore_at(&repo, &log, dir.path(), until).await.unwrap();
        assert_eq!(kv, model_at(until), "until={until}");
        let want = if until >= 79 {
            Some(79)
        } else if until >= 29 {
            Some(29)
        } else {
            None
        };
        assert_eq!(report.snapshot_offset, want, "until={until}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_point_in_time_on_a_compacted_log_is_exact_or_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (repo, _) = memory_repo();
    let log = build(dir.path(), &repo, 300, &[29, 150]).await;
    let report = log.compact(&CompactOptions::default()).unwrap();
    assert!(report.records_after < report.records_before, "{report:?}");
    let horizon = log.horizon().unwrap();
    assert_eq!(
        horizon.superseded_before, 300,
        "compaction examined the whole log"
    );
    let (mut exact, mut refused) = (Vec::new(), Vec::new());
    for until in 0..300 {
        match restore_at(&repo, &log, dir.path(), until).await {
            Ok((kv, report)) => {
                assert_eq!(kv, model_at(until), "until={until}: {report:?}");
                exact.push(until);
            }
            Err(e) => {
                assert_eq!(e.kind(), ErrorKind::Stale, "until={until}: {e}");
                assert!(
                    !dir.path().join(format!("at-{until}")).exists(),
                    "a refused restore creates nothing"
                );
                refused.push(until);
            }
        }
    }
    // Exact: the snapshots' own offsets and the log's last record.
    assert_eq!(exact, vec![29, 150, 299]);
    assert_eq!(refused.len(), 297);
}

/// The plan for the state at `until`.
async fn plan_at(
    repo: &Repository,
    log: &FileChangelog,
    dir: &Path,
    until: u64,
) -> statesnap::Result<statesnap::restore::RestorePlan> {
    let options = PlanOptions {
        until: Some(until),
        ..PlanOptions::default()
    };
    plan_restore(&PortableFormat::memory(), repo, &sk(), log, dir, &options).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_plan_refuses_with_the_exact_points_and_skips_later_snapshots_silently() {
    let dir = tempfile::tempdir().unwrap();
    let (repo, _) = memory_repo();
    let log = build(dir.path(), &repo, 200, &[49, 99, 149]).await;
    let plan = |until| plan_at(&repo, &log, dir.path(), until);
    // Uncompacted: the newest snapshot at or before 120 is chosen, and the
    // snapshot after it is no rejected candidate (nothing is wrong with it).
    let p = plan(120).await.unwrap();
    assert_eq!(p.chosen().unwrap().source.start_offset(), Some(99), "{p:?}");
    assert!(p.rejected.is_empty(), "{:?}", p.rejected);
    assert!(matches!(p.steps.last().unwrap().source, Source::FullReplay));

    log.compact(&CompactOptions::default()).unwrap();
    // At a snapshot's offset: exact, nothing to replay.
    let p = plan(99).await.unwrap();
    assert_eq!(p.chosen().unwrap().source.start_offset(), Some(99));
    assert_eq!(p.chosen().unwrap().records_to_replay, 0);
    // Between snapshots: refused, stale, naming every exact point in time
    // in ascending order — the snapshots after the point too (each is
    // exact at its own offset).
    let e = plan(120).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Stale, "{e}");
    assert!(
        e.to_string()
            .contains("the exact points in time are offsets 49, 99 and 149, and "),
        "{e}"
    );
    // Nothing older than the point can stand in either: every candidate
    // below it is listed with a stale verdict when some source is exact.
    let p = plan(149).await.unwrap();
    assert_eq!(p.steps.len(), 1, "{:?}", p.steps);
    assert!(
        p.rejected
            .iter()
            .all(|r| r.kind == ErrorKind::Stale && r.source.start_offset() < Some(149)),
        "{:?}",
        p.rejected
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_runtime_opens_a_point_in_time_exactly_or_refuses() {
    use statesnap::{StateManager, StoreSpec};
    let dir = tempfile::tempdir().unwrap();
    let (repo, _) = memory_repo();
    let log = build(dir.path(), &repo, 200, &[99]).await;
    log.compact(&CompactOptions::default()).unwrap();
    drop(log);
    let m = StateManager::builder(repo).build().unwrap();
    let spec = |until: u64| {
        let log = FileChangelog::open_read_only(
            dir.path().join("log"),
            StoreKey::new("app", "pit", 0).unwrap().changelog_id(),
        )
        .unwrap();
        StoreSpec::new(
            sk(),
            log,
            PortableFormat::memory(),
            dir.path().join(format!("h{until}")),
        )
        .at_offset(until)
    };
    let h = m.open(spec(99)).await.unwrap();
    assert_eq!(contents(h.store()), model_at(99));
    drop(h);
    let e = m.open(spec(120)).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Stale, "{e}");
    let e = m.open(spec(200)).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Config, "{e}");
    m.shutdown().await;
}
