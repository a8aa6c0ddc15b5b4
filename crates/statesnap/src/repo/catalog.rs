//! Catalog queries: which snapshots exist and which one to use.
//!
//! Listing order of object stores is unspecified, so every result is sorted
//! by `(offset, snapshot id)` here. A manifest that cannot be read is
//! reported in [`Listing::unreadable`] with the reason, never silently
//! dropped and never fatal to the listing.

use futures::{StreamExt, TryStreamExt};
use object_store::ObjectStoreExt;
use object_store::path::Path;

use super::manifest::Manifest;
use super::paths::{self, ManifestName, SnapshotId, StoreKey};
use super::{Repository, map_store_error};
use crate::error::{Error, ErrorKind, Result};

/// A committed, verified snapshot.
#[derive(Debug, Clone, PartialEq)]
pub struct SnapshotInfo {
    /// Object key of the manifest.
    pub key: String,
    /// The decoded manifest.
    pub manifest: Manifest,
}

impl SnapshotInfo {
    /// Snapshot id.
    pub fn id(&self) -> SnapshotId {
        self.manifest.snapshot_id
    }
    /// Last changelog offset included.
    pub fn offset(&self) -> u64 {
        self.manifest.changelog.offset
    }
}

/// An object under `manifests/` that is not a usable manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnreadableManifest {
    /// Object key.
    pub key: String,
    /// Why: `corrupt` (bad bytes), `config` (newer format or unknown required
    /// feature), `transient` (read failed; retry).
    pub kind: ErrorKind,
    /// The error message.
    pub reason: String,
    /// The refusal, when the error carried one ([`crate::Reason`]): what a
    /// program acts on (the message is for people).
    pub refusal: Option<crate::Reason>,
}

/// The snapshots of one store.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Listing {
    /// Valid snapshots, sorted by `(offset, id)`, oldest first.
    pub snapshots: Vec<SnapshotInfo>,
    /// Manifests that could not be used.
    pub unreadable: Vec<UnreadableManifest>,
}

impl Listing {
    /// The live changelog incarnation as far as the repository can tell:
    /// the lineage of the most recently *created* snapshot (a dead
    /// incarnation has no writer left to snapshot it), as retention's
    /// [`crate::repo::retention::plan`] takes it. `None` when there are no
    /// snapshots.
    pub fn live_lineage(&self) -> Option<&crate::changelog::Lineage> {
        self.snapshots
            .iter()
            .max_by_key(|s| (s.manifest.created_at, s.manifest.name()))
            .map(|s| &s.manifest.changelog.lineage)
    }

    /// How many changelog incarnations (lineages) the snapshots span.
    pub fn lineages(&self) -> usize {
        self.snapshots
            .iter()
            .map(|s| &s.manifest.changelog.lineage)
            .collect::<std::collections::BTreeSet<_>>()
            .len()
    }

    /// The newest valid snapshot of the live incarnation
    /// ([`Listing::live_lineage`]): what restore and retention mean by the
    /// newest. Offsets of different incarnations are not comparable (after
    /// a changelog is recreated, the dead incarnation's snapshots sit at
    /// higher offsets), so the highest offset overall is not the answer.
    pub fn latest(&self) -> Option<&SnapshotInfo> {
        let live = self.live_lineage()?;
        self.latest_of(live)
    }

    /// The newest valid snapshot of changelog incarnation `lineage`.
    pub fn latest_of(&self, lineage: &crate::changelog::Lineage) -> Option<&SnapshotInfo> {
        self.snapshots
            .iter()
            .rev()
            .find(|s| s.manifest.changelog.lineage == *lineage)
    }
    /// The newest valid snapshot whose offset is `<= offset`.
    pub fn at_or_before(&self, offset: u64) -> Option<&SnapshotInfo> {
        self.snapshots.iter().rev().find(|s| s.offset() <= offset)
    }

