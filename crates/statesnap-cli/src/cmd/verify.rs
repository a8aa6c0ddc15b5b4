//! `verify [--deep]`: every blob's size and hash; with `--deep`, restores
//! and logical digests. The exit code says whether all is well; a snapshot
//! whose manifest records no digest is said to be so ("no digest recorded:
//! blobs verified only"), never reported as matching one.

use std::process::ExitCode;

use serde_json::json;
use statesnap::repo::{VerifyOptions, VerifyProgress, VerifyReport};
use statesnap::restore::{DeepVerifyReport, DigestCheck, verify_deep};
use statesnap::{ErrorKind, Result};

use super::{FormatKind, open_repo, snapshot, store_key, with_format};
use crate::args::VerifyArgs;
use crate::out::{self, Out};

/// One `--deep` check: the report, or the error the restore failed with.
struct Deep {
    store: String,
    snapshot: String,
    result: std::result::Result<DeepVerifyReport, statesnap::Error>,
}

pub async fn run(a: &VerifyArgs, out: Out) -> Result<ExitCode> {
    let repo = open_repo(&a.repo).await?;
    let opts = VerifyOptions {
        quarantine: a.quarantine,
    };
    let pb = out.progress(0, "verifying blobs", true);
    let progress = |p: &VerifyProgress| {
        pb.set_length(p.bytes_total);
        pb.set_position(p.bytes_checked);
    };
    let report: VerifyReport = match &a.store {
        Some(s) => {
            repo.maintenance()
                .verify_store(&store_key(s)?, &opts, &progress)
                .await?
        }
        None => repo.maintenance().verify(&opts, &progress).await?,
    };
    pb.finish_and_clear();
    let deep = if a.deep {
        deep_checks(a, &repo, out).await?
    } else {
        Vec::new()
    };
    // A snapshot without a digest has nothing found wrong (its blobs were
    // verified by the restore), but is not counted as compared either.
    let deep_ok = deep
        .iter()
        .all(|d| d.result.as_ref().is_ok_and(|r| !r.found_mismatch()));
    let not_compared = deep
        .iter()
        .filter(|d| {
            d.result
                .as_ref()
                .is_ok_and(|r| r.digest_check() == DigestCheck::NotRecorded)
        })
        .count();
    let ok = report.is_ok() && deep_ok;
    if out.json {
        print_json(&report, &deep, ok, not_compared, out);
    } else {
        print_text(&report, &deep, ok, not_compared, a.quarantine);
    }
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        out::problems_found()
    })
}

/// `--deep`: restores the chosen snapshot of each store (of `--store`, or
/// every store) into scratch and compares its logical digest.
async fn deep_checks(a: &VerifyArgs, repo: &statesnap::Repository, out: Out) -> Result<Vec<Deep>> {
    let mut deep = Vec::new();
    let stores = match &a.store {
        Some(s) => vec![store_key(s)?],
        None => repo.catalog().list_stores().await?,
    };
    for sk in stores {
        let id = a.snapshot.as_deref().unwrap_or("latest");
        let s = match snapshot(repo, &sk, id, a.changelog.as_deref()).await {
            Ok(s) => s,
            // A store without a valid snapshot has nothing to restore (one
            // asked for by id or by its changelog must be there).
            Err(e)
                if e.kind() == ErrorKind::NotFound
                    && a.snapshot.is_none()
                    && a.changelog.is_none() =>
            {
                continue;
            }
            Err(e) => return Err(e),
        };
        let spinner = out.spinner(&format!("restoring {sk} snapshot {}", s.id()));
        let (_guard, scratch) = super::scratch()?;
        let result = match FormatKind::named(&s.manifest.store_format.name) {
            Ok(kind) => {
                with_format!(kind, f => verify_deep(&f, repo, &s.manifest, &scratch).await)
            }
            Err(e) => Err(e),
        };
        spinner.finish_and_clear();
        deep.push(Deep {
            store: sk.to_string(),
            snapshot: s.id().to_string(),
            result,
        });
    }
    Ok(deep)
}

