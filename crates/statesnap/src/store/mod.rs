//! State stores: local, queryable caches of a changelog.
//!
//! [`StateStore`] is the small trait a store implements; range helpers such as
//! [`StateStoreExt::prefix`] live in an extension trait with a blanket impl.
//! Every store records the changelog offset it has applied atomically with the
//! data (invariant 2), so after any crash its contents equal the
//! changelog prefix `[0, applied_offset]`. Every store also records which
//! changelog incarnation it follows ([`ChangelogBinding`], invariant 10),
//! durably and before its first record, so an offset is never read against
//! another log; [`ensure_follows`] is the one check every caller makes.

pub(crate) mod logged;
pub(crate) mod memory;
pub(crate) mod owner;
pub(crate) mod replay;
#[cfg(feature = "rocksdb")]
pub(crate) mod rocks;
pub(crate) mod slot;
pub(crate) mod unsynced;
#[cfg(feature = "rocksdb")]
pub(crate) mod written;

pub use logged::{CommitInfo, LoggedStore};
pub use memory::{MemoryCut, MemoryStore};
#[cfg(feature = "rocksdb")]
pub use rocks::{RocksOptions, RocksStore};

use bytes::Bytes;
use std::ops::Bound;

use crate::changelog::{ChangelogBinding, Record};
use crate::error::{Error, Result};

/// A key-value pair as returned by iteration.
pub type KeyValue = (Bytes, Bytes);

/// An ordered iterator over key-value pairs.
pub type KvIter<'a> = Box<dyn Iterator<Item = Result<KeyValue>> + 'a>;

/// Approximate size of a store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SizeEstimate {
    /// Approximate number of live keys.
    pub keys: u64,
    /// Approximate logical bytes (keys + values) of live entries.
    pub bytes: u64,
}

/// A key-value store that caches a changelog.
///
/// Reads take `&self`; writes take `&mut self` because a store has one
/// writer, the processing thread. Implementations must make
/// [`StateStore::apply`] atomic: after a crash either the whole batch *and*
/// the new applied offset are visible, or neither is.
///
/// A conformance suite lives in `statesnap::conformance::store`
/// (feature `conformance`).
pub trait StateStore: Send {
    /// The value of `key`, if present.
    fn get(&self, key: &[u8]) -> Result<Option<Bytes>>;

    /// Live entries with keys in `(start, end)`, in ascending byte order.
    fn range<'a>(&'a self, start: Bound<&[u8]>, end: Bound<&[u8]>) -> Result<KvIter<'a>>;

    /// Applies `batch` in order (later records for a key win) and records
    /// `applied_offset` as the changelog offset the store now reflects — in one
    /// atomic step.
    ///
    /// Only the result is the contract, not the records that led to it:
    /// replay hands over large batches in key order with only the last
    /// record of each key (the same state once applied atomically), so a
    /// store sees fewer records than the log holds.
    fn apply(&mut self, batch: &[Record], applied_offset: u64) -> Result<()>;

    /// The changelog offset of the last applied record, or `None` if the store
    /// has applied nothing.
    fn applied_offset(&self) -> Result<Option<u64>>;

    /// Approximate number of keys and bytes.
    fn approximate_size(&self) -> Result<SizeEstimate>;

    /// The changelog incarnation this store follows, or `None` if it was
    /// never bound (a new, empty store).
    fn binding(&self) -> Result<Option<ChangelogBinding>>;

    /// Records durably that this store follows `binding`, before the first
    /// [`StateStore::apply`] (or, for a restore, before the store is used).
    /// After a crash a store must never show an `applied_offset` without the
    /// binding it was applied under: write the binding first (and durably),
    /// or in the same atomic step as the data. Binding a store again to the
    /// same value is a no-op; to another value, an error (kind `stale`).
    /// Callers use [`ensure_follows`] rather than calling this directly.
    fn bind(&mut self, binding: &ChangelogBinding) -> Result<()>;

    /// A loader that fills this store, which must be empty and bound, with
    /// entries in strictly ascending key order, each with the changelog
    /// offset of its record (ascending too): the fast way to build a whole
    /// store at once (a reshard's targets). The default applies batches
    /// through [`StateStore::apply`]; a store with a faster bulk path
    /// (RocksDB: sorted SST files, ingested) overrides it. If loading
    /// fails, or the loader is dropped before
    /// [`BulkLoader::finish`], the store is to be discarded.
    fn bulk_loader(&mut self) -> Result<Box<dyn BulkLoader + '_>> {
        Ok(Box::new(ApplyLoader {
            store: self,
            batch: Vec::with_capacity(BULK_BATCH),
            last_offset: None,
        }))
    }
}

