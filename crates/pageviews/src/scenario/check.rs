//! Checking a scenario run: how each partition's state moved
//! ([`classify`], [`check_moves`]), the outputs and the final state of every
//! partition against the model ([`verify`]), and the report as a table.

use std::collections::{BTreeMap, BTreeSet};

use statesnap::group::recorded_position;
use statesnap::reshard::{Murmur2, Partitioner};
use statesnap::restore::Source;
use statesnap::{KafkaChangelog, Repository, RocksFormat, StateHandle, StateManager};

use super::{ScenarioConfig, ScenarioReport, input_topic, output_topic, repo_options};
use crate::Result;
use crate::app::{MoveLine, changelog_options, store_spec};
use crate::kafka::read_topic;
use crate::model::{Model, Output, UserState};

/// Names each open by where its state came from: `local`, `handoff
/// snapshot` (the snapshot the partition's previous close handed over),
/// `older snapshot` (a background one, or an earlier handoff), or
/// `replay`. `moves` in time order.
pub fn classify(moves: &[MoveLine]) -> Vec<(MoveLine, String)> {
    let mut handed: BTreeMap<i32, Option<String>> = BTreeMap::new();
    moves
        .iter()
        .map(|m| {
            let what = match (m.event.as_str(), m.source.as_deref()) {
                ("opened", source) => {
                    let last = handed.remove(&m.partition).flatten();
                    match source {
                        Some("local") => "local".to_owned(),
                        Some("snapshot") if m.snapshot.is_some() && m.snapshot == last => {
                            "handoff snapshot".to_owned()
                        }
                        Some("snapshot") => "older snapshot".to_owned(),
                        Some("standby") => "standby".to_owned(),
                        _ => "replay".to_owned(),
                    }
                }
                ("closed", _) => {
                    handed.insert(m.partition, m.snapshot.clone());
                    "closed".to_owned()
                }
                // A standby's bootstrap moves no partition.
                ("standby", _) => "standby bootstrap".to_owned(),
                (e, _) => {
                    handed.remove(&m.partition);
                    e.to_owned()
                }
            };
            (m.clone(), what)
        })
        .collect()
}

/// The move invariants: an open after a graceful close replays nothing;
/// the partitions of the killed process open from a snapshot, not a full
/// replay; nothing failed. Returns the number of graceful moves whose next
/// owner began opening before the old owner's close had ended: the broker
/// gave the partition away before the revoke was done (tansu 0.6.0 does not
/// always wait for a member's rejoin; see `docs/consumer-group.md`). Those
/// may replay the old owner's last commit; the exactness check covers them.
pub fn check_moves(moves: &[MoveLine], killed: &str, killed_held: &BTreeSet<i32>) -> Result<usize> {
    let mut overlapping = 0;
    for m in moves {
        if m.event == "failed" {
            return Err(format!("a store failed to open: {m:?}").into());
        }
        if m.event == "opened" && m.source.as_deref() == Some("standby") && m.downloaded != Some(0)
        {
            return Err(format!(
                "a promoted standby downloaded {:?} bytes: {m:?}",
                m.downloaded
            )
            .into());
        }
        if m.event != "closed" {
            continue;
        }
        // The next owner's open is the first to end after this close
        // began: with a broker that does not wait for the revoke, it may
        // even end before the close does.
        let close_started = m.at_ms - i64::try_from(m.duration_ms).unwrap_or(i64::MAX);
        let Some(n) = moves
            .iter()
            .find(|n| n.partition == m.partition && n.event == "opened" && n.at_ms > close_started)
        else {
            continue;
        };
        let open_started = n.at_ms - i64::try_from(n.duration_ms).unwrap_or(i64::MAX);
        if open_started < m.at_ms {
            overlapping += 1;
            continue;
        }
        // A promoted standby replays its lag: what it had not applied of
        // the old owner's last commits.
        if n.source.as_deref() == Some("standby") {
            continue;
        }
        if n.records_replayed != Some(0) {
            return Err(format!(
                "partition {} was handed off by {} (snapshot {:?}) and then opened by {} \
                 replaying {:?} records, expected 0: {n:?}",
                m.partition, m.process, m.snapshot, n.process, n.records_replayed
            )
            .into());
        }
    }
    for p in killed_held {
        // The killed process's last open of p, then the next open elsewhere.
        let Some(last) = moves
            .iter()
            .rposition(|m| m.process == killed && m.partition == *p && m.event == "opened")
        else {
            continue;
        };
        let Some(n) = moves[last + 1..]
            .iter()
            .find(|n| n.partition == *p && n.event == "opened")
        else {
            return Err(
                format!("partition {p} of the killed process was never opened again").into(),
            );
        };
        if !matches!(n.source.as_deref(), Some("snapshot" | "local" | "standby")) {
            return Err(format!(
                "partition {p} of the killed process reopened by {} from {:?}, expected a \
                 standby, or its last background snapshot and the tail",
                n.process, n.source
            )
            .into());
        }
    }
    Ok(overlapping)
}

