//! Changing the partition count of a running application: the group runs
//! on 6 partitions, its state is resharded to 12, then to 4, each time onto
//! a new input topic, against the real servers the test script starts
//! (tansu: `STATESNAP_TEST_KAFKA_BOOTSTRAP`; s3s-fs: `STATESNAP_TEST_S3_URL`
//! and `AWS_*`). Unset, the test is skipped loudly, or fails when
//! `STATESNAP_REQUIRE_KAFKA=1` / `STATESNAP_REQUIRE_S3=1`.
#![allow(clippy::unwrap_used)]

use crate::common;

use common::{print_logs, scenario_config, servers};
use pageviews::scenario;

/// 6 → 12 → 4 partitions. The scenario fails unless every reshard moved
/// exactly the model's users, each into the partition murmur2 names for
/// it; every resharded partition's first open came from the reshard's
/// snapshot and replayed nothing; and each generation's state and
/// de-duplicated output equal one single-process model of every
/// generation's input in turn.
#[test]
fn the_partition_count_changes_and_state_stays_exact() {
    let Some((bootstrap, repo)) = servers() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let layout = [6, 12, 4];
    let config = scenario_config("pvr", bootstrap, &repo, dir.path(), layout[0]);
    let result = scenario::run_reshard(&config, &layout);
    let generations = match result {
        Ok(g) => g,
        Err(e) => {
            for d in scenario::generation_dirs(dir.path(), &layout) {
                print_logs(&d);
            }
            panic!("reshard scenario failed: {e}");
        }
    };
    println!("{}", scenario::reshard_table(&generations));
    // What the scenario checked, visible here too.
    assert_eq!(generations.len(), 3);
    let mut users = None;
    for (g, step) in generations.iter().enumerate() {
        assert_eq!(step.partitions, layout[g]);
        assert!(step.report.input_records > 0);
        assert_eq!(step.report.final_opens.len(), layout[g] as usize);
        match &step.reshard {
            None => assert_eq!(g, 0),
            Some(r) => {
                assert_eq!(r.keys_per_target.len(), layout[g] as usize);
                assert_eq!(r.keys_per_target.iter().sum::<u64>(), r.keys);
                // Every source partition's input position stayed behind.
                assert_eq!(r.left_behind, layout[g - 1] as u64);
                // Users are never lost: each reshard moves at least as many
                // as the one before.
                assert!(users.is_none_or(|u| r.keys >= u), "{r:?}");
                users = Some(r.keys);
                assert!(
                    step.first_opens
                        .iter()
                        .all(|(_, source, replayed)| source == "snapshot" && *replayed == 0),
                    "{:?}",
                    step.first_opens
                );
            }
        }
    }
}
