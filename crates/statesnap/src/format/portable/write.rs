//! Writing a snapshot, full or a delta over the last cut this format wrote:
//! records are encoded on a blocking thread while the chunks upload.

use bytes::Bytes;
use std::sync::Arc;

use super::chunk::{self, ChunkParams, Chunker};
use super::cut::{CutContents, PortableCut};
use super::meta::{LayerKind, LayerMeta, MAX_LAYERS, PortableMetadata, chunk_path};
use super::{PortableFormat, PortableSource};
use crate::changelog::Record;
use crate::error::{Error, Result};
use crate::format::{FormatOutput, WriteContext};
use crate::repo::{FileEntry, Manifest, SnapshotId, SnapshotStats, SnapshotWriter};
use crate::store::KeyValue;
use crate::store::memory::MemoryMap;

/// Sealed chunks buffered between the encoder thread and the uploader.
const UPLOAD_QUEUE: usize = 4;

/// The last cut this format wrote, kept for computing the next delta.
#[derive(Debug)]
pub(super) struct LastWrite {
    offset: u64,
    files: Vec<FileEntry>,
    map: MemoryMap,
}

impl<S> PortableFormat<S> {
    /// Forgets the last written cut, so the next snapshot is full.
    pub fn forget_last_cut(&self) {
        *self.lock_last() = None;
    }

    fn lock_last(&self) -> std::sync::MutexGuard<'_, Option<LastWrite>> {
        // The guarded value is replaced whole; a poisoned lock holds either
        // the old or the new value, both consistent.
        self.last.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The parent's layers and our last cut, if `parent` is the snapshot this
    /// format wrote last (same offset, same files).
    fn delta_base(&self, parent: Option<&Manifest>) -> Option<(Vec<LayerMeta>, MemoryMap)> {
        let parent = parent?;
        let last = self.lock_last();
        let last = last.as_ref()?;
        if last.offset != parent.changelog.offset || last.files != parent.files {
            return None;
        }
        let meta = PortableMetadata::of(parent).ok()?;
        Some((meta.layers, last.map.clone()))
    }
}

enum Run {
    Map(MemoryMap),
    Sorted(Arc<Vec<KeyValue>>),
    Records(Vec<Record>),
}

/// Encodes `run` on a blocking thread and uploads its chunks as layer
/// `layer` while the next ones are being encoded.
async fn write_layer(
    writer: &mut SnapshotWriter,
    params: ChunkParams,
    layer: usize,
    run: Run,
    kind: LayerKind,
    offset: u64,
) -> Result<LayerMeta> {
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Bytes>(UPLOAD_QUEUE);
    let encoder = crate::util::blocking(move || -> Result<(u64, u64)> {
        let mut chunker = Chunker::new(params)?;
        let mut records = 0u64;
        let mut logical = 0u64;
        let emit = |c: Option<Bytes>| -> bool {
            match c {
                // A closed channel means the uploader failed; stop quietly,
                // it reports the error.
                Some(c) => tx.blocking_send(c).is_ok(),
                None => true,
            }
        };
        let mut push = |k: &[u8], v: Option<&[u8]>| -> Result<bool> {
            records += 1;
            logical += (k.len() + v.map_or(0, <[u8]>::len)) as u64;
            Ok(emit(chunker.push(k, v)?))
        };
        let completed = match &run {
            Run::Map(m) => {
                m.iter().try_fold(
                    true,
                    |ok, (k, v)| {
                        if ok { push(k, Some(v)) } else { Ok(false) }
                    },
                )?
            }
            Run::Sorted(v) => {
                v.iter().try_fold(
                    true,
                    |ok, (k, v)| {
                        if ok { push(k, Some(v)) } else { Ok(false) }
                    },
                )?
            }
            Run::Records(rs) => rs.iter().try_fold(true, |ok, r| {
                if ok {
                    push(&r.key, r.value.as_deref())
                } else {
                    Ok(false)
                }
            })?,
        };
        if completed {
            let last = chunker.finish()?;
            emit(last);
        }
        Ok((records, logical))
    });
    let upload = async {
        let mut chunks = 0u64;
        while let Some(blob) = rx.recv().await {
            writer.put_bytes(&chunk_path(layer, chunks), blob).await?;
            chunks += 1;
        }
        Ok::<_, Error>(chunks)
    };
    // A failed upload drops `rx`: the encoder's next send fails and it stops.
    let (chunks, encoded) = futures::join!(upload, encoder);
    let chunks = chunks?;
    let (records, logical_bytes) = encoded?;
    Ok(LayerMeta {
        kind,
        offset,
        records,
        logical_bytes,
        chunks,
    })
}

/// The keys written or deleted between `old` and `new`, ascending.
fn diff_maps(old: &MemoryMap, new: &MemoryMap) -> Vec<Record> {
    use imbl::ordmap::DiffItem;
    old.diff(new)
        .map(|d| match d {
            DiffItem::Add(k, v) | DiffItem::Update { new: (k, v), .. } => Record {
                key: k.to_bytes(),
                value: Some(v.to_bytes()),
            },
            DiffItem::Remove(k, _) => Record {
                key: k.to_bytes(),
                value: None,
            },
        })
        .collect()
}

