//! `statesnap reshard`: every partition of one store, moved into a new
//! partition count under another store name.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use statesnap::changelog::{Changelog, ChangelogUrl};
use statesnap::repo::StoreKey;
use statesnap::reshard::{
    ReshardOptions, ReshardProgress, ReshardReport, SourcePartition, TargetPartition,
};
use statesnap::{Error, ErrorKind, Repository, Result};

use super::{FormatKind, open_repo, with_format};
use crate::args::ReshardArgs;
use crate::out::{self, Out};

/// `APPLICATION/STORE`.
fn store_name(s: &str) -> Result<(String, String)> {
    match s.split('/').collect::<Vec<_>>()[..] {
        [app, store] => {
            // Validated the way a store key is (its names' rules).
            StoreKey::new(app, store, 0)?;
            Ok((app.to_owned(), store.to_owned()))
        }
        _ => Err(Error::new(
            ErrorKind::Config,
            format!(
                "bad store name store=`{}`; write APPLICATION/STORE, e.g. shop/carts (every \
             partition of it is resharded)",
                s.escape_debug()
            ),
        )),
    }
}

/// The changelog URL of `key` from `template`: `{topic}` (the key's
/// conventional topic, `<application>-<store>-changelog`), `{partition}`,
/// `{application}` and `{store}` are replaced.
pub fn expand(template: &str, key: &StoreKey) -> Result<ChangelogUrl> {
    if !template.contains("{partition}") {
        return Err(Error::new(
            ErrorKind::Config,
            format!(
                "the changelog template names one changelog for every partition template=`{}`; \
             put {{partition}} (and {{topic}}) in it, e.g. kafka://HOST:PORT/{{topic}}/{{partition}} \
             or file:///DIR/{{topic}}-{{partition}}",
                template.escape_debug()
            ),
        ));
    }
    expand_text(template, key).parse()
}

fn expand_text(template: &str, key: &StoreKey) -> String {
    template
        .replace("{topic}", &key.changelog_id().topic)
        .replace("{partition}", &key.partition().to_string())
        .replace("{application}", key.application())
        .replace("{store}", key.store())
}

/// The source partitions in the repository: `0..N`, every one present.
async fn source_keys(repo: &Repository, app: &str, store: &str) -> Result<Vec<StoreKey>> {
    let mut found: Vec<u32> = repo
        .catalog()
        .list_stores()
        .await?
        .into_iter()
        .filter(|k| k.application() == app && k.store() == store)
        .map(|k| k.partition())
        .collect();
    found.sort_unstable();
    let Some(&max) = found.last() else {
        return Err(Error::new(
            ErrorKind::NotFound,
            format!(
                "no partition of the source store has snapshots store=`{app}/{store}` \
                 repository=`{}`; `statesnap stores` lists the stores",
                repo.url()
            ),
        ));
    };
    let missing: Vec<String> = (0..=max)
        .filter(|p| found.binary_search(p).is_err())
        .map(|p| p.to_string())
        .collect();
    if !missing.is_empty() {
        return Err(Error::new(
            ErrorKind::Config,
            format!(
                "source partitions have no snapshots store=`{app}/{store}` missing=[{}] \
             partitions={}; snapshot every partition before resharding",
                missing.join(","),
                max + 1
            ),
        ));
    }
    (0..=max).map(|p| StoreKey::new(app, store, p)).collect()
}

/// The one format every source partition's newest snapshot is in.
async fn source_format(repo: &Repository, keys: &[StoreKey]) -> Result<FormatKind> {
    let mut kind = None;
    for k in keys {
        let this = FormatKind::of_store(repo, k).await?;
        match kind {
            None => kind = Some(this),
            Some(first) if first != this => {
                return Err(Error::new(
                    ErrorKind::Config,
                    format!(
                        "source partitions are in different formats store_key=`{k}`; reshard a \
                     store whose partitions share one format"
                    ),
                ));
            }
            Some(_) => {}
        }
    }
    kind.ok_or_else(|| Error::new(ErrorKind::Config, "no source partitions"))
}

