//! [`Slot`]: how [`MemoryStore`](super::memory::MemoryStore) holds a key or a
//! value — its bytes inline when they are short, else a shared [`Bytes`].
//!
//! Why inline: the store's persistent map shares its leaves with every
//! snapshot cut still held, so the first write to a leaf after a capture
//! copies the leaf. With `Bytes` entries that copy touches one shared
//! reference count per key and per value — each in its own heap
//! allocation, so a cache miss each, and the background thread dropping the
//! old version touches the same counters from the other core. With a
//! 1 s snapshot interval on a store written at random, every leaf is copied
//! once per interval, and those misses cost a third of the writer's
//! throughput (`docs/runtime.md`, "Measured"). An inline entry is copied
//! with the leaf as plain memory; only entries longer than the slot keep a
//! shared buffer. Short keys also compare without chasing a pointer.

use bytes::Bytes;
use equivalent::{Comparable, Equivalent};
use std::borrow::Borrow;
use std::cmp::Ordering;
use std::fmt;
use std::ops::Deref;

/// Longest key kept inline: the slot is then 40 bytes, the size of a
/// shared `Bytes` plus its tag. Most state-store keys (ids, composite keys
/// of a few integers) fit.
pub(crate) const KEY_INLINE: usize = 38;
/// Longest value kept inline: the slot is then 120 bytes and a key and
/// value 160. Counters, small aggregates and session records fit; a longer
/// value is shared and leaves 88 bytes of the slot unused, under 10 % of
/// the memory a value that long takes anyway.
pub(crate) const VALUE_INLINE: usize = 118;

/// A key in a [`MemoryStore`](super::memory::MemoryStore).
pub(crate) type KeySlot = Slot<KEY_INLINE>;
/// A value in a [`MemoryStore`](super::memory::MemoryStore).
pub(crate) type ValueSlot = Slot<VALUE_INLINE>;

/// Bytes held inline up to `N` long, else in a shared buffer. Compares
/// and borrows as the `[u8]` it holds, so a map keyed by slots is
/// searched with a plain `&[u8]`.
#[derive(Clone)]
pub(crate) struct Slot<const N: usize>(Repr<N>);

#[derive(Clone)]
enum Repr<const N: usize> {
    /// The first `len` bytes of the array.
    Inline { len: u8, buf: [u8; N] },
    /// Longer than `N`, in `Bytes`' shared representation (see
    /// [`Slot::copy_of`]).
    Shared(Bytes),
}

impl<const N: usize> Slot<N> {
    /// An owned copy of `s`. Records read from a changelog are slices of
    /// large read buffers; keeping a slice would pin the whole buffer (the
    /// store would hold the log, not the state), so long entries are copied
    /// too.
    pub(crate) fn copy_of(s: &[u8]) -> Self {
        const { assert!(N <= u8::MAX as usize, "the inline length is a u8") };
        if s.len() <= N {
            let mut buf = [0u8; N];
            buf[..s.len()].copy_from_slice(s);
            // Fits: `s.len() <= N <= u8::MAX`, asserted above.
            Slot(Repr::Inline {
                len: s.len() as u8,
                buf,
            })
        } else {
            let b = Bytes::copy_from_slice(s);
            // A `Bytes` made from a `Vec` allocates its reference-count
            // header on its first clone — in the persistent map, a leaf copy
            // after a capture. Cloning once here pays that up front, once.
            drop(b.clone());
            Slot(Repr::Shared(b))
        }
    }

    /// The bytes as a `Bytes`: a copy when inline (they are short), a
    /// reference-count clone when shared.
    pub(crate) fn to_bytes(&self) -> Bytes {
        match &self.0 {
            Repr::Inline { .. } => Bytes::copy_from_slice(self),
            Repr::Shared(b) => b.clone(),
        }
    }

    /// Whether the bytes are held inline (for tests).
    #[cfg(test)]
    fn is_inline(&self) -> bool {
        matches!(self.0, Repr::Inline { .. })
    }
}

impl<const N: usize> Deref for Slot<N> {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match &self.0 {
            Repr::Inline { len, buf } => &buf[..usize::from(*len)],
            Repr::Shared(b) => b,
        }
    }
}

impl<const N: usize> Borrow<[u8]> for Slot<N> {
    fn borrow(&self) -> &[u8] {
        self
    }
}

impl<const N: usize> PartialEq for Slot<N> {
    fn eq(&self, other: &Self) -> bool {
        self[..] == other[..]
    }
}

impl<const N: usize> Eq for Slot<N> {}

impl<const N: usize> PartialOrd for Slot<N> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl<const N: usize> Ord for Slot<N> {
    fn cmp(&self, other: &Self) -> Ordering {
        cmp_bytes(self, other)
    }
}

