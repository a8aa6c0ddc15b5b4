//! The `format_metadata` of a portable snapshot (its layers, checked against
//! the manifest's files), the chunk paths the layers name, and the policy
//! deciding when a snapshot may be a delta.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

use super::chunk;
use crate::error::{Error, Result};
use crate::repo::Manifest;

/// Most layers (one full run + deltas) a snapshot may have. Writes never
/// make more (a longer chain is consolidated into a full snapshot); restore
/// refuses more as corrupt, so a hostile manifest cannot make it hold one
/// prefetch queue per layer without end.
pub const MAX_LAYERS: usize = 64;

/// When a snapshot may be a delta over its parent rather than a full run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeltaPolicy {
    /// Write deltas at all.
    pub enabled: bool,
    /// At most this many delta layers over one full base; the next snapshot
    /// is full.
    pub max_chain_len: usize,
    /// Consolidate into a full snapshot once the deltas' logical bytes
    /// (including the new one) would exceed this percentage of the base's.
    pub max_delta_percent: u64,
}

impl Default for DeltaPolicy {
    fn default() -> Self {
        DeltaPolicy {
            enabled: true,
            max_chain_len: 8,
            max_delta_percent: 50,
        }
    }
}

/// Whether a layer is a full run or a delta.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LayerKind {
    /// Every live key; no tombstones.
    Full,
    /// Keys written or deleted since the previous layer.
    Delta,
}

/// One layer, as recorded in `format_metadata.layers`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LayerMeta {
    /// Full or delta.
    pub kind: LayerKind,
    /// Changelog offset of the cut this layer brings the store to.
    pub offset: u64,
    /// Records (puts and tombstones).
    pub records: u64,
    /// Logical bytes of the records (keys + values).
    pub logical_bytes: u64,
    /// Chunk files.
    pub chunks: u64,
}

/// `format_metadata` of a portable snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PortableMetadata {
    /// Chunk layout version.
    pub chunk_version: u16,
    /// Layers, base first; restore applies them in order.
    pub layers: Vec<LayerMeta>,
}

impl PortableMetadata {
    /// Parses and checks the metadata of `manifest` against its files: the
    /// first layer is full, the rest deltas, and the files are exactly the
    /// chunk paths the layers name.
    pub fn of(manifest: &Manifest) -> Result<Self> {
        let id = manifest.snapshot_id;
        let meta: PortableMetadata = serde_json::from_value(manifest.format_metadata.clone())
            .map_err(|e| {
                Error::corrupt(format!(
                    "portable snapshot has invalid format metadata snapshot=`{id}`"
                ))
                .with_source(e)
            })?;
        if meta.chunk_version != chunk::VERSION {
            return Err(Error::config(format!(
                "unsupported portable chunk version: upgrade statesnap snapshot=`{id}` \
                 chunk_version={} supported={}",
                meta.chunk_version,
                chunk::VERSION
            ))
            .with_reason(crate::Reason::UnsupportedVersion));
        }
        let bad = |why: &str| {
            Error::corrupt(format!(
                "portable snapshot metadata is inconsistent: {why} snapshot=`{id}`"
            ))
        };
        if meta.layers.is_empty() || meta.layers.len() > MAX_LAYERS {
            return Err(bad("layer count out of range"));
        }
        for (i, l) in meta.layers.iter().enumerate() {
            let want = if i == 0 {
                LayerKind::Full
            } else {
                LayerKind::Delta
            };
            if l.kind != want {
                return Err(bad(&format!("layer {i} has the wrong kind")));
            }
        }
        let total: u64 = meta.layers.iter().map(|l| l.chunks).sum();
        if total != manifest.files.len() as u64 {
            return Err(bad(&format!(
                "layers name {total} chunks but the manifest has {} files",
                manifest.files.len()
            )));
        }
        let paths: BTreeMap<&str, ()> = manifest
            .files
            .iter()
            .map(|f| (f.path.as_str(), ()))
            .collect();
        for (i, l) in meta.layers.iter().enumerate() {
            for c in 0..l.chunks {
                if !paths.contains_key(chunk_path(i, c).as_str()) {
                    return Err(bad(&format!("missing file {}", chunk_path(i, c))));
                }
            }
        }
        Ok(meta)
    }
}

/// The snapshot file path of chunk `c` of layer `layer`.
pub fn chunk_path(layer: usize, c: u64) -> String {
    format!("layer-{layer:04}/chunk-{c:06}.sspc")
}
