//! Copying a snapshot to another store partition of the same repository
//! (`statesnap clone`): seeding a blue/green deployment's store, or taking
//! a copy to inspect without touching the original.

use futures::{StreamExt, TryStreamExt};

use super::manifest::{ManifestDraft, ManifestExtras};
use super::{BlobHash, BlobRef, Maintenance, Manifest, SnapshotId, SnapshotWriter, StoreKey};
use crate::error::{Error, Result};

/// What [`Maintenance::clone_snapshot`](crate::repo::Maintenance::clone_snapshot) did.
#[derive(Debug, Clone, PartialEq)]
pub struct CloneReport {
    /// The new snapshot, in the target store.
    pub manifest: Manifest,
    /// Blobs copied (downloaded, verified, uploaded).
    pub blobs_copied: usize,
    /// Bytes copied.
    pub bytes_copied: u64,
    /// Blobs the target store already had.
    pub blobs_shared: usize,
    /// The target already held this snapshot (same changelog position,
    /// format and files): nothing was copied or committed, and
    /// [`CloneReport::manifest`] is the target's existing copy.
    pub already_present: bool,
}

impl<'a> Maintenance<'a> {
    /// Copies snapshot `id` of store `from` (the newest when `None`) to
    /// store `to` as a new snapshot: every blob is read back through its
    /// hash check and stored under `to` (blobs `to` already holds are not
    /// copied again), then a manifest is committed with the same changelog
    /// position, format, files, statistics and logical digest, and no
    /// parent (`to` has none of the source's snapshots, so the copy stands
    /// alone; a delta's chain is flattened because its files are all named).
    ///
    /// The copy still names the *source's* changelog (topic, partition,
    /// lineage): restoring it needs that changelog. If `to` already holds
    /// the same snapshot (same changelog position, format and files), nothing
    /// is copied and the report says `already_present`. Fails `config` when
    /// `from == to`, `not_found` when there is no such snapshot, `corrupt`
    /// when a blob fails its check (nothing is committed then).
    pub async fn clone_snapshot(
        self,
        from: &StoreKey,
        id: Option<SnapshotId>,
        to: &StoreKey,
    ) -> Result<CloneReport> {
        if from == to {
            return Err(Error::config(format!(
                "clone source and target are the same store store_key=`{from}`; name another \
                 target"
            )));
        }
        let source = self.repo.catalog().snapshot_or_latest(from, id).await?;
        let m = source.manifest;
        // Cloning the same snapshot again is a no-op: a second copy would
        // be a duplicate the target's listing shows twice.
        let existing = self.repo.catalog().list_snapshots(to).await?;
        if let Some(same) = existing
            .snapshots
            .iter()
            .find(|s| same_snapshot(&s.manifest, &m))
        {
            return Ok(CloneReport {
                manifest: same.manifest.clone(),
                blobs_copied: 0,
                bytes_copied: 0,
                blobs_shared: 0,
                already_present: true,
            });
        }
        let mut distinct: Vec<BlobRef> = m.files.iter().map(BlobRef::from).collect();
        distinct.sort_by_key(|b| b.hash);
        distinct.dedup_by_key(|b| b.hash);
        // Copy each distinct blob once (bounded parallelism), verified on
        // the way through.
        let copied: Vec<Option<u64>> = futures::stream::iter(distinct)
            .map(|blob| async move {
                if self.repo.blobs().head_blob(to, &blob.hash).await?.is_some() {
                    return Ok::<_, Error>(None);
                }
                let bytes = self.repo.blobs().get_blob_bytes(from, &blob).await?;
                let out = self.repo.blobs().put_blob_bytes(to, bytes).await?;
                Ok(Some(out.blob.size))
            })
            .buffer_unordered(self.repo.transfer().parallelism.max(1))
            .try_collect()
            .await?;
        let mut writer = SnapshotWriter::new(self.repo, to.clone());
        for f in &m.files {
            writer.reuse(f.clone())?;
        }
        for f in &m.inline_files {
            writer.put_inline(&f.path, &f.bytes()?).await?;
        }
        let draft = ManifestDraft {
            store_key: to.clone(),
            changelog: m.changelog.clone(),
            store_format: m.store_format.clone(),
            parent: None,
            depends_on: Vec::new(),
            files: Vec::new(),
            stats: m.stats,
            format_metadata: m.format_metadata.clone(),
            required_features: m.required_features.clone(),
        };
        let manifest = writer
            .commit_with(
                draft,
                ManifestExtras {
                    logical_digest: m.logical_digest,
                    measured: m.measured,
                    ..ManifestExtras::default()
                },
            )
            .await?;
        Ok(CloneReport {
            manifest,
            blobs_copied: copied.iter().flatten().count(),
            bytes_copied: copied.iter().flatten().sum(),
            blobs_shared: copied.iter().filter(|c| c.is_none()).count(),
            already_present: false,
        })
    }
}

/// Whether `a` holds the same snapshot as `b`: the same changelog
/// position, format and files (ids, parents and times differ between a
/// snapshot and its copy).
fn same_snapshot(a: &Manifest, b: &Manifest) -> bool {
    fn files(m: &Manifest) -> Vec<(&str, u64, BlobHash)> {
        let mut f: Vec<(&str, u64, BlobHash)> = m
            .files
            .iter()
            .map(|f| (f.path.as_str(), f.size, f.blake3))
            .chain(
                m.inline_files
                    .iter()
                    .map(|f| (f.path.as_str(), f.size, f.blake3)),
            )
            .collect();
        f.sort();
        f
    }
    a.changelog == b.changelog && a.store_format == b.store_format && files(a) == files(b)
}