pub async fn run(a: &ReshardArgs, out: Out) -> Result<ExitCode> {
    let repo = open_repo(&a.repo).await?;
    let (from_app, from_store) = store_name(&a.from)?;
    let (to_app, to_store) = store_name(&a.to)?;
    let partitioner = statesnap::reshard::by_name(&a.partitioner).ok_or_else(|| {
        Error::new(
            ErrorKind::Config,
            format!(
                "unknown partitioner partitioner=`{}`; known: {}",
                a.partitioner.escape_debug(),
                statesnap::reshard::PARTITIONERS.join(", ")
            ),
        )
    })?;
    let sources = source_keys(&repo, &from_app, &from_store).await?;
    let targets: Vec<StoreKey> = (0..a.partitions)
        .map(|p| StoreKey::new(&to_app, &to_store, p))
        .collect::<Result<_>>()?;
    let from_kind = source_format(&repo, &sources).await?;
    let to_kind = match &a.to_format {
        Some(name) => FormatKind::named(name)?,
        None => from_kind,
    };
    let from_template = a
        .from_changelog_template
        .as_deref()
        .unwrap_or(&a.changelog_template);
    let source_logs: Vec<Box<dyn Changelog>> = sources
        .iter()
        .map(|k| expand(from_template, k)?.open_for_reading(k.changelog_id()))
        .collect::<Result<_>>()?;
    if (&from_app, &from_store) == (&to_app, &to_store) {
        return Err(Error::new(
            ErrorKind::Config,
            format!(
                "the reshard target is the source store store=`{from_app}/{from_store}`; write \
                 the new layout to another application or store name"
            ),
        ));
    }
    // Before anything is created: a target that is not new is refused
    // (unless resuming), so a refused reshard creates no target log.
    let mut not_new = Vec::new();
    for k in &targets {
        let url = expand(&a.changelog_template, k)?;
        let existing = match url.open_for_reading(k.changelog_id()) {
            Ok(log) => Some(log),
            Err(e) if e.kind() == ErrorKind::NotFound => None,
            Err(e) => return Err(e),
        };
        if let Err(e) = statesnap::reshard::check_new_target(&repo, k, existing.as_deref()).await {
            if e.kind() != ErrorKind::AlreadyExists {
                return Err(e);
            }
            not_new.push(e);
        }
    }
    if a.dry_run {
        return dry_run(&repo, &sources, &source_logs, &targets, &not_new, a, out).await;
    }
    if let Some(e) = not_new.into_iter().next()
        && !a.force
    {
        return Err(e);
    }
    let target_logs: Vec<Box<dyn Changelog>> = targets
        .iter()
        .map(|k| {
            expand(&a.changelog_template, k)?.open_partition_of(k.changelog_id(), a.partitions)
        })
        .collect::<Result<_>>()?;
    let progress = Arc::new(ReshardProgress::default());
    let options = ReshardOptions {
        partitioner,
        resume: a.force,
        verify_replay: a.verify,
        progress: Some(Arc::clone(&progress)),
        ..ReshardOptions::default()
    };
    let (_guard, scratch) = match &a.scratch {
        Some(dir) => (None, dir.clone()),
        None => {
            let (g, p) = super::scratch()?;
            (Some(g), p)
        }
    };
    let src = SourcePartition::zip(&sources, &source_logs);
    let dst = TargetPartition::zip(&targets, &target_logs);
    let work = async {
        with_format!(from_kind, f => with_format!(to_kind, g => {
            statesnap::reshard::reshard(&repo, &f, &src, &g, &dst, &scratch, &options).await
        }))
    };
    // The progress follows on a task of its own: the reshard's writing
    // runs in place on this task's thread (`block_in_place`).
    let follower = {
        let progress = Arc::clone(&progress);
        let n = sources.len() as u64;
        tokio::spawn(async move { follow(&progress, n, out).await })
    };
    let report = work.await;
    follower.abort();
    let _ = follower.await;
    let report = report?;
    print_report(&report, out);
    Ok(ExitCode::SUCCESS)
}

