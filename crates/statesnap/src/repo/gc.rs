//! Garbage collection of unreferenced blobs: two-phase mark-and-sweep with
//! condemnation records (invariant 8). `docs/gc.md` has the safety
//! argument; in short:
//!
//! * a run lists blobs first, then (after sealing condemnation records)
//!   lists and reads every manifest;
//! * **mark**: blobs older than the grace period and referenced by no
//!   manifest are not deleted but *condemned*: listed in a record
//!   `stores/<sk>/gc/<ulid>.json`, which is then *sealed* with the time it
//!   was seen durable;
//! * **sweep**: a later run deletes a condemned blob only if its record was
//!   sealed at least one grace period before that run's manifest listing
//!   began, and no manifest in that listing references it;
//! * a snapshot writer reads the records before its final `head` re-check
//!   and refuses blobs condemned more than its commit budget ago, and its
//!   whole commit fits in that budget, which is well below the grace period.
//!
//! Retention-dropped manifests are deleted before the mark phase, so their
//! blobs are condemned in the same run and swept one grace period later.

use futures::{StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::{ObjectStoreExt, PutMode, PutOptions, PutPayload};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use super::catalog::UnreadableManifest;
use super::paths::{self, BlobHash, ParsedKey, SnapshotId, StoreKey};
use super::retention::{self, RetentionPolicy};
use super::{Maintenance, Repository, map_store_error};
use crate::error::{Error, ErrorKind, Result};

/// Format version of condemnation records.
pub const GC_RECORD_FORMAT_VERSION: u64 = 1;

/// One condemned blob.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CondemnedBlob {
    /// Its hash.
    pub blake3: BlobHash,
    /// Its size.
    pub size: u64,
}

/// `stores/<sk>/gc/<ulid>.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CondemnationRecord {
    /// [`GC_RECORD_FORMAT_VERSION`].
    pub format_version: u64,
    /// Gc clock reading taken before the record was first written.
    pub condemned_at: i64,
    /// Gc clock reading taken after the record was seen durable; `None`
    /// until then. Sweeping is measured from here.
    pub sealed_at: Option<i64>,
    /// The condemned blobs.
    pub blobs: Vec<CondemnedBlob>,
}

/// How gc runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GcOptions {
    /// Blobs younger than this are never condemned, and condemned blobs are
    /// swept no earlier than this after their record was sealed. Default 1 h.
    /// Must be at least twice the repository's `max_commit_duration`.
    pub grace: Duration,
    /// Retention to apply first (dropped manifests are deleted), if any.
    pub retention: Option<RetentionPolicy>,
    /// Change nothing; report what would happen.
    pub dry_run: bool,
}

impl Default for GcOptions {
    fn default() -> Self {
        GcOptions {
            grace: Duration::from_secs(3600),
            retention: None,
            dry_run: false,
        }
    }
}

/// What one gc run did (or, in a dry run, would do) to one store.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GcReport {
    /// Store partition.
    pub store_key: Option<StoreKey>,
    /// Whether nothing was changed.
    pub dry_run: bool,
    /// Blobs listed, and their bytes.
    pub blobs_listed: usize,
    /// Bytes of listed blobs.
    pub bytes_listed: u64,
    /// Distinct blobs referenced by kept manifests.
    pub blobs_referenced: usize,
    /// Manifests deleted by retention.
    pub manifests_deleted: Vec<(SnapshotId, String)>,
    /// Blobs condemned by this run (deleted by a later one).
    pub blobs_condemned: Vec<CondemnedBlob>,
    /// Bytes condemned.
    pub bytes_condemned: u64,
    /// Blobs deleted (swept) by this run.
    pub blobs_deleted: Vec<CondemnedBlob>,
    /// Bytes deleted.
    pub bytes_deleted: u64,
    /// Condemned blobs spared because a manifest references them again.
    pub blobs_spared: usize,
    /// Blobs no kept manifest references that were not condemned because
    /// they are younger than the grace period (a later run condemns them).
    pub blobs_too_young: usize,
    /// Bytes of those blobs.
    pub bytes_too_young: u64,
    /// Blobs condemned by earlier runs whose records have not yet waited
    /// out the grace period: a later run deletes them (unless a manifest
    /// references them again by then).
    pub blobs_pending: usize,
    /// Bytes of those blobs.
    pub bytes_pending: u64,
    /// When the first sealed one of those records is ripe (gc clock, ms):
    /// a run that starts listing at or after it deletes its blobs. `None`
    /// when no pending record is sealed yet (a dry run does not seal).
    pub pending_ripe_at_ms: Option<i64>,
    /// Records sealed by this run.
    pub records_sealed: usize,
    /// Records swept and removed by this run.
    pub records_swept: usize,
    /// Unreadable condemnation records removed (releasing is always safe).
    pub records_dropped: usize,
    /// Staging objects of crashed uploads deleted.
    pub staging_deleted: usize,
    /// Corrupt manifests (ignored, not deleted).
    pub unreadable: Vec<UnreadableManifest>,
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

