//! `plan` (the runtime's dry run) and `restore --to DIR`.

use std::path::Path;
use std::process::ExitCode;

use serde_json::{Value, json};
use statesnap::restore::{PlanStep, RestorePlan, RestoreProgress, Source, restore_into};
use statesnap::runtime::BackgroundOptions;
use statesnap::{Error, ErrorKind, RestoreOptions, Result, StateManager, StoreSpec};

use super::{FormatKind, changelog, open_repo, store_key, with_format};
use crate::args::{PlanArgs, RestoreArgs};
use crate::out::{self, Out};

fn source_json(s: &Source) -> Value {
    match s {
        Source::Local { applied_offset } => json!({"kind": "local", "offset": applied_offset}),
        Source::Snapshot { id, offset } => {
            json!({"kind": "snapshot", "id": id.to_string(), "offset": offset})
        }
        Source::FullReplay => json!({"kind": "full_replay"}),
        Source::Standby { applied_offset } => json!({"kind": "standby", "offset": applied_offset}),
    }
}

fn step_json(s: &PlanStep) -> Value {
    json!({
        "source": source_json(&s.source),
        "bytes_to_download": s.bytes_to_download,
        "bytes_local": s.bytes_local,
        "records_to_replay": s.records_to_replay,
    })
}

fn plan_json(
    p: &RestorePlan,
    estimate: std::time::Duration,
    rates: &statesnap::restore::Rates,
) -> Value {
    json!({
        "store": p.store_key.to_string(),
        "changelog": p.changelog.to_string(),
        "end_offset": p.end_offset,
        "until": p.until,
        "chosen": p.chosen().map(step_json),
        "estimated_seconds": estimate.as_secs_f64(),
        // What the estimate assumed: the rates the snapshots recorded (or
        // conservative defaults), not a measurement of this restore.
        "estimate_rates": {
            "download_bytes_per_sec": rates.download_bytes_per_sec,
            "replay_records_per_sec": rates.replay_records_per_sec,
        },
        "steps": p.steps.iter().map(step_json).collect::<Vec<_>>(),
        "rejected": p.rejected.iter().map(|r| json!({
            "source": source_json(&r.source), "kind": r.kind.as_str(), "reason": r.reason,
        })).collect::<Vec<_>>(),
        "unreadable": p.unreadable.iter().map(|u| json!({
            "key": u.key, "kind": u.kind.as_str(), "reason": u.reason,
        })).collect::<Vec<_>>(),
    })
}

pub async fn plan(a: &PlanArgs, out: Out) -> Result<ExitCode> {
    let repo = open_repo(&a.repo).await?;
    let sk = store_key(&a.store.store)?;
    let log = changelog(&a.changelog, &sk)?;
    let kind = FormatKind::of_store(&repo, &sk).await?;
    // Without --dir there is no local store to consider: a path that does
    // not exist.
    let (_guard, nowhere) = super::scratch()?;
    let dir = a.dir.clone().unwrap_or(nowhere);
    let manager = StateManager::builder(repo)
        .background(BackgroundOptions {
            threads: 0,
            ..BackgroundOptions::default()
        })
        .build()?;
    let (plan, estimate, rates) = with_format!(kind, f => {
        let mut spec = StoreSpec::new(sk.clone(), log, f, dir);
        if let Some(o) = a.at_offset {
            spec = spec.at_offset(o);
        }
        let plan = manager.plan(&spec).await?;
        let estimate = manager.estimate(&plan);
        (plan, estimate, manager.rates())
    });
    if out.json {
        out.json(&plan_json(&plan, estimate, &rates));
        return Ok(ExitCode::SUCCESS);
    }
    crate::outln!(
        "store {} on changelog {} (end offset {}{})",
        plan.store_key,
        plan.changelog,
        plan.end_offset,
        plan.until
            .map_or(String::new(), |u| format!(", point in time {u}"))
    );
    if let Some(c) = plan.chosen() {
        crate::outln!(
            "would restore from {}: download {} (more if a local file fails its hash check), \
             reuse up to {} locally, replay up to {} records; estimated {}, a rough figure \
             at the rates the snapshots recorded ({}/s download, {:.0} records/s replay): \
             restores on this project's test machine took a third to a fifth of it",
            c.source,
            out::bytes(c.bytes_to_download),
            out::bytes(c.bytes_local),
            c.records_to_replay,
            out::secs(estimate),
            out::bytes(rates.download_bytes_per_sec as u64),
            rates.replay_records_per_sec,
        );
    }
    let mut t = out.table(&[
        "order",
        "source",
        "download",
        "local (up to)",
        "replay records (up to)",
    ]);
    for (i, s) in plan.steps.iter().enumerate() {
        t.add_row(vec![
            (i + 1).to_string(),
            s.source.to_string(),
            out::bytes(s.bytes_to_download),
            out::bytes(s.bytes_local),
            s.records_to_replay.to_string(),
        ]);
    }
    crate::outln!("fallback order:\n{t}");
    for r in &plan.rejected {
        crate::outln!("not usable: {} ({}): {}", r.source, r.kind, r.reason);
    }
    for u in &plan.unreadable {
        crate::outln!("unreadable manifest {} ({}): {}", u.key, u.kind, u.reason);
    }
    Ok(ExitCode::SUCCESS)
}