/// Shows the reshard's progress until the future is dropped.
async fn follow(progress: &ReshardProgress, sources: u64, out: Out) {
    let pb = out
        .spinner("restoring the sources")
        .with_finish(indicatif::ProgressFinish::AndClear);
    let mut last_line = std::time::Instant::now();
    loop {
        let restored = progress.sources_restored();
        let msg = if restored < sources {
            format!("restoring the sources: {restored}/{sources}")
        } else {
            let per: Vec<String> = progress
                .keys_per_target()
                .iter()
                .map(u64::to_string)
                .collect();
            format!(
                "placed {} keys, {} (per target: {})",
                progress.keys(),
                out::bytes(progress.bytes()),
                per.join(" ")
            )
        };
        out.progress_line(&mut last_line, || format!("reshard: {msg}"));
        pb.set_message(msg);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn dry_run(
    repo: &Repository,
    sources: &[StoreKey],
    logs: &[Box<dyn Changelog>],
    targets: &[StoreKey],
    not_new: &[Error],
    a: &ReshardArgs,
    out: Out,
) -> Result<ExitCode> {
    let mut rows = Vec::new();
    for (k, l) in sources.iter().zip(logs) {
        let newest = repo.catalog().latest(k).await?;
        let end = l.end_offset()?;
        let (id, offset) = match &newest {
            Some(s) => (s.id().to_string(), Some(s.offset())),
            None => ("-".to_owned(), None),
        };
        let tail = end.saturating_sub(offset.map_or(0, |o| o + 1));
        rows.push((k.to_string(), l.id().to_string(), id, offset, end, tail));
    }
    let target_urls: Vec<String> = targets
        .iter()
        .map(|k| expand_text(&a.changelog_template, k))
        .collect();
    if out.json {
        out.json(&json!({
            "dry_run": true,
            "partitioner": a.partitioner,
            "sources": rows.iter().map(|(k, log, id, offset, end, tail)| json!({
                "store_key": k, "changelog": log, "snapshot": id, "snapshot_offset": offset,
                "end_offset": end, "tail_records": tail,
            })).collect::<Vec<_>>(),
            "targets": targets.iter().zip(&target_urls).map(|(k, url)| json!({
                "store_key": k.to_string(), "changelog": url,
            })).collect::<Vec<_>>(),
            "targets_not_new": not_new.iter().map(Error::to_string).collect::<Vec<_>>(),
            "would_be_refused": !not_new.is_empty() && !a.force,
        }));
        return Ok(ExitCode::SUCCESS);
    }
    crate::outln!(
        "dry run: {} source partitions -> {} target partitions ({} partitioner); nothing written",
        sources.len(),
        targets.len(),
        a.partitioner
    );
    let mut t = out.table(&[
        "source",
        "changelog",
        "snapshot",
        "offset",
        "log end",
        "tail to replay",
    ]);
    for (k, log, id, offset, end, tail) in &rows {
        t.add_row(vec![
            k.clone(),
            log.clone(),
            id.clone(),
            offset.map_or("-".to_owned(), |o| o.to_string()),
            end.to_string(),
            tail.to_string(),
        ]);
    }
    crate::outln!("{t}");
    let mut t = out.table(&["target", "changelog"]);
    for (k, url) in targets.iter().zip(&target_urls) {
        t.add_row(vec![k.to_string(), url.clone()]);
    }
    crate::outln!("{t}");
    for e in not_new {
        crate::outln!("target not new: {e}");
    }
    if !not_new.is_empty() {
        if a.force {
            crate::outln!(
                "with --force the run resumes: what the targets hold is checked against this \
                 reshard's output"
            );
        } else {
            crate::outln!(
                "the run would be refused (exit {}): use new targets, or --force to resume an \
                 interrupted reshard of the same sources",
                out::exit_code(ErrorKind::AlreadyExists)
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn print_report(r: &ReshardReport, out: Out) {
    if out.json {
        out.json(&json!({
            "partitioner": r.partitioner,
            "keys": r.keys,
            "bytes": r.bytes,
            "digest": r.digest.to_string(),
            "restore_secs": r.restore_time.as_secs_f64(),
            "write_secs": r.write_time.as_secs_f64(),
            "commit_secs": r.commit_time.as_secs_f64(),
            "sources": r.sources.iter().map(|s| json!({
                "store_key": s.store_key.to_string(),
                "changelog": s.changelog.to_string(),
                "snapshot": s.snapshot.map(|id| id.to_string()),
                "offset": s.offset,
                "replayed": s.replayed,
                "keys": s.keys,
                "left_behind": s.left_behind,
            })).collect::<Vec<_>>(),
            "targets": r.targets.iter().map(|t| json!({
                "store_key": t.store_key.to_string(),
                "changelog": t.changelog.to_string(),
                "keys": t.keys,
                "bytes": t.bytes,
                "appended": t.appended,
                "resumed": t.resumed,
                "last_offset": t.last_offset,
                "snapshot": t.snapshot.map(|id| id.to_string()),
                "snapshot_reused": t.snapshot_reused,
                "replay_verified": t.replay_verified,
                "digest": t.digest.to_string(),
            })).collect::<Vec<_>>(),
        }));
        return;
    }
    crate::outln!(
        "resharded {} keys ({}) from {} partitions into {} ({} partitioner) in {} \
         (restore {}, write {}, commit {})",
        r.keys,
        out::bytes(r.bytes),
        r.sources.len(),
        r.targets.len(),
        r.partitioner,
        out::secs(r.restore_time + r.write_time + r.commit_time),
        out::secs(r.restore_time),
        out::secs(r.write_time),
        out::secs(r.commit_time),
    );
    let mut t = out.table(&[
        "target",
        "keys",
        "bytes",
        "changelog",
        "records",
        "snapshot",
    ]);
    for tr in &r.targets {
        let snapshot = match (tr.snapshot, tr.snapshot_reused) {
            (Some(id), false) => id.to_string(),
            (Some(id), true) => format!("{id} (kept from an earlier run)"),
            (None, _) => "none (no keys)".to_owned(),
        };
        let records = if tr.resumed > 0 {
            format!(
                "{} (+{} found from an earlier run)",
                tr.appended, tr.resumed
            )
        } else {
            tr.appended.to_string()
        };
        t.add_row(vec![
            tr.store_key.to_string(),
            tr.keys.to_string(),
            out::bytes(tr.bytes),
            tr.changelog.to_string(),
            records,
            snapshot,
        ]);
    }
    crate::outln!("{t}");
    crate::outln!(
        "digest of every key moved: {} (sources = targets)",
        r.digest
    );
    let left: u64 = r.sources.iter().map(|s| s.left_behind).sum();
    if left > 0 {
        crate::outln!(
            "left behind: {left} per-partition bookkeeping keys (input positions) of the old layout"
        );
    }
    if r.targets.iter().any(|t| t.replay_verified) {
        crate::outln!("every target's new changelog replays to its snapshot");
    }
}
