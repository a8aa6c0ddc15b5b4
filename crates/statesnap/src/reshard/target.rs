//! Writing the targets: each target's changelog records (or, resuming,
//! the check of what an earlier run left there) on the placing thread, and
//! every target's store through its bulk loader on a thread of its own,
//! fed batches in key order: the two halves of the work run side by side.

use std::sync::mpsc::{Receiver, SyncSender};
use std::sync::{Arc, Mutex};

use bytes::Bytes;

use super::{APPEND_BATCH, TargetPartition, TargetReport};
use crate::changelog::{ChangelogReader, LoggedRecord, Record};
use crate::digest::LogicalDigest;
use crate::error::{Error, ErrorKind, Reason, Result};
use crate::store::BulkLoader;

/// Entries per batch sent to the loader thread.
const LOAD_BATCH: usize = 4_096;

/// Batches in flight to the loader thread (bounded: the placing thread
/// waits rather than buffering the state in memory).
pub(super) const LOAD_QUEUE: usize = 16;

/// Entries of one target, in key order, copied into one buffer: the
/// placing thread allocates nothing per entry, and frees its keys and
/// values itself (freeing them on the loader thread cost more than
/// placing them). Batches go back to the placing thread to be reused.
#[derive(Default)]
pub(super) struct Batch {
    target: usize,
    data: Vec<u8>,
    /// `(key length, value length, changelog offset)` of each entry, in
    /// the order of `data`.
    entries: Vec<(u32, u32, u64)>,
}

impl Batch {
    fn push(&mut self, key: &[u8], value: &[u8], offset: u64) -> Result<()> {
        let (Ok(k), Ok(v)) = (u32::try_from(key.len()), u32::try_from(value.len())) else {
            return Err(Error::config(format!(
                "an entry too large to reshard key_bytes={} value_bytes={}",
                key.len(),
                value.len()
            )));
        };
        self.data.extend_from_slice(key);
        self.data.extend_from_slice(value);
        self.entries.push((k, v, offset));
        Ok(())
    }

    fn for_each(&self, mut f: impl FnMut(&[u8], &[u8], u64) -> Result<()>) -> Result<()> {
        let mut at = 0usize;
        for &(k, v, offset) in &self.entries {
            let (k, v) = (k as usize, v as usize);
            let key = &self.data[at..at + k];
            let value = &self.data[at + k..at + k + v];
            f(key, value, offset)?;
            at += k + v;
        }
        Ok(())
    }

    fn clear(&mut self) {
        self.data.clear();
        self.entries.clear();
    }
}

/// What the loader thread receives.
pub(super) enum Load {
    /// Entries for target `batch.target`, in key order.
    Batch(Batch),
    /// Everything was sent: finish every loader.
    Finish,
}

/// The channels between the placing thread and the loader thread: batches
/// one way, emptied batches back.
pub(super) struct Channel {
    pub(super) tx: SyncSender<Load>,
    free: Arc<Mutex<Receiver<Batch>>>,
}

/// The loader thread's end of the [`Channel`].
pub(super) struct LoaderEnd {
    rx: Receiver<Load>,
    free: SyncSender<Batch>,
}

/// A new channel pair.
pub(super) fn channel() -> (Channel, LoaderEnd) {
    let (tx, rx) = std::sync::mpsc::sync_channel(LOAD_QUEUE);
    let (free_tx, free_rx) = std::sync::mpsc::sync_channel(LOAD_QUEUE + 1);
    (
        Channel {
            tx,
            free: Arc::new(Mutex::new(free_rx)),
        },
        LoaderEnd { rx, free: free_tx },
    )
}

/// The loader thread: feeds each batch to its target's loader, computing
/// each target's logical digest over exactly what it loads, and, once told
/// everything was sent, finishes them all and returns the digests. A
/// channel closed without [`Load::Finish`] (placing failed) leaves the
/// stores unfinished: they are discarded.
pub(super) fn load(
    mut loaders: Vec<Box<dyn BulkLoader + '_>>,
    end: LoaderEnd,
) -> Result<Vec<LogicalDigest>> {
    let mut digests = vec![LogicalDigest::new(); loaders.len()];
    for msg in end.rx {
        match msg {
            Load::Batch(mut batch) => {
                let j = batch.target;
                let (Some(loader), Some(digest)) = (loaders.get_mut(j), digests.get_mut(j)) else {
                    return Err(Error::internal(format!("no loader for target {j}")));
                };
                batch.for_each(|k, v, offset| {
                    digest.add(k, v);
                    loader.put(k, v, offset)
                })?;
                batch.clear();
                // Back for reuse; dropped when the placing thread has enough.
                let _ = end.free.try_send(batch);
            }
            Load::Finish => {
                for l in loaders {
                    l.finish()?;
                }
                return Ok(digests);
            }
        }
    }
    Ok(digests)
}

/// Where a [`TargetWriter`] sends its entries: target `target`'s batches
/// to the loader thread.
pub(super) struct LoadSink {
    target: usize,
    tx: SyncSender<Load>,
    free: Arc<Mutex<Receiver<Batch>>>,
    batch: Batch,
}

impl LoadSink {
    pub(super) fn new(target: usize, channel: &Channel) -> Self {
        let mut sink = LoadSink {
            target,
            tx: channel.tx.clone(),
            free: Arc::clone(&channel.free),
            batch: Batch::default(),
        };
        sink.batch = sink.fresh_batch();
        sink
    }

    /// An emptied batch back from the loader thread, or a new one.
    fn fresh_batch(&self) -> Batch {
        let reused = match self.free.lock() {
            Ok(free) => free.try_recv().ok(),
            Err(_) => None,
        };
        let mut batch = reused.unwrap_or_else(|| Batch {
            target: self.target,
            data: Vec::with_capacity(LOAD_BATCH * 128),
            entries: Vec::with_capacity(LOAD_BATCH),
        });
        batch.target = self.target;
        batch
    }

