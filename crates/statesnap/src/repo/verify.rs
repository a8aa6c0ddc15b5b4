//! Verification: read every blob a committed manifest names, check its size
//! and blake3, and move bad ones out of the blob space.
//!
//! A blob is deduplicated by name (its hash) and size: a writer that finds
//! `blobs/<hash>` present does not upload it again. If the stored bytes rot
//! (or were cut short by a broken upload path), every later snapshot would
//! keep naming the bad blob. [`Maintenance::verify`] finds such blobs and,
//! with [`VerifyOptions::quarantine`], moves each to
//! `stores/<sk>/quarantine/<hash>-<ulid>`: the blob key is then absent, so the
//! next snapshot of a store that still has those bytes uploads them again
//! (dedup never trusts a blob verify found bad), and snapshots naming it fail
//! their restore check and fall back — as they would have anyway.
//!
//! Reads are streamed (memory per blob is one read chunk) and run in
//! parallel, bounded by the repository's transfer parallelism.

use futures::StreamExt;
use object_store::ObjectStoreExt;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

use super::catalog::UnreadableManifest;
use super::paths::{self, BlobHash, SnapshotId, StoreKey};
use super::{BlobRef, Maintenance, map_store_error};
use crate::error::{ErrorKind, Result};

/// What [`Maintenance::verify`] does with what it finds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VerifyOptions {
    /// Move bad blobs (wrong size or hash) to the store's quarantine prefix
    /// so the next snapshot uploads them again. Missing blobs are only
    /// reported.
    pub quarantine: bool,
}

/// Progress, reported after each blob.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VerifyProgress {
    /// Blobs checked so far.
    pub blobs_checked: u64,
    /// Blobs to check in all.
    pub blobs_total: u64,
    /// Bytes read so far.
    pub bytes_checked: u64,
    /// Bytes to read in all.
    pub bytes_total: u64,
}

/// One blob that failed its check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadBlob {
    /// Its store.
    pub store_key: StoreKey,
    /// Its hash (its name).
    pub hash: BlobHash,
    /// The size the manifests give it.
    pub size: u64,
    /// `not_found` (missing) or `corrupt` (wrong size or hash).
    pub kind: ErrorKind,
    /// What was wrong.
    pub reason: String,
    /// Snapshots that name it (they cannot be restored as they are).
    pub referenced_by: Vec<SnapshotId>,
    /// Where it was moved, if it was quarantined.
    pub quarantined_to: Option<String>,
}

/// A file carried inside a manifest ([`InlineFile`](super::InlineFile))
/// whose bytes do not decode to its size and hash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadInlineFile {
    /// Its store.
    pub store_key: StoreKey,
    /// The snapshot that carries it (it cannot be restored as it is).
    pub snapshot: SnapshotId,
    /// The file's path in the snapshot.
    pub path: String,
    /// What was wrong.
    pub reason: String,
}

/// What a verification found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VerifyReport {
    /// Stores checked.
    pub stores: usize,
    /// Snapshots whose blobs were checked.
    pub snapshots: usize,
    /// Distinct blobs checked.
    pub blobs_checked: u64,
    /// Bytes read.
    pub bytes_checked: u64,
    /// Blobs that failed, by store and hash.
    pub bad: Vec<BadBlob>,
    /// Inline files that failed, by store, snapshot and path. (A manifest
    /// whose checksum does not match is unreadable instead; these are in
    /// manifests that were sealed with the damage inside.)
    pub bad_inline: Vec<BadInlineFile>,
    /// Manifests that could not be read (their blobs were not checked).
    pub unreadable: Vec<UnreadableManifest>,
}

impl VerifyReport {
    /// Whether everything checked out (no bad blob or inline file, no
    /// unreadable manifest).
    pub fn is_ok(&self) -> bool {
        self.bad.is_empty() && self.bad_inline.is_empty() && self.unreadable.is_empty()
    }

    /// Snapshots that cannot be restored as they are, per store.
    pub fn broken_snapshots(&self) -> BTreeMap<StoreKey, Vec<SnapshotId>> {
        let mut out: BTreeMap<StoreKey, Vec<SnapshotId>> = BTreeMap::new();
        for b in &self.bad {
            out.entry(b.store_key.clone())
                .or_default()
                .extend(b.referenced_by.iter().copied());
        }
        for f in &self.bad_inline {
            out.entry(f.store_key.clone()).or_default().push(f.snapshot);
        }
        for v in out.values_mut() {
            v.sort();
            v.dedup();
        }
        out
    }
}

impl<'a> Maintenance<'a> {
    /// Verifies every store of the repository; see [`Maintenance::verify_store`].
    pub async fn verify(
        self,
        opts: &VerifyOptions,
        progress: &(dyn Fn(&VerifyProgress) + Sync),
    ) -> Result<VerifyReport> {
        let mut all = VerifyReport::default();
        for sk in self.repo.catalog().list_stores().await? {
            let r = self.verify_store(&sk, opts, progress).await?;
            all.stores += r.stores;
            all.snapshots += r.snapshots;
            all.blobs_checked += r.blobs_checked;
            all.bytes_checked += r.bytes_checked;
            all.bad.extend(r.bad);
            all.bad_inline.extend(r.bad_inline);
            all.unreadable.extend(r.unreadable);
        }
        Ok(all)
    }

