//! Writing the targets: each target's changelog records (or, resuming,
//! the check of what an earlier run left there) on the placing thread, and
//! every target's store through its bulk loader on a thread of its own,
//! fed batches in key order: the two halves of the work run side by side.

use std::sync::mpsc::{Receiver, SyncSender};

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

/// What the loader thread receives.
pub(super) enum Load {
    /// Entries for target `.0`, in key order, with their changelog offsets.
    Batch(usize, Vec<(Bytes, Bytes, u64)>),
    /// Everything was sent: finish every loader.
    Finish,
}

/// The loader thread: feeds each batch to its target's loader and, once
/// told everything was sent, finishes them all. A channel closed without
/// [`Load::Finish`] (placing failed) leaves the stores unfinished: they are
/// discarded.
pub(super) fn load(mut loaders: Vec<Box<dyn BulkLoader + '_>>, rx: Receiver<Load>) -> Result<()> {
    for msg in rx {
        match msg {
            Load::Batch(j, batch) => {
                let loader = loaders
                    .get_mut(j)
                    .ok_or_else(|| Error::internal(format!("no loader for target {j}")))?;
                for (k, v, offset) in &batch {
                    loader.put(k, v, *offset)?;
                }
            }
            Load::Finish => {
                for l in loaders {
                    l.finish()?;
                }
                return Ok(());
            }
        }
    }
    Ok(())
}

/// Where a [`TargetWriter`] sends its entries: target `target`'s batches
/// to the loader thread.
pub(super) struct LoadSink {
    target: usize,
    tx: SyncSender<Load>,
    batch: Vec<(Bytes, Bytes, u64)>,
}

impl LoadSink {
    pub(super) fn new(target: usize, tx: SyncSender<Load>) -> Self {
        LoadSink {
            target,
            tx,
            batch: Vec::with_capacity(LOAD_BATCH),
        }
    }

    fn put(&mut self, key: Bytes, value: Bytes, offset: u64) -> Result<()> {
        self.batch.push((key, value, offset));
        if self.batch.len() >= LOAD_BATCH {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<()> {
        if self.batch.is_empty() {
            return Ok(());
        }
        let batch = std::mem::replace(&mut self.batch, Vec::with_capacity(LOAD_BATCH));
        self.tx
            .send(Load::Batch(self.target, batch))
            .map_err(|_| Error::internal("the store loader stopped"))
    }
}

/// Writes one target: appends its records to its changelog (or, resuming,
/// checks them against what is already there) and loads its store.
pub(super) struct TargetWriter<'t> {
    target: &'t TargetPartition<'t>,
    sink: LoadSink,
    /// Resuming: the records an earlier run appended, not yet compared.
    existing: Option<Box<dyn ChangelogReader + 't>>,
    existing_batch: std::collections::VecDeque<LoggedRecord>,
    pending: Vec<Record>,
    digest: LogicalDigest,
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
        sink: LoadSink,
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
            digest: LogicalDigest::new(),
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
        self.digest.add(&key, &value);
        self.keys += 1;
        self.last_bytes = (key.len() + value.len()) as u64;
        self.bytes += self.last_bytes;
        if (self.existing.is_some() || !self.existing_batch.is_empty())
            && let Some(found) = self.next_existing()?
        {
            if found.key != key || found.value.as_ref() != Some(&value) {
                return Err(self.not_ours(found.offset));
            }
            self.sink.put(key, value, found.offset)?;
            self.last_offset = Some(found.offset);
            self.resumed += 1;
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
            if let Some(v) = r.value {
                self.sink.put(r.key, v, offset)?;
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
        self.target.changelog.flush()?;
        self.sink.flush()?;
        Ok(TargetReport {
            store_key: self.target.store_key.clone(),
            changelog: self.target.changelog.id().clone(),
            keys: self.keys,
            bytes: self.bytes,
            appended: self.appended,
            resumed: self.resumed,
            last_offset: self.last_offset,
            digest: self.digest,
            snapshot: None,
            snapshot_reused: false,
            replay_verified: false,
        })
    }
}
