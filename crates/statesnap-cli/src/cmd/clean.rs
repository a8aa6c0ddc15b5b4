//! `retain` and `gc`: what goes, and the bytes freed.

use std::process::ExitCode;
use std::time::Duration;

use serde_json::json;
use statesnap::repo::{GcOptions, GcReport, RetentionPolicy};
use statesnap::{Error, ErrorKind, Repository, Result};

use super::{open_repo, store_key};
use crate::args::{GcArgs, RetainArgs};
use crate::out::{self, Out};

async fn run_gc(repo: &Repository, store: Option<&str>, opts: &GcOptions) -> Result<Vec<GcReport>> {
    match store {
        Some(s) => Ok(vec![
            repo.maintenance().gc_store(&store_key(s)?, opts).await?,
        ]),
        None => repo.maintenance().gc(opts).await,
    }
}

fn print(reports: &[GcReport], dry_run: bool, grace: Duration, out: Out) {
    if out.json {
        out.json(&json!({
            "dry_run": dry_run,
            "stores": reports.iter().map(|r| json!({
                "store": r.store_key.as_ref().map(ToString::to_string),
                "manifests_deleted": r.manifests_deleted.iter().map(|(id, why)| json!({
                    "id": id.to_string(), "reason": why,
                })).collect::<Vec<_>>(),
                "blobs_listed": r.blobs_listed,
                "bytes_listed": r.bytes_listed,
                "blobs_referenced": r.blobs_referenced,
                "blobs_condemned": r.blobs_condemned.len(),
                "bytes_condemned": r.bytes_condemned,
                "blobs_deleted": r.blobs_deleted.len(),
                "bytes_deleted": r.bytes_deleted,
                "blobs_spared": r.blobs_spared,
                "blobs_too_young": r.blobs_too_young,
                "bytes_too_young": r.bytes_too_young,
                "blobs_pending": r.blobs_pending,
                "bytes_pending": r.bytes_pending,
                "pending_ripe_at_ms": r.pending_ripe_at_ms,
            })).collect::<Vec<_>>(),
        }));
        return;
    }
    let verb = if dry_run { "would" } else { "did" };
    let mut t = out.table(&[
        "store",
        "snapshots dropped",
        "blobs condemned",
        "blobs deleted",
        "bytes freed",
    ]);
    for r in reports {
        t.add_row(vec![
            r.store_key.as_ref().map_or("-".into(), ToString::to_string),
            r.manifests_deleted.len().to_string(),
            format!(
                "{} ({})",
                r.blobs_condemned.len(),
                out::bytes(r.bytes_condemned)
            ),
            r.blobs_deleted.len().to_string(),
            out::bytes(r.bytes_deleted),
        ]);
    }
    crate::outln!("{t}");
    for r in reports {
        for (id, why) in &r.manifests_deleted {
            let sk = r.store_key.as_ref().map_or("-".into(), ToString::to_string);
            crate::outln!("{verb} drop {sk} snapshot {id}: {why}");
        }
    }
    // Unreferenced blobs the grace period protects: say so, or a run that
    // condemns nothing looks like one that found nothing.
    let young: usize = reports.iter().map(|r| r.blobs_too_young).sum();
    if young > 0 {
        let young_bytes: u64 = reports.iter().map(|r| r.bytes_too_young).sum();
        crate::outln!(
            "{young} unreferenced blobs ({}) are younger than the grace period ({}) and were not \
             condemned; a run after they are older condemns them (or pass a shorter --grace)",
            out::bytes(young_bytes),
            out::duration(grace),
        );
    }
    // Blobs earlier runs condemned, still waiting out their grace: a
    // later run deletes them, and says nothing of them until then.
    let pending: usize = reports.iter().map(|r| r.blobs_pending).sum();
    if pending > 0 {
        let pending_bytes: u64 = reports.iter().map(|r| r.bytes_pending).sum();
        let ripe = reports.iter().filter_map(|r| r.pending_ripe_at_ms).min();
        let when = match ripe {
            Some(at) => {
                let now = statesnap::clock::Clock::now_ms(&*statesnap::clock::system_clock());
                let wait_ms = at.saturating_sub(now);
                let wait = Duration::from_millis(u64::try_from(wait_ms).unwrap_or(0));
                if wait.is_zero() {
                    "the next gc run deletes them".to_owned()
                } else {
                    format!(
                        "a gc run {} from now or later deletes the first of them",
                        out::duration(wait)
                    )
                }
            }
            None => "a later gc run deletes them once they are sealed".to_owned(),
        };
        crate::outln!(
            "{pending} blobs ({}) condemned by earlier runs are waiting out the grace period; {when}",
            out::bytes(pending_bytes),
        );
    }
    let condemned: u64 = reports.iter().map(|r| r.bytes_condemned).sum();
    let freed: u64 = reports.iter().map(|r| r.bytes_deleted).sum();
    if dry_run {
        crate::outln!(
            "{} would be freed now; {} would be condemned, deleted by a gc run {} after that or \
             later (dry run: nothing changed)",
            out::bytes(freed),
            out::bytes(condemned),
            out::duration(grace),
        );
    } else {
        crate::outln!(
            "{} freed now; {} condemned, deleted by a gc run {} from now or later",
            out::bytes(freed),
            out::bytes(condemned),
            out::duration(grace),
        );
    }
}

pub async fn retain(a: &RetainArgs, out: Out) -> Result<ExitCode> {
    if a.keep_last.is_none() && a.keep_newer_than.is_none() {
        return Err(Error::new(
            ErrorKind::Config,
            "retain needs a policy: --keep-last N and/or --keep-newer-than DURATION",
        ));
    }
    let repo = open_repo(&a.repo).await?;
    let opts = GcOptions {
        grace: a.grace,
        retention: Some(RetentionPolicy {
            keep_last: a.keep_last,
            keep_newer_than: a.keep_newer_than,
        }),
        dry_run: a.dry_run,
    };
    let reports = run_gc(&repo, a.store.as_deref(), &opts).await?;
    print(&reports, a.dry_run, a.grace, out);
    Ok(ExitCode::SUCCESS)
}

pub async fn gc(a: &GcArgs, out: Out) -> Result<ExitCode> {
    let repo = open_repo(&a.repo).await?;
    let opts = GcOptions {
        grace: a.grace,
        retention: None,
        dry_run: a.dry_run,
    };
    let reports = run_gc(&repo, a.store.as_deref(), &opts).await?;
    print(&reports, a.dry_run, a.grace, out);
    Ok(ExitCode::SUCCESS)
}