async fn read_records(
    repo: &Repository,
    sk: &StoreKey,
) -> Result<(Vec<(Path, CondemnationRecord)>, Vec<Path>)> {
    let prefix = paths::gc_prefix(sk);
    let metas: Vec<_> = repo
        .store
        .list(Some(&prefix))
        .try_collect()
        .await
        .map_err(|e| map_store_error(e, &format!("cannot list gc records prefix=`{prefix}`")))?;
    let mut good = Vec::new();
    let mut bad = Vec::new();
    for m in metas {
        if !matches!(paths::parse(&m.location), Some(ParsedKey::GcRecord(ref k, _)) if k == sk) {
            continue;
        }
        if m.size > MAX_GC_RECORD_BYTES {
            // Not something gc wrote: it condemns nothing; drop it.
            bad.push(m.location);
            continue;
        }
        let bytes = match repo.store.get(&m.location).await {
            Ok(r) => r.bytes().await,
            Err(e) => Err(e),
        };
        let bytes = match bytes {
            Ok(b) => b,
            Err(object_store::Error::NotFound { .. }) => continue,
            Err(e) => {
                return Err(map_store_error(
                    e,
                    &format!("cannot read gc record key=`{}`", m.location),
                ));
            }
        };
        let value: serde_json::Value = match serde_json::from_slice(&bytes) {
            Ok(v) => v,
            Err(_) => {
                bad.push(m.location);
                continue;
            }
        };
        match value
            .get("format_version")
            .and_then(serde_json::Value::as_u64)
        {
            Some(GC_RECORD_FORMAT_VERSION) => {}
            Some(v) => {
                return Err(Error::config(format!(
                    "unsupported gc record format version: upgrade statesnap key=`{}` \
                     format_version={v} supported={GC_RECORD_FORMAT_VERSION}",
                    m.location
                ))
                .with_reason(crate::Reason::UnsupportedVersion));
            }
            None => {
                bad.push(m.location);
                continue;
            }
        }
        match serde_json::from_value::<CondemnationRecord>(value) {
            Ok(r) => good.push((m.location, r)),
            Err(_) => bad.push(m.location),
        }
    }
    Ok((good, bad))
}

/// Largest condemnation record gc reads (one names each condemned blob in
/// about 100 bytes).
const MAX_GC_RECORD_BYTES: u64 = 64 << 20;

/// Blobs of `sk` under condemnation, with the earliest `condemned_at`. A
/// record that cannot be parsed condemns nothing (no sweep can act on it).
pub(crate) async fn condemned_blobs(
    repo: &Repository,
    sk: &StoreKey,
) -> Result<BTreeMap<BlobHash, i64>> {
    let (records, _) = read_records(repo, sk).await?;
    let mut out: BTreeMap<BlobHash, i64> = BTreeMap::new();
    for (_, r) in records {
        for b in r.blobs {
            let e = out.entry(b.blake3).or_insert(r.condemned_at);
            *e = (*e).min(r.condemned_at);
        }
    }
    Ok(out)
}

fn encode_record(r: &CondemnationRecord) -> Result<PutPayload> {
    serde_json::to_vec_pretty(r)
        .map(PutPayload::from)
        .map_err(|e| Error::internal("cannot serialize gc record").with_source(e))
}