    fn put(&mut self, key: &[u8], value: &[u8], offset: u64) -> Result<()> {
        self.batch.push(key, value, offset)?;
        if self.batch.entries.len() >= LOAD_BATCH {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<()> {
        if self.batch.entries.is_empty() {
            return Ok(());
        }
        let fresh = self.fresh_batch();
        let batch = std::mem::replace(&mut self.batch, fresh);
        self.tx
            .send(Load::Batch(batch))
            .map_err(|_| Error::internal("the store loader stopped"))
    }
}

/// Writes one target: appends its records to its changelog (or, resuming,
/// checks them against what is already there) and loads its store. Without
/// a sink it only checks: it compares with what an earlier run left and
/// counts, appending and loading nothing (the reshard's checking pass).
pub(super) struct TargetWriter<'t> {
    target: &'t TargetPartition<'t>,
    sink: Option<LoadSink>,
    /// Resuming: the records an earlier run appended, not yet compared.
    existing: Option<Box<dyn ChangelogReader + 't>>,
    existing_batch: std::collections::VecDeque<LoggedRecord>,
    pending: Vec<Record>,
    pub(super) keys: u64,
    bytes: u64,
    pub(super) last_bytes: u64,
    appended: u64,
    resumed: u64,
    last_offset: Option<u64>,
}

impl<'t> TargetWriter<'t> {
    pub(super) fn new(
        target: &'t TargetPartition<'t>,
        sink: Option<LoadSink>,
        resume: bool,
    ) -> Result<Self> {
        let changelog = target.changelog;
        let existing = if resume && changelog.end_offset()? > 0 {
            Some(changelog.read_from(changelog.start_offset()?)?)
        } else {
            None
        };
        Ok(TargetWriter {
            target,
            sink,
            existing,
            existing_batch: Default::default(),
            pending: Vec::with_capacity(APPEND_BATCH),
            keys: 0,
            bytes: 0,
            last_bytes: 0,
            appended: 0,
            resumed: 0,
            last_offset: None,
        })
    }

    /// The next record an earlier run left, if any remain.
    fn next_existing(&mut self) -> Result<Option<LoggedRecord>> {
        loop {
            if let Some(r) = self.existing_batch.pop_front() {
                return Ok(Some(r));
            }
            let Some(reader) = &mut self.existing else {
                return Ok(None);
            };
            match reader.next_batch(APPEND_BATCH)? {
                Some(batch) => self.existing_batch.extend(batch),
                None => {
                    self.existing = None;
                    return Ok(None);
                }
            }
        }
    }

    pub(super) fn put(&mut self, key: Bytes, value: Bytes) -> Result<()> {
        self.keys += 1;
        self.last_bytes = (key.len() + value.len()) as u64;
        self.bytes += self.last_bytes;
        if (self.existing.is_some() || !self.existing_batch.is_empty())
            && let Some(found) = self.next_existing()?
        {
            if found.key != key || found.value.as_ref() != Some(&value) {
                return Err(self.not_ours(found.offset));
            }
            if let Some(sink) = &mut self.sink {
                sink.put(&key, &value, found.offset)?;
            }
            self.last_offset = Some(found.offset);
            self.resumed += 1;
            return Ok(());
        }
        if self.sink.is_none() {
            // Checking only: what would be appended is counted, not kept.
            self.appended += 1;
            return Ok(());
        }
        self.pending.push(Record::put(key, value));
        if self.pending.len() >= APPEND_BATCH {
            self.append()?;
        }
        Ok(())
    }

    /// Appends the pending records and loads them with their offsets.
    fn append(&mut self) -> Result<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let offsets = self.target.changelog.append(&self.pending)?;
        if offsets.len() != self.pending.len() {
            return Err(Error::internal(format!(
                "the changelog returned {} offsets for {} records changelog=`{}`",
                offsets.len(),
                self.pending.len(),
                self.target.changelog.id()
            )));
        }
        self.appended += self.pending.len() as u64;
        self.last_offset = offsets.last().copied().or(self.last_offset);
        for (r, offset) in self.pending.drain(..).zip(offsets) {
            if let (Some(v), Some(sink)) = (&r.value, &mut self.sink) {
                sink.put(&r.key, v, offset)?;
            }
        }
        Ok(())
    }

    fn not_ours(&self, offset: u64) -> Error {
        Error::new(
            ErrorKind::AlreadyExists,
            format!(
                "the target changelog holds records this reshard did not write \
                 changelog=`{}` store_key=`{}` first_difference_at={offset}; the sources or the \
                 partitioner changed since the interrupted run: recreate the target changelogs \
                 and reshard again",
                self.target.changelog.id(),
                self.target.store_key
            ),
        )
        .with_reason(Reason::AlreadyExists)
    }

    pub(super) fn finish(mut self) -> Result<TargetReport> {
        self.append()?;
        if let Some(extra) = self.next_existing()? {
            return Err(self.not_ours(extra.offset));
        }
        if let Some(sink) = &mut self.sink {
            self.target.changelog.flush()?;
            sink.flush()?;
        }
        Ok(TargetReport {
            store_key: self.target.store_key.clone(),
            changelog: self.target.changelog.id().clone(),
            keys: self.keys,
            bytes: self.bytes,
            appended: self.appended,
            resumed: self.resumed,
            last_offset: self.last_offset,
            // Filled in from the loader thread's count of what it loaded.
            digest: LogicalDigest::new(),
            snapshot: None,
            snapshot_reused: false,
            replay_verified: false,
        })
    }
}
