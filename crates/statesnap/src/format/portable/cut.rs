//! What a portable snapshot captures: a consistent cut of a store's contents
//! and applied offset ([`PortableCut`]), and the stores that produce one
//! ([`PortableSource`]).

use std::sync::Arc;

use crate::changelog::ChangelogBinding;
use crate::digest::LogicalDigest;
use crate::error::Result;
use crate::store::memory::{MemoryCut, MemoryMap, MemoryStore};
use crate::store::{KeyValue, StateStore, StateStoreExt};

/// A store the portable format can snapshot: it produces a consistent cut of
/// its contents and applied offset.
///
/// Implement it in one line for any store with
/// [`PortableCut::materialize`]; [`MemoryStore`] returns an O(1) cut that
/// also allows delta snapshots.
pub trait PortableSource: StateStore {
    /// A consistent cut: contents and applied offset taken together
    /// (invariant 2). Runs on the caller's thread.
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

/// The digest of `new`, given `digest` = the digest of `old`: each pair
/// that changed between them is taken away and the new one added. `None`
/// when half the keys or more changed (a scan of `new` is cheaper then).
pub(super) fn follow_digest(
    mut digest: LogicalDigest,
    old: &MemoryMap,
    new: &MemoryMap,
) -> Option<LogicalDigest> {
    use imbl::ordmap::DiffItem;
    let budget = new.len() / 2 + 16;
    for (changed, d) in old.diff(new).enumerate() {
        if changed >= budget {
            return None;
        }
        match d {
            DiffItem::Add(k, v) => digest.add(k, v),
            DiffItem::Update {
                old: (k, was),
                new: (_, now),
            } => {
                digest.remove(k, was);
                digest.add(k, now);
            }
            DiffItem::Remove(k, v) => digest.remove(k, v),
        }
    }
    Some(digest)
}

/// A consistent cut of a store for the portable format.
#[derive(Debug, Clone)]
pub struct PortableCut {
    pub(super) applied_offset: Option<u64>,
    pub(super) binding: Option<ChangelogBinding>,
    pub(super) contents: CutContents,
}

#[derive(Debug, Clone)]
pub(super) enum CutContents {
    Memory(MemoryMap, u64),
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

    /// The logical digest of the cut's contents.
    pub fn logical_digest(&self) -> LogicalDigest {
        match &self.contents {
            CutContents::Memory(m, _) => {
                LogicalDigest::of_pairs(m.iter().map(|(k, v)| (&k[..], &v[..])))
            }
            CutContents::Sorted(e, _) => {
                LogicalDigest::of_pairs(e.iter().map(|(k, v)| (&k[..], &v[..])))
            }
        }
    }

    /// Logical bytes (keys + values).
    pub fn logical_bytes(&self) -> u64 {
        match &self.contents {
            CutContents::Memory(_, b) | CutContents::Sorted(_, b) => *b,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::slot::{KeySlot, ValueSlot};
    use proptest::prelude::*;

    fn scan(m: &MemoryMap) -> LogicalDigest {
        LogicalDigest::of_pairs(m.iter().map(|(k, v)| (&k[..], &v[..])))
    }

    proptest! {
        /// Following the changes gives the digest a scan gives, through a
        /// chain of cuts with puts, overwrites and deletes.
        #[test]
        fn a_followed_digest_equals_a_scan(
            rounds in proptest::collection::vec(
                proptest::collection::vec((0u8..40, proptest::option::of(0u8..4)), 0..30),
                1..6,
            ),
        ) {
            let mut map = MemoryMap::new();
            let mut last = (map.clone(), LogicalDigest::new());
            for ops in rounds {
                for (k, v) in ops {
                    match v {
                        Some(v) => { map.insert(KeySlot::copy_of(&[k]), ValueSlot::copy_of(&[v; 3])); }
                        None => { map.remove(&[k][..]); }
                    }
                }
                let expected = scan(&map);
                if let Some(d) = follow_digest(last.1, &last.0, &map) {
                    prop_assert_eq!(d, expected);
                }
                last = (map.clone(), expected);
            }
        }
    }

    #[test]
    fn a_mostly_rewritten_map_is_scanned_instead() {
        let old: MemoryMap = (0u32..100)
            .map(|i| (KeySlot::copy_of(&i.to_be_bytes()), ValueSlot::copy_of(b"a")))
            .collect();
        let mut new = old.clone();
        for i in 0u32..80 {
            new.insert(KeySlot::copy_of(&i.to_be_bytes()), ValueSlot::copy_of(b"b"));
        }
        assert!(follow_digest(scan(&old), &old, &new).is_none());
        new = old.clone();
        new.insert(KeySlot::copy_of(b"x"), ValueSlot::copy_of(b"y"));
        assert_eq!(follow_digest(scan(&old), &old, &new), Some(scan(&new)));
    }
}
