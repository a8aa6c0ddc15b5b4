//! The portable format: any store that can iterate in key order snapshots as
//! sorted, content-defined chunks ([`chunk`]), and any store restores from
//! them.
//!
//! * **Capture** ([`PortableSource::portable_cut`]) runs on the caller's
//!   thread. For [`MemoryStore`] it is an O(1) clone of the persistent map
//!   plus its applied offset; other stores materialise their contents
//!   ([`PortableCut::materialize`]).
//! * **Write** serialises and compresses on a blocking thread
//!   (`tokio::task::spawn_blocking`) while uploads run on the runtime, so
//!   neither the processing thread nor the async workers do the CPU work.
//! * **Layers.** A snapshot is a full sorted run (layer 0) followed by zero
//!   or more *delta* layers: the keys written or deleted since the previous
//!   layer's cut (tombstones included), computed with `OrdMap::diff` against
//!   the last cut this format wrote — kept in memory, so only a
//!   [`MemoryStore`] in the same process produces deltas. A delta snapshot
//!   reuses its parent's files and lists its parent and all the parent's
//!   dependencies in `depends_on`, so retention keeps the whole chain.
//!   [`DeltaPolicy`] bounds the chain.
//! * **Restore** builds the store with the factory given to
//!   [`PortableFormat::new`] — any store type, not necessarily the one that
//!   wrote the snapshot — then merges the layers (newest wins, tombstones
//!   drop the key) and applies the result in batches at the snapshot's
//!   offset. The store is built at a hidden staging path next to the
//!   target (`.<name>.statesnap-restore-<uuid>`), closed, fsynced and only
//!   then renamed over the target (the old target moved aside first and put
//!   back on failure), and reopened with the factory: a crash or an error
//!   mid-restore leaves the target as it was, never a partial store that
//!   already claims the snapshot's offset (`tests/portable_restore_crash.rs`
//!   kills a restore at 17 points). A factory that creates nothing at the
//!   path it is given (an in-memory store) gets the loaded store directly.
//!   The factory must open the store *at* the path it is given.
//!
//! Snapshot file paths are `layer-LLLL/chunk-CCCCCC.sspc`; the manifest's
//! `format_metadata` lists the layers (see `docs/format.md`).

pub mod chunk;

use bytes::Bytes;
use futures::StreamExt;
use imbl::OrdMap;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;
use std::sync::{Arc, Mutex};

use self::chunk::{ChunkParams, Chunker, decode_chunk, decode_header};
use super::staging::{self, new_restore_staging, swap_into_place, sync_tree};
use super::{FormatOutput, RestoreContext, RestoreStats, StoreFormat, WriteContext};
use crate::changelog::{ChangelogBinding, Record};
use crate::error::{Error, Result};
use crate::repo::{BlobRef, FileEntry, Manifest, SnapshotStats, SnapshotWriter, StoreFormatId};
use crate::store::memory::{MemoryCut, MemoryStore};
use crate::store::{KeyValue, StateStore, StateStoreExt};

/// Format name recorded in manifests.
pub const FORMAT_NAME: &str = "portable";
/// Format version this build writes and reads.
pub const FORMAT_VERSION: u32 = 1;

/// Records per `apply` call during restore.
const RESTORE_BATCH: usize = 4096;
/// Most layers (one full run + deltas) a snapshot may have. Writes never
/// make more (a longer chain is consolidated into a full snapshot); restore
/// refuses more as corrupt, so a hostile manifest cannot make it hold one
/// prefetch queue per layer without end.
pub const MAX_LAYERS: usize = 64;
/// Compressed chunks fetched ahead per layer during a restore.
const RESTORE_PREFETCH: usize = 2;
/// Most bytes of decoded chunks held at once during a restore, across all
/// layers (one chunk per layer is decoded at a time; honest snapshots need
/// layers x 4 MiB). A manifest needing more is refused as corrupt.
pub const RESTORE_DECODE_BUDGET: u64 = 1 << 30;
/// Sealed chunks buffered between the encoder thread and the uploader.
const UPLOAD_QUEUE: usize = 4;

/// A store the portable format can snapshot: it produces a consistent cut of
/// its contents and applied offset.
///
/// Implement it in one line for any store with
/// [`PortableCut::materialize`]; [`MemoryStore`] returns an O(1) cut that
/// also allows delta snapshots.
pub trait PortableSource: StateStore {
    /// A consistent cut: contents and applied offset taken together
    /// (design invariant 2). Runs on the caller's thread.
    fn portable_cut(&self) -> Result<PortableCut>;
}