    /// Counts and sizes over the listing (see [`StoreSummary`]).
    pub fn summary(&self, store_key: &StoreKey) -> StoreSummary {
        let mut blobs = std::collections::BTreeMap::new();
        let mut total_bytes = 0u64;
        for s in &self.snapshots {
            for f in &s.manifest.files {
                total_bytes += f.size;
                blobs.insert(f.blake3, f.size);
            }
        }
        let newest = self.latest();
        StoreSummary {
            store_key: store_key.clone(),
            snapshots: self.snapshots.len(),
            unreadable: self.unreadable.len(),
            newest_offset: newest.map(SnapshotInfo::offset),
            newest_created_at: newest.map(|s| s.manifest.created_at),
            total_bytes,
            unique_bytes: blobs.values().sum(),
        }
    }
}

/// What one store partition holds in the repository.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreSummary {
    /// The store partition.
    pub store_key: StoreKey,
    /// Valid snapshots.
    pub snapshots: usize,
    /// Manifests that could not be used.
    pub unreadable: usize,
    /// The newest snapshot's changelog offset.
    pub newest_offset: Option<u64>,
    /// When the newest snapshot was created (ms since the epoch).
    pub newest_created_at: Option<i64>,
    /// Bytes the snapshots name, each counted once per snapshot (what
    /// restoring every one of them would download).
    pub total_bytes: u64,
    /// Bytes of the distinct blobs they name (what they occupy; blobs not
    /// yet collected by gc are not counted).
    pub unique_bytes: u64,
}

/// A manifest key found by listing, not yet read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManifestKey {
    /// Offset and id parsed from the key.
    pub name: ManifestName,
    /// The key.
    pub key: Path,
}

/// Largest manifest a reader accepts: a manifest names each file in about
/// 150 bytes, so this allows ~400 000 files, far beyond any store.
pub const MAX_MANIFEST_BYTES: u64 = 64 << 20;

/// The catalog of a [`Repository`] ([`Repository::catalog`]): which stores
/// and snapshots exist; reading, picking and deleting their manifests.
#[derive(Debug, Clone, Copy)]
pub struct Catalog<'a> {
    pub(crate) repo: &'a Repository,
}

impl<'a> Catalog<'a> {
    /// Lists manifest keys of `sk` without reading them, sorted by
    /// `(offset, id)`; objects under `manifests/` that are not manifest keys
    /// come back as unreadable.
    pub async fn list_manifest_keys(
        self,
        sk: &StoreKey,
    ) -> Result<(Vec<ManifestKey>, Vec<UnreadableManifest>)> {
        let prefix = paths::manifests_prefix(sk);
        let metas: Vec<_> = self
            .repo
            .store
            .list(Some(&prefix))
            .try_collect()
            .await
            .map_err(|e| map_store_error(e, &format!("cannot list manifests prefix=`{prefix}`")))?;
        let mut keys = Vec::new();
        let mut foreign = Vec::new();
        for m in metas {
            match paths::parse_manifest(&m.location) {
                Some((k, name)) if &k == sk => keys.push(ManifestKey {
                    name,
                    key: m.location,
                }),
                _ => foreign.push(UnreadableManifest {
                    key: m.location.to_string(),
                    kind: ErrorKind::Corrupt,
                    reason: "not a manifest key (foreign object under manifests/)".into(),
                    refusal: None,
                }),
            }
        }
        keys.sort_by_key(|a| a.name);
        foreign.sort_by(|a, b| a.key.cmp(&b.key));
        Ok((keys, foreign))
    }

