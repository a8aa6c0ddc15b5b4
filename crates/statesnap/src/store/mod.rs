//! State stores: local, queryable caches of a changelog.
//!
//! [`StateStore`] is the small trait a store implements; range helpers such as
//! [`StateStoreExt::prefix`] live in an extension trait with a blanket impl.
//! Every store records the changelog offset it has applied atomically with the
//! data (design invariant 2), so after any crash its contents equal the
//! changelog prefix `[0, applied_offset]`.

pub mod logged;
pub mod memory;
#[cfg(feature = "rocksdb")]
pub mod rocks;

use bytes::Bytes;
use std::ops::Bound;

use crate::changelog::Record;
use crate::error::Result;

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
    fn apply(&mut self, batch: &[Record], applied_offset: u64) -> Result<()>;

    /// The changelog offset of the last applied record, or `None` if the store
    /// has applied nothing.
    fn applied_offset(&self) -> Result<Option<u64>>;

    /// Approximate number of keys and bytes.
    fn approximate_size(&self) -> Result<SizeEstimate>;
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
