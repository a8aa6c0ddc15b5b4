//! [`MemoryStore`]: an in-memory store on a persistent ordered map.
//!
//! The map is `imbl::OrdMap`, a B-tree with structural sharing: cloning it is
//! O(1) and later writes copy only the nodes they touch. That is what lets a
//! snapshot take a consistent cut ([`MemoryStore::cut`]) on the processing
//! thread in microseconds and serialise it in the background while writes go
//! on.
//!
//! Keys and values are [`Slot`](super::slot)s: inline when short, so the
//! leaf copies a capture causes are plain memory copies (see that module).

use bytes::Bytes;
use imbl::OrdMap;
use std::ops::Bound;

use super::slot::{KeySlot, Lookup, ValueSlot, cmp_bytes};
use super::{KvIter, SizeEstimate, StateStore};
use crate::changelog::{ChangelogBinding, Record};
use crate::error::Result;

/// The persistent map a [`MemoryStore`] and its cuts hold.
pub(crate) type MemoryMap = OrdMap<KeySlot, ValueSlot>;

/// An in-memory [`StateStore`].
#[derive(Debug, Clone, Default)]
pub struct MemoryStore {
    map: MemoryMap,
    applied_offset: Option<u64>,
    /// Sum of key and value lengths of live entries.
    bytes: u64,
    /// The changelog incarnation the offset belongs to.
    binding: Option<ChangelogBinding>,
}

/// A consistent, immutable cut of a [`MemoryStore`]: its contents and the
/// changelog offset they reflect, taken together (invariant 2).
///
/// Read it through its methods; the persistent map inside is an
/// implementation detail (formats inside the crate take it apart with
/// `into_parts` to compute deltas).
#[derive(Debug, Clone)]
pub struct MemoryCut {
    map: MemoryMap,
    applied_offset: Option<u64>,
    bytes: u64,
    binding: Option<ChangelogBinding>,
}

impl MemoryCut {
    /// The offset the contents reflect.
    pub fn applied_offset(&self) -> Option<u64> {
        self.applied_offset
    }

    /// The changelog incarnation the offset belongs to.
    pub fn binding(&self) -> Option<&ChangelogBinding> {
        self.binding.as_ref()
    }

    /// Logical bytes (keys + values) at the cut.
    pub fn logical_bytes(&self) -> u64 {
        self.bytes
    }

    /// Number of keys at the cut.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether the cut holds no keys.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// The value of `key` at the cut.
    pub fn get(&self, key: &[u8]) -> Option<&[u8]> {
        self.map.get(&Lookup(key)).map(|v| &v[..])
    }

    /// Every entry at the cut, in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        self.map.iter().map(|(k, v)| (&k[..], &v[..]))
    }

    /// Map, offset, logical bytes and binding, for formats in this crate.
    pub(crate) fn into_parts(self) -> (MemoryMap, Option<u64>, u64, Option<ChangelogBinding>) {
        (self.map, self.applied_offset, self.bytes, self.binding)
    }
}

impl MemoryStore {
    /// An empty store that has applied nothing.
    pub fn new() -> Self {
        MemoryStore::default()
    }

    /// A store holding `cut`'s contents (used by restore).
    pub fn from_cut(cut: MemoryCut) -> Self {
        MemoryStore {
            map: cut.map,
            applied_offset: cut.applied_offset,
            bytes: cut.bytes,
            binding: cut.binding,
        }
    }

    /// An O(1) consistent cut of the contents and applied offset.
    pub fn cut(&self) -> MemoryCut {
        MemoryCut {
            map: self.map.clone(),
            applied_offset: self.applied_offset,
            bytes: self.bytes,
            binding: self.binding.clone(),
        }
    }

    /// Number of live keys (exact).
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether the store holds no keys.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

impl StateStore for MemoryStore {
    fn get(&self, key: &[u8]) -> Result<Option<Bytes>> {
        Ok(self.map.get(&Lookup(key)).map(ValueSlot::to_bytes))
    }

