//! Manifest v1: the JSON document that *is* a snapshot (invariant 3: a
//! snapshot exists iff its manifest exists). Documented field by field in
//! `docs/format.md`, section "Repository and manifest v1".
//!
//! Encoding, decoding and validation are in `manifest/codec.rs`.

mod codec;

use serde::{Deserialize, Serialize};

use super::paths::{self, BlobHash, ManifestName, SnapshotId, StoreKey};
use crate::changelog::{ChangelogBinding, ChangelogId, Lineage};
use crate::digest::LogicalDigest;
use crate::error::{Error, Result};
pub use codec::validate_file_path;

/// The manifest format version this build writes and reads.
pub const MANIFEST_FORMAT_VERSION: u64 = 1;

/// The feature a manifest carrying [`InlineFile`]s requires: a reader that
/// does not know it would restore the snapshot without those files.
pub const FEATURE_INLINE_FILES: &str = "inline-files";

/// Features this build understands; a manifest listing any other entry in
/// `required_features` is refused.
pub const SUPPORTED_FEATURES: &[&str] = &[FEATURE_INLINE_FILES];

/// Largest file a manifest may carry inline, in bytes.
pub const MAX_INLINE_FILE: u64 = 64 << 10;

/// Most bytes (before compression) a manifest may carry inline in all.
pub const MAX_INLINE_TOTAL: u64 = 256 << 10;

/// Longest file path inside a snapshot, in bytes.
pub const MAX_FILE_PATH_LEN: usize = 1024;

/// Where in the changelog a snapshot is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChangelogPosition {
    /// Changelog topic.
    pub topic: String,
    /// Changelog partition.
    pub partition: u32,
    /// The last changelog offset whose effect the snapshot includes.
    pub offset: u64,
    /// The changelog incarnation the offset belongs to.
    pub lineage: Lineage,
    /// The changelog's writer epoch at `offset`, when the log keeps an
    /// epoch history ([`crate::changelog::Changelog::epoch_at`]). Absent in
    /// manifests of logs without one (and of older writers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epoch: Option<u64>,
}

impl ChangelogPosition {
    /// If the changelog lost the history this position was taken in: the
    /// epoch recorded here and the (different) one the log now has at the
    /// offset. `None` when they agree or either side keeps no epoch.
    pub fn lost_history<C: crate::changelog::Changelog + ?Sized>(
        &self,
        changelog: &C,
    ) -> Result<Option<(u64, u64)>> {
        let Some(taken) = self.epoch else {
            return Ok(None);
        };
        Ok(changelog
            .epoch_at(self.offset)?
            .filter(|&now| now != taken)
            .map(|now| (taken, now)))
    }

    /// The changelog incarnation a store restored from this snapshot follows.
    pub fn binding(&self) -> ChangelogBinding {
        ChangelogBinding {
            changelog: ChangelogId {
                topic: self.topic.clone(),
                partition: self.partition,
            },
            lineage: self.lineage.clone(),
        }
    }
}

/// Which store format wrote the files, and its version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoreFormatId {
    /// Format name, e.g. `rocksdb` or `portable`.
    pub name: String,
    /// Format version.
    pub version: u32,
}

/// One file of a snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileEntry {
    /// Relative path inside the restore directory (validated, `/`-separated).
    pub path: String,
    /// Size in bytes.
    pub size: u64,
    /// blake3 of the bytes; also the blob's name.
    pub blake3: BlobHash,
}

/// A small file carried in the manifest itself rather than as a blob: no
/// upload of its own, no durable write of its own, no `head` at commit, no
/// download at restore. Writers use it for files that change with every
/// snapshot and are too small for a blob's fixed costs to be worth paying
/// (a RocksDB store's `CURRENT`, `MANIFEST-*` and `OPTIONS-*`).
///
/// The bytes are stored zstd-compressed and base64-encoded; [`InlineFile::bytes`]
/// decodes them and checks them against `size` and `blake3`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InlineFile {
    /// Relative path inside the restore directory (validated, `/`-separated).
    pub path: String,
    /// Size in bytes, at most [`MAX_INLINE_FILE`].
    pub size: u64,
    /// blake3 of the bytes.
    pub blake3: BlobHash,
    /// The bytes: zstd, then base64 (standard alphabet, padded).
    pub zstd_base64: String,
}

impl InlineFile {
    /// An inline file holding `bytes` (at most [`MAX_INLINE_FILE`]).
    pub fn new(path: &str, bytes: &[u8]) -> Result<InlineFile> {
        use base64::Engine as _;
        validate_file_path(path)?;
        if bytes.len() as u64 > MAX_INLINE_FILE {
            return Err(Error::config(format!(
                "file too large to carry in a manifest path=`{}` size={} max={MAX_INLINE_FILE}",
                path.escape_debug(),
                bytes.len()
            )));
        }
        let packed = zstd::bulk::compress(bytes, 3)
            .map_err(|e| Error::internal("cannot compress inline file").with_source(e))?;
        Ok(InlineFile {
            path: path.to_owned(),
            size: bytes.len() as u64,
            blake3: BlobHash::of(bytes),
            zstd_base64: base64::engine::general_purpose::STANDARD.encode(packed),
        })
    }

