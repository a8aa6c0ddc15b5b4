//! Warm standbys in the consumer group, against the real servers the test
//! script starts (tansu, s3s-fs; skipped loudly without them, or failing
//! under `STATESNAP_REQUIRE_*=1`).
#![allow(clippy::unwrap_used)]

use crate::common;

use common::{report_or_logs, scenario_config, servers};
use pageviews::scenario::{self, ScenarioConfig};

/// Two processes follow each other's partitions as standbys; one is
/// SIGKILLed while input flows; the survivor takes the killed one's
/// partitions by promoting its standbys — nothing downloaded, only the
/// lag replayed — and the state and outputs stay exact.
#[test]
fn a_killed_owners_partitions_are_promoted_from_standbys() {
    let Some((bootstrap, repo)) = servers() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let config = ScenarioConfig {
        standbys: 1,
        ..scenario_config("pvs", bootstrap, &repo, dir.path(), 6)
    };
    let report = report_or_logs(scenario::run_standby(&config), dir.path());
    println!("{}", scenario::table(&report));
    for (p, kind, replayed) in &report.killed_reopens {
        println!("partition {p} of the killed process: {kind}, {replayed} records replayed");
    }
    assert_eq!(report.killed, vec!["a".to_owned()]);
    let promotions: Vec<_> = report
        .classified
        .iter()
        .filter(|(m, kind)| kind == "standby" && m.event == "opened")
        .collect();
    assert!(!promotions.is_empty(), "{:?}", report.killed_reopens);
    // Every promotion (the killed process's partitions, and any while the
    // group first settled) downloaded nothing.
    for (m, _) in &promotions {
        assert_eq!(m.downloaded, Some(0), "{m:?}");
    }
    assert!(
        report
            .killed_reopens
            .iter()
            .any(|(_, kind, _)| kind == "standby"),
        "{:?}",
        report.killed_reopens
    );
    // The standbys' bootstraps are in the report (from a snapshot once the
    // owner took one, by replaying the short log before that).
    let bootstraps: Vec<_> = report
        .moves
        .iter()
        .filter(|m| m.event == "standby")
        .collect();
    assert!(!bootstraps.is_empty());
    assert_eq!(report.final_opens.len(), 6);
}
