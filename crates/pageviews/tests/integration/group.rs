//! The moving-partitions scenario against the real servers the test script
//! starts (tansu: `STATESNAP_TEST_KAFKA_BOOTSTRAP`; s3s-fs:
//! `STATESNAP_TEST_S3_URL` and `AWS_*`). Unset, the test is skipped loudly,
//! or fails when `STATESNAP_REQUIRE_KAFKA=1` / `STATESNAP_REQUIRE_S3=1`.
#![allow(clippy::unwrap_used)]

use crate::common;

use common::{report_or_logs, scenario_config, servers};
use pageviews::scenario;

/// Two processes share 6 partitions; a third joins; one leaves gracefully;
/// one is SIGKILLed; the first comes back; input flows throughout. The
/// scenario fails unless every partition's state and the de-duplicated
/// output equal the single-process model, every open after a graceful
/// handoff replayed nothing, and the killed process's partitions came back
/// from a snapshot (not a full replay).
#[test]
fn partitions_move_between_processes_and_state_stays_exact() {
    let Some((bootstrap, repo)) = servers() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let config = scenario_config("pvt", bootstrap, &repo, dir.path(), 6);
    let report = report_or_logs(scenario::run(&config), dir.path());
    println!("{}", scenario::table(&report));
    // What the scenario checked, visible here too.
    assert!(report.input_records > 0);
    assert_eq!(report.final_opens.len(), 6);
    assert!(
        report
            .final_opens
            .iter()
            .all(|(_, source, replayed)| source == "snapshot" && *replayed == 0)
    );
    let kinds: Vec<&str> = report.classified.iter().map(|(_, k)| k.as_str()).collect();
    assert!(
        kinds.contains(&"handoff snapshot"),
        "no open used a handoff snapshot: {kinds:?}"
    );
    // The killed process's partitions came back from a snapshot or a local
    // store plus the tail, never a full replay (check_moves); each is
    // listed.
    assert!(!report.killed_reopens.is_empty(), "{kinds:?}");
    assert!(
        report
            .killed_reopens
            .iter()
            .all(|(_, kind, _)| kind != "replay"),
        "{:?}",
        report.killed_reopens
    );
    assert_eq!(report.killed, vec!["b".to_owned()]);
    // A store opened from a handoff snapshot replays nothing.
    for (m, kind) in &report.classified {
        if kind == "handoff snapshot" {
            assert_eq!(m.records_replayed, Some(0), "{m:?}");
        }
    }
}