impl<'a> Maintenance<'a> {
    /// Runs gc on every store of the repository.
    pub async fn gc(self, opts: &GcOptions) -> Result<Vec<GcReport>> {
        let mut out = Vec::new();
        for sk in self.repo.catalog().list_stores().await? {
            out.push(self.gc_store(&sk, opts).await?);
        }
        Ok(out)
    }

    /// Runs one gc pass (retention, sweep of ripe records, mark) on `sk`.
    pub async fn gc_store(self, sk: &StoreKey, opts: &GcOptions) -> Result<GcReport> {
        let grace = ms(opts.grace);
        let budget = ms(self.repo.max_commit_duration);
        if grace <= 0 || budget.saturating_mul(2) > grace {
            return Err(Error::config(format!(
                "the gc grace period ({}) must be at least twice the longest a snapshot commit may \
                 take ({}), so at least {}: a blob a commit in flight uploaded is never collected \
                 under it; give a longer grace (CLI: --grace {}), or, if every writer of this \
                 repository commits faster, lower the commit budget to what they use \
                 (RepositoryOptions::max_commit_duration; CLI: --max-commit) grace_ms={grace} \
                 max_commit_ms={budget}",
                human_ms(grace),
                human_ms(budget),
                human_ms(budget.saturating_mul(2)),
                human_ms(budget.saturating_mul(2)),
            )));
        }
        let mut pass = GcPass {
            repo: self.repo,
            sk,
            grace,
            dry: opts.dry_run,
            t_start: self.repo.clock.now_ms(),
            report: GcReport {
                store_key: Some(sk.clone()),
                dry_run: opts.dry_run,
                ..Default::default()
            },
        };
        let listed = pass.list_blobs().await?;
        let records = pass.seal_records().await?;
        let (t_list, listing) = pass.list_manifests().await?;
        let referenced = pass
            .apply_retention(listing, opts.retention.as_ref())
            .await?;
        let (pending, swept) = pass.sweep(&records, &referenced, t_list).await?;
        pass.mark(&listed.blobs, &referenced, &pending, &swept)
            .await?;
        pass.delete_staging(listed.staging).await?;
        Ok(pass.report)
    }

    /// Deletes `keys` through the store's `delete_stream`: one bulk request
    /// per thousand keys on S3, concurrent single deletes elsewhere. A key
    /// already gone counts as deleted (gc runs repeat each other's work).
    /// The first other failure stops the deletes and is returned, naming
    /// its key, as a single delete reports it.
    ///
    /// Results come in the order of `keys` (the `delete_stream` contract),
    /// but an error may stand for a whole bulk request, and S3 reports one
    /// key's failure inside a bulk request as a generic error without its
    /// kind. So from the first generic error on, the remaining keys are
    /// deleted one at a time, as before bulk deletes: every key is then
    /// deleted or reported, with the error a single delete gives.
    async fn delete_all_ignoring_missing(self, keys: Vec<Path>) -> Result<()> {
        if keys.is_empty() {
            return Ok(());
        }
        let requests = futures::stream::iter(keys.clone().into_iter().map(Ok)).boxed();
        let mut results = self.repo.store.delete_stream(requests);
        let mut n = 0;
        while let Some(res) = results.next().await {
            match res {
                Ok(_) | Err(object_store::Error::NotFound { .. }) => n += 1,
                Err(object_store::Error::Generic { .. }) => break,
                Err(e) => {
                    let key = keys.get(n).map(Path::as_ref).unwrap_or("");
                    return Err(map_store_error(e, &format!("cannot delete key=`{key}`")));
                }
            }
        }
        drop(results);
        for key in keys.get(n..).unwrap_or_default() {
            self.delete_ignoring_missing(key).await?;
        }
        Ok(())
    }

    async fn delete_ignoring_missing(self, key: &Path) -> Result<()> {
        match self.repo.store.delete(key).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(map_store_error(e, &format!("cannot delete key=`{key}`"))),
        }
    }
}