    /// Reads every blob the committed manifests of `sk` name, in parallel,
    /// checking size and blake3; reports (and with `opts.quarantine`, moves
    /// aside) the bad ones. The files manifests carry inline are decoded and
    /// checked the same way (there is nothing to move aside: the snapshot
    /// is reported). A transient failure (the repository is
    /// unreachable) is returned as an error: nothing is concluded from it.
    pub async fn verify_store(
        self,
        sk: &StoreKey,
        opts: &VerifyOptions,
        progress: &(dyn Fn(&VerifyProgress) + Sync),
    ) -> Result<VerifyReport> {
        let listing = self.repo.catalog().list_snapshots(sk).await?;
        // hash -> (size, referencing snapshots)
        let mut blobs: BTreeMap<BlobHash, (u64, Vec<SnapshotId>)> = BTreeMap::new();
        for s in &listing.snapshots {
            for f in &s.manifest.files {
                let e = blobs.entry(f.blake3).or_insert((f.size, Vec::new()));
                if !e.1.contains(&s.id()) {
                    e.1.push(s.id());
                }
            }
        }
        let blobs_total = blobs.len() as u64;
        let bytes_total: u64 = blobs.values().map(|(s, _)| s).sum();
        let checked = AtomicU64::new(0);
        let bytes = AtomicU64::new(0);
        let results: Vec<(BlobHash, u64, Vec<SnapshotId>, Result<()>)> =
            futures::stream::iter(blobs.into_iter().map(|(hash, (size, refs))| {
                let (checked, bytes) = (&checked, &bytes);
                async move {
                    let r = self.read_through(sk, &BlobRef { hash, size }).await;
                    let n = checked.fetch_add(1, Ordering::Relaxed) + 1;
                    let b = bytes.fetch_add(size, Ordering::Relaxed) + size;
                    progress(&VerifyProgress {
                        blobs_checked: n,
                        blobs_total,
                        bytes_checked: b,
                        bytes_total,
                    });
                    (hash, size, refs, r)
                }
            }))
            .buffer_unordered(self.repo.transfer.parallelism.max(1))
            .collect()
            .await;
        let mut report = VerifyReport {
            stores: 1,
            snapshots: listing.snapshots.len(),
            blobs_checked: blobs_total,
            bytes_checked: bytes_total,
            bad: Vec::new(),
            bad_inline: Vec::new(),
            unreadable: listing.unreadable,
        };
        for s in &listing.snapshots {
            for f in &s.manifest.inline_files {
                if let Err(e) = f.bytes() {
                    tracing::warn!(store_key = %sk, snapshot = %s.id(), path = %f.path, error = %e, "bad inline file");
                    report.bad_inline.push(BadInlineFile {
                        store_key: sk.clone(),
                        snapshot: s.id(),
                        path: f.path.clone(),
                        reason: e.message().to_string(),
                    });
                }
            }
        }
        for (hash, size, mut refs, r) in results {
            let e = match r {
                Ok(()) => continue,
                Err(e) if matches!(e.kind(), ErrorKind::Corrupt | ErrorKind::NotFound) => e,
                Err(e) => return Err(e),
            };
            refs.sort();
            let quarantined_to = if opts.quarantine && e.kind() == ErrorKind::Corrupt {
                Some(self.quarantine_blob(sk, &hash).await?)
            } else {
                None
            };
            tracing::warn!(store_key = %sk, blob = %hash, error = %e, quarantined = quarantined_to.is_some(), "bad blob");
            report.bad.push(BadBlob {
                store_key: sk.clone(),
                hash,
                size,
                kind: e.kind(),
                reason: e.message().to_string(),
                referenced_by: refs,
                quarantined_to,
            });
        }
        report.bad.sort_by_key(|b| b.hash);
        Ok(report)
    }

    /// Streams a blob through its size and hash check, keeping nothing.
    async fn read_through(self, sk: &StoreKey, blob: &BlobRef) -> Result<()> {
        let mut r = self.repo.blobs().open_blob(sk, blob).await?;
        while r.next_chunk().await?.is_some() {}
        Ok(())
    }

    /// Copies a bad blob to the quarantine prefix, then deletes it from the
    /// blob space. Returns the quarantine key.
    async fn quarantine_blob(self, sk: &StoreKey, hash: &BlobHash) -> Result<String> {
        let from = paths::blob(sk, hash);
        let to = paths::quarantine(sk, hash, self.repo.new_ulid());
        self.repo.store.copy(&from, &to).await.map_err(|e| {
            map_store_error(e, &format!("cannot quarantine blob key=`{from}` to=`{to}`"))
        })?;
        match self.repo.store.delete(&from).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(to.to_string()),
            Err(e) => Err(map_store_error(
                e,
                &format!("cannot remove quarantined blob key=`{from}`"),
            )),
        }
    }
}