/// Feeds the input to `model` (empty, or holding the state of earlier
/// input generations) and compares the outputs and every partition's
/// final state with it.
pub async fn verify(
    config: &ScenarioConfig,
    report: &mut ScenarioReport,
    model: &mut Model,
) -> Result<()> {
    let ends = verify_outputs(config, report, model)?;
    let repo = Repository::open(&config.repo, repo_options(config)).await?;
    let manager = StateManager::builder(repo).build()?;
    let kafka = changelog_options(&config.bootstrap, config.partitions);
    for p in 0..config.partitions {
        let dir = config.dir.join("verify").join(p.to_string());
        let spec = store_spec(&config.app_id, &kafka, p as u32, dir)?;
        let handle = manager.open(spec).await?;
        let r = handle.report();
        let source = match &r.source {
            Source::Local { .. } => "local",
            Source::Snapshot { .. } => "snapshot",
            Source::FullReplay => "replay",
            Source::Standby { .. } => "standby",
        };
        report
            .final_opens
            .push((p, source.to_owned(), r.replay.records));
        let states = verify_states(&handle, p, model)?;
        let position = recorded_position(&handle)?;
        let end = ends.get(&p).copied().unwrap_or(0);
        if end > 0 && position != Some(end) {
            return Err(format!(
                "partition {p}: the state's input position is {position:?}, the input ends at {end}"
            )
            .into());
        }
        report.users_checked += states;
        handle.abandon().await;
        if r_records(&report.final_opens, p) != 0 {
            return Err(format!(
                "partition {p}: opening after the final handoff replayed {} records, expected 0",
                r_records(&report.final_opens, p)
            )
            .into());
        }
    }
    manager.shutdown().await;
    Ok(())
}

/// Feeds the input to the model and compares the outputs with its: each
/// input's output, repeats identical. Returns the input's end offsets.
fn verify_outputs(
    config: &ScenarioConfig,
    report: &mut ScenarioReport,
    model: &mut Model,
) -> Result<BTreeMap<i32, i64>> {
    let (input, ends) = read_topic(&config.bootstrap, &input_topic(&config.app_id))?;
    let partitions = u32::try_from(config.partitions)?;
    for r in &input {
        // The feeder places each user's events as the Java client does; a
        // reshard by the same function puts each user's state there too.
        let key = r.key.as_deref().unwrap_or_default();
        let expected = Murmur2.partition(key, partitions);
        if u32::try_from(r.partition).ok() != Some(expected) {
            return Err(format!(
                "input record {}/{} of key {:?} is not in the partition murmur2 names ({expected})",
                r.partition,
                r.offset,
                String::from_utf8_lossy(key)
            )
            .into());
        }
        model.feed(r.partition, r.offset, &r.value);
    }
    report.input_records = input.len();

    let (output, _) = read_topic(&config.bootstrap, &output_topic(&config.app_id))?;
    let mut seen: BTreeMap<(i32, i64), Output> = BTreeMap::new();
    for r in &output {
        let o: Output = serde_json::from_slice(&r.value).map_err(|e| {
            format!(
                "output at {}/{} does not decode: {e}",
                r.partition, r.offset
            )
        })?;
        let key = (o.partition, o.offset);
        if let Some(first) = seen.get(&key) {
            if first != &o {
                return Err(format!(
                    "output for input {key:?} repeated with another value: {first:?} then {o:?}"
                )
                .into());
            }
            report.output_repeats += 1;
        } else {
            seen.insert(key, o);
        }
    }
    report.output_records = output.len();
    if seen != model.outputs {
        let missing: Vec<_> = model
            .outputs
            .keys()
            .filter(|k| !seen.contains_key(k))
            .take(5)
            .collect();
        let wrong: Vec<_> = model
            .outputs
            .iter()
            .filter(|(k, v)| seen.get(k).is_some_and(|s| s != *v))
            .take(3)
            .collect();
        return Err(format!(
            "outputs differ from the model: {} distinct vs {} expected; missing e.g. {missing:?}; \
             different e.g. {wrong:?}",
            seen.len(),
            model.outputs.len()
        )
        .into());
    }
    Ok(ends)
}

/// Partition `p`'s users as the opened store holds them, compared with the
/// model's; returns how many there are.
fn verify_states(
    handle: &StateHandle<RocksFormat, KafkaChangelog>,
    p: i32,
    model: &Model,
) -> Result<usize> {
    let mut states: BTreeMap<String, UserState> = BTreeMap::new();
    for kv in handle.range(
        std::ops::Bound::Included(b"user/".as_slice()),
        std::ops::Bound::Excluded(b"user0".as_slice()),
    )? {
        let (k, v) = kv?;
        let user = String::from_utf8_lossy(&k["user/".len()..]).into_owned();
        states.insert(user, serde_json::from_slice(&v)?);
    }
    let expected = model.states.get(&p).cloned().unwrap_or_default();
    if states != expected {
        let diff: Vec<_> = expected
            .iter()
            .filter(|(u, s)| states.get(*u) != Some(s))
            .take(3)
            .map(|(u, s)| (u.clone(), s.clone(), states.get(u).cloned()))
            .collect();
        return Err(format!(
            "partition {p}: state differs from the model ({} users vs {} expected); e.g. \
             (user, expected, found) {diff:?}",
            states.len(),
            expected.len()
        )
        .into());
    }
    Ok(states.len())
}