    /// The file's bytes, checked against its size and hash (corrupt
    /// otherwise). Decompression never allocates more than `size` bytes.
    pub fn bytes(&self) -> Result<Vec<u8>> {
        use base64::Engine as _;
        let bad = |what: &str| {
            Error::corrupt(format!(
                "inline file in manifest is damaged ({what}) path=`{}` size={}",
                self.path.escape_debug(),
                self.size
            ))
        };
        if self.size > MAX_INLINE_FILE {
            return Err(bad("larger than an inline file may be"));
        }
        let packed = base64::engine::general_purpose::STANDARD
            .decode(&self.zstd_base64)
            .map_err(|e| bad("not base64").with_source(e))?;
        // One byte of room beyond the size, so a longer payload is seen
        // as such rather than cut short.
        let bytes = zstd::bulk::decompress(&packed, self.size as usize + 1)
            .map_err(|e| bad("not zstd, or longer than its size").with_source(e))?;
        if bytes.len() as u64 != self.size {
            return Err(bad(&format!("decodes to {} bytes", bytes.len())));
        }
        if BlobHash::of(&bytes) != self.blake3 {
            return Err(bad("blake3 mismatch"));
        }
        Ok(bytes)
    }
}

/// Counters for humans and planners.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct SnapshotStats {
    /// Live keys in the snapshot: counted when [`SnapshotStats::counts_exact`],
    /// else the store's estimate (RocksDB's `estimate-num-keys`, which
    /// counts overwritten and deleted entries not yet compacted away).
    pub keys: u64,
    /// Logical bytes (keys + values): counted when
    /// [`SnapshotStats::counts_exact`], else the store's estimate.
    pub logical_bytes: u64,
    /// Bytes this snapshot uploaded.
    pub bytes_uploaded: u64,
    /// Bytes of blobs reused from earlier snapshots.
    pub bytes_reused: u64,
    /// Whether `keys` and `logical_bytes` were counted from the snapshot's
    /// contents when it was taken. `false`: they are estimates, or the
    /// manifest predates this field (absent in JSON) and does not say.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub counts_exact: bool,
}

/// What a snapshot writer supplies; [`super::Repository::commit`] adds the
/// id, `created_at`, format version and checksum.
#[derive(Debug, Clone, PartialEq)]
pub struct ManifestDraft {
    /// Which store partition.
    pub store_key: StoreKey,
    /// Changelog position the data matches exactly.
    pub changelog: ChangelogPosition,
    /// Store format.
    pub store_format: StoreFormatId,
    /// The snapshot this one was derived from, if any (informational).
    pub parent: Option<SnapshotId>,
    /// Snapshots whose data this one needs to restore (e.g. a delta's base).
    pub depends_on: Vec<SnapshotId>,
    /// Files, each a blob that must already be stored.
    pub files: Vec<FileEntry>,
    /// Counters.
    pub stats: SnapshotStats,
    /// Free-form, per store format.
    pub format_metadata: serde_json::Value,
    /// Features a reader must understand to use this manifest.
    pub required_features: Vec<String>,
}

/// A decoded, verified manifest (v1).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// Always [`MANIFEST_FORMAT_VERSION`].
    pub format_version: u64,
    /// Snapshot id (ULID).
    pub snapshot_id: SnapshotId,
    /// Store partition.
    pub store_key: StoreKey,
    /// Changelog position.
    pub changelog: ChangelogPosition,
    /// Store format.
    pub store_format: StoreFormatId,
    /// Creation time, ms since the epoch, from the writer's injected clock.
    pub created_at: i64,
    /// Derived-from snapshot (informational).
    pub parent: Option<SnapshotId>,
    /// Snapshots this one needs to restore; retention keeps them.
    pub depends_on: Vec<SnapshotId>,
    /// Files.
    pub files: Vec<FileEntry>,
    /// Small files carried in the manifest instead of as blobs (requires
    /// [`FEATURE_INLINE_FILES`]). Absent when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub inline_files: Vec<InlineFile>,
    /// Counters.
    pub stats: SnapshotStats,
    /// Free-form per store format.
    pub format_metadata: serde_json::Value,
    /// Features a reader must understand.
    pub required_features: Vec<String>,
    /// Order-independent digest of the snapshot's key/value contents, when
    /// its writer computed one (`verify --deep` and digest-checking restores
    /// compare against it). Optional: older readers ignore it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logical_digest: Option<LogicalDigest>,
    /// Rates the writer measured, for restore-time estimates. Optional.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub measured: Option<MeasuredRates>,
    /// blake3 hex of the canonical body (see [`Manifest::canonical_body`]).
    pub checksum: String,
}