/// The `--json` report.
fn print_json(report: &VerifyReport, deep: &[Deep], ok: bool, not_compared: usize, out: Out) {
    out.json(&json!({
        "ok": ok,
        "deep_not_compared": not_compared,
        "stores": report.stores,
        "snapshots": report.snapshots,
        "blobs_checked": report.blobs_checked,
        "bytes_checked": report.bytes_checked,
        "bad_blobs": report.bad.iter().map(|b| json!({
            "store": b.store_key.to_string(),
            "blob": b.hash.to_hex(),
            "kind": b.kind.as_str(),
            "reason": b.reason,
            "snapshots": b.referenced_by.iter().map(ToString::to_string).collect::<Vec<_>>(),
            "quarantined_to": b.quarantined_to,
        })).collect::<Vec<_>>(),
        "bad_inline_files": report.bad_inline.iter().map(|f| json!({
            "store": f.store_key.to_string(),
            "snapshot": f.snapshot.to_string(),
            "path": f.path,
            "reason": f.reason,
        })).collect::<Vec<_>>(),
        "unreadable_manifests": report.unreadable.iter().map(|u| json!({
            "key": u.key, "kind": u.kind.as_str(), "reason": u.reason,
        })).collect::<Vec<_>>(),
        "deep": deep.iter().map(|d| match &d.result {
            Ok(r) => json!({
                "store": d.store, "snapshot": d.snapshot,
                "ok": !r.found_mismatch(),
                "status": r.digest_check().as_str(),
                "digest_compared": r.expected.is_some(),
                "expected_digest": r.expected.map(|e| e.to_string()),
                "actual_digest": r.actual.to_string(),
                "keys": r.actual.keys(),
                "bytes_downloaded": r.bytes_downloaded,
            }),
            Err(e) => json!({
                "store": d.store, "snapshot": d.snapshot, "ok": false,
                "status": "restore_failed",
                "digest_compared": false,
                "kind": e.kind().as_str(), "error": e.to_string(),
            }),
        }).collect::<Vec<_>>(),
    }));
}

/// The text report: what was checked, each problem, each deep check, the verdict.
fn print_text(
    report: &VerifyReport,
    deep: &[Deep],
    ok: bool,
    not_compared: usize,
    quarantined: bool,
) {
    crate::outln!(
        "checked {} blobs ({}) of {} snapshots in {} stores",
        report.blobs_checked,
        out::bytes(report.bytes_checked),
        report.snapshots,
        report.stores
    );
    for b in &report.bad {
        let snaps: Vec<String> = b.referenced_by.iter().map(ToString::to_string).collect();
        crate::outln!(
            "BAD blob {} of store {} ({}): {}; named by snapshots {}{}",
            b.hash.to_hex(),
            b.store_key,
            b.kind,
            b.reason,
            snaps.join(", "),
            b.quarantined_to
                .as_ref()
                .map_or(String::new(), |q| format!(" (quarantined to {q})"))
        );
    }
    for f in &report.bad_inline {
        crate::outln!(
            "BAD inline file {} of snapshot {} of store {}: {}",
            f.path,
            f.snapshot,
            f.store_key,
            f.reason
        );
    }
    for u in &report.unreadable {
        crate::outln!("UNREADABLE manifest {} ({}): {}", u.key, u.kind, u.reason);
    }
    print_deep(deep);
    if ok && not_compared > 0 {
        crate::outln!(
            "all well, as far as checked: {not_compared} of {} restored snapshots had no \
             digest recorded (blobs verified only)",
            deep.len()
        );
    } else if ok {
        crate::outln!("all well");
    } else if quarantined && !report.bad.is_empty() {
        crate::outln!(
            "problems found: the bad blobs were quarantined, so the next snapshot of each store \
             uploads them again; until then restores fall back past the snapshots that need \
             them"
        );
    } else if report.bad.is_empty() {
        crate::outln!(
            "problems found (above): no blob is bad, so --quarantine would change nothing"
        );
    } else {
        crate::outln!(
            "problems found: restores fall back past bad snapshots; run with --quarantine \
             so the next snapshot uploads bad blobs again"
        );
    }
}

/// One line per `--deep` check.
fn print_deep(deep: &[Deep]) {
    for d in deep {
        match &d.result {
            Ok(r) => match r.digest_check() {
                DigestCheck::Matched => crate::outln!(
                    "deep: {} snapshot {} restored; its {} keys match the recorded digest ({})",
                    d.store,
                    d.snapshot,
                    r.actual.keys(),
                    r.actual
                ),
                DigestCheck::NotRecorded => crate::outln!(
                    "deep: {} snapshot {} restored ({} keys); no digest recorded: blobs \
                     verified only, contents not compared",
                    d.store,
                    d.snapshot,
                    r.actual.keys()
                ),
                _ => crate::outln!(
                    "DEEP MISMATCH: {} snapshot {} restored to digest {} but its manifest \
                     records {}",
                    d.store,
                    d.snapshot,
                    r.actual,
                    r.expected.map_or("-".into(), |e| e.to_string())
                ),
            },
            Err(e) => crate::outln!(
                "DEEP FAILED: {} snapshot {} could not be restored: {e}",
                d.store,
                d.snapshot
            ),
        }
    }
}