/// Whether `dir` is a directory that holds anything. The path is read as
/// the library reads a restore target: `link/` and `link/.` name the link
/// (never followed: the restore refuses it), so a link, a file or nothing
/// at all is not "non-empty" here and is left to the library to judge.
fn non_empty(dir: &Path) -> Result<bool> {
    let dir = statesnap::restore::normalize_target(dir)?;
    let io = |e: std::io::Error| {
        Error::new(
            ErrorKind::Io,
            format!("cannot read the restore target path=`{}`", dir.display()),
        )
        .with_source(e)
    };
    match std::fs::symlink_metadata(&dir) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => return Ok(false),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(io(e)),
    }
    Ok(std::fs::read_dir(&dir).map_err(io)?.next().is_some())
}

pub async fn restore(a: &RestoreArgs, out: Out) -> Result<ExitCode> {
    if non_empty(&a.to)? && !a.force {
        return Err(Error::new(
            ErrorKind::Config,
            format!(
                "the restore target is not empty path=`{}`; give an empty or new directory, or \
                 --force to replace what is there",
                a.to.display()
            ),
        ));
    }
    let repo = open_repo(&a.repo).await?;
    let sk = store_key(&a.store.store)?;
    let log = changelog(&a.changelog, &sk)?;
    let kind = FormatKind::of_store(&repo, &sk).await?;
    let progress = std::sync::Arc::new(RestoreProgress::default());
    let options = RestoreOptions {
        full_replay: a.full_replay,
        replace_unmarked: a.force,
        until: a.at_offset,
        progress: Some(progress.clone()),
        commit_gate: Some(crate::signal::gate()),
        ..RestoreOptions::default()
    };
    let started = std::time::Instant::now();
    let what = format!("restoring {sk} into {}", a.to.display());
    // The progress follows on a task of its own: the restore's replay
    // runs in place on this task's thread (`block_in_place`), and a
    // follower polled beside it would stand still until it ended.
    let follower = {
        let progress = progress.clone();
        tokio::spawn(async move { out.follow_restore(&progress, &what).await })
    };
    let report = with_format!(kind, f => {
        restore_into(&f, &repo, &sk, &*log, &a.to, &options).await
    });
    follower.abort();
    let _ = follower.await;
    let report = report?;
    let took = started.elapsed();
    crate::signal::after_commit();
    if out.json {
        out.json(&json!({
            "store": sk.to_string(),
            "target": a.to.display().to_string(),
            "source": source_json(&report.source),
            "seconds": took.as_secs_f64(),
            // Only a restore from a snapshot spent time restoring one.
            "snapshot_seconds": matches!(report.source, Source::Snapshot { .. })
                .then(|| report.snapshot_duration.as_secs_f64()),
            "bytes_downloaded": report.transfer.bytes_downloaded,
            "bytes_reused_locally": report.transfer.bytes_reused_locally,
            "records_replayed": report.replay.records,
            "applied_offset": report.replay.applied_offset,
            "skipped": report.skipped.iter().map(|s| json!({
                "id": s.id.to_string(), "offset": s.offset,
                "kind": s.kind.as_str(), "reason": s.reason,
            })).collect::<Vec<_>>(),
        }));
        return Ok(ExitCode::SUCCESS);
    }
    for s in &report.skipped {
        crate::outln!(
            "skipped snapshot {} at offset {} ({}): {}",
            s.id,
            s.offset,
            s.kind,
            s.reason
        );
    }
    crate::outln!(
        "restored {} into {} from {} in {}: downloaded {}, replayed {} records; now at offset {}",
        sk,
        a.to.display(),
        report.source,
        out::secs(took),
        out::bytes(report.transfer.bytes_downloaded),
        report.replay.records,
        report
            .replay
            .applied_offset
            .map_or("-".into(), |o| o.to_string())
    );
    Ok(ExitCode::SUCCESS)
}