    /// Reads and verifies one manifest. A manifest larger than
    /// [`MAX_MANIFEST_BYTES`] is refused as corrupt before it is read.
    pub async fn read_manifest(self, key: &Path) -> Result<Manifest> {
        let res = self
            .repo
            .store
            .get(key)
            .await
            .map_err(|e| map_store_error(e, &format!("cannot read manifest key=`{key}`")))?;
        if res.meta.size > MAX_MANIFEST_BYTES {
            return Err(Error::corrupt(format!(
                "manifest is larger than any statesnap writes key=`{key}` size={} max={MAX_MANIFEST_BYTES}",
                res.meta.size
            )));
        }
        let bytes = res
            .bytes()
            .await
            .map_err(|e| map_store_error(e, &format!("cannot read manifest key=`{key}`")))?;
        Manifest::decode(key.as_ref(), &bytes)
    }

    /// Lists the snapshots of `sk`, reading every manifest (bounded
    /// parallelism). A manifest deleted while listing is skipped.
    pub async fn list_snapshots(self, sk: &StoreKey) -> Result<Listing> {
        let (keys, mut unreadable) = self.list_manifest_keys(sk).await?;
        let results: Vec<(ManifestKey, Result<Manifest>)> = futures::stream::iter(keys)
            .map(|k| async move {
                let r = self.read_manifest(&k.key).await;
                (k, r)
            })
            .buffer_unordered(self.repo.transfer.parallelism.max(1) * 4)
            .collect()
            .await;
        let mut snapshots = Vec::new();
        for (k, r) in results {
            match r {
                Ok(manifest) => snapshots.push(SnapshotInfo {
                    key: k.key.to_string(),
                    manifest,
                }),
                Err(e) if e.kind() == ErrorKind::NotFound => {}
                Err(e) => unreadable.push(UnreadableManifest {
                    key: k.key.to_string(),
                    kind: e.kind(),
                    reason: e.message().to_owned(),
                    refusal: e.reason(),
                }),
            }
        }
        snapshots.sort_by_key(|a| a.manifest.name());
        unreadable.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(Listing {
            snapshots,
            unreadable,
        })
    }

    /// The newest valid snapshot of `sk`'s live incarnation (see
    /// [`Listing::latest`]).
    pub async fn latest(self, sk: &StoreKey) -> Result<Option<SnapshotInfo>> {
        Ok(self.list_snapshots(sk).await?.latest().cloned())
    }

    /// Snapshot `id` of `sk`, or the newest valid one of its live
    /// incarnation when `id` is `None` ([`Listing::latest`]; `not_found`
    /// when it has none).
    pub async fn snapshot_or_latest(
        self,
        sk: &StoreKey,
        id: Option<SnapshotId>,
    ) -> Result<SnapshotInfo> {
        match id {
            Some(id) => self.get_snapshot(sk, id).await,
            None => self.latest(sk).await?.ok_or_else(|| {
                Error::not_found(format!(
                    "store has no valid snapshot store_key=`{sk}`; `statesnap stores` lists the \
                     stores that have some, `statesnap list` a store's snapshots"
                ))
            }),
        }
    }

    /// The newest valid snapshot of `sk` with offset `<= offset`.
    pub async fn at_or_before(self, sk: &StoreKey, offset: u64) -> Result<Option<SnapshotInfo>> {
        Ok(self.list_snapshots(sk).await?.at_or_before(offset).cloned())
    }

    async fn find_manifest_key(self, sk: &StoreKey, id: SnapshotId) -> Result<ManifestKey> {
        let (keys, _) = self.list_manifest_keys(sk).await?;
        keys.into_iter().find(|k| k.name.id == id).ok_or_else(|| {
            Error::not_found(format!(
                "no such snapshot store_key=`{sk}` snapshot_id=`{id}`"
            ))
        })
    }

    /// The snapshot `id` of `sk`.
    pub async fn get_snapshot(self, sk: &StoreKey, id: SnapshotId) -> Result<SnapshotInfo> {
        let k = self.find_manifest_key(sk, id).await?;
        let manifest = self.read_manifest(&k.key).await?;
        Ok(SnapshotInfo {
            key: k.key.to_string(),
            manifest,
        })
    }

