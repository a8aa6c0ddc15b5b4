//! Taking snapshots: capture on the caller's thread, write and commit in the
//! background.

use crate::changelog::{Changelog, ChangelogBinding};
use crate::error::{Error, Result};
use crate::format::{StoreFormat, WriteContext};
use crate::repo::{
    ChangelogPosition, Manifest, ManifestDraft, ManifestExtras, MeasuredRates, Repository, StoreKey,
};

/// Options of [`commit_snapshot_with`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SnapshotOptions {
    /// Record the cut's logical digest in the manifest (a scan of the cut,
    /// off the processing thread): `None` = the format's default
    /// ([`StoreFormat::digest_by_default`]; the portable and RocksDB
    /// formats record one).
    pub logical_digest: Option<bool>,
    /// The writer's measured replay rate (records/s), recorded in the
    /// manifest for other processes' restore-time estimates.
    pub replay_records_per_sec: Option<u64>,
}

/// Writes `cut` with `format` and commits its manifest for store partition
/// `store_key`, tagged with `changelog`'s id, lineage and the cut's offset.
/// `parent` is the previous snapshot whose blobs may be reused; it is
/// ignored unless it has the same store key, format name and lineage, an
/// offset not after the cut's, and (when it recorded one) the epoch the log
/// still has at its offset.
///
/// Before the manifest is committed, the changelog is flushed (design
/// invariant 11): a snapshot never covers records the log has not made
/// durable, so a power loss that cuts the log's unsynced tail cannot leave a
/// snapshot holding records at offsets the log will hand out again.
///
/// Fails (kind `config`) for a cut of a store that has applied nothing, and
/// (kind `stale`) for a cut ahead of the changelog, or when the changelog's
/// lineage changed while the snapshot was written (it was recreated).
pub async fn commit_snapshot<F: StoreFormat, C: Changelog + ?Sized>(
    format: &F,
    cut: F::Cut,
    repo: &Repository,
    store_key: &StoreKey,
    changelog: &C,
    parent: Option<&Manifest>,
) -> Result<Manifest> {
    commit_snapshot_with(
        format,
        cut,
        repo,
        store_key,
        changelog,
        parent,
        &SnapshotOptions::default(),
    )
    .await
}

/// [`commit_snapshot`] with options: whether to record the cut's logical
/// digest, and the rates to record for restore-time estimates (the upload
/// rate is measured here).
pub async fn commit_snapshot_with<F: StoreFormat, C: Changelog + ?Sized>(
    format: &F,
    cut: F::Cut,
    repo: &Repository,
    store_key: &StoreKey,
    changelog: &C,
    parent: Option<&Manifest>,
    options: &SnapshotOptions,
) -> Result<Manifest> {
    let (offset, binding) = check_cut(format, &cut, store_key, changelog)?;
    let fid = format.id();
    let parent = usable_parent(parent, &fid, &binding, offset, store_key, changelog)?;
    let digest_wanted = options
        .logical_digest
        .unwrap_or_else(|| format.digest_by_default());
    let cut_digest = if digest_wanted {
        format.cut_digest(&cut).await?
    } else {
        None
    };
    let started = std::time::Instant::now();
    let write = format.write(
        cut,
        WriteContext {
            repo,
            store_key,
            parent,
            // Not given before the write: the format computes it there.
            logical_digest: digest_wanted && cut_digest.is_none(),
        },
    );
    // Durability: everything up to the cut's offset is on disk (file log:
    // fsync; Kafka: acknowledged by all in-sync replicas) before a manifest
    // can name that offset. The flush only has to finish before the commit
    // below, so it runs while the files upload, its wait on a blocking
    // thread (`flush_async`): the uploads, and other stores' snapshots on
    // the same executor, go on meanwhile.
    let (out, flushed) = futures::join!(write, changelog.flush_async());
    let out = out?;
    flushed?;
    let logical_digest = if digest_wanted {
        cut_digest.or(out.logical_digest)
    } else {
        None
    };
    // A digest and an exact key count of the same cut agree; anything else
    // is a bug in the format, and the manifest would contradict itself.
    if let Some(d) = logical_digest
        && out.stats.counts_exact
        && d.keys() != out.stats.keys
    {
        return Err(Error::internal(format!(
            "the format's key count and logical digest disagree store_key=`{store_key}` \
             keys={} digest_keys={}; nothing was committed",
            out.stats.keys,
            d.keys()
        )));
    }
    let now = changelog.lineage()?;
    if now != binding.lineage {
        return Err(Error::stale(format!(
            "the changelog was recreated while the snapshot was written store_key=`{store_key}` \
             changelog=`{}` lineage_before=`{}` lineage_now=`{now}`; nothing was committed",
            binding.changelog, binding.lineage
        ))
        .with_reason(crate::Reason::LineageChanged));
    }
    // The epoch is read after the flush: the records up to `offset` are
    // durable in the history it names.
    let epoch = changelog.epoch_at(offset)?;
    let draft = ManifestDraft {
        store_key: store_key.clone(),
        changelog: ChangelogPosition {
            topic: binding.changelog.topic,
            partition: binding.changelog.partition,
            offset,
            lineage: binding.lineage,
            epoch,
        },
        store_format: fid,
        parent: parent.map(|p| p.snapshot_id),
        depends_on: out.depends_on,
        files: Vec::new(),
        stats: out.stats,
        format_metadata: out.format_metadata,
        required_features: out.required_features,
    };
    let measured = measured_rates(&out.writer, started, options);
    out.writer
        .commit_with(
            draft,
            ManifestExtras {
                logical_digest,
                measured,
                ..ManifestExtras::default()
            },
        )
        .await
}

