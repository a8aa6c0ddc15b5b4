//! Encoding, decoding and validation of a [`Manifest`].
//!
//! Decoding checks, in order: the `format_version` (unknown → config error
//! naming both versions), the `checksum` (blake3 of the canonical body;
//! mismatch → corrupt), the typed shape (→ corrupt), `required_features`
//! (unknown → config error naming them), and the semantic rules (key/body
//! agreement, safe relative file paths, no duplicate paths → corrupt).

use std::collections::BTreeSet;
use std::path::{Component, PathBuf};

use super::{
    FEATURE_INLINE_FILES, MANIFEST_FORMAT_VERSION, MAX_FILE_PATH_LEN, MAX_INLINE_FILE,
    MAX_INLINE_TOTAL, Manifest, SUPPORTED_FEATURES,
};
use crate::error::{Error, Result};
use crate::repo::paths;

impl Manifest {
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
mod tests {
    use super::*;
    use crate::ErrorKind;
    use crate::changelog::Lineage;
    use crate::repo::manifest::{
        ChangelogPosition, FileEntry, InlineFile, ManifestDraft, ManifestExtras, SnapshotStats,
        StoreFormatId,
    };
    use crate::repo::paths::{BlobHash, SnapshotId, StoreKey};

    fn draft(sk: &StoreKey, offset: u64, files: Vec<FileEntry>) -> ManifestDraft {
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

        let mut v = good.clone();
        v["created_at"] = 5.into();
        let e = Manifest::decode(&key, &serde_json::to_vec(&v).unwrap()).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Corrupt);

        let mut v = good.clone();
        v["format_version"] = 2.into();
        reseal(&mut v);
        let e = Manifest::decode(&key, &serde_json::to_vec(&v).unwrap()).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Config);
        assert_eq!(e.reason(), Some(crate::Reason::UnsupportedVersion));

        let mut v = good.clone();
        v["required_features"] = serde_json::json!(["zstd-dict", "encryption"]);
        reseal(&mut v);
        let e = Manifest::decode(&key, &serde_json::to_vec(&v).unwrap()).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Config);
        assert_eq!(e.reason(), Some(crate::Reason::UnsupportedVersion));

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
        assert_eq!(e.kind(), ErrorKind::Config);
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
        assert_eq!(e.kind(), ErrorKind::Corrupt);
    }
}