/// A key to look up in a map of [`Slot`]s: compares with [`cmp_bytes`]
/// where a plain `&[u8]` would call `memcmp` for every comparison of the
/// descent (key comparisons were a quarter of a replay's time).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Lookup<'a>(pub(crate) &'a [u8]);

impl<const N: usize> Equivalent<Slot<N>> for Lookup<'_> {
    fn equivalent(&self, key: &Slot<N>) -> bool {
        self.0 == &key[..]
    }
}

impl<const N: usize> Comparable<Slot<N>> for Lookup<'_> {
    fn compare(&self, key: &Slot<N>) -> Ordering {
        cmp_bytes(self.0, key)
    }
}

/// `a.cmp(b)` for byte strings, eight bytes at a time: big-endian words
/// order as their bytes do, so the result is the lexicographic order of
/// `[u8]`, without a `memcmp` call per comparison for short keys.
pub(crate) fn cmp_bytes(mut a: &[u8], mut b: &[u8]) -> Ordering {
    while let (Some((x, rest_a)), Some((y, rest_b))) =
        (a.split_first_chunk::<8>(), b.split_first_chunk::<8>())
    {
        let (x, y) = (u64::from_be_bytes(*x), u64::from_be_bytes(*y));
        if x != y {
            return x.cmp(&y);
        }
        (a, b) = (rest_a, rest_b);
    }
    for (x, y) in a.iter().zip(b) {
        if x != y {
            return x.cmp(y);
        }
    }
    a.len().cmp(&b.len())
}

impl<const N: usize> fmt::Debug for Slot<N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // As `Bytes` prints: a byte string with escapes.
        fmt::Debug::fmt(&Bytes::copy_from_slice(self), f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_slots_are_the_documented_sizes() {
        assert_eq!(std::mem::size_of::<KeySlot>(), 40);
        assert_eq!(std::mem::size_of::<ValueSlot>(), 120);
    }

    #[test]
    fn short_bytes_are_inline_and_long_ones_shared() {
        assert!(KeySlot::copy_of(&[]).is_inline());
        assert!(KeySlot::copy_of(&[7; KEY_INLINE]).is_inline());
        assert!(!KeySlot::copy_of(&[7; KEY_INLINE + 1]).is_inline());
        assert!(ValueSlot::copy_of(&[7; VALUE_INLINE]).is_inline());
        assert!(!ValueSlot::copy_of(&[7; VALUE_INLINE + 1]).is_inline());
    }

    proptest! {
        /// Keys that share a prefix of any length (most of a map's
        /// comparisons are between such keys) compare as their bytes.
        #[test]
        fn keys_with_a_common_prefix_compare_as_bytes(
            prefix in proptest::collection::vec(any::<u8>(), 0..40),
            a in proptest::collection::vec(any::<u8>(), 0..12),
            b in proptest::collection::vec(any::<u8>(), 0..12),
        ) {
            let a: Vec<u8> = prefix.iter().chain(&a).copied().collect();
            let b: Vec<u8> = prefix.iter().chain(&b).copied().collect();
            prop_assert_eq!(cmp_bytes(&a, &b), a.cmp(&b));
            prop_assert_eq!(KeySlot::copy_of(&a).cmp(&KeySlot::copy_of(&b)), a.cmp(&b));
        }

        /// Whatever the lengths, a slot holds, compares and orders exactly
        /// as the bytes it was made from, so a map of slots is ordered and
        /// searched as a map of byte strings.
        #[test]
        fn slots_behave_as_their_bytes(
            a in proptest::collection::vec(any::<u8>(), 0..60),
            b in proptest::collection::vec(any::<u8>(), 0..60),
        ) {
            let (sa, sb) = (KeySlot::copy_of(&a), KeySlot::copy_of(&b));
            prop_assert_eq!(&sa[..], &a[..]);
            prop_assert_eq!(&sa.to_bytes()[..], &a[..]);
            prop_assert_eq!(sa.cmp(&sb), a.cmp(&b));
            prop_assert_eq!(cmp_bytes(&a, &b), a.cmp(&b));
            prop_assert_eq!(Lookup(&a).compare(&sb), a.cmp(&b));
            prop_assert_eq!(Lookup(&a).equivalent(&sb), a == b);
            prop_assert_eq!(sa == sb, a == b);
            let borrowed: &[u8] = sa.borrow();
            prop_assert_eq!(borrowed, &a[..]);
            prop_assert_eq!(format!("{sa:?}"), format!("{:?}", Bytes::from(a.clone())));
        }
    }
}
