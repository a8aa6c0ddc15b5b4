//! Taking snapshots: capture on the caller's thread, write and commit in the
//! background.

use crate::changelog::{ChangelogId, Lineage};
use crate::error::{Error, Result};
use crate::format::{StoreFormat, WriteContext};
use crate::repo::{ChangelogPosition, Manifest, ManifestDraft, Repository, StoreKey};

/// Where a snapshot goes and what it belongs to.
#[derive(Debug, Clone)]
pub struct SnapshotTarget {
    /// Which store partition in the repository.
    pub store_key: StoreKey,
    /// The changelog the store follows.
    pub changelog: ChangelogId,
    /// The changelog's current incarnation.
    pub lineage: Lineage,
}

/// Writes `cut` with `format` and commits its manifest. `parent` is the
/// previous snapshot whose blobs may be reused; it is ignored unless it has
/// the same format name and lineage and an offset not after the cut's.
///
/// Fails (kind `config`) for a cut of a store that has applied nothing.
pub async fn commit_snapshot<F: StoreFormat>(
    format: &F,
    cut: F::Cut,
    repo: &Repository,
    target: &SnapshotTarget,
    parent: Option<&Manifest>,
) -> Result<Manifest> {
    let Some(offset) = format.cut_offset(&cut) else {
        return Err(Error::config(format!(
            "nothing to snapshot: the store has applied no changelog record store_key=`{}`",
            target.store_key
        )));
    };
    let fid = format.id();
    let parent = parent.filter(|p| {
        p.store_format.name == fid.name
            && p.changelog.lineage == target.lineage
            && p.changelog.offset <= offset
            && p.store_key == target.store_key
    });
    let out = format
        .write(
            cut,
            WriteContext {
                repo,
                store_key: &target.store_key,
                parent,
            },
        )
        .await?;
    let draft = ManifestDraft {
        store_key: target.store_key.clone(),
        changelog: ChangelogPosition {
            topic: target.changelog.topic.clone(),
            partition: target.changelog.partition,
            offset,
            lineage: target.lineage.clone(),
        },
        store_format: fid,
        parent: parent.map(|p| p.snapshot_id),
        depends_on: out.depends_on,
        files: Vec::new(),
        stats: out.stats,
        format_metadata: out.format_metadata,
        required_features: out.required_features,
    };
    out.writer.commit(draft).await
}