impl PortableSource for MemoryStore {
    fn portable_cut(&self) -> Result<PortableCut> {
        Ok(PortableCut::from_memory(self.cut()))
    }
}

#[cfg(feature = "rocksdb")]
impl PortableSource for crate::store::rocks::RocksStore {
    fn portable_cut(&self) -> Result<PortableCut> {
        // `&self` excludes writers for the duration, so iteration and the
        // offset read see the same state.
        PortableCut::materialize(self)
    }
}

/// A consistent cut of a store for the portable format.
#[derive(Debug, Clone)]
pub struct PortableCut {
    applied_offset: Option<u64>,
    binding: Option<ChangelogBinding>,
    contents: CutContents,
}

#[derive(Debug, Clone)]
enum CutContents {
    Memory(OrdMap<Bytes, Bytes>, u64),
    Sorted(Arc<Vec<KeyValue>>, u64),
}

impl PortableCut {
    /// An O(1) cut of a [`MemoryStore`]; deltas can be computed against it.
    pub fn from_memory(cut: MemoryCut) -> Self {
        let (map, applied_offset, bytes, binding) = cut.into_parts();
        PortableCut {
            applied_offset,
            binding,
            contents: CutContents::Memory(map, bytes),
        }
    }

    /// A cut from entries in strictly ascending key order (checked when the
    /// snapshot is written), with no binding: add the store's with
    /// [`PortableCut::with_binding`] (a cut without one cannot be committed).
    pub fn from_sorted(entries: Vec<KeyValue>, applied_offset: Option<u64>) -> Self {
        let bytes = entries
            .iter()
            .map(|(k, v)| (k.len() + v.len()) as u64)
            .sum();
        PortableCut {
            applied_offset,
            binding: None,
            contents: CutContents::Sorted(Arc::new(entries), bytes),
        }
    }

    /// The cut, recording that its offset belongs to `binding` (the store's
    /// [`StateStore::binding`], read together with the offset).
    pub fn with_binding(mut self, binding: Option<ChangelogBinding>) -> Self {
        self.binding = binding;
        self
    }

    /// Copies every live entry of `store`, in key order, with its applied
    /// offset: O(n) on the caller's thread, for stores without a cheaper cut.
    pub fn materialize<S: StateStore + ?Sized>(store: &S) -> Result<Self> {
        let applied_offset = store.applied_offset()?;
        let binding = store.binding()?;
        let entries = store.iter()?.collect::<Result<Vec<_>>>()?;
        Ok(PortableCut::from_sorted(entries, applied_offset).with_binding(binding))
    }

    /// The offset the cut reflects.
    pub fn applied_offset(&self) -> Option<u64> {
        self.applied_offset
    }

    /// Live keys in the cut.
    pub fn len(&self) -> usize {
        match &self.contents {
            CutContents::Memory(m, _) => m.len(),
            CutContents::Sorted(v, _) => v.len(),
        }
    }

    /// Whether the cut holds no keys.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Logical bytes (keys + values).
    pub fn logical_bytes(&self) -> u64 {
        match &self.contents {
            CutContents::Memory(_, b) | CutContents::Sorted(_, b) => *b,
        }
    }
}

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
            )));
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

/// The last cut this format wrote, kept for computing the next delta.
#[derive(Debug)]
struct LastWrite {
    offset: u64,
    files: Vec<FileEntry>,
    map: OrdMap<Bytes, Bytes>,
}

type Factory<S> = dyn Fn(&Path) -> Result<S> + Send + Sync;

/// The portable [`StoreFormat`] for any [`PortableSource`] store `S`.
pub struct PortableFormat<S> {
    factory: Arc<Factory<S>>,
    chunking: ChunkParams,
    policy: DeltaPolicy,
    decode_budget: u64,
    last: Mutex<Option<LastWrite>>,
}

impl<S> fmt::Debug for PortableFormat<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PortableFormat")
            .field("store", &std::any::type_name::<S>())
            .field("chunking", &self.chunking)
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

impl PortableFormat<MemoryStore> {
    /// The portable format restoring into [`MemoryStore`]s.
    pub fn memory() -> Self {
        PortableFormat::new(|_: &Path| Ok(MemoryStore::new()))
    }
}

