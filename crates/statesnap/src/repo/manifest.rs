//! Manifest v1: the JSON document that *is* a snapshot (invariant 3: a
//! snapshot exists iff its manifest exists). Documented field by field in
//! `docs/format.md`, section "Repository and manifest v1".
//!
//! Decoding checks, in order: the `format_version` (unknown → config error
//! naming both versions), the `checksum` (blake3 of the canonical body;
//! mismatch → corrupt), the typed shape (→ corrupt), `required_features`
//! (unknown → config error naming them), and the semantic rules (key/body
//! agreement, safe relative file paths, no duplicate paths → corrupt).

use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::path::{Component, PathBuf};

use super::paths::{self, BlobHash, ManifestName, SnapshotId, StoreKey};
use crate::changelog::{ChangelogBinding, ChangelogId, Lineage};
use crate::digest::LogicalDigest;
use crate::error::{Error, Result};

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

    /// The canonical body: the JSON object without `checksum`, with keys
    /// sorted, no whitespace (as `serde_json` writes a `Value`).
    pub fn canonical_body(value: &serde_json::Value) -> Result<Vec<u8>> {
        let mut body = value.clone();
        if let Some(obj) = body.as_object_mut() {
            obj.remove("checksum");
        }
        let canonical = sort_keys(body);
        serde_json::to_vec(&canonical)
            .map_err(|e| Error::internal("cannot serialize manifest body").with_source(e))
    }

    /// Recomputes and stores the checksum.
    pub fn seal(&mut self) -> Result<()> {
        let v = serde_json::to_value(&*self)
            .map_err(|e| Error::internal("cannot serialize manifest").with_source(e))?;
        self.checksum = blake3::hash(&Self::canonical_body(&v)?)
            .to_hex()
            .to_string();
        Ok(())
    }

    /// Encodes as JSON (after [`Manifest::seal`]).
    pub fn encode(&self) -> Result<Vec<u8>> {
        let v = serde_json::to_value(self)
            .map_err(|e| Error::internal("cannot serialize manifest").with_source(e))?;
        serde_json::to_vec_pretty(&sort_keys(v))
            .map_err(|e| Error::internal("cannot serialize manifest").with_source(e))
    }

    /// Decodes and verifies the manifest stored at `key`.
    pub fn decode(key: &str, bytes: &[u8]) -> Result<Self> {
        let value: serde_json::Value = serde_json::from_slice(bytes).map_err(|e| {
            Error::corrupt(format!(
                "manifest is not valid json (truncated?) key=`{key}` length={}",
                bytes.len()
            ))
            .with_source(e)
        })?;
        let obj = value
            .as_object()
            .ok_or_else(|| Error::corrupt(format!("manifest is not a json object key=`{key}`")))?;
        let version = obj
            .get("format_version")
            .and_then(serde_json::Value::as_u64)
            .ok_or_else(|| {
                Error::corrupt(format!(
                    "manifest has no numeric format_version key=`{key}`"
                ))
            })?;
        if version != MANIFEST_FORMAT_VERSION {
            return Err(Error::config(format!(
                "unsupported manifest format version: upgrade statesnap key=`{key}` \
                 format_version={version} supported={MANIFEST_FORMAT_VERSION}"
            ))
            .with_reason(crate::Reason::UnsupportedVersion));
        }
        let stored = obj
            .get("checksum")
            .and_then(serde_json::Value::as_str)
            .unwrap_or("")
            .to_owned();
        let actual = blake3::hash(&Self::canonical_body(&value)?)
            .to_hex()
            .to_string();
        if stored != actual {
            return Err(Error::corrupt(format!(
                "manifest checksum mismatch key=`{key}` stored=`{}` computed=`{actual}`",
                stored.escape_debug()
            )));
        }
        let m: Manifest = serde_json::from_value(value).map_err(|e| {
            Error::corrupt(format!("manifest has an invalid shape key=`{key}`")).with_source(e)
        })?;
        let unknown: Vec<&str> = m
            .required_features
            .iter()
            .map(String::as_str)
            .filter(|f| !SUPPORTED_FEATURES.contains(f))
            .collect();
        if !unknown.is_empty() {
            return Err(Error::config(format!(
                "manifest requires features this statesnap does not understand: upgrade statesnap \
                 key=`{key}` unknown_features=`{}`",
                unknown.join(",")
            ))
            .with_reason(crate::Reason::UnsupportedVersion));
        }
        m.validate()
            .map_err(|e| Error::corrupt(format!("{} key=`{key}`", e.message())))?;
        if let Some((sk, name)) = paths::parse_manifest(&object_store::path::Path::from(key))
            && (sk != m.store_key || name != m.name())
        {
            return Err(Error::corrupt(format!(
                "manifest body does not match its key key=`{key}` body_store_key=`{}` \
                     body_offset={} body_id=`{}`",
                m.store_key, m.changelog.offset, m.snapshot_id
            )));
        }
        Ok(m)
    }

    /// Semantic checks: every file path is safe, no duplicates (blob and
    /// inline files together); inline files within their limits and
    /// declared in `required_features`.
    pub fn validate(&self) -> Result<()> {
        let mut seen = BTreeSet::new();
        let paths = self
            .files
            .iter()
            .map(|f| &f.path)
            .chain(self.inline_files.iter().map(|f| &f.path));
        for path in paths {
            validate_file_path(path)?;
            if !seen.insert(path.as_str()) {
                return Err(Error::config(format!(
                    "duplicate file path in manifest path=`{}`",
                    path.escape_debug()
                )));
            }
        }
        if !self.inline_files.is_empty() {
            if !self
                .required_features
                .iter()
                .any(|f| f == FEATURE_INLINE_FILES)
            {
                return Err(Error::config(format!(
                    "manifest carries inline files but does not require feature \
                     `{FEATURE_INLINE_FILES}` (older readers would miss them)"
                )));
            }
            let mut total = 0u64;
            for f in &self.inline_files {
                if f.size > MAX_INLINE_FILE {
                    return Err(Error::config(format!(
                        "inline file too large path=`{}` size={} max={MAX_INLINE_FILE}",
                        f.path.escape_debug(),
                        f.size
                    )));
                }
                total += f.size;
            }
            if total > MAX_INLINE_TOTAL {
                return Err(Error::config(format!(
                    "manifest carries too many inline bytes total={total} max={MAX_INLINE_TOTAL}"
                )));
            }
        }
        if self.depends_on.contains(&self.snapshot_id) {
            return Err(Error::config(format!(
                "manifest depends on itself snapshot_id=`{}`",
                self.snapshot_id
            )));
        }
        Ok(())
    }

    /// Joins `path` (a manifest file path) onto `target_dir`, refusing any
    /// path that could land outside it.
    pub fn file_path_within(target_dir: &std::path::Path, path: &str) -> Result<PathBuf> {
        validate_file_path(path)?;
        let mut out = target_dir.to_path_buf();
        for part in path.split('/') {
            out.push(part);
        }
        // Belt and braces: only normal components were added.
        let added = out.strip_prefix(target_dir).map_err(|_| {
            Error::internal(format!(
                "joined path escaped target path=`{}`",
                path.escape_debug()
            ))
        })?;
        if !added
            .components()
            .all(|c| matches!(c, Component::Normal(_)))
        {
            return Err(Error::internal(format!(
                "joined path has non-normal components path=`{}`",
                path.escape_debug()
            )));
        }
        Ok(out)
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

/// Rejects any path that is not a plain relative `/`-separated path of
/// normal names: no `..`, `.`, empty components, absolute or drive paths,
/// backslashes, NUL or control characters; at most [`MAX_FILE_PATH_LEN`] bytes.
pub fn validate_file_path(path: &str) -> Result<()> {
    let bad = |why: &str| {
        Err(Error::config(format!(
            "unsafe file path in manifest: {why} path=`{}`",
            path.escape_debug()
        )))
    };
    if path.is_empty() {
        return bad("empty");
    }
    if path.len() > MAX_FILE_PATH_LEN {
        return bad("too long");
    }
    if path.chars().any(char::is_control) {
        return bad("control character");
    }
    if path.contains('\\') {
        return bad("backslash");
    }
    if path.starts_with('/') {
        return bad("absolute");
    }
    for part in path.split('/') {
        match part {
            "" => return bad("empty component"),
            "." | ".." => return bad("dot component"),
            _ => {}
        }
        if part.contains(':') {
            return bad("drive or stream separator `:`");
        }
        if part.len() > 255 {
            return bad("component too long");
        }
    }
    Ok(())
}

fn sort_keys(v: serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    match v {
        Value::Object(map) => {
            let mut entries: Vec<(String, Value)> = map.into_iter().collect();
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            Value::Object(
                entries
                    .into_iter()
                    .map(|(k, v)| (k, sort_keys(v)))
                    .collect(),
            )
        }
        Value::Array(items) => Value::Array(items.into_iter().map(sort_keys).collect()),
        other => other,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
pub(crate) mod tests {
    use super::*;
    use crate::ErrorKind;

    pub(crate) fn draft(sk: &StoreKey, offset: u64, files: Vec<FileEntry>) -> ManifestDraft {
        ManifestDraft {
            store_key: sk.clone(),
            changelog: ChangelogPosition {
                topic: "app-s-changelog".into(),
                partition: sk.partition(),
                offset,
                lineage: Lineage("lin".into()),
                epoch: None,
            },
            store_format: StoreFormatId {
                name: "test".into(),
                version: 1,
            },
            parent: None,
            depends_on: vec![],
            files,
            stats: SnapshotStats::default(),
            format_metadata: serde_json::json!({"z": 1, "a": [1.5, {"y": null, "b": true}]}),
            required_features: vec![],
        }
    }

    fn sample() -> Manifest {
        let sk = StoreKey::new("app", "s", 3).unwrap();
        let files = vec![FileEntry {
            path: "a/b.sst".into(),
            size: 3,
            blake3: BlobHash::of(b"abc"),
        }];
        Manifest::from_draft(draft(&sk, 42, files), SnapshotId::from_parts(1000, 7), 1000).unwrap()
    }

    fn reseal(v: &mut serde_json::Value) {
        let body = Manifest::canonical_body(v).unwrap();
        v["checksum"] = blake3::hash(&body).to_hex().to_string().into();
    }

    /// Reseals `v` (an edit with a valid checksum) and returns why decoding
    /// it as `key` fails.
    fn refused(key: &str, mut v: serde_json::Value) -> Error {
        reseal(&mut v);
        Manifest::decode(key, &serde_json::to_vec(&v).unwrap()).unwrap_err()
    }

    #[test]
    fn round_trips_and_ignores_unknown_plain_fields() {
        let m = sample();
        let key = m.key().to_string();
        let bytes = m.encode().unwrap();
        assert_eq!(Manifest::decode(&key, &bytes).unwrap(), m);
        let mut v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        v["future_field"] = serde_json::json!({"x": 1});
        reseal(&mut v);
        let back = Manifest::decode(&key, &serde_json::to_vec(&v).unwrap()).unwrap();
        assert_eq!(back.snapshot_id, m.snapshot_id);
    }

    #[test]
    fn hostile_and_broken_manifests_fail_with_the_right_kind() {
        let m = sample();
        let key = m.key().to_string();
        let good: serde_json::Value = serde_json::from_slice(&m.encode().unwrap()).unwrap();
        let bytes = m.encode().unwrap();
        let e = Manifest::decode(&key, &bytes[..bytes.len() / 2]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Corrupt);
        assert!(e.message().contains(&key), "{e}");

        let mut v = good.clone();
        v["created_at"] = 5.into();
        let e = Manifest::decode(&key, &serde_json::to_vec(&v).unwrap()).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Corrupt);
        assert!(e.message().contains("checksum mismatch"), "{e}");

        let mut v = good.clone();
        v["format_version"] = 2.into();
        reseal(&mut v);
        let e = Manifest::decode(&key, &serde_json::to_vec(&v).unwrap()).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Config);
        assert!(e.message().contains("format_version=2 supported=1"), "{e}");

        let mut v = good.clone();
        v["required_features"] = serde_json::json!(["zstd-dict", "encryption"]);
        reseal(&mut v);
        let e = Manifest::decode(&key, &serde_json::to_vec(&v).unwrap()).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Config);
        assert!(e.message().contains("zstd-dict,encryption"), "{e}");

        for bad in [
            "../etc/passwd",
            "a/../../b",
            "/abs",
            "C:/x",
            "a\\b",
            "a\0b",
            "./a",
            "a//b",
            "a/",
            "",
        ] {
            let mut v = good.clone();
            v["files"][0]["path"] = bad.into();
            reseal(&mut v);
            let e = Manifest::decode(&key, &serde_json::to_vec(&v).unwrap()).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Corrupt, "{bad}: {e}");
        }

        let mut v = good.clone();
        v["changelog"]["offset"] = 43.into();
        let e = refused(&key, v);
        assert_eq!(e.kind(), ErrorKind::Corrupt);
        assert!(e.message().contains("does not match its key"), "{e}");
    }

    #[test]
    fn file_path_within_joins_only_safe_paths() {
        let dir = std::path::Path::new("/restore/here");
        assert_eq!(
            Manifest::file_path_within(dir, "a/b.sst").unwrap(),
            dir.join("a").join("b.sst")
        );
        for bad in [
            "..",
            "../x",
            "a/../../x",
            "/etc",
            "C:\\x",
            "c:x",
            "a\\..\\b",
            "a\u{1}b",
        ] {
            let e = Manifest::file_path_within(dir, bad).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Config, "{bad}");
        }
    }

    fn with_inline(files: Vec<InlineFile>) -> Manifest {
        let sk = StoreKey::new("app", "s", 3).unwrap();
        let extras = ManifestExtras {
            inline_files: files,
            ..ManifestExtras::default()
        };
        Manifest::from_draft_with(
            draft(&sk, 42, sample().files),
            extras,
            SnapshotId::from_parts(1000, 7),
            1000,
        )
        .unwrap()
    }

    #[test]
    fn inline_files_round_trip_and_require_their_feature() {
        let text = b"MANIFEST-000005\n".repeat(40);
        let m = with_inline(vec![
            InlineFile::new("CURRENT", &text).unwrap(),
            InlineFile::new("empty.log", b"").unwrap(),
        ]);
        assert_eq!(m.required_features, vec![FEATURE_INLINE_FILES.to_owned()]);
        // Compressed: the repeated text takes far less than its size.
        assert!(m.inline_files[0].zstd_base64.len() < text.len() / 4);
        let key = m.key().to_string();
        let back = Manifest::decode(&key, &m.encode().unwrap()).unwrap();
        assert_eq!(back, m);
        assert_eq!(back.inline_files[0].bytes().unwrap(), text);
        assert_eq!(back.inline_files[1].bytes().unwrap(), b"");
        // A manifest without inline files does not mention them at all.
        let plain = sample().encode().unwrap();
        assert!(!String::from_utf8(plain).unwrap().contains("inline"));

        // A reader that does not know the feature refuses the manifest.
        let mut v: serde_json::Value = serde_json::from_slice(&m.encode().unwrap()).unwrap();
        v["required_features"] = serde_json::json!([]);
        let e = refused(&key, v);
        assert_eq!(e.kind(), ErrorKind::Corrupt);
        assert!(e.message().contains("inline-files"), "{e}");
    }

    #[test]
    fn inline_files_obey_paths_and_limits() {
        // A path both a blob and inline.
        let sk = StoreKey::new("app", "s", 3).unwrap();
        let extras = ManifestExtras {
            inline_files: vec![InlineFile::new("a/b.sst", b"abc").unwrap()],
            ..ManifestExtras::default()
        };
        let e = Manifest::from_draft_with(
            draft(&sk, 42, sample().files),
            extras,
            SnapshotId::from_parts(1000, 7),
            1000,
        )
        .unwrap_err();
        assert!(e.message().contains("duplicate file path"), "{e}");
        // Unsafe paths and oversized files are refused when built.
        assert!(InlineFile::new("../x", b"a").is_err());
        let big = vec![7u8; MAX_INLINE_FILE as usize + 1];
        assert_eq!(
            InlineFile::new("big", &big).unwrap_err().kind(),
            ErrorKind::Config
        );
        // And in a decoded manifest, whatever its writer claimed.
        let m = with_inline(vec![InlineFile::new("CURRENT", b"x").unwrap()]);
        let key = m.key().to_string();
        let good: serde_json::Value = serde_json::from_slice(&m.encode().unwrap()).unwrap();
        let mut v = good.clone();
        v["inline_files"][0]["size"] = (MAX_INLINE_FILE + 1).into();
        let e = refused(&key, v);
        assert_eq!(e.kind(), ErrorKind::Corrupt);
        assert!(e.message().contains("inline file too large"), "{e}");
        let one = InlineFile::new("f0", &vec![1u8; MAX_INLINE_FILE as usize]).unwrap();
        let mut many = good;
        many["inline_files"] = serde_json::Value::Array(
            (0..5)
                .map(|i| {
                    let mut f = serde_json::to_value(&one).unwrap();
                    f["path"] = format!("f{i}").into();
                    f
                })
                .collect(),
        );
        let e = refused(&key, many);
        assert!(e.message().contains("too many inline bytes"), "{e}");
    }

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
            assert!(e.message().contains(what), "{what}: {e}");
            assert!(e.message().contains("CURRENT"), "{what}: {e}");
        }
    }
}