/// Fills an empty store in key order; see [`StateStore::bulk_loader`].
pub trait BulkLoader: Send {
    /// Adds `key` = `value`, written to the changelog at `offset`. Keys and
    /// offsets ascend strictly.
    fn put(&mut self, key: &[u8], value: &[u8], offset: u64) -> Result<()>;

    /// Makes every entry visible and records the offset of the last one as
    /// the store's applied offset.
    fn finish(self: Box<Self>) -> Result<()>;
}

/// Entries per [`StateStore::apply`] of the default loader.
const BULK_BATCH: usize = 10_000;

/// The default [`BulkLoader`]: batches through [`StateStore::apply`].
struct ApplyLoader<'a, S: ?Sized> {
    store: &'a mut S,
    batch: Vec<Record>,
    last_offset: Option<u64>,
}

impl<S: StateStore + ?Sized> ApplyLoader<'_, S> {
    fn flush(&mut self) -> Result<()> {
        if let Some(offset) = self.last_offset.filter(|_| !self.batch.is_empty()) {
            self.store.apply(&self.batch, offset)?;
            self.batch.clear();
        }
        Ok(())
    }
}

impl<S: StateStore + ?Sized> BulkLoader for ApplyLoader<'_, S> {
    fn put(&mut self, key: &[u8], value: &[u8], offset: u64) -> Result<()> {
        self.batch.push(Record::put(
            Bytes::copy_from_slice(key),
            Bytes::copy_from_slice(value),
        ));
        self.last_offset = Some(offset);
        if self.batch.len() >= BULK_BATCH {
            self.flush()?;
        }
        Ok(())
    }

    fn finish(mut self: Box<Self>) -> Result<()> {
        self.flush()
    }
}

/// The file that marks a directory as a store this library made. A restore
/// (or `create_empty`) replaces only an absent path, an empty directory, or
/// a directory holding it; stores the library creates on disk carry it.
pub const STORE_MARKER: &str = ".statesnap-store";

/// Marks `dir` (a store directory) as one restores may replace. Idempotent.
/// Stores made by this library are marked already; call it to let a restore
/// replace a directory of your own.
pub fn mark_store_dir(dir: &std::path::Path) -> Result<()> {
    let p = dir.join(STORE_MARKER);
    if std::fs::symlink_metadata(&p).is_ok_and(|m| m.is_file()) {
        return Ok(());
    }
    std::fs::write(
        &p,
        b"a statesnap store: restores may replace this directory\n",
    )
    .map_err(|e| {
        Error::io(
            format!("cannot write store marker path=`{}`", p.display()),
            e,
        )
    })
}

/// Checks that `store` follows `expected` (invariant 10), binding a
/// store that has never applied anything.
///
/// Fails with kind `stale` when the store follows another changelog or an
/// earlier incarnation of this one (the log was deleted and recreated), or
/// when it has applied records but records no binding at all (written by a
/// store implementation that did not record it): such a store cannot be
/// caught up exactly, so it must be restored again or rebuilt.
pub fn ensure_follows<S: StateStore + ?Sized>(
    store: &mut S,
    expected: &ChangelogBinding,
) -> Result<()> {
    match store.binding()? {
        Some(b) if &b == expected => Ok(()),
        Some(b) => Err(Error::stale(format!(
            "store follows another changelog store_follows=`{b}` changelog=`{expected}`; the \
             changelog was recreated or the store belongs elsewhere: delete the store and restore \
             it (restore_store replaces it) or rebuild it by full replay"
        ))
        .with_reason(crate::Reason::OtherChangelog)),
        None => match store.applied_offset()? {
            None => store.bind(expected),
            Some(o) => Err(Error::stale(format!(
                "store has applied records but does not record which changelog it follows \
                 applied_offset={o} changelog=`{expected}`; its offset cannot be trusted against \
                 this log: delete the store and restore it or rebuild it by full replay"
            ))
            .with_reason(crate::Reason::Unbound)),
        },
    }
}

/// For [`StateStore::bind`] implementations: whether `new` must be written
/// (`Ok(false)`: the store already records it), or the error for a store
/// bound to something else.
pub fn check_rebind(current: Option<&ChangelogBinding>, new: &ChangelogBinding) -> Result<bool> {
    match current {
        None => Ok(true),
        Some(c) if c == new => Ok(false),
        Some(c) => Err(Error::stale(format!(
            "store is already bound to another changelog store_follows=`{c}` requested=`{new}`; a \
             store follows one changelog incarnation for life: use a new store"
        ))
        .with_reason(crate::Reason::OtherChangelog)),
    }
}