    /// Deletes snapshot `id` of `sk` (its manifest; blobs go with gc).
    pub async fn delete_snapshot(self, sk: &StoreKey, id: SnapshotId) -> Result<()> {
        let k = self.find_manifest_key(sk, id).await?;
        self.repo
            .store
            .delete(&k.key)
            .await
            .map_err(|e| map_store_error(e, &format!("cannot delete manifest key=`{}`", k.key)))
    }

    /// [`Listing::summary`] of every store partition, sorted by key.
    pub async fn store_summaries(self) -> Result<Vec<StoreSummary>> {
        let mut out = Vec::new();
        for sk in self.list_stores().await? {
            let listing = self.list_snapshots(&sk).await?;
            out.push(listing.summary(&sk));
        }
        Ok(out)
    }

    /// Up to `limit` store partitions of the repository whose names are
    /// close to `sk` (for a "did you mean" when `sk` has no snapshots): the
    /// same application and store with other partitions first, then keys
    /// a few edits away; closest first. `sk` itself is never among them.
    pub async fn similar_stores(self, sk: &StoreKey, limit: usize) -> Result<Vec<StoreKey>> {
        Ok(similar_store_keys(sk, &self.list_stores().await?, limit))
    }

    /// Every store partition with a folder in the repository, sorted.
    pub async fn list_stores(self) -> Result<Vec<StoreKey>> {
        let prefix = paths::stores_prefix();
        let res = self
            .repo
            .store
            .list_with_delimiter(Some(&prefix))
            .await
            .map_err(|e| map_store_error(e, &format!("cannot list stores prefix=`{prefix}`")))?;
        let mut out: Vec<StoreKey> = res
            .common_prefixes
            .iter()
            .filter_map(|p| p.filename().and_then(StoreKey::parse))
            .collect();
        out.sort();
        out.dedup();
        Ok(out)
    }
}

/// The ranking behind [`Catalog::similar_stores`](crate::repo::Catalog::similar_stores).
pub(crate) fn similar_store_keys(
    sk: &StoreKey,
    candidates: &[StoreKey],
    limit: usize,
) -> Vec<StoreKey> {
    let want = sk.to_string();
    let mut scored: Vec<(usize, &StoreKey)> = candidates
        .iter()
        .filter(|c| *c != sk)
        .filter_map(|c| {
            if c.application() == sk.application() && c.store() == sk.store() {
                // Another partition of the same store: closest of all.
                return Some((0, c));
            }
            let d = edit_distance(&want, &c.to_string());
            (d <= (want.len() / 4).max(2)).then_some((d, c))
        })
        .collect();
    scored.sort();
    scored
        .into_iter()
        .take(limit)
        .map(|(_, c)| c.clone())
        .collect()
}

/// Levenshtein distance over chars.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            let subst = prev[j] + usize::from(ca != *cb);
            cur[j + 1] = subst.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

#[cfg(test)]
mod similar_tests {
    use super::*;

    fn k(a: &str, s: &str, p: u32) -> StoreKey {
        StoreKey::new(a, s, p).unwrap()
    }

    #[test]
    fn similar_stores_put_other_partitions_first_then_near_names() {
        let all = vec![
            k("shop", "carts", 0),
            k("shop", "carts", 3),
            k("shop", "cart", 1),
            k("shop", "orders", 1),
            k("billing", "invoices", 1),
        ];
        let got = similar_store_keys(&k("shop", "carts", 1), &all, 5);
        assert_eq!(
            got,
            vec![
                k("shop", "carts", 0),
                k("shop", "carts", 3),
                k("shop", "cart", 1)
            ]
        );
        assert_eq!(similar_store_keys(&k("shop", "carts", 1), &all, 1).len(), 1);
        assert!(similar_store_keys(&k("zzz", "yyy", 9), &all, 5).is_empty());
        assert_eq!(edit_distance("kitten", "sitting"), 3);
    }
}
