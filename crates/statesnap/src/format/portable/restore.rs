//! The streaming restore: one fetch task per layer, the layers merged
//! (newest wins, tombstones drop the key) and applied to a store built at a
//! staging path that is switched in only when complete.

use bytes::Bytes;
use futures::StreamExt;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use super::chunk::{decode_chunk, decode_header};
use super::meta::{LayerKind, LayerMeta, PortableMetadata, chunk_path};
use super::{Factory, PortableFormat, PortableSource};
use crate::changelog::Record;
use crate::error::{Error, Result};
use crate::format::staging::{self, new_restore_staging, swap_into_place, sync_tree};
use crate::format::{RestoreContext, RestoreStats};
use crate::repo::{BlobRef, FileEntry, Manifest, Repository, StoreKey};
use crate::store::StateStore;

/// Records per `apply` call during restore.
const RESTORE_BATCH: usize = 4096;
/// Compressed chunks fetched ahead per layer during a restore.
const RESTORE_PREFETCH: usize = 2;
/// Most bytes of decoded chunks held at once during a restore, across all
/// layers (one chunk per layer is decoded at a time; honest snapshots need
/// layers x 4 MiB). A manifest needing more is refused as corrupt.
pub const RESTORE_DECODE_BUDGET: u64 = 1 << 30;

impl<S> PortableFormat<S> {
    /// Another cap on decoded chunk bytes held during a restore (default
    /// [`RESTORE_DECODE_BUDGET`]); a snapshot needing more fails `corrupt`.
    pub fn with_restore_memory_budget(mut self, bytes: u64) -> Self {
        self.decode_budget = bytes;
        self
    }
}

impl<S: PortableSource + 'static> PortableFormat<S> {
    pub(super) async fn restore_impl(
        &self,
        manifest: &Manifest,
        ctx: RestoreContext<'_>,
    ) -> Result<(S, RestoreStats)> {
        let meta = PortableMetadata::of(manifest)?;
        if let Some(f) = manifest.inline_files.first() {
            // This format writes none: such a snapshot is not one of its own.
            return Err(Error::corrupt(format!(
                "portable snapshot carries an inline file, which the portable format never \
                 writes snapshot=`{}` path=`{}`",
                manifest.snapshot_id,
                f.path.escape_debug()
            )));
        }
        let target = staging::normalize_target(ctx.target)?;
        staging::check_replaceable(&target)?;
        let per_layer = layer_files(manifest, &meta.layers)?;
        let stats = RestoreStats {
            bytes_downloaded: per_layer.iter().flatten().map(|f| f.size).sum(),
            files_downloaded: per_layer.iter().map(|l| l.len() as u64).sum(),
            ..Default::default()
        };
        // Streaming: one fetch task per layer downloads its chunks in order,
        // a few ahead, into a bounded queue the loader drains. Memory is
        // bounded by layers x (prefetch + 1) compressed chunks plus the
        // decode budget, whatever the snapshot's size. Every blob is
        // verified against its manifest size and hash (invariant 6)
        // before a byte of it is decoded.
        let (mut fetchers, queues) = spawn_fetchers(ctx.repo, &manifest.store_key, per_layer);
        let factory = Arc::clone(&self.factory);
        let budget = self.decode_budget;
        // The load runs on its own thread: if this restore is cancelled, it
        // runs on until its fetches end, and `target` (when it is a staging
        // path itself) must outlive it.
        let held = staging::hold(&[&target]);
        let offset = manifest.changelog.offset;
        let binding = manifest.changelog.binding();
        let id = manifest.snapshot_id.to_string();
        let load = move || -> Result<S> {
            // Built at a staging path, switched in only when complete: a
            // crash mid-load never leaves a partial store at `target` that
            // already carries the snapshot's offset (invariant 1).
            let (staging, guard) = new_restore_staging(&target)?;
            let mut store = factory(&staging)?;
            // Bound before the first record and before the switch: a store
            // at `target` never carries the snapshot's offset without it.
            crate::store::bind_restored(&mut store, &binding)?;
            load_layers(&mut store, queues, &meta.layers, offset, &id, budget)?;
            switch_in(&staging, guard, store, &target, &*factory, offset, &id)
        };
        // After the store is closed: the hold may remove `target`.
        let store = staging::blocking_held(held, load).await;
        // The loader is done (or failed): no fetch may outlive the restore.
        fetchers.shutdown().await;
        Ok((store?, stats))
    }
}

/// Each layer's chunk files, in order, from the manifest's files.
fn layer_files(manifest: &Manifest, layers: &[LayerMeta]) -> Result<Vec<Vec<FileEntry>>> {
    let by_path: BTreeMap<&str, &FileEntry> = manifest
        .files
        .iter()
        .map(|f| (f.path.as_str(), f))
        .collect();
    let mut per_layer: Vec<Vec<FileEntry>> = Vec::with_capacity(layers.len());
    for (i, l) in layers.iter().enumerate() {
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
    Ok(per_layer)
}

/// The queue a layer's fetch task fills with its chunks, in order.
type ChunkQueue = tokio::sync::mpsc::Receiver<Result<(String, Bytes)>>;

/// Spawns one fetch task per layer, downloading its chunks in order a few
/// ahead into a bounded queue; gives the tasks and the queues.
fn spawn_fetchers(
    repo: &Repository,
    sk: &StoreKey,
    per_layer: Vec<Vec<FileEntry>>,
) -> (tokio::task::JoinSet<()>, Vec<ChunkQueue>) {
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
                        let b = repo.blobs().get_blob_bytes(sk, &BlobRef::from(&f)).await?;
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
    (fetchers, queues)
}

/// Switches the loaded `store`, built at `staging`, in at `target`: closed,
/// synced, moved and reopened with `factory` (or, for a store that keeps
/// nothing at its path, kept as it is). `guard` is disarmed once it is.
fn switch_in<S: StateStore>(
    staging: &Path,
    guard: staging::PathGuard,
    store: S,
    target: &Path,
    factory: &Factory<S>,
    offset: u64,
    id: &str,
) -> Result<S> {
    if std::fs::symlink_metadata(staging).is_err() {
        // The factory keeps nothing at the path (an in-memory
        // store): there is nothing a crash could leave half-written.
        guard.disarm();
        remove_path(target)?;
        return Ok(store);
    }
    drop(store); // closes it: its files are complete
    if std::fs::symlink_metadata(staging).is_ok_and(|m| m.is_dir()) {
        crate::store::mark_store_dir(staging)?;
    }
    sync_tree(staging)?;
    let store = swap_into_place(staging, target, |target| {
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
    guard.disarm();
    Ok(store)
}

/// Removes a file or directory at `p` (a missing path is fine).
pub(super) fn remove_path(p: &Path) -> Result<()> {
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