impl<S> PortableFormat<S> {
    /// A portable format whose restores build an empty store with `factory`
    /// (called with the target path, after anything there was removed).
    pub fn new(factory: impl Fn(&Path) -> Result<S> + Send + Sync + 'static) -> Self {
        PortableFormat {
            factory: Arc::new(factory),
            chunking: ChunkParams::default(),
            policy: DeltaPolicy::default(),
            decode_budget: RESTORE_DECODE_BUDGET,
            last: Mutex::new(None),
        }
    }

    /// Other chunk sizes (validated). Changing them changes where chunks are
    /// cut, so the next snapshot shares nothing with earlier ones.
    pub fn with_chunking(mut self, params: ChunkParams) -> Result<Self> {
        params.validate()?;
        self.chunking = params;
        Ok(self)
    }

    /// Another cap on decoded chunk bytes held during a restore (default
    /// [`RESTORE_DECODE_BUDGET`]); a snapshot needing more fails `corrupt`.
    pub fn with_restore_memory_budget(mut self, bytes: u64) -> Self {
        self.decode_budget = bytes;
        self
    }

    /// Another delta policy.
    pub fn with_delta_policy(mut self, policy: DeltaPolicy) -> Self {
        self.policy = policy;
        self
    }

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
    fn delta_base(
        &self,
        parent: Option<&Manifest>,
    ) -> Option<(Vec<LayerMeta>, OrdMap<Bytes, Bytes>)> {
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
    Map(OrdMap<Bytes, Bytes>),
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
    let encoder = tokio::task::spawn_blocking(move || -> Result<(u64, u64)> {
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
        let mut push = |k: &Bytes, v: Option<&Bytes>| -> Result<bool> {
            records += 1;
            logical += (k.len() + v.map_or(0, Bytes::len)) as u64;
            Ok(emit(chunker.push(k, v.map(|v| &v[..]))?))
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
                    push(&r.key, r.value.as_ref())
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
    let mut chunks = 0u64;
    while let Some(blob) = rx.recv().await {
        writer.put_bytes(&chunk_path(layer, chunks), blob).await?;
        chunks += 1;
    }
    let (records, logical_bytes) = encoder
        .await
        .map_err(|e| Error::internal("portable encoder task failed").with_source(e))??;
    Ok(LayerMeta {
        kind,
        offset,
        records,
        logical_bytes,
        chunks,
    })
}

/// The keys written or deleted between `old` and `new`, ascending.
fn diff_maps(old: &OrdMap<Bytes, Bytes>, new: &OrdMap<Bytes, Bytes>) -> Vec<Record> {
    use imbl::ordmap::DiffItem;
    old.diff(new)
        .map(|d| match d {
            DiffItem::Add(k, v) | DiffItem::Update { new: (k, v), .. } => Record {
                key: k.clone(),
                value: Some(v.clone()),
            },
            DiffItem::Remove(k, _) => Record {
                key: k.clone(),
                value: None,
            },
        })
        .collect()
}

impl<S: PortableSource + 'static> PortableFormat<S> {
    async fn write_impl(&self, cut: PortableCut, ctx: WriteContext<'_>) -> Result<FormatOutput> {
        let offset = cut.applied_offset.ok_or_else(|| {
            Error::config("nothing to snapshot: the store has applied no changelog record")
        })?;
        let stats = SnapshotStats {
            keys: cut.len() as u64,
            logical_bytes: cut.logical_bytes(),
            ..Default::default()
        };
        let mut writer = SnapshotWriter::new(ctx.repo, ctx.store_key.clone());
        let new_map = match &cut.contents {
            CutContents::Memory(m, _) => Some(m.clone()),
            CutContents::Sorted(..) => None,
        };
        // Delta if the parent is our last cut and the policy allows it, and
        // the parent's blobs are all still there: gc may have swept them
        // since, and a delta naming them would fail its commit on every
        // retry. Then a full snapshot is written from the cut.
        let mut delta = None;
        let mut base = self.delta_base(ctx.parent);
        if base.is_some()
            && let Some(parent) = ctx.parent
            && !ctx.repo.blobs_present(ctx.store_key, &parent.files).await?
        {
            tracing::warn!(
                parent = %parent.snapshot_id,
                "the parent snapshot's blobs are gone (gc?); writing a full snapshot"
            );
            self.forget_last_cut();
            base = None;
        }
        if let (true, Some(new), Some((layers, old))) = (self.policy.enabled, new_map.clone(), base)
            && layers.len() < self.policy.max_chain_len.saturating_add(1).min(MAX_LAYERS)
        {
            let records = tokio::task::spawn_blocking(move || diff_maps(&old, &new))
                .await
                .map_err(|e| Error::internal("portable diff task failed").with_source(e))?;
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
        let (layers, depends_on) = match (delta, ctx.parent) {
            (Some((mut layers, records)), Some(parent)) => {
                for f in &parent.files {
                    writer.reuse(f.clone())?;
                }
                let n = layers.len();
                let meta = write_layer(
                    &mut writer,
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
                (layers, deps)
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
        })
    }

    async fn restore_impl(
        &self,
        manifest: &Manifest,
        ctx: RestoreContext<'_>,
    ) -> Result<(S, RestoreStats)> {
        let meta = PortableMetadata::of(manifest)?;
        staging::check_replaceable(ctx.target)?;
        let by_path: BTreeMap<&str, &FileEntry> = manifest
            .files
            .iter()
            .map(|f| (f.path.as_str(), f))
            .collect();
        let mut per_layer: Vec<Vec<FileEntry>> = Vec::with_capacity(meta.layers.len());
        for (i, l) in meta.layers.iter().enumerate() {
            let mut files = Vec::new();
            for c in 0..l.chunks {
                let p = chunk_path(i, c);
                let f = by_path
                    .get(p.as_str())
                    .ok_or_else(|| Error::internal(format!("checked file vanished path=`{p}`")))?;
                files.push((*f).clone());
            }
            per_layer.push(files);
        }
        let stats = RestoreStats {
            bytes_downloaded: per_layer.iter().flatten().map(|f| f.size).sum(),
            files_downloaded: per_layer.iter().map(|l| l.len() as u64).sum(),
            ..Default::default()
        };
        // Streaming: one fetch task per layer downloads its chunks in order,
        // a few ahead, into a bounded queue the loader drains. Memory is
        // bounded by layers x (prefetch + 1) compressed chunks plus the
        // decode budget, whatever the snapshot's size. Every blob is
        // verified against its manifest size and hash (design invariant 6)
        // before a byte of it is decoded.
        let repo = ctx.repo;
        let sk = &manifest.store_key;
        let depth = repo.transfer().parallelism.clamp(1, RESTORE_PREFETCH);
        let mut fetchers = tokio::task::JoinSet::new();
        let mut queues = Vec::with_capacity(per_layer.len());
        for files in per_layer {
            let (tx, rx) = tokio::sync::mpsc::channel::<Result<(String, Bytes)>>(depth);
            let (repo, sk) = (repo.clone(), sk.clone());
            fetchers.spawn(async move {
                let mut blobs = futures::stream::iter(files)
                    .map(|f| {
                        let (repo, sk) = (&repo, &sk);
                        async move {
                            let b = repo.get_blob_bytes(sk, &BlobRef::from(&f)).await?;
                            Ok::<_, Error>((f.path, b))
                        }
                    })
                    .buffered(depth);
                while let Some(r) = blobs.next().await {
                    let failed = r.is_err();
                    // A closed queue: the loader stopped (it reports why).
                    if tx.send(r).await.is_err() || failed {
                        return;
                    }
                }
            });
            queues.push(rx);
        }
        let factory = Arc::clone(&self.factory);
        let budget = self.decode_budget;
        let target = ctx.target.to_path_buf();
        let offset = manifest.changelog.offset;
        let binding = manifest.changelog.binding();
        let id = manifest.snapshot_id.to_string();
        let store = tokio::task::spawn_blocking(move || -> Result<S> {
            // Built at a staging path, switched in only when complete: a
            // crash mid-load never leaves a partial store at `target` that
            // already carries the snapshot's offset (invariant 1).
            let (staging, mut guard) = new_restore_staging(&target)?;
            let mut store = factory(&staging)?;
            // Bound before the first record and before the switch: a store
            // at `target` never carries the snapshot's offset without it.
            crate::store::bind_restored(&mut store, &binding)?;
            load_layers(&mut store, queues, &meta.layers, offset, &id, budget)?;
            if std::fs::symlink_metadata(&staging).is_err() {
                // The factory keeps nothing at the path (an in-memory
                // store): there is nothing a crash could leave half-written.
                guard.armed = false;
                remove_path(&target)?;
                return Ok(store);
            }
            drop(store); // closes it: its files are complete
            if std::fs::symlink_metadata(&staging).is_ok_and(|m| m.is_dir()) {
                crate::store::mark_store_dir(&staging)?;
            }
            sync_tree(&staging)?;
            let store = swap_into_place(&staging, &target, |target| {
                let store = factory(target)?;
                let applied = store.applied_offset()?;
                if applied != Some(offset) {
                    return Err(Error::corrupt(format!(
                        "restored store does not sit at its snapshot's offset after reopening \
                         snapshot=`{id}` snapshot_offset={offset} applied_offset={applied:?} \
                         path=`{}`; the store factory must open the store at the path it is given",
                        target.display()
                    )));
                }
                Ok(store)
            })?;
            guard.armed = false;
            Ok(store)
        })
        .await
        .map_err(|e| Error::internal("portable restore task failed").with_source(e));
        // The loader is done (or failed): no fetch may outlive the restore.
        fetchers.shutdown().await;
        Ok((store??, stats))
    }
}

/// Removes a file or directory at `p` (a missing path is fine).
fn remove_path(p: &Path) -> Result<()> {
    staging::remove_path(p).map_err(|e| {
        Error::io(
            format!("cannot clear restore target path=`{}`", p.display()),
            e,
        )
    })
}

/// Reads one layer's chunks in order, as its fetch task delivers them,
/// checking order across chunks.
struct LayerReader<'a> {
    layer: usize,
    kind: LayerKind,
    blobs: tokio::sync::mpsc::Receiver<Result<(String, Bytes)>>,
    /// Chunks the layer's metadata promises, and chunks received.
    chunks: u64,
    received: u64,
    current: std::vec::IntoIter<Record>,
    /// Uncompressed bytes of the chunk in `current`, counted in `decoded`.
    current_len: u64,
    /// Decoded bytes held across all layers, and the most allowed.
    decoded: &'a std::cell::Cell<u64>,
    budget: u64,
    last_key: Option<Bytes>,
    records: u64,
    snapshot: &'a str,
}

impl LayerReader<'_> {
    fn next(&mut self) -> Result<Option<Record>> {
        loop {
            if let Some(r) = self.current.next() {
                self.records += 1;
                return Ok(Some(r));
            }
            self.decoded
                .set(self.decoded.get().saturating_sub(self.current_len));
            self.current_len = 0;
            let Some(next) = self.blobs.blocking_recv() else {
                if self.received != self.chunks {
                    return Err(Error::internal(format!(
                        "portable restore: a chunk fetch ended early snapshot=`{}` layer={} \
                         received={} chunks={}",
                        self.snapshot, self.layer, self.received, self.chunks
                    )));
                }
                return Ok(None);
            };
            let (path, blob) = next?;
            self.received += 1;
            let wrap = |e: Error, what: &str| {
                Error::new(
                    e.kind(),
                    format!(
                        "{what} snapshot=`{}` file=`{path}` layer={}",
                        self.snapshot, self.layer
                    ),
                )
                .with_source(e)
            };
            let header =
                decode_header(&blob).map_err(|e| wrap(e, "cannot decode portable chunk"))?;
            let want = u64::from(header.uncompressed_len);
            let held = self.decoded.get();
            if held.saturating_add(want) > self.budget {
                return Err(Error::corrupt(format!(
                    "portable snapshot needs more memory to restore than allowed: its layers' \
                     chunks decode to more than the budget at once snapshot=`{}` file=`{path}` \
                     layer={} decoded_bytes={} budget={}; raise it with \
                     PortableFormat::with_restore_memory_budget if the snapshot is trusted",
                    self.snapshot,
                    self.layer,
                    held.saturating_add(want),
                    self.budget
                )));
            }
            let chunk = decode_chunk(&blob).map_err(|e| wrap(e, "cannot decode portable chunk"))?;
            drop(blob);
            self.decoded.set(held + want);
            self.current_len = want;
            if let (Some(prev), Some(first)) = (&self.last_key, chunk.records.first())
                && first.key <= *prev
            {
                return Err(wrap(
                    Error::corrupt("keys are not ascending across chunks"),
                    "portable snapshot is corrupt",
                ));
            }
            if self.kind == LayerKind::Full && chunk.records.iter().any(Record::is_tombstone) {
                return Err(wrap(
                    Error::corrupt("tombstone in a full layer"),
                    "portable snapshot is corrupt",
                ));
            }
            if let Some(last) = chunk.records.last() {
                self.last_key = Some(last.key.clone());
            }
            self.current = chunk.records.into_iter();
        }
    }
}

/// Merges the layers (later layers win; tombstones drop the key) and applies
/// the live entries to `store` in batches at `offset`.
fn load_layers<S: StateStore>(
    store: &mut S,
    queues: Vec<tokio::sync::mpsc::Receiver<Result<(String, Bytes)>>>,
    metas: &[LayerMeta],
    offset: u64,
    snapshot: &str,
    budget: u64,
) -> Result<()> {
    let decoded = std::cell::Cell::new(0u64);
    let mut readers: Vec<LayerReader<'_>> = queues
        .into_iter()
        .zip(metas)
        .enumerate()
        .map(|(layer, (blobs, m))| LayerReader {
            layer,
            kind: m.kind,
            blobs,
            chunks: m.chunks,
            received: 0,
            current: Vec::new().into_iter(),
            current_len: 0,
            decoded: &decoded,
            budget,
            last_key: None,
            records: 0,
            snapshot,
        })
        .collect();
    let mut heads = readers
        .iter_mut()
        .map(LayerReader::next)
        .collect::<Result<Vec<_>>>()?;
    let mut batch = Vec::with_capacity(RESTORE_BATCH);
    let mut applied_any = false;
    loop {
        // The smallest key; among equal keys the newest layer wins.
        let mut best: Option<usize> = None;
        for (i, h) in heads.iter().enumerate() {
            if let Some(r) = h
                && best.is_none_or(|b| heads[b].as_ref().is_some_and(|br| r.key <= br.key))
            {
                best = Some(i);
            }
        }
        let Some(b) = best else { break };
        let winner = heads[b].take();
        let Some(winner) = winner else { break };
        heads[b] = readers[b].next()?;
        for i in 0..heads.len() {
            if i != b && heads[i].as_ref().is_some_and(|r| r.key == winner.key) {
                heads[i] = readers[i].next()?;
            }
        }
        if winner.value.is_some() {
            batch.push(winner);
            if batch.len() == RESTORE_BATCH {
                store.apply(&batch, offset)?;
                applied_any = true;
                batch.clear();
            }
        }
    }
    if !batch.is_empty() || !applied_any {
        store.apply(&batch, offset)?;
    }
    for (r, m) in readers.iter().zip(metas) {
        if r.records != m.records {
            return Err(Error::corrupt(format!(
                "portable layer holds a different record count than its metadata \
                 snapshot=`{snapshot}` layer={} records={} metadata_records={}",
                r.layer, r.records, m.records
            )));
        }
    }
    Ok(())
}

impl<S: PortableSource + 'static> StoreFormat for PortableFormat<S> {
    type Store = S;
    type Cut = PortableCut;

    fn id(&self) -> StoreFormatId {
        StoreFormatId {
            name: FORMAT_NAME.to_owned(),
            version: FORMAT_VERSION,
        }
    }

    fn capture(&self, store: &S) -> Result<PortableCut> {
        store.portable_cut()
    }

    fn cut_offset(&self, cut: &PortableCut) -> Option<u64> {
        cut.applied_offset
    }

    fn cut_binding(&self, cut: &PortableCut) -> Option<ChangelogBinding> {
        cut.binding.clone()
    }

    fn write(
        &self,
        cut: PortableCut,
        ctx: WriteContext<'_>,
    ) -> impl Future<Output = Result<FormatOutput>> + Send {
        self.write_impl(cut, ctx)
    }

    fn restore(
        &self,
        manifest: &Manifest,
        ctx: RestoreContext<'_>,
    ) -> impl Future<Output = Result<(S, RestoreStats)>> + Send {
        self.restore_impl(manifest, ctx)
    }

    fn create_empty(&self, target: &Path) -> Result<S> {
        staging::check_replaceable(target)?;
        staging::clean_restore_leftovers(target)?;
        remove_path(target)?;
        (self.factory)(target)
    }
}