/// A duration in milliseconds for people: `45s`, `20m`, `1h30m`, `7d`.
fn human_ms(ms: i64) -> String {
    let s = ms.max(0) / 1000;
    match (s / 86_400, s % 86_400 / 3600, s % 3600 / 60, s % 60) {
        (0, 0, 0, s) => format!("{s}s"),
        (0, 0, m, 0) => format!("{m}m"),
        (0, 0, m, s) => format!("{m}m{s}s"),
        (0, h, 0, _) => format!("{h}h"),
        (0, h, m, _) => format!("{h}h{m}m"),
        (d, 0, _, _) => format!("{d}d"),
        (d, h, _, _) => format!("{d}d{h}h"),
    }
}

/// Why retention dropped snapshot `s`, for people (the report's reason).
fn drop_text(
    why: Option<retention::DropReason>,
    policy: &RetentionPolicy,
    s: &super::SnapshotInfo,
    live: Option<&crate::changelog::Lineage>,
) -> String {
    use retention::DropReason;
    let age = policy
        .keep_newer_than
        .map(|d| format!("older than {}", human_ms(ms(d))));
    match why {
        Some(DropReason::Expired) => match (policy.keep_last, age) {
            (Some(n), Some(age)) => format!("not among the newest {n} snapshots, and {age}"),
            (Some(n), None) => format!("not among the newest {n} snapshots"),
            (None, Some(age)) => age,
            (None, None) => "expired".to_owned(),
        },
        Some(DropReason::DeadLineage) => format!(
            "of another changelog incarnation (lineage {}; the live one, that of the newest \
             snapshot, is {})",
            s.manifest.changelog.lineage,
            live.map_or_else(|| "unknown".to_owned(), ToString::to_string)
        ),
        Some(DropReason::LostHistory) => {
            "its offset lies in history the changelog lost and handed out again".to_owned()
        }
        None => "dropped by retention".to_owned(),
    }
}

/// One gc pass over one store: its settings, its clock reading at the
/// start, and the report its phases fill in, one method per phase.
struct GcPass<'a> {
    repo: &'a Repository,
    sk: &'a StoreKey,
    /// The grace period, ms.
    grace: i64,
    dry: bool,
    /// `t_start`: read before anything is listed.
    t_start: i64,
    report: GcReport,
}

/// What phase 1 lists.
struct ListedBlobs {
    /// Every blob of the store: size, last modified (ms).
    blobs: BTreeMap<BlobHash, (u64, i64)>,
    /// Staging objects older than the grace period.
    staging: Vec<Path>,
}

