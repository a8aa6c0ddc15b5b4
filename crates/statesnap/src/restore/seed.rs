//! Seeding a store that follows a *new* changelog from another store's
//! snapshot (`statesnap clone --changelog`): a blue/green deployment's
//! store starts with the old one's state, and its own changelog stays the
//! source of truth (invariant: a store is a cache of its changelog).

use std::path::Path;

use super::{RestoreOptions, ScratchDir, open_snapshot, restore_store};
use crate::changelog::{Changelog, Record};
use crate::digest::LogicalDigest;
use crate::error::{Error, ErrorKind, Result};
use crate::format::StoreFormat;
use crate::repo::{Manifest, Repository, SnapshotId, StoreKey};
use crate::snapshot::commit_snapshot;
use crate::store::StateStoreExt;

/// Records appended to the target changelog per batch.
const BATCH: usize = 10_000;

/// What [`seed_store`] did.
#[derive(Debug, Clone)]
pub struct SeedReport {
    /// The snapshot the state came from.
    pub source: SnapshotId,
    /// The source changelog offset that snapshot reflects.
    pub source_offset: u64,
    /// Records appended to the target changelog (one per live key).
    pub records: u64,
    /// The target's first snapshot, at the target changelog's last offset.
    pub manifest: Manifest,
    /// The logical digest both stores share.
    pub digest: LogicalDigest,
}

/// Seeds store `to`, which follows `changelog` (empty, the target
/// application's own), with the contents of snapshot `snapshot` of store
/// `from` (the newest when `None`): the snapshot is restored alone into a
/// scratch directory, every live pair is appended to `changelog` as a put,
/// a store is rebuilt from `changelog` by replay and checked to hold the
/// same logical digest, and it is snapshotted as `to`'s first snapshot.
/// `scratch` must not exist; it is removed at the end.
///
/// Fails `config` when `from == to` or the changelog already holds
/// records (seeding appends the whole state: into a log with history of
/// its own it would mix two states), `already-exists` when `to` has
/// snapshots, `not-found` when the source has no such snapshot, `corrupt`
/// when a blob or the rebuilt digest does not check. If it fails after
/// appending, the changelog holds part or all of the state and no
/// snapshot names it: empty or recreate that changelog before seeding
/// again.
#[allow(clippy::too_many_arguments)]
pub async fn seed_store<F: StoreFormat, C: Changelog + ?Sized>(
    format: &F,
    repo: &Repository,
    from: &StoreKey,
    snapshot: Option<SnapshotId>,
    to: &StoreKey,
    changelog: &C,
    scratch: &Path,
) -> Result<SeedReport> {
    if from == to {
        return Err(Error::config(format!(
            "seed source and target are the same store store_key=`{from}`; name another target"
        )));
    }
    let end = changelog.end_offset()?;
    if end != 0 {
        return Err(Error::config(format!(
            "the target changelog already holds records changelog=`{}` end_offset={end}; seeding \
             appends the whole state and needs an empty changelog (a new topic or directory)",
            changelog.id()
        ))
        .with_reason(crate::Reason::AlreadyExists));
    }
    if let Some(existing) = repo.catalog().latest(to).await? {
        return Err(Error::new(
            ErrorKind::AlreadyExists,
            format!(
                "the target store already has snapshots store_key=`{to}` newest=`{}`; seed a \
                 store that has none",
                existing.id()
            ),
        )
        .with_reason(crate::Reason::AlreadyExists));
    }
    let source = repo.catalog().snapshot_or_latest(from, snapshot).await?;
    let scratch = ScratchDir::create(scratch)?;
    let result = seed_in(
        format,
        repo,
        &source.manifest,
        to,
        changelog,
        scratch.path(),
    )
    .await;
    scratch.remove()?;
    result
}

async fn seed_in<F: StoreFormat, C: Changelog + ?Sized>(
    format: &F,
    repo: &Repository,
    source: &Manifest,
    to: &StoreKey,
    changelog: &C,
    scratch: &Path,
) -> Result<SeedReport> {
    let (store, _) = open_snapshot(format, repo, source, &scratch.join("source")).await?;
    let mut digest = LogicalDigest::new();
    let mut records = 0u64;
    let mut batch = Vec::with_capacity(BATCH);
    for kv in store.iter()? {
        let (k, v) = kv?;
        digest.add(&k, &v);
        batch.push(Record::put(k, v));
        if batch.len() == BATCH {
            records += changelog.append(&batch)?.len() as u64;
            batch.clear();
        }
    }
    if !batch.is_empty() {
        records += changelog.append(&batch)?.len() as u64;
    }
    changelog.flush()?;
    drop(store);
    if records == 0 {
        return Err(Error::config(format!(
            "snapshot holds no keys snapshot=`{}`; there is nothing to seed",
            source.snapshot_id
        )));
    }

    let (rebuilt, _) = restore_store(
        format,
        repo,
        to,
        changelog,
        &scratch.join("target"),
        &RestoreOptions {
            full_replay: true,
            ..RestoreOptions::default()
        },
    )
    .await?;
    let actual = rebuilt.logical_digest()?;
    if actual != digest {
        return Err(Error::corrupt(format!(
            "the store rebuilt from the seeded changelog differs from the snapshot \
             expected={digest} actual={actual}; nothing was committed"
        ))
        .with_reason(crate::Reason::DigestMismatch));
    }
    let cut = format.capture(&rebuilt)?;
    let manifest = commit_snapshot(format, cut, repo, to, changelog, None).await?;
    Ok(SeedReport {
        source: source.snapshot_id,
        source_offset: source.changelog.offset,
        records,
        manifest,
        digest,
    })
}