/// A binding check for a store that came out of a snapshot restore: binds an
/// unbound store (a snapshot's data carries no binding of its own in the
/// portable format) to the snapshot's changelog, refuses (`corrupt`) one
/// whose recorded binding disagrees with the manifest.
pub(crate) fn bind_restored<S: StateStore + ?Sized>(
    store: &mut S,
    expected: &ChangelogBinding,
) -> Result<()> {
    match store.binding()? {
        Some(b) if &b == expected => Ok(()),
        Some(b) => Err(Error::corrupt(format!(
            "restored store records another changelog than its snapshot's manifest \
             store_follows=`{b}` manifest=`{expected}`; the snapshot is unusable"
        ))),
        None => store.bind(expected),
    }
}

/// Convenience methods over any [`StateStore`].
pub trait StateStoreExt: StateStore {
    /// Every live entry, in key order.
    fn iter(&self) -> Result<KvIter<'_>> {
        self.range(Bound::Unbounded, Bound::Unbounded)
    }

    /// Entries whose key starts with `prefix`, in key order.
    fn prefix<'a>(&'a self, prefix: &[u8]) -> Result<KvIter<'a>> {
        match prefix_end(prefix) {
            Some(end) => self.range(Bound::Included(prefix), Bound::Excluded(&end)),
            None => self.range(Bound::Included(prefix), Bound::Unbounded),
        }
    }

    /// The order-independent digest of every live entry (one full scan).
    fn logical_digest(&self) -> Result<crate::digest::LogicalDigest> {
        let mut d = crate::digest::LogicalDigest::new();
        for kv in self.iter()? {
            let (k, v) = kv?;
            d.add(&k, &v);
        }
        Ok(d)
    }
}

impl<S: StateStore + ?Sized> StateStoreExt for S {}

/// The smallest key greater than every key starting with `prefix`, or `None`
/// if there is none (empty prefix or all `0xff`).
pub fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

/// Whether `key` lies within `(start, end)`.
pub fn in_bounds(key: &[u8], start: Bound<&[u8]>, end: Bound<&[u8]>) -> bool {
    let after_start = match start {
        Bound::Included(s) => key >= s,
        Bound::Excluded(s) => key > s,
        Bound::Unbounded => true,
    };
    let before_end = match end {
        Bound::Included(e) => key <= e,
        Bound::Excluded(e) => key < e,
        Bound::Unbounded => true,
    };
    after_start && before_end
}

impl<S: StateStore + ?Sized> StateStore for Box<S> {
    fn get(&self, key: &[u8]) -> Result<Option<Bytes>> {
        (**self).get(key)
    }
    fn range<'a>(&'a self, start: Bound<&[u8]>, end: Bound<&[u8]>) -> Result<KvIter<'a>> {
        (**self).range(start, end)
    }
    fn apply(&mut self, batch: &[Record], applied_offset: u64) -> Result<()> {
        (**self).apply(batch, applied_offset)
    }
    fn applied_offset(&self) -> Result<Option<u64>> {
        (**self).applied_offset()
    }
    fn approximate_size(&self) -> Result<SizeEstimate> {
        (**self).approximate_size()
    }
    fn binding(&self) -> Result<Option<ChangelogBinding>> {
        (**self).binding()
    }
    fn bind(&mut self, binding: &ChangelogBinding) -> Result<()> {
        (**self).bind(binding)
    }
    fn bulk_loader(&mut self) -> Result<Box<dyn BulkLoader + '_>> {
        (**self).bulk_loader()
    }
}

/// Whether `(start, end)` can hold no key (start after end, or an empty
/// exclusive range) — the B-tree range APIs panic on such ranges.
pub(crate) fn range_is_empty(start: Bound<&[u8]>, end: Bound<&[u8]>) -> bool {
    match (start, end) {
        (Bound::Included(s), Bound::Included(e)) => s > e,
        (Bound::Included(s), Bound::Excluded(e))
        | (Bound::Excluded(s), Bound::Included(e))
        | (Bound::Excluded(s), Bound::Excluded(e)) => s >= e,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_end_handles_ff_runs() {
        assert_eq!(prefix_end(b"ab"), Some(b"ac".to_vec()));
        assert_eq!(prefix_end(b"a\xff"), Some(b"b".to_vec()));
        assert_eq!(prefix_end(b"\xff\xff"), None);
        assert_eq!(prefix_end(b""), None);
    }
}
