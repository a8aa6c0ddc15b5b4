//! Writing one target: its changelog records (or, resuming, the check of
//! what an earlier run left there) and its store, through the store's bulk
//! loader.

use bytes::Bytes;

use super::{APPEND_BATCH, TargetPartition, TargetReport};
use crate::changelog::{ChangelogReader, LoggedRecord, Record};
use crate::digest::LogicalDigest;
use crate::error::{Error, ErrorKind, Reason, Result};
use crate::store::BulkLoader;

/// Writes one target: appends its records to its changelog (or, resuming,
/// checks them against what is already there) and loads its store.
pub(super) struct TargetWriter<'t, 's> {
    target: &'t TargetPartition<'t>,
    loader: Box<dyn BulkLoader + 's>,
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

impl<'t, 's> TargetWriter<'t, 's> {
    pub(super) fn new(
        target: &'t TargetPartition<'t>,
        loader: Box<dyn BulkLoader + 's>,
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
            loader,
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
            self.loader.put(&key, &value, found.offset)?;
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
        for (r, offset) in self.pending.iter().zip(&offsets) {
            if let Some(v) = &r.value {
                self.loader.put(&r.key, v, *offset)?;
            }
        }
        self.appended += self.pending.len() as u64;
        self.last_offset = offsets.last().copied().or(self.last_offset);
        self.pending.clear();
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
        self.loader.finish()?;
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