/// The cut's offset, and the binding of `changelog` it must follow: a cut
/// that applied nothing (`config`), follows another log or none, or is
/// ahead of the log (`stale`) is refused.
fn check_cut<F: StoreFormat, C: Changelog + ?Sized>(
    format: &F,
    cut: &F::Cut,
    store_key: &StoreKey,
    changelog: &C,
) -> Result<(u64, ChangelogBinding)> {
    let Some(offset) = format.cut_offset(cut) else {
        return Err(Error::config(format!(
            "nothing to snapshot: the store has applied no changelog record store_key=`{store_key}`"
        )));
    };
    let binding = ChangelogBinding::of(changelog)?;
    // The cut says which incarnation its offset belongs to (invariant 10):
    // a cut of a store that follows another log must not be tagged with
    // this one's id and lineage.
    match format.cut_binding(cut) {
        Some(b) if b == binding => {}
        Some(b) => {
            return Err(Error::stale(format!(
                "the cut follows another changelog than the one given store_key=`{store_key}` \
                 cut_follows=`{b}` changelog=`{binding}`; snapshot a store with its own changelog"
            ))
            .with_reason(crate::Reason::OtherChangelog));
        }
        None => {
            return Err(Error::stale(format!(
                "the cut's store records no changelog binding store_key=`{store_key}` \
                 changelog=`{binding}`; open the store through LoggedStore (or bind it with \
                 store::ensure_follows before its first write) so its offset can be trusted"
            ))
            .with_reason(crate::Reason::Unbound));
        }
    }
    let end = changelog.end_offset()?;
    if offset >= end {
        return Err(Error::stale(format!(
            "the cut is ahead of its changelog store_key=`{store_key}` changelog=`{binding}` \
             cut_offset={offset} end_offset={end}; the store does not follow this changelog"
        ))
        .with_reason(crate::Reason::AheadOfLog));
    }
    Ok((offset, binding))
}

/// `parent` if this cut may reuse its blobs: same store, format and
/// lineage, not after the cut, and in history the log still has.
fn usable_parent<'a, C: Changelog + ?Sized>(
    parent: Option<&'a Manifest>,
    fid: &crate::repo::StoreFormatId,
    binding: &ChangelogBinding,
    offset: u64,
    store_key: &StoreKey,
    changelog: &C,
) -> Result<Option<&'a Manifest>> {
    // A parent in history the log lost is no base for this cut (its data
    // is not the log's state at its offset any more).
    let parent_epoch_ok = match parent {
        Some(p) => p.changelog.lost_history(changelog)?.is_none(),
        None => true,
    };
    Ok(parent.filter(|p| {
        parent_epoch_ok
            && p.store_format.name == fid.name
            && p.changelog.lineage == binding.lineage
            && p.changelog.offset <= offset
            && &p.store_key == store_key
    }))
}

/// The rates to record: the upload rate measured here (from 1 MiB up:
/// below, a write is mostly fixed costs), and the writer's replay rate.
fn measured_rates(
    writer: &crate::repo::SnapshotWriter,
    started: std::time::Instant,
    options: &SnapshotOptions,
) -> Option<MeasuredRates> {
    let secs = started.elapsed().as_secs_f64();
    let uploaded: u64 = writer.bytes_uploaded();
    // Below 1 MiB a write is mostly fixed costs, not a rate.
    let upload_bytes_per_sec =
        (uploaded >= 1 << 20 && secs > 0.0).then(|| (uploaded as f64 / secs) as u64);
    (upload_bytes_per_sec.is_some() || options.replay_records_per_sec.is_some()).then_some(
        MeasuredRates {
            upload_bytes_per_sec,
            replay_records_per_sec: options.replay_records_per_sec,
        },
    )
}
