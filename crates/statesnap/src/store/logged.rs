//! [`LoggedStore`]: a store kept in step with its changelog.
//!
//! Writes go to a pending batch that reads see immediately (read-your-writes).
//! [`LoggedStore::commit`] appends the batch to the changelog **first** and
//! only then applies it to the store, tagged with the batch's last offset
//! (invariant 1). A crash between the two leaves the store *behind* the
//! changelog — replay catches it up — and never ahead of it.

use bytes::Bytes;
use std::collections::BTreeMap;
use std::iter::Peekable;
use std::ops::Bound;

use super::{KeyValue, KvIter, StateStore, ensure_follows};
use crate::changelog::{Changelog, ChangelogBinding, Record};
use crate::error::{Error, Result};
use crate::store::replay::{ReplayOptions, ReplayProgress, ReplayReport, replay};

/// A [`StateStore`] whose writes are logged to a [`Changelog`].
#[derive(Debug)]
pub struct LoggedStore<S, C> {
    store: S,
    changelog: C,
    /// Pending writes, newest per key (`None` = delete), in key order.
    pending: BTreeMap<Bytes, Option<Bytes>>,
    /// Set when a batch reached the changelog but not the store.
    behind: bool,
    /// Set when an append failed: some of its records may be in the
    /// changelog all the same. The next commit replays them first, so the
    /// store never applies a later offset without them.
    unsure: bool,
    /// Set when the changelog handed out offsets the store had already
    /// applied: the log lost records the store holds. Permanent.
    broken: Option<String>,
    /// This store's writer claim on its changelog handle, once
    /// [`LoggedStore::claim_writer`] took one: its appends are refused
    /// once a newer owner claims the handle.
    claim: Option<crate::changelog::WriterClaim>,
}

/// What a [`LoggedStore::commit`] wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommitInfo {
    /// Records appended (one per distinct key written since the last commit).
    pub records: usize,
    /// Changelog offset of the first record of the batch.
    pub first_offset: u64,
    /// Changelog offset of the last record, now the store's applied offset.
    pub last_offset: u64,
}

impl<S: StateStore, C: Changelog> LoggedStore<S, C> {
    /// Wraps `store` and `changelog`.
    ///
    /// Fails (kind `stale`) if the store follows another changelog or an
    /// earlier incarnation of this one, or records no binding although it
    /// has applied records (see [`ensure_follows`]); a new store is bound to
    /// `changelog` here. Fails too if the store is ahead of the changelog
    /// (the log lost records the store applied). The store may be behind:
    /// call [`LoggedStore::catch_up`] before serving reads. A commit on a
    /// store that is behind first applies the records it missed, so it can
    /// never claim offsets it did not apply.
    pub fn new(mut store: S, changelog: C) -> Result<Self> {
        ensure_follows(&mut store, &ChangelogBinding::of(&changelog)?)?;
        let applied = store.applied_offset()?;
        let end = changelog.end_offset()?;
        if let Some(a) = applied
            && a >= end
        {
            return Err(Error::stale(format!(
                "store is ahead of its changelog changelog=`{}` applied_offset={a} end_offset={end}; \
                     the changelog lost records the store applied — delete the store and restore or replay it",
                changelog.id()
            )).with_reason(crate::Reason::AheadOfLog));
        }
        Ok(LoggedStore {
            store,
            changelog,
            pending: BTreeMap::new(),
            behind: false,
            unsure: false,
            broken: None,
            claim: None,
        })
    }

    /// Makes this store the owner of its changelog handle: a writer claim
    /// ([`Changelog::begin_writer`]) that fences every older one, so that a
    /// store the handle was shared with before (the old owner of a
    /// partition whose standby was promoted) can no longer commit. From
    /// now on this store's commits are refused (`stale`, reason `fenced`)
    /// once a newer owner claims the handle. The runtime claims for every
    /// writable handle it opens or promotes. A backend that hands out no
    /// claims leaves this a no-op.
    pub fn claim_writer(&mut self) -> Result<()> {
        self.claim = self.changelog.begin_writer()?;
        Ok(())
    }

    /// Replays whatever the changelog holds beyond the store's applied offset.
    pub fn catch_up(&mut self, options: &ReplayOptions) -> Result<ReplayReport> {
        self.catch_up_with_progress(options, &mut |_| {})
    }