    fn range<'a>(&'a self, start: Bound<&[u8]>, end: Bound<&[u8]>) -> Result<KvIter<'a>> {
        if super::range_is_empty(start, end) {
            return Ok(Box::new(std::iter::empty()));
        }
        let it = self
            .map
            .range::<_, [u8]>((start, end))
            .map(|(k, v)| Ok((k.to_bytes(), v.to_bytes())));
        Ok(Box::new(it))
    }

    fn apply(&mut self, batch: &[Record], applied_offset: u64) -> Result<()> {
        // Both the data and the offset live in this value: one `&mut self`
        // update, so no reader or cut can see one without the other.
        //
        // Large batches are applied in key order, one record per key
        // (`replay::last_write_per_key`, which says why the result is the
        // same): consecutive inserts then walk mostly the same path of the
        // tree, whose nodes and keys are still in cache, instead of a
        // random one each. Replay hands over its batches ordered already
        // (by another thread): a strictly ascending batch is taken as it
        // is.
        let mut order: Vec<&Record>;
        let records: &mut dyn Iterator<Item = &Record> = if batch.len() >= SORTED_APPLY_MIN
            && !batch
                .windows(2)
                .all(|w| cmp_bytes(&w[0].key, &w[1].key).is_lt())
        {
            order = batch.iter().collect();
            super::replay::last_write_per_key(&mut order);
            &mut order.into_iter()
        } else {
            &mut batch.iter()
        };
        for r in records {
            // Own copies, never slices of the record's buffer
            // (`Slot::copy_of`).
            let old_len = match &r.value {
                // Most writes overwrite a key: replace the value in place,
                // passing only the key down the tree (an `insert` moves the
                // whole 160-byte entry through every level).
                Some(v) => {
                    self.bytes += (r.key.len() + v.len()) as u64;
                    match self.map.get_mut(&Lookup(&r.key)) {
                        Some(slot) => {
                            let old_len = slot.len();
                            *slot = ValueSlot::copy_of(v);
                            Some(old_len)
                        }
                        None => {
                            self.map
                                .insert(KeySlot::copy_of(&r.key), ValueSlot::copy_of(v));
                            None
                        }
                    }
                }
                None => self.map.remove(&Lookup(&r.key)).map(|old| old.len()),
            };
            if let Some(old_len) = old_len {
                self.bytes = self.bytes.saturating_sub((r.key.len() + old_len) as u64);
            }
        }
        self.applied_offset = Some(applied_offset);
        Ok(())
    }

    fn applied_offset(&self) -> Result<Option<u64>> {
        Ok(self.applied_offset)
    }

    fn approximate_size(&self) -> Result<SizeEstimate> {
        Ok(SizeEstimate {
            keys: self.map.len() as u64,
            bytes: self.bytes,
        })
    }

    fn binding(&self) -> Result<Option<ChangelogBinding>> {
        Ok(self.binding.clone())
    }

    fn bind(&mut self, binding: &ChangelogBinding) -> Result<()> {
        if super::check_rebind(self.binding.as_ref(), binding)? {
            self.binding = Some(binding.clone());
        }
        Ok(())
    }
}

/// Batches of at least this many records are applied in key order.
/// (Replay's threshold, so the batches it orders are the ones this would.)
const SORTED_APPLY_MIN: usize = super::replay::ORDER_BATCHES_OF;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::StateStoreExt;

    #[test]
    fn cut_is_isolated_from_later_writes() {
        let mut s = MemoryStore::new();
        s.apply(&[Record::put("a", "1"), Record::put("b", "2")], 1)
            .unwrap();
        let cut = s.cut();
        s.apply(
            &[
                Record::put("a", "9"),
                Record::delete("b"),
                Record::put("c", "3"),
            ],
            4,
        )
        .unwrap();
        assert_eq!(cut.applied_offset, Some(1));
        assert_eq!(cut.get(b"a"), Some(&b"1"[..]));
        assert!(cut.get(b"b").is_some());
        assert_eq!(s.get(b"a").unwrap().as_deref(), Some(&b"9"[..]));
        assert_eq!(s.get(b"b").unwrap(), None);
        let keys: Vec<_> = s.iter().unwrap().map(|kv| kv.unwrap().0).collect();
        assert_eq!(keys, vec![Bytes::from("a"), Bytes::from("c")]);
        assert_eq!(
            s.approximate_size().unwrap(),
            SizeEstimate { keys: 2, bytes: 4 }
        );
    }

    /// Batches large enough to be applied in key order end exactly where
    /// applying them record by record does: a few keys written many times
    /// in one batch, deletes between puts, values of changing length.
    #[test]
    fn sorted_apply_equals_sequential_application() {
        let mut seed = 7u64;
        let mut store = MemoryStore::new();
        let mut model = std::collections::BTreeMap::<Bytes, Bytes>::new();
        let mut offset = 0u64;
        for round in 0..20 {
            let len = if round % 2 == 0 {
                SORTED_APPLY_MIN * 4
            } else {
                SORTED_APPLY_MIN / 2
            };
            let batch: Vec<Record> = (0..len)
                .map(|_| {
                    let x = crate::util::splitmix64(&mut seed);
                    let key = Bytes::from(format!("k{}", x % 40));
                    if x.is_multiple_of(5) {
                        Record::delete(key)
                    } else {
                        Record::put(key, vec![b'v'; (x % 17) as usize])
                    }
                })
                .collect();
            for r in &batch {
                match &r.value {
                    Some(v) => model.insert(r.key.clone(), v.clone()),
                    None => model.remove(&r.key),
                };
            }
            offset += len as u64;
            store.apply(&batch, offset - 1).unwrap();
            let got: std::collections::BTreeMap<Bytes, Bytes> =
                store.iter().unwrap().map(|kv| kv.unwrap()).collect();
            assert_eq!(got, model, "round {round}");
            let bytes: usize = model.iter().map(|(k, v)| k.len() + v.len()).sum();
            assert_eq!(store.approximate_size().unwrap().bytes, bytes as u64);
        }
    }
}