impl<S: PortableSource + 'static> PortableFormat<S> {
    pub(super) async fn write_impl(
        &self,
        cut: PortableCut,
        ctx: WriteContext<'_>,
    ) -> Result<FormatOutput> {
        let offset = cut.applied_offset.ok_or_else(|| {
            Error::config("nothing to snapshot: the store has applied no changelog record")
        })?;
        // Counted: the cut holds every pair.
        let stats = SnapshotStats {
            keys: cut.len() as u64,
            logical_bytes: cut.logical_bytes(),
            counts_exact: true,
            ..Default::default()
        };
        let mut writer = SnapshotWriter::new(ctx.repo, ctx.store_key.clone());
        let new_map = match &cut.contents {
            CutContents::Memory(m, _) => Some(m.clone()),
            CutContents::Sorted(..) => None,
        };
        let delta = self.choose_delta(&ctx, new_map.as_ref()).await?;
        let (layers, depends_on) = match (delta, ctx.parent) {
            (Some((layers, records)), Some(parent)) => {
                self.write_delta(&mut writer, parent, layers, records, offset)
                    .await?
            }
            _ => {
                let run = match cut.contents {
                    CutContents::Memory(m, _) => Run::Map(m),
                    CutContents::Sorted(v, _) => Run::Sorted(v),
                };
                let meta = write_layer(&mut writer, self.chunking, 0, run, LayerKind::Full, offset)
                    .await?;
                (vec![meta], Vec::new())
            }
        };
        if let Some(map) = new_map {
            *self.lock_last() = Some(LastWrite {
                offset,
                files: writer.files().to_vec(),
                map,
            });
        }
        let metadata = PortableMetadata {
            chunk_version: chunk::VERSION,
            layers,
        };
        let format_metadata = serde_json::to_value(&metadata)
            .map_err(|e| Error::internal("cannot serialize portable metadata").with_source(e))?;
        Ok(FormatOutput {
            writer,
            stats,
            format_metadata,
            depends_on,
            required_features: Vec::new(),
            // Given by `cut_digest`, before the write.
            logical_digest: None,
        })
    }

    /// The parent's layers and the records to write over them as a new
    /// delta layer, or `None` for a full snapshot.
    async fn choose_delta(
        &self,
        ctx: &WriteContext<'_>,
        new_map: Option<&MemoryMap>,
    ) -> Result<Option<(Vec<LayerMeta>, Vec<Record>)>> {
        // Delta if the parent is our last cut and the policy allows it, and
        // the parent's blobs are all still there: gc may have swept them
        // since, and a delta naming them would fail its commit on every
        // retry. Then a full snapshot is written from the cut.
        let mut delta = None;
        let mut base = self.delta_base(ctx.parent);
        if base.is_some()
            && let Some(parent) = ctx.parent
            && !ctx
                .repo
                .blobs()
                .blobs_present(ctx.store_key, &parent.files)
                .await?
        {
            tracing::warn!(
                parent = %parent.snapshot_id,
                "the parent snapshot's blobs are gone (gc?); writing a full snapshot"
            );
            self.forget_last_cut();
            base = None;
        }
        if let (true, Some(new), Some((layers, old))) =
            (self.policy.enabled, new_map.cloned(), base)
            && layers.len() < self.policy.max_chain_len.saturating_add(1).min(MAX_LAYERS)
        {
            let records = crate::util::blocking(move || Ok(diff_maps(&old, &new))).await?;
            let new_bytes: u64 = records
                .iter()
                .map(|r| (r.key.len() + r.value.as_ref().map_or(0, Bytes::len)) as u64)
                .sum();
            let base = layers[0].logical_bytes;
            let deltas: u64 = layers[1..].iter().map(|l| l.logical_bytes).sum::<u64>() + new_bytes;
            if u128::from(deltas) * 100
                <= u128::from(base) * u128::from(self.policy.max_delta_percent)
            {
                delta = Some((layers, records));
            }
        }
        Ok(delta)
    }

    /// Writes `records` as a new delta layer over the parent's `layers`,
    /// reusing the parent's files; gives the layers and the snapshots the
    /// new one depends on.
    async fn write_delta(
        &self,
        writer: &mut SnapshotWriter,
        parent: &Manifest,
        mut layers: Vec<LayerMeta>,
        records: Vec<Record>,
        offset: u64,
    ) -> Result<(Vec<LayerMeta>, Vec<SnapshotId>)> {
        for f in &parent.files {
            writer.reuse(f.clone())?;
        }
        let n = layers.len();
        let meta = write_layer(
            writer,
            self.chunking,
            n,
            Run::Records(records),
            LayerKind::Delta,
            offset,
        )
        .await?;
        layers.push(meta);
        let mut deps = parent.depends_on.clone();
        deps.push(parent.snapshot_id);
        Ok((layers, deps))
    }
}