    /// [`LoggedStore::catch_up`] with a progress callback, called per batch.
    pub fn catch_up_with_progress(
        &mut self,
        options: &ReplayOptions,
        progress: &mut dyn FnMut(&ReplayProgress),
    ) -> Result<ReplayReport> {
        if let Some(msg) = &self.broken {
            return Err(Error::stale(msg.clone()).with_reason(crate::Reason::HistoryLost));
        }
        let report = replay(&mut self.store, &self.changelog, options, progress)?;
        self.behind = false;
        self.unsure = false;
        Ok(report)
    }

    /// Buffers a put.
    pub fn put(&mut self, key: impl Into<Bytes>, value: impl Into<Bytes>) {
        self.pending.insert(key.into(), Some(value.into()));
    }

    /// Buffers a delete.
    pub fn delete(&mut self, key: impl Into<Bytes>) {
        self.pending.insert(key.into(), None);
    }

    /// The value of `key`, seeing pending writes.
    pub fn get(&self, key: &[u8]) -> Result<Option<Bytes>> {
        match self.pending.get(key) {
            Some(v) => Ok(v.clone()),
            None => self.store.get(key),
        }
    }

    /// Entries in `(start, end)` in key order, pending writes merged over the
    /// store's contents.
    pub fn range<'a>(&'a self, start: Bound<&[u8]>, end: Bound<&[u8]>) -> Result<KvIter<'a>> {
        let base = self.store.range(start, end)?;
        if self.pending.is_empty() || super::range_is_empty(start, end) {
            return Ok(base);
        }
        let over = self.pending.range::<[u8], _>((start, end));
        Ok(Box::new(MergeIter {
            base: base.peekable(),
            over: over.peekable(),
        }))
    }

    /// Number of distinct keys written since the last commit.
    pub fn pending_len(&self) -> usize {
        self.pending.len()
    }

    /// Drops every pending write.
    pub fn discard(&mut self) {
        self.pending.clear();
    }

    /// Appends the pending writes to the changelog, then applies them to the
    /// store with the batch's last offset. Returns `None` if nothing was
    /// pending.
    ///
    /// If the append fails, nothing is applied and the writes stay pending, so
    /// the commit can be retried (a retry may log some records twice, which is
    /// harmless: replay is last-write-wins). A failed append may still have
    /// written some of its records (Kafka delivers some of a batch, a file
    /// write is cut short), so the next commit first replays whatever the
    /// changelog holds beyond the store's applied offset: the store never
    /// moves past records it did not apply, even if the writes were
    /// [discarded](LoggedStore::discard) or changed in between. If the append
    /// succeeds but the store write fails, the writes are durable in the
    /// changelog; the store is behind, and every later call fails until
    /// [`LoggedStore::catch_up`] has run.
    ///
    /// The store's offset moves only over offsets it applied (design
    /// invariant 9): the batch must land exactly at the offset after the
    /// store's. If the changelog holds records in between (the store was not
    /// caught up, or another writer appended), they are replayed — in order,
    /// with this batch — before the commit returns. If the changelog gives
    /// the batch offsets the store already applied (it lost records), the
    /// commit fails `stale` and this `LoggedStore` refuses every later call.
    pub fn commit(&mut self) -> Result<Option<CommitInfo>> {
        self.check_not_behind()?;
        self.settle_unsure()?;
        if self.pending.is_empty() {
            return Ok(None);
        }
        let records: Vec<Record> = self
            .pending
            .iter()
            .map(|(k, v)| Record {
                key: k.clone(),
                value: v.clone(),
            })
            .collect();
        // The offset the batch must start at for the store to stay exact.
        let expected = self
            .store
            .applied_offset()?
            .map_or(0, |o| o.saturating_add(1));
        // Invariant 1: the changelog first.
        let appended = match self.claim {
            Some(claim) => self.changelog.append_as(claim, &records),
            None => self.changelog.append(&records),
        };
        let offsets = match appended {
            Ok(o) => o,
            Err(e) => {
                self.unsure = true;
                return Err(e);
            }
        };
        let (Some(&first_offset), Some(&last_offset)) = (offsets.first(), offsets.last()) else {
            return Err(Error::internal(format!(
                "changelog returned no offsets for a batch changelog=`{}` records={}",
                self.changelog.id(),
                records.len()
            )));
        };
        self.pending.clear();
        let info = CommitInfo {
            records: records.len(),
            first_offset,
            last_offset,
        };
        if first_offset < expected {
            return Err(self.history_lost(first_offset, expected));
        }
        if first_offset > expected {
            self.replay_gap(records.len(), first_offset, expected)?;
            return Ok(Some(info));
        }
        if let Err(e) = self.store.apply(&records, last_offset) {
            self.behind = true;
            return Err(e);
        }
        Ok(Some(info))
    }

    /// After a failed append, replays whatever the changelog holds beyond
    /// the store's applied offset, so the store never moves past records it
    /// did not apply.
    fn settle_unsure(&mut self) -> Result<()> {
        if self.unsure {
            // A replay error leaves `unsure` set; the commit can be retried.
            replay(
                &mut self.store,
                &self.changelog,
                &ReplayOptions::default(),
                &mut |_| {},
            )?;
            self.unsure = false;
        }
        Ok(())
    }

    /// Marks this store broken: the changelog gave a batch at
    /// `first_offset` offsets below `expected`, which the store had applied.
    fn history_lost(&mut self, first_offset: u64, expected: u64) -> Error {
        // The log gave this batch offsets the store already applied
        // other records at: it lost them (a torn tail cut after a power
        // loss, a truncated or recreated log). No replay can fix that.
        let msg = format!(
            "the changelog handed out offsets the store had already applied changelog=`{}` \
             first_offset={first_offset} expected={expected}; the log lost records the store \
             holds: delete the store and restore or replay it",
            self.changelog.id()
        );
        self.broken = Some(msg.clone());
        Error::stale(msg).with_reason(crate::Reason::HistoryLost)
    }

    /// Applies a batch of `batch_len` records the changelog put at
    /// `first_offset`, past `expected`, by replaying the whole tail.
    fn replay_gap(&mut self, batch_len: usize, first_offset: u64, expected: u64) -> Result<()> {
        // Records between the store's offset and this batch: another
        // writer's, a failed append's partial records, or a store that
        // was never caught up. Applying the batch at its own offset would
        // claim them unapplied (invariant 9), so replay the whole tail —
        // which holds this batch too — in order instead.
        let report = match replay(
            &mut self.store,
            &self.changelog,
            &ReplayOptions::default(),
            &mut |_| {},
        ) {
            Ok(r) => r,
            Err(e) => {
                self.behind = true;
                return Err(e);
            }
        };
        // A log's own bookkeeping records (a Kafka writer claim before
        // a new writer's first batch) hold offsets but no data: only
        // records the replay applied beyond this batch are news.
        let foreign = report.records.saturating_sub(batch_len as u64);
        if foreign > 0 {
            tracing::warn!(
                changelog = %self.changelog.id(),
                expected,
                first_offset,
                foreign,
                "commit found changelog records the store had not applied; replayed them \
                 first (is another writer appending to this changelog?)"
            );
        }
        Ok(())
    }

    fn check_not_behind(&self) -> Result<()> {
        if let Some(msg) = &self.broken {
            return Err(Error::stale(msg.clone()).with_reason(crate::Reason::HistoryLost));
        }
        if self.behind {
            return Err(Error::stale(format!(
                "store missed a committed batch after a store write failed changelog=`{}`; call catch_up() first",
                self.changelog.id()
            )).with_reason(crate::Reason::Behind));
        }
        Ok(())
    }

    /// The wrapped store (committed state only).
    pub fn store(&self) -> &S {
        &self.store
    }

    /// The changelog.
    pub fn changelog(&self) -> &C {
        &self.changelog
    }

    /// Gives back the store and the changelog, dropping pending writes.
    pub fn into_parts(self) -> (S, C) {
        (self.store, self.changelog)
    }
}

/// Merges pending writes (which win, and may delete) over store entries.
struct MergeIter<'a, B: Iterator<Item = Result<KeyValue>>> {
    base: Peekable<B>,
    over: Peekable<std::collections::btree_map::Range<'a, Bytes, Option<Bytes>>>,
}

impl<B: Iterator<Item = Result<KeyValue>>> Iterator for MergeIter<'_, B> {
    type Item = Result<KeyValue>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            let take_over = match (self.base.peek(), self.over.peek()) {
                (None, None) => return None,
                (Some(Err(_)), _) => return self.base.next(),
                (None, Some(_)) => true,
                (Some(_), None) => false,
                (Some(Ok((bk, _))), Some((ok, _))) => {
                    if bk == *ok {
                        // Shadowed by a pending write.
                        self.base.next();
                        true
                    } else {
                        *ok < bk
                    }
                }
            };
            if take_over {
                let (k, v) = self.over.next()?;
                match v {
                    Some(v) => return Some(Ok((k.clone(), v.clone()))),
                    None => continue, // pending delete
                }
            }
            return self.base.next();
        }
    }
}