fn r_records(opens: &[(i32, String, u64)], p: i32) -> u64 {
    opens.iter().find(|o| o.0 == p).map_or(0, |o| o.2)
}

/// The report as a table.
pub fn table(report: &ScenarioReport) -> String {
    let mut t = comfy_table::Table::new();
    t.set_header([
        "process",
        "partition",
        "move",
        "source",
        "records replayed",
        "input position",
        "ms",
    ]);
    for (m, what) in &report.classified {
        t.add_row([
            m.process.clone(),
            m.partition.to_string(),
            m.event.clone(),
            if m.event == "opened" {
                what.clone()
            } else {
                m.detail.clone().unwrap_or_default()
            },
            m.records_replayed
                .map(|r| r.to_string())
                .unwrap_or_default(),
            m.position.map(|p| p.to_string()).unwrap_or_default(),
            m.duration_ms.to_string(),
        ]);
    }
    format!(
        "{t}\ninput records: {}; outputs: {} ({} repeats, identical); users checked: {}; \
         final opens (partition, source, replayed): {:?}; handoffs the broker did not wait for: {}; \
         the killed process's partitions came back from (partition, source, replayed): {:?}",
        report.input_records,
        report.output_records,
        report.output_repeats,
        report.users_checked,
        report.final_opens,
        report.overlapping_moves,
        report.killed_reopens
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn mv(process: &str, partition: i32, event: &str, at_ms: i64, duration_ms: u64) -> MoveLine {
        MoveLine {
            process: process.into(),
            at_ms,
            partition,
            event: event.into(),
            duration_ms,
            ..MoveLine::default()
        }
    }

    fn opened(
        process: &str,
        at_ms: i64,
        duration_ms: u64,
        source: &str,
        replayed: u64,
    ) -> MoveLine {
        MoveLine {
            source: Some(source.into()),
            records_replayed: Some(replayed),
            snapshot: (source == "snapshot").then(|| "s1".to_owned()),
            ..mv(process, 0, "opened", at_ms, duration_ms)
        }
    }

    fn closed(process: &str, at_ms: i64, duration_ms: u64) -> MoveLine {
        MoveLine {
            snapshot: Some("s1".into()),
            ..mv(process, 0, "closed", at_ms, duration_ms)
        }
    }

    #[test]
    fn an_open_after_a_handoff_must_replay_nothing() {
        let none = BTreeSet::new();
        let ok = [
            opened("a", 100, 10, "replay", 0),
            closed("a", 1000, 500),
            opened("b", 1500, 300, "snapshot", 0),
        ];
        assert_eq!(check_moves(&ok, "x", &none).unwrap(), 0);
        let bad = [
            opened("a", 100, 10, "replay", 0),
            closed("a", 1000, 500),
            opened("b", 1500, 300, "snapshot", 5),
        ];
        assert!(check_moves(&bad, "x", &none).is_err());
        assert_eq!(classify(&ok)[2].1, "handoff snapshot");
    }

    #[test]
    fn an_open_that_began_before_the_close_ended_is_counted_not_failed() {
        let none = BTreeSet::new();
        // The next owner's open ended even before the close did.
        let early = [
            opened("a", 100, 10, "replay", 0),
            opened("b", 900, 300, "snapshot", 1),
            closed("a", 1000, 500),
        ];
        assert_eq!(check_moves(&early, "x", &none).unwrap(), 1);
        assert_eq!(classify(&early)[1].1, "older snapshot");
        // Began before the close ended, ended after it.
        let late = [
            opened("a", 100, 10, "replay", 0),
            closed("a", 1000, 500),
            opened("b", 1100, 300, "snapshot", 1),
        ];
        assert_eq!(check_moves(&late, "x", &none).unwrap(), 1);
    }

    #[test]
    fn the_killed_process_partitions_must_not_come_back_by_full_replay() {
        let held: BTreeSet<i32> = [0].into();
        let replayed = [
            opened("b", 100, 10, "replay", 0),
            opened("c", 9000, 100, "replay", 500),
        ];
        assert!(check_moves(&replayed, "b", &held).is_err());
        let snapshot = [
            opened("b", 100, 10, "replay", 0),
            opened("c", 9000, 100, "snapshot", 500),
        ];
        assert_eq!(check_moves(&snapshot, "b", &held).unwrap(), 0);
        let never = [opened("b", 100, 10, "replay", 0)];
        assert!(check_moves(&never, "b", &held).is_err());
    }
}