impl GcPass<'_> {
    /// (1) Blobs first: anything uploaded after this listing is not a
    /// candidate in this run.
    async fn list_blobs(&mut self) -> Result<ListedBlobs> {
        let sk = self.sk;
        let prefix = paths::store_prefix(sk);
        let metas: Vec<_> = self
            .repo
            .store
            .list(Some(&prefix))
            .try_collect()
            .await
            .map_err(|e| map_store_error(e, &format!("cannot list store prefix=`{prefix}`")))?;
        let mut blobs: BTreeMap<BlobHash, (u64, i64)> = BTreeMap::new();
        let mut staging = Vec::new();
        for m in &metas {
            match paths::parse(&m.location) {
                Some(ParsedKey::Blob(k, h)) if &k == sk => {
                    blobs.insert(h, (m.size, m.last_modified.timestamp_millis()));
                }
                Some(ParsedKey::Staging(k, _))
                    if &k == sk
                        && m.last_modified.timestamp_millis()
                            < self.t_start.saturating_sub(self.grace) =>
                {
                    staging.push(m.location.clone());
                }
                _ => {}
            }
        }
        self.report.blobs_listed = blobs.len();
        self.report.bytes_listed = blobs.values().map(|(s, _)| s).sum();
        Ok(ListedBlobs { blobs, staging })
    }

    /// (2) Condemnation records; seal the unsealed ones with a clock
    /// reading taken after they were seen. Unreadable records are deleted.
    async fn seal_records(&mut self) -> Result<Vec<(Path, CondemnationRecord)>> {
        let (mut records, bad) = read_records(self.repo, self.sk).await?;
        let t_seen = self.repo.clock.now_ms();
        for (key, rec) in &mut records {
            if rec.sealed_at.is_none() {
                rec.sealed_at = Some(t_seen);
                self.report.records_sealed += 1;
                if !self.dry {
                    self.repo
                        .store
                        .put(key, encode_record(rec)?)
                        .await
                        .map_err(|e| {
                            map_store_error(e, &format!("cannot seal gc record key=`{key}`"))
                        })?;
                }
            }
        }
        self.report.records_dropped += bad.len();
        if !self.dry {
            self.repo
                .maintenance()
                .delete_all_ignoring_missing(bad)
                .await?;
        }
        Ok(records)
    }

    /// (3) Manifests, listed only now (`t_list` is read first). Anything we
    /// cannot understand (newer format, read failure) might reference any
    /// blob: stop.
    async fn list_manifests(&mut self) -> Result<(i64, super::Listing)> {
        let t_list = self.repo.clock.now_ms();
        let listing = self.repo.catalog().list_snapshots(self.sk).await?;
        if let Some(u) = listing
            .unreadable
            .iter()
            .find(|u| u.kind != ErrorKind::Corrupt)
        {
            let msg = format!(
                "gc stopped: a manifest could not be understood, so its blobs cannot be \
                     ruled unreferenced key=`{}` reason=`{}`",
                u.key, u.reason
            );
            return Err(if u.kind == ErrorKind::Transient {
                Error::transient(msg)
            } else {
                Error::config(msg)
            });
        }
        self.report.unreadable = listing.unreadable.clone();
        Ok((t_list, listing))
    }

    /// (4) Retention: delete dropped manifests before their blobs can be
    /// condemned. Returns the blobs the kept manifests reference.
    async fn apply_retention(
        &mut self,
        listing: super::Listing,
        policy: Option<&RetentionPolicy>,
    ) -> Result<BTreeSet<BlobHash>> {
        let mut kept = listing.snapshots.clone();
        if let Some(policy) = policy {
            let plan = retention::plan(&listing.snapshots, policy, self.repo.clock.now_ms());
            let (dropped, still): (Vec<_>, Vec<_>) =
                kept.into_iter().partition(|s| plan.drops(s.id()));
            if !self.dry {
                let keys = dropped.iter().map(|s| Path::from(s.key.as_str()));
                self.repo
                    .maintenance()
                    .delete_all_ignoring_missing(keys.collect())
                    .await?;
            }
            let live = listing.live_lineage();
            self.report
                .manifests_deleted
                .extend(dropped.iter().map(|s| {
                    let why = plan
                        .drop
                        .iter()
                        .find(|(d, _)| *d == s.id())
                        .map(|(_, r)| *r);
                    (s.id(), drop_text(why, policy, s, live))
                }));
            kept = still;
        }
        let referenced: BTreeSet<BlobHash> = kept
            .iter()
            .flat_map(|s| s.manifest.files.iter().map(|f| f.blake3))
            .collect();
        self.report.blobs_referenced = referenced.len();
        Ok(referenced)
    }

    /// (5) Sweep records sealed at least one grace period before the
    /// manifest listing began. Returns the blobs of the records not yet
    /// ripe, and the blobs swept.
    async fn sweep(
        &mut self,
        records: &[(Path, CondemnationRecord)],
        referenced: &BTreeSet<BlobHash>,
        t_list: i64,
    ) -> Result<(BTreeSet<BlobHash>, BTreeSet<BlobHash>)> {
        let mut pending: BTreeSet<BlobHash> = BTreeSet::new();
        let mut swept: BTreeSet<BlobHash> = BTreeSet::new();
        let mut ripe_records = Vec::new();
        for (key, rec) in records {
            let ripe_at = rec.sealed_at.map(|s| s.saturating_add(self.grace));
            if ripe_at.is_none_or(|r| r > t_list) {
                for b in &rec.blobs {
                    if pending.insert(b.blake3) && !referenced.contains(&b.blake3) {
                        self.report.blobs_pending += 1;
                        self.report.bytes_pending += b.size;
                    }
                }
                if let Some(r) = ripe_at {
                    self.report.pending_ripe_at_ms =
                        Some(self.report.pending_ripe_at_ms.map_or(r, |p| p.min(r)));
                }
                continue;
            }
            for b in &rec.blobs {
                if referenced.contains(&b.blake3) {
                    self.report.blobs_spared += 1;
                    continue;
                }
                if swept.insert(b.blake3) {
                    self.report.bytes_deleted += b.size;
                    self.report.blobs_deleted.push(*b);
                }
            }
            ripe_records.push(key.clone());
            self.report.records_swept += 1;
        }
        if !self.dry {
            let blobs = swept.iter().map(|h| paths::blob(self.sk, h)).collect();
            self.repo
                .maintenance()
                .delete_all_ignoring_missing(blobs)
                .await?;
            // Only after their blobs are gone (a writer that finds no
            // record must then find the blob missing); a failed blob
            // delete above keeps every record.
            self.repo
                .maintenance()
                .delete_all_ignoring_missing(ripe_records)
                .await?;
        }
        Ok((pending, swept))
    }

    /// (6) Mark: old, unreferenced, not yet condemned. Writes one record
    /// naming them, then seals it.
    async fn mark(
        &mut self,
        blobs: &BTreeMap<BlobHash, (u64, i64)>,
        referenced: &BTreeSet<BlobHash>,
        pending: &BTreeSet<BlobHash>,
        swept: &BTreeSet<BlobHash>,
    ) -> Result<()> {
        let cutoff = self.t_start.saturating_sub(self.grace);
        let victims: Vec<CondemnedBlob> = blobs
            .iter()
            .filter(|(h, (_, modified))| {
                *modified < cutoff
                    && !referenced.contains(h)
                    && !pending.contains(h)
                    && !swept.contains(h)
            })
            .map(|(h, (size, _))| CondemnedBlob {
                blake3: *h,
                size: *size,
            })
            .collect();
        for (h, (size, modified)) in blobs {
            if *modified >= cutoff
                && !referenced.contains(h)
                && !pending.contains(h)
                && !swept.contains(h)
            {
                self.report.blobs_too_young += 1;
                self.report.bytes_too_young += size;
            }
        }
        if victims.is_empty() {
            return Ok(());
        }
        self.report.bytes_condemned = victims.iter().map(|b| b.size).sum();
        if !self.dry {
            self.write_record(victims.clone()).await?;
            self.report.records_sealed += 1;
        }
        self.report.blobs_condemned = victims;
        Ok(())
    }

    /// Phase 6's record: a conditional create, then, once the put has
    /// returned, the rewrite that seals it.
    async fn write_record(&self, victims: Vec<CondemnedBlob>) -> Result<()> {
        let repo = self.repo;
        let key = paths::gc_record(self.sk, repo.new_ulid());
        let mut rec = CondemnationRecord {
            format_version: GC_RECORD_FORMAT_VERSION,
            condemned_at: repo.clock.now_ms(),
            sealed_at: None,
            blobs: victims,
        };
        let create = PutOptions {
            mode: PutMode::Create,
            ..Default::default()
        };
        repo.store
            .put_opts(&key, encode_record(&rec)?, create)
            .await
            .map_err(|e| map_store_error(e, &format!("cannot write gc record key=`{key}`")))?;
        // Seen durable: seal now (a crash here leaves it to the next
        // run to seal).
        rec.sealed_at = Some(repo.clock.now_ms());
        repo.store
            .put(&key, encode_record(&rec)?)
            .await
            .map_err(|e| map_store_error(e, &format!("cannot seal gc record key=`{key}`")))?;
        Ok(())
    }

    /// (7) Staging objects of crashed large uploads.
    async fn delete_staging(&mut self, staging: Vec<Path>) -> Result<()> {
        self.report.staging_deleted += staging.len();
        if !self.dry {
            self.repo
                .maintenance()
                .delete_all_ignoring_missing(staging)
                .await?;
        }
        Ok(())
    }
}
