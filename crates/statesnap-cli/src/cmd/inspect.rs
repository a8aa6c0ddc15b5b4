//! `init`, `stores`, `list`, `show`: what a repository holds.

use std::process::ExitCode;

use serde_json::json;
use statesnap::repo::{Listing, SnapshotId, StoreKey};
use statesnap::restore::{PlanOptions, Source, plan_restore};
use statesnap::{Repository, Result};

use super::{FormatKind, changelog, open_repo, repo_options, snapshot, store_key, with_format};
use crate::args::{ListArgs, RepoArgs, ShowArgs};
use crate::out::{self, Out};

pub async fn init(a: &RepoArgs, out: Out) -> Result<ExitCode> {
    let repo = Repository::init(&a.repo, repo_options(a)).await?;
    let marker = repo.read_marker().await?;
    if out.json {
        out.json(&json!({
            "repository": repo.url(),
            "repository_id": marker.repository_id,
            "format_version": marker.format_version,
        }));
    } else {
        crate::outln!(
            "initialized repository {} (id {}, format version {})",
            repo.url(),
            marker.repository_id,
            marker.format_version
        );
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn stores(a: &RepoArgs, out: Out) -> Result<ExitCode> {
    let repo = open_repo(a).await?;
    let all = repo.catalog().store_summaries().await?;
    let now = repo.clock().now_ms();
    if out.json {
        out.json(&json!(
            all.iter()
                .map(|s| json!({
                    "store": s.store_key.to_string(),
                    "snapshots": s.snapshots,
                    "unreadable": s.unreadable,
                    "newest_offset": s.newest_offset,
                    "newest_created_at_ms": s.newest_created_at,
                    "total_bytes": s.total_bytes,
                    "unique_bytes": s.unique_bytes,
                }))
                .collect::<Vec<_>>()
        ));
        return Ok(ExitCode::SUCCESS);
    }
    if all.is_empty() {
        crate::outln!("no stores in {}", repo.url());
        return Ok(ExitCode::SUCCESS);
    }
    let mut t = out.table(&[
        "store",
        "snapshots",
        "newest offset",
        "newest age",
        "blob bytes",
        "unique blob bytes",
    ]);
    for s in &all {
        let mut snaps = s.snapshots.to_string();
        if s.unreadable > 0 {
            snaps.push_str(&format!(" (+{} unreadable)", s.unreadable));
        }
        t.add_row(vec![
            s.store_key.to_string(),
            snaps,
            s.newest_offset.map_or("-".into(), |o| o.to_string()),
            s.newest_created_at.map_or("-".into(), |c| out::age(c, now)),
            out::bytes(s.total_bytes),
            out::bytes(s.unique_bytes),
        ]);
    }
    crate::outln!("{t}");
    Ok(ExitCode::SUCCESS)
}

pub async fn list(a: &ListArgs, out: Out) -> Result<ExitCode> {
    let repo = open_repo(&a.repo).await?;
    let sk = store_key(&a.store.store)?;
    let listing = repo.catalog().list_snapshots(&sk).await?;
    // No snapshots and no manifests at all: the store does not exist here
    // (as for `show`), likely a misspelling or another partition.
    if listing.snapshots.is_empty() && listing.unreadable.is_empty() {
        return Err(super::store_not_found(&repo, &sk).await);
    }
    // With the changelog, the restore plan says which snapshots a restore
    // could use, and why not the others.
    let verdicts = match &a.changelog {
        Some(url) => Some(verdicts(&repo, &sk, url).await?),
        None => None,
    };
    let now = repo.clock().now_ms();
    if out.json {
        list_json(&sk, &listing, verdicts.as_ref(), out);
        return Ok(ExitCode::SUCCESS);
    }
    list_text(&listing, verdicts.as_ref(), now, out);
    Ok(ExitCode::SUCCESS)
}

/// Whether a restore could use each snapshot, by id: `Err(why)` if not.
type Verdicts = std::collections::BTreeMap<SnapshotId, std::result::Result<(), String>>;

/// The verdicts of the restore plan of `sk` with the changelog at `url`.
async fn verdicts(repo: &Repository, sk: &StoreKey, url: &str) -> Result<Verdicts> {
    let log = changelog(url, sk)?;
    let kind = FormatKind::of_store(repo, sk).await?;
    let (_guard, nowhere) = super::scratch()?;
    let plan = with_format!(kind, f => plan_restore(&f, repo, sk, &*log, &nowhere, &PlanOptions::default()).await?);
    let mut v = std::collections::BTreeMap::new();
    for s in &plan.steps {
        if let Source::Snapshot { id, .. } = s.source {
            v.insert(id, Ok(()));
        }
    }
    for r in &plan.rejected {
        if let Source::Snapshot { id, .. } = r.source {
            v.insert(id, Err(format!("{}: {}", r.kind, r.reason)));
        }
    }
    Ok(v)
}

/// `list --json`.
fn list_json(sk: &StoreKey, listing: &Listing, verdicts: Option<&Verdicts>, out: Out) {
    let rows: Vec<_> = listing
        .snapshots
        .iter()
        .map(|s| {
            let m = &s.manifest;
            let usable = verdicts.map(|v| match v.get(&m.snapshot_id) {
                Some(Ok(())) => json!(true),
                Some(Err(why)) => json!({ "usable": false, "reason": why }),
                None => json!(null),
            });
            json!({
                "id": m.snapshot_id.to_string(),
                "offset": m.changelog.offset,
                "created_at_ms": m.created_at,
                "format": format!("{}/{}", m.store_format.name, m.store_format.version),
                "files": m.files.len() + m.inline_files.len(),
                "bytes": m.file_bytes(),
                "new_bytes": m.stats.bytes_uploaded,
                "keys": out::keys_figure(m).0,
                "keys_exact": out::keys_figure(m).1,
                "parent": m.parent.map(|p| p.to_string()),
                "usable": usable,
            })
        })
        .collect();
    out.json(&json!({
        "store": sk.to_string(),
        "snapshots": rows,
        "unreadable": listing.unreadable.iter().map(|u| json!({
            "key": u.key, "kind": u.kind.as_str(), "reason": u.reason,
        })).collect::<Vec<_>>(),
    }));
}

/// `list` as a table, then the unreadable manifests and notes.
fn list_text(listing: &Listing, verdicts: Option<&Verdicts>, now: i64, out: Out) {
    let mut t = out.table(&[
        "id",
        "offset",
        "age",
        "format",
        "keys",
        "files",
        "file bytes",
        "uploaded",
        "parent",
        "usable",
    ]);
    for s in &listing.snapshots {
        let m = &s.manifest;
        let usable = match verdicts.map(|v| v.get(&m.snapshot_id)) {
            None => "?".to_owned(),
            Some(Some(Ok(()))) => "yes".to_owned(),
            Some(Some(Err(why))) => format!("no: {why}"),
            Some(None) => "-".to_owned(),
        };
        t.add_row(vec![
            m.snapshot_id.to_string(),
            m.changelog.offset.to_string(),
            out::age(m.created_at, now),
            format!("{}/{}", m.store_format.name, m.store_format.version),
            out::keys_text(m),
            (m.files.len() + m.inline_files.len()).to_string(),
            out::bytes(m.file_bytes()),
            out::bytes(m.stats.bytes_uploaded),
            m.parent.map_or("-".into(), |p| p.to_string()),
            usable,
        ]);
    }
    crate::outln!("{t}");
    for u in &listing.unreadable {
        crate::outln!("unreadable manifest {} ({}): {}", u.key, u.kind, u.reason);
    }
    if listing
        .snapshots
        .iter()
        .any(|s| s.manifest.exact_keys().is_none())
    {
        crate::outln!("(~N keys: the store's estimate, recorded by a writer that did not count)");
    }
    if verdicts.is_none() {
        crate::outln!("(usable? needs the changelog: add --changelog URL)");
    }
}

pub async fn show(a: &ShowArgs, out: Out) -> Result<ExitCode> {
    let repo = open_repo(&a.repo).await?;
    let sk = store_key(&a.store.store)?;
    let s = snapshot(&repo, &sk, &a.id, a.live.changelog.as_deref()).await?;
    let m = &s.manifest;
    if out.json {
        out.json(&serde_json::to_value(m).map_err(|e| {
            statesnap::Error::new(statesnap::ErrorKind::Internal, "cannot print the manifest")
                .with_source(e)
        })?);
        return Ok(ExitCode::SUCCESS);
    }
    let now = repo.clock().now_ms();
    crate::outln!("snapshot   {}", m.snapshot_id);
    crate::outln!("store      {}", m.store_key);
    crate::outln!(
        "changelog  {} partition {} offset {} (lineage {}{})",
        m.changelog.topic,
        m.changelog.partition,
        m.changelog.offset,
        m.changelog.lineage,
        m.changelog
            .epoch
            .map_or(String::new(), |e| format!(", epoch {e}"))
    );
    crate::outln!(
        "format     {} version {}",
        m.store_format.name,
        m.store_format.version
    );
    crate::outln!("created    {} ago", out::age(m.created_at, now));
    crate::outln!(
        "parent     {}",
        m.parent.map_or("-".into(), |p| p.to_string())
    );
    if !m.depends_on.is_empty() {
        let deps: Vec<String> = m.depends_on.iter().map(ToString::to_string).collect();
        crate::outln!("depends on {}", deps.join(", "));
    }
    // Each figure says what it is: counted at snapshot time, or the
    // store's estimate (a RocksDB snapshot that recorded no digest).
    let keys = match m.exact_keys() {
        Some(k) => format!("{k} keys (counted)"),
        None => format!("~{} keys (estimate)", m.stats.keys),
    };
    let logical = match m.exact_logical_bytes() {
        Some(b) => format!("{} of keys and values (counted)", out::bytes(b)),
        None => format!(
            "~{} of keys and values (estimate)",
            out::bytes(m.stats.logical_bytes)
        ),
    };
    crate::outln!("contents   {keys}, {logical}");
    let blob_bytes: u64 = m.files.iter().map(|f| f.size).sum();
    crate::outln!(
        "files      {} in {} files ({} in {} blobs, {} inline in the manifest)",
        out::bytes(m.file_bytes()),
        m.files.len() + m.inline_files.len(),
        out::bytes(blob_bytes),
        m.files.len(),
        out::bytes(m.file_bytes() - blob_bytes)
    );
    crate::outln!(
        "transfer   {} uploaded, {} reused (when the snapshot was written)",
        out::bytes(m.stats.bytes_uploaded),
        out::bytes(m.stats.bytes_reused)
    );
    match &m.logical_digest {
        Some(d) => crate::outln!("digest     {d}"),
        None => crate::outln!("digest     none recorded (verify --deep can verify the blobs only)"),
    }
    let mut t = out.table(&["file", "size", "blake3"]);
    for f in &m.files {
        t.add_row(vec![f.path.clone(), out::bytes(f.size), f.blake3.to_hex()]);
    }
    // Carried in the manifest itself (no blob of their own).
    for f in &m.inline_files {
        t.add_row(vec![
            format!("{} (inline)", f.path),
            out::bytes(f.size),
            f.blake3.to_hex(),
        ]);
    }
    crate::outln!("{t}");
    Ok(ExitCode::SUCCESS)
}

pub async fn clone(a: &crate::args::CloneArgs, out: Out) -> Result<ExitCode> {
    let repo = open_repo(&a.repo).await?;
    let from = store_key(&a.from)?;
    let to = store_key(&a.to)?;
    let id = super::snapshot_id(&a.snapshot)?;
    if let Some(url) = &a.changelog {
        return seed(&repo, &from, id, &to, url, out).await;
    }
    let what = format!("copying {from} to {to}");
    let r = out
        .reading(&repo, &what, async |repo| {
            repo.maintenance().clone_snapshot(&from, id, &to).await
        })
        .await?;
    let m = &r.manifest;
    if out.json {
        out.json(&json!({
            "from": from.to_string(),
            "to": to.to_string(),
            "snapshot": m.snapshot_id.to_string(),
            "offset": m.changelog.offset,
            "blobs_copied": r.blobs_copied,
            "bytes_copied": r.bytes_copied,
            "blobs_shared": r.blobs_shared,
            "already_present": r.already_present,
        }));
    } else if r.already_present {
        crate::outln!(
            "already present: {to} holds this snapshot of {from} as {} at offset {}; nothing \
             copied",
            m.snapshot_id,
            m.changelog.offset
        );
    } else {
        crate::outln!(
            "cloned {from} to {to} as snapshot {} at offset {} ({} blobs copied, {}; {} already there)",
            m.snapshot_id,
            m.changelog.offset,
            r.blobs_copied,
            out::bytes(r.bytes_copied),
            r.blobs_shared
        );
        crate::outln!(
            "the copy names the source's changelog ({} partition {}): restore it with that changelog",
            m.changelog.topic,
            m.changelog.partition
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// `clone --changelog`: the target follows its own changelog.
async fn seed(
    repo: &statesnap::Repository,
    from: &statesnap::StoreKey,
    id: Option<statesnap::SnapshotId>,
    to: &statesnap::StoreKey,
    url: &str,
    out: Out,
) -> Result<ExitCode> {
    let url: statesnap::changelog::ChangelogUrl = url.parse()?;
    let log = url.open(to.changelog_id())?;
    let kind = FormatKind::of_store(repo, from).await?;
    let (_guard, scratch) = super::scratch()?;
    let what = format!("seeding {to} from {from}");
    let r = with_format!(kind, f => out
        .reading(repo, &what, async |repo| {
            statesnap::restore::seed_store(&f, repo, from, id, to, &*log, &scratch).await
        })
        .await?);
    let m = &r.manifest;
    if out.json {
        out.json(&json!({
            "from": from.to_string(),
            "to": to.to_string(),
            "source_snapshot": r.source.to_string(),
            "source_offset": r.source_offset,
            "records_written": r.records,
            "snapshot": m.snapshot_id.to_string(),
            "offset": m.changelog.offset,
            "changelog": {"topic": m.changelog.topic, "partition": m.changelog.partition},
            "digest": r.digest.to_string(),
        }));
    } else {
        crate::outln!(
            "seeded {to} from {from} snapshot {} (offset {}): {} records written to its \
             changelog ({} partition {}), first snapshot {} at offset {}",
            r.source,
            r.source_offset,
            r.records,
            m.changelog.topic,
            m.changelog.partition,
            m.snapshot_id,
            m.changelog.offset
        );
    }
    Ok(ExitCode::SUCCESS)
}