/// What a snapshot's writer measured, recorded in its manifest so a plan
/// in another process can estimate restore time before measuring anything.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct MeasuredRates {
    /// Bytes uploaded per second while the snapshot was written (`None`
    /// when it uploaded too little to measure).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upload_bytes_per_sec: Option<u64>,
    /// The writer's changelog replay rate, records per second, as last
    /// measured in that process.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replay_records_per_sec: Option<u64>,
}

/// Fields a writer adds to a manifest besides its draft.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ManifestExtras {
    pub(crate) logical_digest: Option<LogicalDigest>,
    pub(crate) measured: Option<MeasuredRates>,
    pub(crate) inline_files: Vec<InlineFile>,
}

impl Manifest {
    /// Builds a manifest from a draft and seals it (computes its checksum).
    pub fn from_draft(
        draft: ManifestDraft,
        snapshot_id: SnapshotId,
        created_at: i64,
    ) -> Result<Self> {
        Self::from_draft_with(draft, ManifestExtras::default(), snapshot_id, created_at)
    }

    pub(crate) fn from_draft_with(
        draft: ManifestDraft,
        extras: ManifestExtras,
        snapshot_id: SnapshotId,
        created_at: i64,
    ) -> Result<Self> {
        let mut required_features = draft.required_features;
        if !extras.inline_files.is_empty()
            && !required_features.iter().any(|f| f == FEATURE_INLINE_FILES)
        {
            required_features.push(FEATURE_INLINE_FILES.to_owned());
        }
        let mut m = Manifest {
            format_version: MANIFEST_FORMAT_VERSION,
            snapshot_id,
            store_key: draft.store_key,
            changelog: draft.changelog,
            store_format: draft.store_format,
            created_at,
            parent: draft.parent,
            depends_on: draft.depends_on,
            files: draft.files,
            inline_files: extras.inline_files,
            stats: draft.stats,
            format_metadata: draft.format_metadata,
            required_features,
            logical_digest: extras.logical_digest,
            measured: extras.measured,
            checksum: String::new(),
        };
        m.validate()?;
        m.seal()?;
        Ok(m)
    }

    /// The key name (offset and id).
    pub fn name(&self) -> ManifestName {
        ManifestName {
            offset: self.changelog.offset,
            id: self.snapshot_id,
        }
    }

    /// The object key of this manifest.
    pub fn key(&self) -> object_store::path::Path {
        paths::manifest(&self.store_key, self.name())
    }

    /// The snapshot's live keys, counted when it was taken: `stats.keys`
    /// when [`SnapshotStats::counts_exact`], else the count its logical
    /// digest carries, else `None` (only an estimate was recorded:
    /// `stats.keys`).
    pub fn exact_keys(&self) -> Option<u64> {
        if self.stats.counts_exact {
            Some(self.stats.keys)
        } else {
            self.logical_digest.map(|d| d.keys())
        }
    }

    /// The snapshot's logical bytes (keys + values), counted when it was
    /// taken; `None` when only an estimate was recorded.
    pub fn exact_logical_bytes(&self) -> Option<u64> {
        self.stats.counts_exact.then_some(self.stats.logical_bytes)
    }

    /// Bytes of every file of the snapshot: its blobs' and its inline ones.
    pub fn file_bytes(&self) -> u64 {
        let blobs: u64 = self.files.iter().map(|f| f.size).sum();
        blobs + self.inline_files.iter().map(|f| f.size).sum::<u64>()
    }

    /// Distinct blobs named by the manifest.
    pub fn blobs(&self) -> Vec<(BlobHash, u64)> {
        let mut set = std::collections::BTreeMap::new();
        for f in &self.files {
            set.insert(f.blake3, f.size);
        }
        set.into_iter().collect()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    /// Damaged inline bytes (a manifest rewritten with a fresh checksum)
    /// are refused when read, and never decompressed beyond their size.
    #[test]
    fn damaged_inline_bytes_are_corrupt() {
        use base64::Engine as _;
        let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
        let good = InlineFile::new("CURRENT", b"MANIFEST-000005\n").unwrap();
        let cases = [
            ("not base64", "%%%".to_owned(), good.size),
            ("not zstd", b64(b"plain bytes"), good.size),
            (
                "longer than its size",
                b64(&zstd::bulk::compress(&[0u8; 1 << 20], 3).unwrap()),
                good.size,
            ),
            ("decodes to", good.zstd_base64.clone(), good.size - 1),
            (
                "blake3 mismatch",
                b64(&zstd::bulk::compress(b"MANIFEST-000006\n", 3).unwrap()),
                good.size,
            ),
        ];
        for (what, data, size) in cases {
            let f = InlineFile {
                zstd_base64: data,
                size,
                ..good.clone()
            };
            let e = f.bytes().unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Corrupt, "{what}: {e}");
        }
    }
}
